-- crashproof ledger, schema 6 (SQLite): the index of unresolved act intents across runs
-- (crashproof.store.intents). One row per act of a run whose intent is journaled and
-- has no final record yet (in flight, unknown, frozen): a new run's act with the same
-- intent digest on the same instance is refused while it is there. A cache folded from
-- the journals, like the run index, and filled from them here.
CREATE TABLE unresolved_intents (
    run_id        TEXT NOT NULL,
    step_key      TEXT NOT NULL,
    intent_digest TEXT NOT NULL,
    instance      TEXT NOT NULL DEFAULT '',
    since         REAL NOT NULL,
    PRIMARY KEY (run_id, step_key)
) STRICT, WITHOUT ROWID;
CREATE INDEX unresolved_intents_by_digest ON unresolved_intents (intent_digest, instance);
-- fill: unresolved_intents
INSERT INTO unresolved_intents (run_id, step_key, intent_digest, instance, since)
SELECT e.run_id, e.key,
       -- hold_digest (a first intent's: no tool version) where there is one
       coalesce(max(json_extract(e.payload, '$.hold_digest')),
                max(coalesce(json_extract(e.payload, '$.intent_digest'),
                             json_extract(e.payload, '$.digest'), ''))),
       coalesce(max(json_extract(e.payload, '$.observed.before.instance')), ''),
       min(e.created_at)
FROM events AS e
WHERE e.type = 'act_intent' AND e.key IS NOT NULL AND json_valid(e.payload)
  AND NOT EXISTS (SELECT 1 FROM events AS d
                  WHERE d.run_id = e.run_id AND d.key = e.key AND d.type = 'step_done'
                    AND d.seq > e.seq)
  AND NOT EXISTS (SELECT 1 FROM events AS t
                  WHERE t.run_id = e.run_id
                    AND t.type IN ('run_succeeded', 'run_failed'))
GROUP BY e.run_id, e.key;
