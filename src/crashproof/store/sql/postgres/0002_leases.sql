-- crashproof ledger, schema 2 (PostgreSQL): leases and fencing tokens on the run index.
-- owner: the worker holding the run (NULL: nobody); lease_expires_at: until when, by the
-- database server's clock (epoch seconds); fencing_token: incremented by every claim,
-- never lowered, and checked by every fenced journal commit in the same transaction.
ALTER TABLE runs ADD COLUMN owner text;
ALTER TABLE runs ADD COLUMN lease_expires_at double precision;
ALTER TABLE runs ADD COLUMN fencing_token bigint NOT NULL DEFAULT 0;
