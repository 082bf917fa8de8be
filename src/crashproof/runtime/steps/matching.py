"""Replay's match: a call meets the recorded step at its place in the journal, and must be
the same call (same key, same kind, same arguments digest; a ``patched`` marker matches
only ``ctx.patched``). What a mismatch says is built here, the freeze is the caller's."""

from __future__ import annotations

import time
from typing import Any

from crashproof.journal import payloads
from crashproof.journal.codec import NO_ARGS_DIGEST
from crashproof.journal.records import Event, StepKind, StepStatus

__all__ = ["mismatch", "patch_marker"]


def mismatch(
    recorded: Event, key: str, kind: StepKind, digest: str
) -> tuple[str, dict[str, Any]] | None:
    """None when the call ``key`` (``kind``, ``digest``) is the recorded one; else the
    reason and evidence of a non-determinism freeze."""
    payload = payloads.step_done(recorded)
    if (
        recorded.key == key
        and payload["kind"] == kind.value
        and payload["digest"] == digest
        and payload["kind"] != StepKind.PATCHED
    ):
        return None
    expected = {"key": recorded.key, "kind": payload["kind"], "digest": payload["digest"]}
    actual = {"key": key, "kind": kind.value, "digest": digest}
    what = "arguments differ" if recorded.key == key else "another call"
    return (
        f"non-determinism at {key!r}: the journal holds {payload['kind']} "
        f"{recorded.key!r} here, the code now makes {kind} {key!r} ({what})",
        {"expected": expected, "actual": actual, "seq": recorded.seq},
    )


def patch_marker() -> dict[str, Any]:
    """The ``step_done`` payload ``ctx.patched`` records where new code first passes."""
    now = time.time()
    return payloads.as_dict(
        payloads.StepDone(
            kind=StepKind.PATCHED.value,
            digest=NO_ARGS_DIGEST,
            status=StepStatus.SUCCEEDED.value,
            attempt=1,
            started_at=now,
            ended_at=now,
        )
    )
