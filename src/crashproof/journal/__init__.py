"""Pure domain: records, states, canonical JSON and digests, replay matching. No I/O."""
