-- crashproof ledger, schema 6 (PostgreSQL): a model call's request kept beside its
-- record. A decision's step_done record holds the SHA-256 of its request's text
-- (request_sha256, under the record's MAC); the text is here, written in the record's
-- transaction. Read only to show a request (Store.load_requests), never by a resume: its
-- bytes stay out of the verified journal.
CREATE TABLE requests (
    run_id text NOT NULL,
    seq    bigint NOT NULL,
    text   text NOT NULL,
    PRIMARY KEY (run_id, seq)
);
