-- crashproof ledger, schema 3 (SQLite): leases and fencing tokens on the run index.
-- owner: the worker holding the run (NULL: nobody); lease_expires_at: until when, by the
-- local clock (epoch seconds); fencing_token: incremented by every claim, never lowered,
-- and checked by every fenced journal commit in the same transaction.
ALTER TABLE runs ADD COLUMN owner TEXT;
ALTER TABLE runs ADD COLUMN lease_expires_at REAL;
ALTER TABLE runs ADD COLUMN fencing_token INTEGER NOT NULL DEFAULT 0;
