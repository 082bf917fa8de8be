-- Named queries for the SQLite store. Each starts with "-- name: NAME".

-- name: get_meta
SELECT value FROM crashproof_meta WHERE key = ?;

-- name: set_meta
INSERT INTO crashproof_meta (key, value) VALUES (?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: record_migration
INSERT INTO crashproof_migrations (version, name, applied_at) VALUES (?, ?, ?);

-- name: insert_run
-- Returns the new run's number (no row when the run exists already).
INSERT INTO runs (run_id, workflow, version, status, reason, input_digest, created_at, updated_at,
                  owner, lease_expires_at, fencing_token, run_no)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, (SELECT coalesce(max(run_no), 0) + 1 FROM runs))
ON CONFLICT (run_id) DO NOTHING
RETURNING run_no;

-- name: get_run
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM runs WHERE run_id = ?;

-- name: get_runs
-- get_run of many runs at once (?: a JSON array of run ids): an async loop's starts.
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM runs WHERE run_id IN (SELECT value FROM json_each(?));

-- name: list_runs
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM runs ORDER BY created_at, run_id;

-- name: list_runs_by_status
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM runs WHERE status = ? ORDER BY created_at, run_id;

-- name: set_status
-- A terminal status releases the run's lease too (Store.append): no release commit after.
UPDATE runs SET status = ?1, reason = ?2, updated_at = ?3,
    owner = CASE WHEN ?1 IN ('succeeded', 'failed', 'cancelled') THEN NULL ELSE owner END,
    lease_expires_at = CASE WHEN ?1 IN ('succeeded', 'failed', 'cancelled') THEN NULL
                            ELSE lease_expires_at END
WHERE run_id = ?4;

-- name: insert_event
-- The first value is the row id: the run's run_no * 2^32 + seq (schema.sql).
INSERT INTO events (id, run_id, seq, type, key, payload, value, blob, created_at, key_id, mac)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_event_alone
-- insert_event as one statement in autocommit mode (no BEGIN, no COMMIT: 3 statements
-- fewer per record), for one record right after the run's last one as this store wrote
-- it. The statement checks that nobody else appended since (the record before this one,
-- ?1 - 1, is still the run's last; ?1 - ?3 is the run's first row id) and that the run's
-- fencing token is still the writer's ?11 (NULL: no lease); if not, run_id becomes NULL,
-- the NOT NULL constraint refuses the insert, and the store takes its checked path.
INSERT INTO events (id, run_id, seq, type, key, payload, value, blob, created_at, key_id, mac)
VALUES (?1,
        CASE WHEN (?11 IS NULL OR (SELECT fencing_token FROM runs WHERE run_id = ?2) = ?11)
              AND (SELECT id FROM events WHERE id BETWEEN ?1 - ?3 AND ?1
                   ORDER BY id DESC LIMIT 1) = ?1 - 1
             THEN ?2 END,
        ?3, ?4, ?5, ?6, ?7, NULL, ?8, ?9, ?10);


-- name: insert_request
-- (record's row id, text): a decision's request beside its record, schema 9, in parts of
-- 1,000 characters (substr counts characters), in order: one statement for all its parts.
WITH RECURSIVE part (at) AS (
    SELECT 0
    UNION ALL
    SELECT at + 1000 FROM part WHERE at + 1000 < length(?2)
)
INSERT INTO requests (record, text) SELECT ?1, substr(?2, at + 1, 1000) FROM part ORDER BY at;

-- name: load_requests
-- A run's requests by record seq (the low half of the row id), each in its parts.
SELECT q.record - (r.run_no << 32), q.text
FROM runs AS r
JOIN requests AS q ON q.record BETWEEN r.run_no << 32 AND (r.run_no << 32) + 4294967295
WHERE r.run_id = ?
ORDER BY q.record, q.rowid;

-- name: insert_blob
-- (digest, data, base, prefix): base and prefix NULL for a whole value (store/deltas.py).
INSERT INTO blobs (digest, data, base, prefix) VALUES (?, ?, ?, ?)
ON CONFLICT (digest) DO NOTHING;

-- name: has_blob
SELECT 1 FROM blobs WHERE digest = ?;

-- name: blob_row
SELECT data, base, prefix FROM blobs WHERE digest = ?;

-- name: load_records
-- A value kept as a text delta (blobs.base set, schema 7) is resolved by crashproof_text,
-- a function of the connection (store/deltas.py), here, before any MAC check; a whole one
-- never leaves SQLite for it.
-- load_events without what only names a fault (a sealed journal's MACs catch both a record
-- of another run, read as seq -1, and a missing blob, read as a NULL value): 2 columns
-- and a join per record fewer. A store that finds a fault reads load_events to name it.
SELECT CASE WHEN e.run_id IS r.run_id THEN e.seq ELSE -1 END, e.type, e.key, e.payload,
       coalesce(e.value, (SELECT CASE WHEN b.base IS NULL THEN b.data
                                      ELSE crashproof_text(b.digest, b.data, b.base, b.prefix)
                                 END
                          FROM blobs AS b WHERE b.digest = e.blob)),
       e.created_at, e.key_id, e.mac
FROM runs AS r
JOIN events AS e ON e.id BETWEEN r.run_no << 32 AND (r.run_no << 32) + 4294967295
WHERE r.run_id = ? ORDER BY e.id;

-- name: load_records_from
-- load_records from the record of seq ?2 on (store/sqlite_journal.py: a verified
-- journal read again from its end).
SELECT CASE WHEN e.run_id IS r.run_id THEN e.seq ELSE -1 END, e.type, e.key, e.payload,
       coalesce(e.value, (SELECT CASE WHEN b.base IS NULL THEN b.data
                                      ELSE crashproof_text(b.digest, b.data, b.base, b.prefix)
                                 END
                          FROM blobs AS b WHERE b.digest = e.blob)),
       e.created_at, e.key_id, e.mac
FROM runs AS r
JOIN events AS e ON e.id BETWEEN (r.run_no << 32) + ?2 AND (r.run_no << 32) + 4294967295
WHERE r.run_id = ?1 ORDER BY e.id;

-- name: load_events
-- The run's row-id range, in order. A record there that names another run (only an
-- edited file has one) reads as seq -1, so its MAC cannot match, and its seq is in the
-- last column (NULL for every sound record) to name it.
SELECT CASE WHEN e.run_id IS r.run_id THEN e.seq ELSE -1 END, e.type, e.key, e.payload,
       coalesce(e.value, CASE WHEN b.base IS NULL THEN b.data
                              ELSE crashproof_text(b.digest, b.data, b.base, b.prefix) END),
       e.created_at, e.key_id, e.mac, e.blob,
       CASE WHEN e.run_id IS r.run_id THEN NULL ELSE e.seq END
FROM runs AS r
JOIN events AS e ON e.id BETWEEN r.run_no << 32 AND (r.run_no << 32) + 4294967295
LEFT JOIN blobs AS b ON b.digest = e.blob
WHERE r.run_id = ? ORDER BY e.id;

-- name: journal_end
-- (next seq, last MAC, fencing token, run_no) of a run; no row for an unknown run.
-- (ORDER BY id DESC LIMIT 1, not max(id): max over a range reads the whole range.)
SELECT coalesce((SELECT e.id FROM events AS e
                 WHERE e.id BETWEEN r.run_no << 32 AND (r.run_no << 32) + 4294967295
                 ORDER BY e.id DESC LIMIT 1)
                - (r.run_no << 32) + 1, 0),
       (SELECT e.mac FROM events AS e
        WHERE e.id BETWEEN r.run_no << 32 AND (r.run_no << 32) + 4294967295
        ORDER BY e.id DESC LIMIT 1),
       r.fencing_token, r.run_no
FROM runs AS r WHERE r.run_id = ?;

-- name: get_lease
SELECT owner, lease_expires_at, fencing_token FROM runs WHERE run_id = ?;

-- name: claim_lease
UPDATE runs SET owner = ?, lease_expires_at = ?, fencing_token = fencing_token + 1
WHERE run_id = ?;

-- name: renew_lease
UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND owner = ? AND fencing_token = ?;

-- name: renew_leases
-- Renewals of several runs' leases in one statement (?1: now; ?2: a JSON list of
-- [run id, owner, token, ttl]): each renewed only while its owner and token are current.
-- Per lease renewed: its run id and new expiry.
UPDATE runs SET lease_expires_at = ?1 + asked.ttl
FROM (SELECT json_extract(value, '$[0]') AS run_id, json_extract(value, '$[1]') AS owner,
             json_extract(value, '$[2]') AS token, json_extract(value, '$[3]') AS ttl
      FROM json_each(?2)) AS asked
WHERE runs.run_id = asked.run_id AND runs.owner = asked.owner
  AND runs.fencing_token = asked.token
RETURNING runs.run_id, runs.lease_expires_at;

-- name: release_lease
UPDATE runs SET owner = NULL, lease_expires_at = NULL
WHERE run_id = ? AND owner = ? AND fencing_token = ?;

-- name: intent_holds
-- The holds a new intent of run ?1 at step ?2 meets: its own (a re-attempt), and those
-- of the same digest ?3 on the same instance ?4 (store/intents.py).
SELECT run_id, step_key, intent_digest, instance, since FROM unresolved_intents
WHERE (run_id = ?1 AND step_key = ?2) OR (intent_digest = ?3 AND instance = ?4);

-- name: hold_intent
INSERT INTO unresolved_intents (run_id, step_key, intent_digest, instance, since)
VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, step_key) DO NOTHING;

-- name: release_intent
DELETE FROM unresolved_intents WHERE run_id = ? AND step_key = ?;

-- name: release_run_intents
DELETE FROM unresolved_intents WHERE run_id = ?;

-- name: unresolved_intents
SELECT run_id, step_key, intent_digest, instance, since FROM unresolved_intents
ORDER BY since, run_id, step_key;

-- name: index_page
-- crashproof.store.index: a page of the run index, newest update first. instr, not LIKE:
-- a run id may hold % and _.
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM runs
WHERE substr(run_id, 1, 11) <> 'crashproof:'
  AND (:status IS NULL OR status = :status)
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (:search IS NULL OR instr(run_id, :search) > 0)
  AND (:since IS NULL OR updated_at >= :since)
  AND (:until IS NULL OR updated_at < :until)
ORDER BY updated_at DESC, run_id
LIMIT :limit OFFSET :offset;

-- name: index_count
SELECT count(*) FROM runs
WHERE substr(run_id, 1, 11) <> 'crashproof:'
  AND (:status IS NULL OR status = :status)
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (:search IS NULL OR instr(run_id, :search) > 0)
  AND (:since IS NULL OR updated_at >= :since)
  AND (:until IS NULL OR updated_at < :until);

-- name: index_summary
SELECT status, workflow, count(*) FROM runs
WHERE substr(run_id, 1, 11) <> 'crashproof:'
GROUP BY status, workflow;

-- name: index_marks
SELECT run_id, status, updated_at FROM runs WHERE substr(run_id, 1, 11) <> 'crashproof:';

-- name: index_outbox_runs
-- Runs with an outbox message journaled (a text test, as journal/fold.py makes it; the
-- reader then verifies and folds those journals only).
SELECT DISTINCT run_id FROM events
WHERE type = 'step_done' AND instr(payload, '"outbox"') > 0
  AND substr(run_id, 1, 11) <> 'crashproof:';

-- name: index_reconciled_runs
-- Runs with a journaled reconciliation finding (runtime/operations/reconciling.py).
SELECT DISTINCT run_id FROM events WHERE type = 'act_reconciled';

-- name: clock_floor
-- The newest time the ledger holds (store/port.py, Store.now): the last status change of
-- a run, the newest unresolved act intent. Two small scans; asked only by approved acts
-- and idempotency windows.
SELECT max(t) FROM (SELECT max(updated_at) AS t FROM runs
                    UNION ALL SELECT max(since) FROM unresolved_intents);
