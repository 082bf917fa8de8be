"""The naive executor from the seed article: a patch log and a receipt set that live in
separate persistence domains, with a cursor checkpointed every few steps.

It reproduces the three failures crashproof exists to prevent: a patch applied twice,
a patch lost, a resumed run that ends with different artifacts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["CHECKPOINT_EVERY", "STEPS", "NaiveBox", "fingerprint", "naive_matrix"]

STEPS = [{"id": f"s{k}", "hunk": f"+line-{k}"} for k in range(8)]
CHECKPOINT_EVERY = 3


@dataclass
class NaiveBox:
    """An executor whose patch log and receipts may or may not survive a crash."""

    log_durable: bool
    receipts_durable: bool
    log: list[str] = field(default_factory=list)
    receipts: set[str] = field(default_factory=set)
    cursor: int = 0

    def apply(self, step: dict[str, str]) -> None:
        if step["id"] in self.receipts:  # the idempotency check
            return
        self.log.append(step["hunk"])
        self.receipts.add(step["id"])
        self.cursor += 1

    def crash(self) -> NaiveBox:
        """What a restart finds: durable parts kept, the cursor from the last checkpoint."""
        return NaiveBox(
            self.log_durable,
            self.receipts_durable,
            log=list(self.log) if self.log_durable else [],
            receipts=set(self.receipts) if self.receipts_durable else set(),
            cursor=(
                self.cursor
                if self.receipts_durable
                else (self.cursor // CHECKPOINT_EVERY) * CHECKPOINT_EVERY
            ),
        )

    def run(self) -> None:
        for step in STEPS[self.cursor :]:
            self.apply(step)


def fingerprint(log: list[str]) -> str:
    """SHA-256 over the patch log, all 64 hex digits."""
    return hashlib.sha256("\n".join(log).encode()).hexdigest()


def naive_matrix() -> list[tuple[bool, bool, list[tuple[int, bool]]]]:
    """For each durability combination, crash after k steps (k = 1..7), restart, and
    report whether the final log equals the uninterrupted one."""
    reference = NaiveBox(True, True)
    reference.run()
    ref = fingerprint(reference.log)
    rows = []
    for log_durable in (True, False):
        for receipts_durable in (True, False):
            outcomes = []
            for k in range(1, len(STEPS)):
                box = NaiveBox(log_durable, receipts_durable)
                for step in STEPS[:k]:
                    box.apply(step)
                resumed = box.crash()
                resumed.run()
                outcomes.append((k, fingerprint(resumed.log) == ref))
            rows.append((log_durable, receipts_durable, outcomes))
    return rows
