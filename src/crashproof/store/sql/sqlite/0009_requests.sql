-- crashproof ledger, schema 9 (SQLite): a model call's request kept beside its record.
-- A decision's step_done record holds the SHA-256 of its request's text (request_sha256,
-- under the record's MAC); the text is here, written in the record's transaction, under
-- the record's row id (events.id: run_no * 2^32 + seq), in parts of at most 1,000
-- characters in rowid order: a ~2 KB row took a 4 KB page of its own (one fits a page),
-- parts pack four to a page (6.2 -> 3.7 KB on disk per turn, bench/transcript.py). Read
-- only to show a request (Store.load_requests), never by a resume.
CREATE TABLE requests (
    record INTEGER NOT NULL,
    text   TEXT NOT NULL
) STRICT;
CREATE INDEX requests_by_record ON requests (record);
