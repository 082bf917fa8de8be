-- Named queries for the PostgreSQL store. Each starts with "-- name: NAME".
-- {schema} is replaced by the ledger's (validated, quoted) schema name when loaded:
-- queries name their tables in full so that they do not depend on a session's
-- search_path (which a transaction-pooling proxy would not keep).

-- name: get_meta
SELECT value FROM {schema}.crashproof_meta WHERE key = %s;

-- name: set_meta
INSERT INTO {schema}.crashproof_meta (key, value) VALUES (%s, %s)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: record_migration
INSERT INTO {schema}.crashproof_migrations (version, name, applied_at) VALUES (%s, %s, %s);

-- name: list_tables
SELECT c.relname FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
ORDER BY c.relname;

-- name: insert_run
-- Held under a first lease when given one (owner, ttl, token; else NULL, NULL, 0): the
-- expiry by the server's clock, as a claim's.
INSERT INTO {schema}.runs
    (run_id, workflow, version, status, reason, input_digest, created_at, updated_at,
     owner, lease_expires_at, fencing_token)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s,
        %s, extract(epoch FROM clock_timestamp())::float8 + %s::float8, %s)
ON CONFLICT (run_id) DO NOTHING;

-- name: get_run
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM {schema}.runs WHERE run_id = %s;

-- name: list_runs
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM {schema}.runs ORDER BY created_at, run_id COLLATE "C";

-- name: list_runs_by_status
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM {schema}.runs WHERE status = %s ORDER BY created_at, run_id COLLATE "C";

-- name: set_status
-- A terminal status releases the run's lease too (Store.append): no release commit after.
UPDATE {schema}.runs SET status = %(status)s::text, reason = %(reason)s::text,
    updated_at = %(now)s::float8,
    owner = CASE WHEN %(status)s::text IN ('succeeded', 'failed', 'cancelled') THEN NULL
                 ELSE owner END,
    lease_expires_at = CASE WHEN %(status)s::text IN ('succeeded', 'failed', 'cancelled')
                            THEN NULL ELSE lease_expires_at END
WHERE run_id = %(run_id)s;

-- name: insert_event
INSERT INTO {schema}.events
    (run_id, seq, type, key, payload, value, blob, created_at, key_id, mac)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s);

-- name: insert_blob
INSERT INTO {schema}.blobs (digest, data) VALUES (%s, %s) ON CONFLICT (digest) DO NOTHING;

-- name: load_events
SELECT e.seq, e.type, e.key, e.payload, coalesce(e.value, b.data), e.blob, e.created_at,
       e.key_id, e.mac
FROM {schema}.events AS e LEFT JOIN {schema}.blobs AS b ON b.digest = e.blob
WHERE e.run_id = %s ORDER BY e.seq;

-- name: journal_end
-- The next seq and the last record's MAC (the chain goes on from it). Locks the run's
-- index row: appends to one run queue up here, and the second one then meets the first
-- one's rows (a taken seq) instead of racing it.
SELECT (SELECT coalesce(max(e.seq) + 1, 0) FROM {schema}.events AS e WHERE e.run_id = r.run_id),
       (SELECT e.mac FROM {schema}.events AS e WHERE e.run_id = r.run_id
        ORDER BY e.seq DESC LIMIT 1),
       r.fencing_token
FROM {schema}.runs AS r WHERE r.run_id = %s FOR UPDATE;

-- name: get_lease
-- The run's lease and the server's clock, the row locked until the transaction ends.
SELECT owner, lease_expires_at, fencing_token, extract(epoch FROM clock_timestamp())::float8
FROM {schema}.runs WHERE run_id = %s FOR UPDATE;

-- name: claim_lease
UPDATE {schema}.runs
SET owner = %s, lease_expires_at = extract(epoch FROM clock_timestamp())::float8 + %s,
    fencing_token = fencing_token + 1
WHERE run_id = %s
RETURNING fencing_token, lease_expires_at;

-- name: renew_lease
UPDATE {schema}.runs SET lease_expires_at = extract(epoch FROM clock_timestamp())::float8 + %s
WHERE run_id = %s AND owner = %s AND fencing_token = %s
RETURNING lease_expires_at;

-- name: release_lease
UPDATE {schema}.runs SET owner = NULL, lease_expires_at = NULL
WHERE run_id = %s AND owner = %s AND fencing_token = %s;

-- name: append_events
-- A journal append in one statement and one round trip (store/pg_append.py), sent in
-- autocommit: its own transaction. It writes only if the run's row, locked until the
-- commit, still carries the writer's fencing token (NULL: an unfenced write) and the
-- record before the first new one is there with the MAC the writer chained to; the
-- primary key refuses a taken seq. Blobs, records and the status change land together
-- or not at all. set_config(..., true) sets synchronous_commit for this transaction
-- only: "on" makes the commit wait for the server's disk (an output point, or
-- durability "full"). Its row count is the number of records written; 0: refused.
WITH fence AS (
    SELECT 1 FROM {schema}.runs
    WHERE run_id = %(run_id)s
      AND (%(token)s::bigint IS NULL OR fencing_token = %(token)s::bigint)
    FOR UPDATE
), ok AS (
    SELECT set_config('synchronous_commit', %(synchronous)s::text, true) AS synchronous
    WHERE EXISTS (SELECT FROM fence)
      AND EXISTS (SELECT FROM {schema}.events
                  WHERE run_id = %(run_id)s AND seq = %(first)s::bigint - 1
                    AND mac IS NOT DISTINCT FROM %(prev_mac)s::text)
), new_blobs AS (
    INSERT INTO {schema}.blobs (digest, data)
    SELECT b.digest, b.data
    FROM unnest(%(digests)s::text[], %(datas)s::text[]) AS b (digest, data), ok
    ON CONFLICT (digest) DO NOTHING
), new_status AS (
    UPDATE {schema}.runs SET status = %(status)s::text, reason = %(reason)s::text,
        updated_at = %(now)s::float8,
        owner = CASE WHEN %(status)s::text IN ('succeeded', 'failed', 'cancelled') THEN NULL
                     ELSE owner END,
        lease_expires_at = CASE WHEN %(status)s::text IN ('succeeded', 'failed', 'cancelled')
                                THEN NULL ELSE lease_expires_at END
    FROM ok WHERE run_id = %(run_id)s AND %(status)s::text IS NOT NULL
)
INSERT INTO {schema}.events
    (run_id, seq, type, key, payload, value, blob, created_at, key_id, mac)
SELECT %(run_id)s, e.seq, e.type, e.key, e.payload, e.value, e.blob, e.created_at,
       e.key_id, e.mac
FROM unnest(%(seqs)s::bigint[], %(types)s::text[], %(keys)s::text[], %(payloads)s::text[],
            %(values)s::text[], %(blobs)s::text[], %(created_ats)s::float8[],
            %(key_ids)s::text[], %(macs)s::text[])
     AS e (seq, type, key, payload, value, blob, created_at, key_id, mac), ok;

-- name: append_event
-- append_events for one record (nearly every append): the same checks and writes, with
-- plain parameters instead of arrays, which the driver encodes much faster.
WITH fence AS (
    SELECT 1 FROM {schema}.runs
    WHERE run_id = %(run_id)s
      AND (%(token)s::bigint IS NULL OR fencing_token = %(token)s::bigint)
    FOR UPDATE
), ok AS (
    SELECT set_config('synchronous_commit', %(synchronous)s::text, true) AS synchronous
    WHERE EXISTS (SELECT FROM fence)
      AND EXISTS (SELECT FROM {schema}.events
                  WHERE run_id = %(run_id)s AND seq = %(seq)s::bigint - 1
                    AND mac IS NOT DISTINCT FROM %(prev_mac)s::text)
), new_blob AS (
    INSERT INTO {schema}.blobs (digest, data)
    SELECT %(blob)s::text, %(data)s::text FROM ok WHERE %(blob)s::text IS NOT NULL
    ON CONFLICT (digest) DO NOTHING
), new_status AS (
    UPDATE {schema}.runs SET status = %(status)s::text, reason = %(reason)s::text,
        updated_at = %(now)s::float8,
        owner = CASE WHEN %(status)s::text IN ('succeeded', 'failed', 'cancelled') THEN NULL
                     ELSE owner END,
        lease_expires_at = CASE WHEN %(status)s::text IN ('succeeded', 'failed', 'cancelled')
                                THEN NULL ELSE lease_expires_at END
    FROM ok WHERE run_id = %(run_id)s AND %(status)s::text IS NOT NULL
)
INSERT INTO {schema}.events
    (run_id, seq, type, key, payload, value, blob, created_at, key_id, mac)
SELECT %(run_id)s, %(seq)s::bigint, %(type)s::text, %(key)s::text, %(payload)s::text,
       %(value)s::text, %(blob)s::text, %(created_at)s::float8, %(key_id)s::text,
       %(mac)s::text
FROM ok;

-- name: append_event_releasing
-- append_event for a record that releases intents of its run from the index (an act's
-- end: the hold of its step, release_key; the run's end: every hold, release_all),
-- released in the same statement, so only with the record (released ... USING ok). A
-- record that holds a new intent needs the check in Python (store/pg_append.py).
WITH fence AS (
    SELECT 1 FROM {schema}.runs
    WHERE run_id = %(run_id)s
      AND (%(token)s::bigint IS NULL OR fencing_token = %(token)s::bigint)
    FOR UPDATE
), ok AS (
    SELECT set_config('synchronous_commit', %(synchronous)s::text, true) AS synchronous
    WHERE EXISTS (SELECT FROM fence)
      AND EXISTS (SELECT FROM {schema}.events
                  WHERE run_id = %(run_id)s AND seq = %(seq)s::bigint - 1
                    AND mac IS NOT DISTINCT FROM %(prev_mac)s::text)
), new_blob AS (
    INSERT INTO {schema}.blobs (digest, data)
    SELECT %(blob)s::text, %(data)s::text FROM ok WHERE %(blob)s::text IS NOT NULL
    ON CONFLICT (digest) DO NOTHING
), released AS (
    DELETE FROM {schema}.unresolved_intents AS u USING ok
    WHERE u.run_id = %(run_id)s
      AND (%(release_all)s::boolean OR u.step_key = %(release_key)s::text)
), new_status AS (
    UPDATE {schema}.runs SET status = %(status)s::text, reason = %(reason)s::text,
        updated_at = %(now)s::float8,
        owner = CASE WHEN %(status)s::text IN ('succeeded', 'failed', 'cancelled') THEN NULL
                     ELSE owner END,
        lease_expires_at = CASE WHEN %(status)s::text IN ('succeeded', 'failed', 'cancelled')
                                THEN NULL ELSE lease_expires_at END
    FROM ok WHERE run_id = %(run_id)s AND %(status)s::text IS NOT NULL
)
INSERT INTO {schema}.events
    (run_id, seq, type, key, payload, value, blob, created_at, key_id, mac)
SELECT %(run_id)s, %(seq)s::bigint, %(type)s::text, %(key)s::text, %(payload)s::text,
       %(value)s::text, %(blob)s::text, %(created_at)s::float8, %(key_id)s::text,
       %(mac)s::text
FROM ok;

-- name: lock_intent
-- Serialises the transactions that would hold one intent digest (store/intents.py): a
-- check and the hold that follows it cannot interleave with another run's.
SELECT pg_advisory_xact_lock(hashtextextended(%s, 0));

-- name: intent_holds
-- The holds a new intent of a run at a step meets: its own (a re-attempt), and those of
-- the same digest on the same instance.
SELECT run_id, step_key, intent_digest, instance, since FROM {schema}.unresolved_intents
WHERE (run_id = %s AND step_key = %s) OR (intent_digest = %s AND instance = %s);

-- name: hold_intent
INSERT INTO {schema}.unresolved_intents (run_id, step_key, intent_digest, instance, since)
VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id, step_key) DO NOTHING;

-- name: release_intent
DELETE FROM {schema}.unresolved_intents WHERE run_id = %s AND step_key = %s;

-- name: release_run_intents
DELETE FROM {schema}.unresolved_intents WHERE run_id = %s;

-- name: unresolved_intents
SELECT run_id, step_key, intent_digest, instance, since FROM {schema}.unresolved_intents
ORDER BY since, run_id, step_key;

-- name: index_page
-- crashproof.store.index: a page of the run index, newest update first. strpos, not
-- LIKE: a run id may hold LIKE wildcards, searched as text.
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM {schema}.runs
WHERE left(run_id, 11) <> 'crashproof:'
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(search)s::text IS NULL OR strpos(run_id, %(search)s::text) > 0)
ORDER BY updated_at DESC, run_id COLLATE "C"
LIMIT %(limit)s OFFSET %(offset)s;

-- name: index_count
SELECT count(*) FROM {schema}.runs
WHERE left(run_id, 11) <> 'crashproof:'
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(search)s::text IS NULL OR strpos(run_id, %(search)s::text) > 0);

-- name: index_summary
SELECT status, workflow, count(*) FROM {schema}.runs
WHERE left(run_id, 11) <> 'crashproof:'
GROUP BY status, workflow;

-- name: index_marks
SELECT run_id, status, updated_at FROM {schema}.runs WHERE left(run_id, 11) <> 'crashproof:';

-- name: index_outbox_runs
-- Runs with an outbox message journaled (a text test, as journal/fold.py makes it; the
-- reader then verifies and folds those journals only).
SELECT DISTINCT run_id FROM {schema}.events
WHERE type = 'step_done' AND strpos(payload, '"outbox"') > 0
  AND left(run_id, 11) <> 'crashproof:';

-- name: index_reconciled_runs
-- Runs with a journaled reconciliation finding (runtime/operations/reconciling.py).
SELECT DISTINCT run_id FROM {schema}.events WHERE type = 'act_reconciled';
