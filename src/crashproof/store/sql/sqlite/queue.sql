-- Named queries of the work queue (crashproof.store.queue) for the SQLite store.
-- Each starts with "-- name: NAME". Run inside BEGIN IMMEDIATE: SQLite has one writer
-- at a time, so the select and the claim_lease update that follows cannot interleave
-- with another process's claim.

-- name: next_runnable
SELECT run_id, owner, fencing_token FROM runs
WHERE status = 'running'
  AND (owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= :now)
  AND workflow || char(31) || version IN (SELECT value FROM json_each(:runnable))
  AND run_id NOT IN (SELECT value FROM json_each(:exclude))
ORDER BY created_at, run_id
LIMIT 1;

-- name: leases
SELECT run_id, owner, lease_expires_at, fencing_token FROM runs;
