-- crashproof ledger, the current schema (PostgreSQL) in one file: what a new ledger gets.
-- It must equal every numbered migration applied in order (tests/integration/
-- test_postgres_migrations.py); change both together.
-- Runs with search_path set to the ledger's schema ("crashproof" by default), so the
-- ledger can share a database with an application without touching its tables.
--
-- JSON (payload, value, blob data, reason) is kept as `text`, not `jsonb`: the journal
-- must give back the very bytes it was given (key order, number spelling, duplicate
-- keys), and jsonb normalises all of these and refuses the \u0000 escape outright.
CREATE TABLE crashproof_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE crashproof_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at double precision NOT NULL
);

-- The run index: a cache folded from events, never trusted over them.
-- `reason` is a JSON string: text columns cannot hold NUL, JSON can escape it.
CREATE TABLE runs (
    run_id       text PRIMARY KEY,
    workflow     text NOT NULL,
    version      text NOT NULL,
    status       text NOT NULL,
    reason       text,
    input_digest text NOT NULL,
    created_at   double precision NOT NULL,
    updated_at   double precision NOT NULL,
    -- leases (schema 2): the worker holding the run, until when (the server's clock), and
    -- the fencing token checked by every fenced journal commit.
    owner            text,
    lease_expires_at double precision,
    fencing_token    bigint NOT NULL DEFAULT 0,
    -- retry schedule (schema 5): when a worker tries a run stopped for a retryable cause
    -- again (the server's clock; NULL: at once), and the automatic attempts of its outage.
    retry_at         double precision,
    retries          integer NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_status ON runs (status, created_at);

-- Large recorded values (model responses, results), stored once by SHA-256.
CREATE TABLE blobs (
    digest text PRIMARY KEY,
    data   text NOT NULL
);

-- The append-only journal. (run_id, seq) is the fence against two writers.
-- key_id names the key that sealed a record (never the key itself); mac is its HMAC over
-- the record's stored bytes and the previous record's mac (as SQLite's schema 2); both
-- are NULL when the ledger is used without a sealer.
CREATE TABLE events (
    run_id     text NOT NULL,
    seq        bigint NOT NULL,
    type       text NOT NULL,
    key        text,
    payload    text NOT NULL,
    value      text,
    blob       text REFERENCES blobs (digest),
    created_at double precision NOT NULL,
    key_id     text,
    mac        text,
    PRIMARY KEY (run_id, seq)
);

-- A decision's request, kept beside its record (whose payload holds its SHA-256) and
-- read only to show it (schema 6).
CREATE TABLE requests (
    run_id text NOT NULL,
    seq    bigint NOT NULL,
    text   text NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- The index of unresolved act intents across runs (schema 4, crashproof.store.intents):
-- one row per act whose intent is journaled and has no final record yet; a cache.
CREATE TABLE unresolved_intents (
    run_id        text NOT NULL,
    step_key      text NOT NULL,
    intent_digest text NOT NULL,
    instance      text NOT NULL DEFAULT '',
    since         double precision NOT NULL,
    PRIMARY KEY (run_id, step_key)
);
CREATE INDEX unresolved_intents_by_digest ON unresolved_intents (intent_digest, instance);
