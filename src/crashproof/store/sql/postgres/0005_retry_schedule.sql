-- crashproof ledger, schema 5 (PostgreSQL): when a worker tries a stopped run again. A
-- run stopped for a retryable cause (status 'stopped', reason 'unavailable:...': a model,
-- a tool or a lookup out) is claimed again by any worker once retry_at (the server's
-- clock, epoch seconds) has passed (NULL: at once); retries counts the automatic
-- attempts of the current outage. A schedule, not a record: the journal says why the run
-- stopped, this says when it is tried again.
ALTER TABLE runs ADD COLUMN retry_at double precision;
ALTER TABLE runs ADD COLUMN retries integer NOT NULL DEFAULT 0;
