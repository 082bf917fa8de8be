"""Integrity: keys, the HMAC-chained journal, and the generation witness (anti-rollback)."""
