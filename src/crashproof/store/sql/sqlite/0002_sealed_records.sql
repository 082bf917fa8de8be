-- crashproof ledger, schema 2 (SQLite): every journal record sealed by an HMAC chain.
-- key_id names the key (never the key itself); mac covers the record's stored bytes and
-- the previous record's mac. NULL only in ledgers written before schema 2.
ALTER TABLE events ADD COLUMN key_id TEXT;
ALTER TABLE events ADD COLUMN mac TEXT;
