-- crashproof ledger, the current schema (SQLite) in one file: what a new ledger gets.
-- It must equal every numbered migration applied in order (tests/unit/test_migrations.py);
-- change both together.
CREATE TABLE crashproof_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

CREATE TABLE crashproof_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
) STRICT;

-- The run index: a cache folded from events, never trusted over them.
-- owner: the worker holding the run (NULL: nobody); lease_expires_at: until when, by the
-- local clock (epoch seconds); fencing_token: incremented by every claim, never lowered.
-- retry_at, retries (schema 8): when a worker tries a run stopped for a retryable cause
-- again (NULL: at once), and how many automatic attempts its current outage has had.
CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    workflow         TEXT NOT NULL,
    version          TEXT NOT NULL,
    status           TEXT NOT NULL,
    reason           TEXT,
    input_digest     TEXT NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    owner            TEXT,
    lease_expires_at REAL,
    fencing_token    INTEGER NOT NULL DEFAULT 0,
    run_no           INTEGER,
    retry_at         REAL,
    retries          INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX runs_by_status ON runs (status, created_at);
-- run_no: the run's number, the high half of its records' row ids (events.id).
CREATE UNIQUE INDEX runs_by_no ON runs (run_no);

-- Large recorded values (model responses, results), stored once by SHA-256 (digest, of
-- the full text). data is the full text when base is NULL, else the full text is
-- text(base)[:prefix] + data: a value that extends an earlier one (crashproof.store.deltas).
CREATE TABLE blobs (
    digest TEXT PRIMARY KEY,
    data   TEXT NOT NULL,
    base   TEXT,
    prefix INTEGER
) STRICT, WITHOUT ROWID;

-- The append-only journal. A record's row id is its run's run_no * 2^32 + seq: a run's
-- records sit side by side in one rowid B-tree, an append lands at the end of its run,
-- and the row id is the fence against two writers (one row per run and seq). Every
-- record is sealed by an HMAC chain: key_id names the key (never the key itself); mac
-- covers the record's stored bytes (run_id and seq included) and the previous record's mac.
CREATE TABLE events (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    type       TEXT NOT NULL,
    key        TEXT,
    payload    TEXT NOT NULL,
    value      TEXT,
    blob       TEXT REFERENCES blobs (digest),
    created_at REAL NOT NULL,
    key_id     TEXT,
    mac        TEXT,
    CHECK (seq >= 0 AND seq < 4294967296 AND id - seq = (id >> 32) << 32)
) STRICT;

-- A decision's request, kept beside its record (whose payload holds its SHA-256) and
-- read only to show it: record is the record's row id (events.id); the text in parts
-- of at most 1,000 characters, in rowid order (packed four to a page). Schema 9.
CREATE TABLE requests (
    record INTEGER NOT NULL,
    text   TEXT NOT NULL
) STRICT;
CREATE INDEX requests_by_record ON requests (record);

-- The index of unresolved act intents across runs (crashproof.store.intents): one row
-- per act whose intent is journaled and has no final record yet; a cache of the journals.
CREATE TABLE unresolved_intents (
    run_id        TEXT NOT NULL,
    step_key      TEXT NOT NULL,
    intent_digest TEXT NOT NULL,
    instance      TEXT NOT NULL DEFAULT '',
    since         REAL NOT NULL,
    PRIMARY KEY (run_id, step_key)
) STRICT, WITHOUT ROWID;
CREATE INDEX unresolved_intents_by_digest ON unresolved_intents (intent_digest, instance);
