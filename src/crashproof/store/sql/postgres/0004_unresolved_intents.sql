-- crashproof ledger, schema 4 (PostgreSQL): the index of unresolved act intents across
-- runs (crashproof.store.intents). One row per act of a run whose intent is journaled and
-- has no final record yet (in flight, unknown, frozen): a new run's act with the same
-- intent digest on the same instance is refused while it is there. A cache folded from
-- the journals, like the run index, and filled from them here.
CREATE TABLE unresolved_intents (
    run_id        text NOT NULL,
    step_key      text NOT NULL,
    intent_digest text NOT NULL,
    instance      text NOT NULL DEFAULT '',
    since         double precision NOT NULL,
    PRIMARY KEY (run_id, step_key)
);
CREATE INDEX unresolved_intents_by_digest ON unresolved_intents (intent_digest, instance);
-- fill: unresolved_intents
INSERT INTO unresolved_intents (run_id, step_key, intent_digest, instance, since)
SELECT e.run_id, e.key,
       -- hold_digest (a first intent's: no tool version) where there is one
       coalesce(max(e.payload::json ->> 'hold_digest'),
                max(coalesce(e.payload::json ->> 'intent_digest', e.payload::json ->> 'digest', ''))),
       coalesce(max(e.payload::json -> 'observed' -> 'before' ->> 'instance'), ''),
       min(e.created_at)
FROM events AS e
WHERE e.type = 'act_intent' AND e.key IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM events AS d
                  WHERE d.run_id = e.run_id AND d.key = e.key AND d.type = 'step_done'
                    AND d.seq > e.seq)
  AND NOT EXISTS (SELECT 1 FROM events AS t
                  WHERE t.run_id = e.run_id
                    AND t.type IN ('run_succeeded', 'run_failed'))
GROUP BY e.run_id, e.key;
