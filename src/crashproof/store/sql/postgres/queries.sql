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

-- name: insert_request
-- (run_id, seq, text): a decision's request beside its record (schema 6).
INSERT INTO {schema}.requests (run_id, seq, text) VALUES (%s, %s, %s);

-- name: insert_request_after
-- insert_request in the transaction of a one-record append (pg_append.py), only where
-- that statement wrote the very record (its payload and MAC): refused, it writes nothing.
INSERT INTO {schema}.requests (run_id, seq, text)
SELECT %(run_id)s, %(seq)s, %(text)s
WHERE EXISTS (
    SELECT 1 FROM {schema}.events
    WHERE run_id = %(run_id)s AND seq = %(seq)s AND payload = %(payload)s
      AND mac IS NOT DISTINCT FROM %(mac)s
);

-- name: insert_requests_after
-- insert_request_after for a batch's records (pg_batch.py, append_batch), sent after all
-- of the batch's appends in their transaction: each text only where the very record it
-- goes with (its payload and MAC) is then in the journal, i.e. where one of them wrote
-- it; a refused record's text is not written. The arrays are sent in binary.
INSERT INTO {schema}.requests (run_id, seq, text)
SELECT r.run_id, r.seq, r.text
FROM unnest(%(run_ids)b::text[], %(seqs)b::bigint[], %(payloads)b::text[],
            %(macs)b::text[], %(texts)b::text[]) AS r (run_id, seq, payload, mac, text)
WHERE EXISTS (
    SELECT 1 FROM {schema}.events AS e
    WHERE e.run_id = r.run_id AND e.seq = r.seq AND e.payload = r.payload
      AND e.mac IS NOT DISTINCT FROM r.mac
);

-- name: load_requests
SELECT seq, text FROM {schema}.requests WHERE run_id = %s ORDER BY seq;

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

-- name: claim_leases
-- Claims of several runs in one statement and one round trip, sent in autocommit (its own
-- transaction; concurrent claims combined: store/combining.py): each run's row locked (in
-- run id order), its lease taken when the claim rule (store/port.py, check_claimable)
-- lets the owner in: no owner, an expired lease (the server's clock), the same owner
-- again, take_over, or take_from naming the owner found. Per run asked: whether it exists, its owner and expiry as found,
-- the server's clock, and the new token and expiry (NULL: not taken, nothing written;
-- the caller raises LeaseHeld from what was found).
WITH asked AS (
    SELECT *
    FROM unnest(%(run_ids)b::text[], %(owners)b::text[], %(ttls)b::float8[],
                %(take_overs)b::boolean[], %(take_froms)b::text[])
         AS a (run_id, owner, ttl, take_over, take_from)
), found AS (
    SELECT r.run_id, r.owner, r.lease_expires_at,
           extract(epoch FROM clock_timestamp())::float8 AS now
    FROM {schema}.runs AS r
    WHERE r.run_id IN (SELECT asked.run_id FROM asked)
    ORDER BY r.run_id
    FOR UPDATE OF r
), claimed AS (
    UPDATE {schema}.runs AS r
    SET owner = asked.owner, lease_expires_at = found.now + asked.ttl,
        fencing_token = r.fencing_token + 1
    FROM found JOIN asked ON asked.run_id = found.run_id
    WHERE r.run_id = found.run_id
      AND (asked.take_over OR found.owner = asked.take_from OR found.owner IS NULL OR found.lease_expires_at IS NULL
           OR found.lease_expires_at <= found.now OR found.owner = asked.owner)
      AND set_config('synchronous_commit', %(synchronous)s::text, true) IS NOT NULL
    RETURNING r.run_id, r.fencing_token, r.lease_expires_at
)
SELECT asked.run_id, found.run_id IS NOT NULL, found.owner, found.lease_expires_at,
       found.now, claimed.fencing_token, claimed.lease_expires_at
FROM asked
LEFT JOIN found ON found.run_id = asked.run_id
LEFT JOIN claimed ON claimed.run_id = asked.run_id;

-- name: renew_lease
-- Autocommit, one round trip: set_config is its SET LOCAL.
UPDATE {schema}.runs SET lease_expires_at = extract(epoch FROM clock_timestamp())::float8 + %s
WHERE run_id = %s AND owner = %s AND fencing_token = %s
  AND set_config('synchronous_commit', %s::text, true) IS NOT NULL
RETURNING lease_expires_at;

-- name: renew_leases
-- Renewals of several runs' leases in one statement and one round trip (autocommit),
-- each renewed only while its owner and token are current, for its ttl by the server's
-- clock; the rows locked in run id order. Per lease renewed: its run id and new expiry.
WITH asked AS (
    SELECT *
    FROM unnest(%(run_ids)b::text[], %(owners)b::text[], %(tokens)b::bigint[],
                %(ttls)b::float8[])
         AS a (run_id, owner, token, ttl)
), held AS (
    SELECT r.run_id, asked.ttl
    FROM {schema}.runs AS r JOIN asked ON asked.run_id = r.run_id
    WHERE r.owner = asked.owner AND r.fencing_token = asked.token
    ORDER BY r.run_id
    FOR UPDATE OF r
)
UPDATE {schema}.runs AS r
SET lease_expires_at = extract(epoch FROM clock_timestamp())::float8 + held.ttl
FROM held
WHERE r.run_id = held.run_id
  AND set_config('synchronous_commit', %(synchronous)s::text, true) IS NOT NULL
RETURNING r.run_id, r.lease_expires_at;

-- name: release_leases
-- Releases of several runs' leases (each by its owner and token) in one statement and one
-- round trip, autocommit (concurrent releases combined, as claims are); the rows locked
-- in run id order.
WITH asked AS (
    SELECT *
    FROM unnest(%(run_ids)b::text[], %(owners)b::text[], %(tokens)b::bigint[])
         AS a (run_id, owner, token)
), held AS (
    SELECT r.run_id
    FROM {schema}.runs AS r JOIN asked ON asked.run_id = r.run_id
    WHERE r.owner = asked.owner AND r.fencing_token = asked.token
    ORDER BY r.run_id
    FOR UPDATE OF r
)
UPDATE {schema}.runs AS r SET owner = NULL, lease_expires_at = NULL
FROM held
WHERE r.run_id = held.run_id
  AND set_config('synchronous_commit', %(synchronous)s::text, true) IS NOT NULL
RETURNING r.run_id;

-- name: create_runs
-- New runs' rows and their start records in one statement and one round trip
-- (autocommit: its own transaction; concurrent starts combined: store/combining.py),
-- each run's record only with the row this statement inserted (in run id order). Per
-- run asked: whether this statement inserted it, and the row that existed as of the
-- statement's snapshot (none when this statement created it, or when another
-- transaction created it meanwhile: the caller reads it then). A run given a first lease
-- (owner, ttl, token; else NULL, NULL, 0) is created held under it, its expiry by the
-- server's clock, as a claim's.
WITH asked AS (
    SELECT *
    FROM unnest(%(run_ids)b::text[], %(workflows)b::text[], %(versions)b::text[],
                %(states)b::text[], %(reasons)b::text[], %(input_digests)b::text[],
                %(createds)b::float8[], %(updateds)b::float8[], %(seqs)b::bigint[],
                %(types)b::text[], %(keys)b::text[], %(payloads)b::text[],
                %(values)b::text[], %(blobs)b::text[], %(datas)b::text[],
                %(created_ats)b::float8[], %(key_ids)b::text[], %(macs)b::text[],
                %(owners)b::text[], %(ttls)b::float8[], %(tokens)b::bigint[])
         AS a (run_id, workflow, version, status, reason, input_digest, created, updated,
               seq, type, key, payload, value, blob, data, created_at, key_id, mac,
               owner, ttl, token)
), new_runs AS (
    INSERT INTO {schema}.runs
        (run_id, workflow, version, status, reason, input_digest, created_at, updated_at,
         owner, lease_expires_at, fencing_token)
    SELECT run_id, workflow, version, status, reason, input_digest, created, updated,
           owner, extract(epoch FROM clock_timestamp())::float8 + ttl, token
    FROM asked
    WHERE set_config('synchronous_commit', %(synchronous)s::text, true) IS NOT NULL
    ORDER BY run_id
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
), new_blobs AS (
    INSERT INTO {schema}.blobs (digest, data)
    SELECT DISTINCT asked.blob, asked.data
    FROM asked JOIN new_runs ON new_runs.run_id = asked.run_id
    WHERE asked.blob IS NOT NULL
    ON CONFLICT (digest) DO NOTHING
), new_events AS (
    INSERT INTO {schema}.events
        (run_id, seq, type, key, payload, value, blob, created_at, key_id, mac)
    SELECT asked.run_id, asked.seq, asked.type, asked.key, asked.payload, asked.value,
           asked.blob, asked.created_at, asked.key_id, asked.mac
    FROM asked JOIN new_runs ON new_runs.run_id = asked.run_id
)
SELECT asked.run_id, new_runs.run_id IS NOT NULL, r.run_id, r.workflow, r.version, r.status,
       r.reason, r.input_digest, r.created_at, r.updated_at
FROM asked
LEFT JOIN new_runs ON new_runs.run_id = asked.run_id
LEFT JOIN {schema}.runs AS r ON r.run_id = asked.run_id;

-- name: get_runs
SELECT run_id, workflow, version, status, reason, input_digest, created_at, updated_at
FROM {schema}.runs WHERE run_id = ANY(%(run_ids)b::text[]);

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

-- name: append_records
-- append_event (and append_event_releasing) for many runs at once, a record each (the
-- first record of each run in a batch that holds no new intent: store/pg_batch.py), one
-- statement instead of one per record: each row written only if its run's row, locked
-- (in run id order) until the commit, still carries the writer's fencing token (NULL:
-- unfenced) and the record before it is there with the MAC it chained to; a taken seq
-- fails the statement (the batch is undone). With its row, and only with it, go its
-- blob, its run's status change (state NULL: none; a terminal one releases the run's
-- lease too, as set_status does) and the intents it releases (an
-- act's end: release_key; a run's end: release_all). Returns the run ids of the rows
-- written. The arrays are sent in binary (placeholders ending in b, not s): the driver
-- writes their elements as they are, with no escaping (in text, escaping cost as much
-- as the rest of the batch: bench in docs/benchmarks.md).
WITH rec AS (
    SELECT *
    FROM unnest(%(run_ids)b::text[], %(tokens)b::bigint[], %(prev_macs)b::text[],
                %(seqs)b::bigint[], %(types)b::text[], %(keys)b::text[],
                %(payloads)b::text[], %(values)b::text[], %(blobs)b::text[],
                %(created_ats)b::float8[], %(key_ids)b::text[], %(macs)b::text[],
                %(datas)b::text[], %(states)b::text[], %(reasons)b::text[],
                %(nows)b::float8[], %(release_alls)b::boolean[], %(release_keys)b::text[])
         AS e (run_id, token, prev_mac, seq, type, key, payload, value, blob, created_at,
               key_id, mac, data, state, reason, now, release_all, release_key)
), fence AS (
    SELECT r.run_id
    FROM {schema}.runs AS r JOIN rec ON rec.run_id = r.run_id
    WHERE rec.token IS NULL OR r.fencing_token = rec.token
    ORDER BY r.run_id
    FOR UPDATE OF r
), ok AS (
    SELECT rec.*
    FROM rec JOIN fence ON fence.run_id = rec.run_id
    WHERE set_config('synchronous_commit', %(synchronous)s::text, true) IS NOT NULL
      AND EXISTS (SELECT FROM {schema}.events AS p
                  WHERE p.run_id = rec.run_id AND p.seq = rec.seq - 1
                    AND p.mac IS NOT DISTINCT FROM rec.prev_mac)
), new_blobs AS (
    INSERT INTO {schema}.blobs (digest, data)
    SELECT DISTINCT ok.blob, ok.data FROM ok WHERE ok.blob IS NOT NULL
    ON CONFLICT (digest) DO NOTHING
), released AS (
    DELETE FROM {schema}.unresolved_intents AS u USING ok
    WHERE u.run_id = ok.run_id AND (ok.release_all OR u.step_key = ok.release_key)
), new_status AS (
    UPDATE {schema}.runs AS r
    SET status = ok.state, reason = ok.reason, updated_at = ok.now,
        owner = CASE WHEN ok.state IN ('succeeded', 'failed', 'cancelled') THEN NULL
                     ELSE r.owner END,
        lease_expires_at = CASE WHEN ok.state IN ('succeeded', 'failed', 'cancelled')
                                THEN NULL ELSE r.lease_expires_at END
    FROM ok WHERE r.run_id = ok.run_id AND ok.state IS NOT NULL
)
INSERT INTO {schema}.events
    (run_id, seq, type, key, payload, value, blob, created_at, key_id, mac)
SELECT ok.run_id, ok.seq, ok.type, ok.key, ok.payload, ok.value, ok.blob, ok.created_at,
       ok.key_id, ok.mac
FROM ok
RETURNING run_id;

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

-- name: append_event_holding
-- append_event for an act's intent, a new hold in the index of unresolved intents (the
-- batch: store/pg_batch.py), checked and installed in SQL as apply_change does it in
-- Python: written only if the run holds the step already (its own act again), or no
-- other run holds the same digest on the same instance except those its overrides name;
-- else nothing is written (0 rows) and the checked path says who holds it. Sent right
-- after lock_run_intent in the same transaction, so its snapshot sees every hold
-- committed before that lock was granted, and a hold made earlier in the transaction.
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
      AND (EXISTS (SELECT FROM {schema}.unresolved_intents
                   WHERE run_id = %(run_id)s AND step_key = %(key)s::text)
           OR NOT EXISTS (SELECT FROM {schema}.unresolved_intents
                          WHERE intent_digest = %(digest)s::text
                            AND instance = %(instance)s::text
                            AND run_id <> %(run_id)s
                            AND run_id <> ALL(%(overrides)s::text[])))
), new_blob AS (
    INSERT INTO {schema}.blobs (digest, data)
    SELECT %(blob)s::text, %(data)s::text FROM ok WHERE %(blob)s::text IS NOT NULL
    ON CONFLICT (digest) DO NOTHING
), new_hold AS (
    INSERT INTO {schema}.unresolved_intents (run_id, step_key, intent_digest, instance, since)
    SELECT %(run_id)s, %(key)s::text, %(digest)s::text, %(instance)s::text,
           %(created_at)s::float8
    FROM ok
    ON CONFLICT (run_id, step_key) DO NOTHING
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

-- name: lock_run_intent
-- Before append_event_holding, a statement of its own (its snapshot is taken when it
-- starts): the run's row, as the checked path locks it first (journal_end), then the
-- intent digest's lock (lock_intent), both held until the transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended(%(digest)s::text, 0))
FROM (SELECT 1 FROM {schema}.runs WHERE run_id = %(run_id)s::text FOR UPDATE) AS run;

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
  AND (%(since)s::float8 IS NULL OR updated_at >= %(since)s::float8)
  AND (%(until)s::float8 IS NULL OR updated_at < %(until)s::float8)
ORDER BY updated_at DESC, run_id COLLATE "C"
LIMIT %(limit)s OFFSET %(offset)s;

-- name: index_count
SELECT count(*) FROM {schema}.runs
WHERE left(run_id, 11) <> 'crashproof:'
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(search)s::text IS NULL OR strpos(run_id, %(search)s::text) > 0)
  AND (%(since)s::float8 IS NULL OR updated_at >= %(since)s::float8)
  AND (%(until)s::float8 IS NULL OR updated_at < %(until)s::float8);

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

-- name: clock_now
-- The server's clock (store/port.py, Store.now): the time of this statement, not of a
-- transaction.
SELECT extract(epoch FROM clock_timestamp())::float8;
