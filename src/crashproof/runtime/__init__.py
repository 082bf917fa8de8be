"""The runtime: Ledger, Context, replay and recording."""
