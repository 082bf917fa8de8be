-- crashproof ledger, schema 9 (SQLite): a model call's request kept beside its record.
-- A decision's step_done record holds the SHA-256 of its request's text (request_sha256,
-- under the record's MAC); the text is here, written in the record's transaction, keyed
-- by the record's row id (events.id: run_no * 2^32 + seq). Read only to show a request
-- (Store.load_requests), never by a resume: its bytes stay out of the verified journal.
CREATE TABLE requests (
    id   INTEGER PRIMARY KEY,
    text TEXT NOT NULL
) STRICT;
