-- crashproof ledger, schema 7 (SQLite): large values stored as text deltas
-- (crashproof.store.deltas). A blob row's digest stays the SHA-256 of the full text; its
-- data is the full text when base is NULL (every row written before schema 7), else
-- only the tail, and the full text is text(base)[:prefix] + data (prefix in characters).
-- Readers resolve it in the query, before any MAC is checked over the text. An older
-- crashproof would read a tail as the value, so this number makes it refuse the ledger.
ALTER TABLE blobs ADD COLUMN base TEXT;
ALTER TABLE blobs ADD COLUMN prefix INTEGER;
