-- Named queries of the work queue (crashproof.store.queue) for the SQLite store.
-- Each starts with "-- name: NAME". Run inside BEGIN IMMEDIATE: SQLite has one writer
-- at a time, so the select and the claim_lease update that follows cannot interleave
-- with another process's claim.

-- name: next_runnable
-- Runnable: running and held by nobody (never claimed, released, or the lease expired),
-- or stopped for a retryable cause (reason "unavailable:...") once its retry_at passed.
SELECT run_id, owner, fencing_token, status, retries FROM runs
WHERE (status = 'running'
       OR (status = 'stopped' AND reason LIKE 'unavailable:%'
           AND (retry_at IS NULL OR retry_at <= :now)))
  AND (owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= :now)
  AND workflow || char(31) || version IN (SELECT value FROM json_each(:runnable))
  AND run_id NOT IN (SELECT value FROM json_each(:exclude))
ORDER BY created_at, run_id
LIMIT 1;

-- name: count_retry
-- A stopped run claimed for another automatic attempt.
UPDATE runs SET retries = retries + 1 WHERE run_id = ? RETURNING retries;

-- name: schedule_retry
-- When a run that stopped again is tried next (?1), and its attempts so far (?2).
UPDATE runs SET retry_at = ?1, retries = ?2
WHERE run_id = ?3 AND status = 'stopped';

-- name: leases
SELECT run_id, owner, lease_expires_at, fencing_token, retry_at, retries FROM runs;
