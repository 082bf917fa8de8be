-- Named queries of the work queue (crashproof.store.queue) for the PostgreSQL store.
-- Each starts with "-- name: NAME"; {schema} is replaced as in queries.sql.

-- name: claim_next
-- The oldest runnable run of the given workflow versions (runnable_key), skipping rows
-- another transaction holds (a claim in progress, or a journal append of the run's
-- current driver): workers on many hosts pull from one table without waiting on each
-- other. Expiry by the server's clock. Returns the run, its new token and expiry, and
-- the owner it had (NULL: nobody; else a worker whose lease expired).
WITH next AS (
    SELECT run_id, owner AS previous_owner
    FROM {schema}.runs
    WHERE status = 'running'
      AND (owner IS NULL OR lease_expires_at IS NULL
           OR lease_expires_at <= extract(epoch FROM clock_timestamp())::float8)
      AND workflow || chr(31) || version = ANY(%(runnable)s::text[])
      AND NOT (run_id = ANY(%(exclude)s::text[]))
    ORDER BY created_at, run_id COLLATE "C"
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.runs AS r
SET owner = %(owner)s,
    lease_expires_at = extract(epoch FROM clock_timestamp())::float8 + %(ttl)s,
    fencing_token = r.fencing_token + 1
FROM next
WHERE r.run_id = next.run_id
RETURNING r.run_id, r.fencing_token, r.lease_expires_at, next.previous_owner;

-- name: leases
SELECT run_id, owner, lease_expires_at, fencing_token FROM {schema}.runs;
