-- Named queries of the work queue (crashproof.store.queue) for the PostgreSQL store.
-- Each starts with "-- name: NAME"; {schema} is replaced as in queries.sql.

-- name: claim_next
-- The oldest runnable run of the given workflow versions (runnable_key), skipping rows
-- another transaction holds (a claim in progress, or a journal append of the run's
-- current driver): workers on many hosts pull from one table without waiting on each
-- other. Expiry by the server's clock. Returns the run, its new token and expiry, and
-- the owner it had (NULL: nobody; else a worker whose lease expired).
-- Also runnable: a run stopped for a retryable cause (reason "unavailable:...", stored as
-- JSON text) once its retry_at passed; its claim counts one more automatic attempt.
WITH next AS (
    SELECT run_id, owner AS previous_owner, status AS was
    FROM {schema}.runs
    WHERE (status = 'running'
           OR (status = 'stopped' AND reason LIKE '"unavailable:%%'
               AND (retry_at IS NULL
                    OR retry_at <= extract(epoch FROM clock_timestamp())::float8)))
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
    fencing_token = r.fencing_token + 1,
    retries = CASE WHEN next.was = 'stopped' THEN r.retries + 1 ELSE r.retries END
FROM next
WHERE r.run_id = next.run_id
RETURNING r.run_id, r.fencing_token, r.lease_expires_at, next.previous_owner,
          CASE WHEN next.was = 'stopped' THEN r.retries ELSE 0 END;

-- name: schedule_retry
-- When a run that stopped again is tried next (in %(delay)s seconds by the server's
-- clock), and its attempts so far; returns that time.
UPDATE {schema}.runs
SET retry_at = extract(epoch FROM clock_timestamp())::float8 + %(delay)s,
    retries = %(retries)s
WHERE run_id = %(run_id)s AND status = 'stopped'
RETURNING retry_at;

-- name: leases
SELECT run_id, owner, lease_expires_at, fencing_token, retry_at, retries FROM {schema}.runs;
