-- Named queries for the SQLite store. Each starts with "-- name: NAME".

-- name: get_meta
SELECT value FROM crashproof_meta WHERE key = ?;

-- name: set_meta
INSERT INTO crashproof_meta (key, value) VALUES (?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: record_migration
INSERT INTO crashproof_migrations (version, name, applied_at) VALUES (?, ?, ?);

-- name: insert_run
INSERT INTO runs (run_id, workflow, version, status, reason, input_digest, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id) DO NOTHING;

-- name: get_run
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM runs WHERE run_id = ?;

-- name: list_runs
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM runs ORDER BY created_at, run_id;

-- name: list_runs_by_status
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM runs WHERE status = ? ORDER BY created_at, run_id;

-- name: set_status
UPDATE runs SET status = ?, reason = ?, updated_at = ? WHERE run_id = ?;

-- name: insert_event
INSERT INTO events (run_id, seq, type, key, payload, value, blob, created_at, key_id, mac)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_blob
INSERT INTO blobs (digest, data) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING;

-- name: load_events
SELECT e.seq, e.type, e.key, e.payload, coalesce(e.value, b.data), e.created_at, e.key_id,
       e.mac, e.blob
FROM events AS e LEFT JOIN blobs AS b ON b.digest = e.blob
WHERE e.run_id = ? ORDER BY e.seq;

-- name: journal_end
SELECT (SELECT coalesce(max(e.seq) + 1, 0) FROM events AS e WHERE e.run_id = r.run_id),
       (SELECT e.mac FROM events AS e WHERE e.run_id = r.run_id ORDER BY e.seq DESC LIMIT 1),
       r.fencing_token
FROM runs AS r WHERE r.run_id = ?;

-- name: get_lease
SELECT owner, lease_expires_at, fencing_token FROM runs WHERE run_id = ?;

-- name: claim_lease
UPDATE runs SET owner = ?, lease_expires_at = ?, fencing_token = fencing_token + 1
WHERE run_id = ?;

-- name: renew_lease
UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND owner = ? AND fencing_token = ?;

-- name: release_lease
UPDATE runs SET owner = NULL, lease_expires_at = NULL
WHERE run_id = ? AND owner = ? AND fencing_token = ?;
