"""SIGKILL of a real child running a fan-out of lookup-less acts, one run each, at once
(threads, or one loop with batched commits: child_unavailable_group.py), while one act of
the group stops ``cp.Unavailable`` and another is in flight, completed, or killed
mid-effect, and a fourth, once the first stopped, acts on the same intent (the stop
released its hold). After each kill the parent resumes the whole group, and per
DESIGN.md §11:

- no effect twice (invariant 2), none without its intent in the journal;
- an act the journal proves not done (the stop after its last attempt, ``none_done``)
  is sent again and completes, never frozen for review, whatever the others were doing;
- an act in doubt (an intent, no receipt, no such stop) is settled as its tool's
  ``on_unknown`` says, the tool being unable to look it up: ``review`` freezes its run,
  ``at_most_once`` records it not done, ``at_least_once`` sends it again (the one
  declared repeat);
- an act completed replays;
- of the two acts on one intent, one at a time: while one is unresolved the other waits,
  stopped retryable (``cp.IntentHeld`` refused its intent: ``unavailable:<key>: waiting
  for another run``), sending nothing; it goes on once the first is resolved, and keeps
  waiting while the first waits for a person.

What each act was when the child died is read from the journal the kill left, and some
points pin it (a kill after a's stop committed: a proven not done; in c's execute: c in
doubt; before c's receipt: c posted, in doubt)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.steps.holds import waits_for_holder

sys.path.insert(0, str(Path(__file__).parent))
import child_unavailable_group as child

CHILD = Path(__file__).parent / "child_unavailable_group.py"
POINTS = [
    "before_commit[act_intent:post-a]",
    "after_commit[act_intent:post-a]",
    "before_commit[run_stopped:post-a]",
    "after_commit[run_stopped:post-a]",
    "before_commit[act_intent:post-c]",
    "after_commit[act_intent:post-c]",
    "in-execute:c",
    "before_commit[step_done:post-c]",
    "after_commit[step_done:post-c]",
    "before_commit[step_done:post-b]",
    "after_commit[step_done:post-b]",
    "after_commit[act_intent:post-d]",
    "before_commit[step_done:post-d]",
    "after_commit[step_done:post-d]",
    "none",
]
# What the kill leaves for sure at some points (else read from the journal alone).
PINNED: dict[str, dict[str, str]] = {
    "after_commit[run_stopped:post-a]": {"a": "not done", "b": "done"},
    "in-execute:c": {"a": "not done", "b": "done", "c": "in doubt"},
    "before_commit[step_done:post-c]": {"a": "not done", "b": "done", "c": "in doubt"},
    "after_commit[step_done:post-c]": {"a": "not done", "b": "done", "c": "done"},
    "before_commit[run_stopped:post-a]": {"a": "in doubt", "b": "done", "d": "new"},
    "after_commit[act_intent:post-d]": {"a": "not done", "d": "in doubt"},
    "before_commit[step_done:post-d]": {"a": "not done", "d": "in doubt"},
    "after_commit[step_done:post-d]": {"a": "not done", "d": "done"},
    "none": {"a": "not done", "b": "done", "c": "done", "d": "done"},
}
PARTNER = {"a": "d", "d": "a"}  # the two acts on one intent


def left(ledger: cp.Ledger, run_id: str) -> str:
    """What the journal says of the run's act: new, done, not done or in doubt."""
    key = f"post-{run_id}"
    try:
        events = [e for e in ledger.journal(run_id) if e.key == key]
    except cp.CrashproofError:  # the kill came before the run's first record
        return "new"
    intents = [e for e in events if e.type is EventType.ACT_INTENT]
    if any(e.type is EventType.STEP_DONE for e in events):
        return "done"
    if not intents:
        return "new"
    # Not done: the last record is the runtime's stop naming the last attempt, which the
    # tool said was out (as were the earlier ones: every attempt of this tool is).
    last, stop = intents[-1].payload, events[-1]
    out = stop.payload.get("evidence", {}).get("unavailable", {})
    if stop.type is EventType.RUN_STOPPED and (out.get("operation_id"), out.get("attempt")) == (
        last["operation_id"],
        last["attempt"],
    ):
        return "not done"
    return "in doubt"


def posted(directory: Path) -> list[str]:
    path = directory / "posted.txt"
    return sorted(path.read_text().splitlines()) if path.exists() else []


@pytest.mark.parametrize("on_unknown", [m.value for m in cp.OnUnknown])
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_kill_anywhere_in_the_group_sends_only_what_the_journal_shows_not_done(
    tmp_path: Path, shell: str, point: str, on_unknown: str
) -> None:
    db = tmp_path / "l.db"
    done = subprocess.run(
        [sys.executable, str(CHILD), str(db), str(tmp_path), shell, point, on_unknown],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == (0 if point == "none" else -9), done.stderr[-2000:]
    before = posted(tmp_path)
    (tmp_path / "lock-a").unlink()  # a's target is back
    with cp.Ledger(f"sqlite:///{db}") as ledger:
        states = {r: left(ledger, r) for r in child.RUNS}
        intents = {
            e.payload["operation_id"]
            for r in child.RUNS
            if states[r] != "new"
            for e in ledger.journal(r)
            if e.type is EventType.ACT_INTENT
        }
        # No effect without its intent; none twice.
        assert {line.split()[0] for line in before} <= intents, (states, before)
        assert len(set(before)) == len(before)
        for run_id, state in PINNED.get(point, {}).items():
            assert states[run_id] == state, (point, states)
        tool = child.Post(db, tmp_path, on_unknown)
        child.MODE["point"] = "resumed"
        got = child.drive_all(ledger, tool, shell)
        for run_id, result in got.items():  # refused: nothing sent
            if isinstance(result, cp.RunStopped) and waits_for_holder(result.reason):
                assert run_id in PARTNER, (run_id, result)
                assert f"run {PARTNER[run_id]!r} holds the same intent" in str(result)
                assert mine(posted(tmp_path), run_id) == mine(before, run_id)
        got = child.drive_all(ledger, tool, shell)  # the refused go on once it is resolved
        after = {r: ledger.get_run(r) for r in child.RUNS}
    lines = posted(tmp_path)
    for run_id, state in states.items():
        text, had = child.TEXTS[run_id], mine(before, run_id)
        partner = PARTNER.get(run_id)
        if (
            partner is not None
            and state in ("new", "not done")
            and states[partner] == "in doubt"
            and on_unknown == "review"
        ):  # the partner waits for a person, holding the intent: this one waits too
            assert isinstance(got[run_id], cp.RunStopped), (run_id, got[run_id])
            assert waits_for_holder(got[run_id].reason)
            assert after[run_id].status is cp.RunStatus.STOPPED  # a worker tries it again
            assert mine(lines, run_id) == had == []
            continue
        if state == "in doubt" and on_unknown == "review":  # not sent: a person decides
            assert isinstance(got[run_id], cp.RunFrozen), (run_id, got[run_id])
            assert "cannot look it up" in str(got[run_id])
            assert after[run_id].status is cp.RunStatus.NEEDS_REVIEW
            assert mine(lines, run_id) == had
            continue
        if state == "in doubt" and on_unknown == "at_most_once":  # never sent again
            assert got[run_id] == {"not_done": text}, (run_id, got[run_id])
            assert mine(lines, run_id) == had
            continue
        line = f"{run_id}/post-{run_id} {text}"
        if state == "in doubt":  # at_least_once: sent again, the declared repeat
            assert got[run_id] == {"posted": text}, (run_id, got[run_id])
            assert mine(lines, run_id) == [*had, line]
            continue
        # done: replayed; not done or new: sent once, never a question for a person.
        assert got[run_id] == {"posted": text}, (run_id, state, got[run_id])
        assert after[run_id].status is cp.RunStatus.SUCCEEDED
        assert mine(lines, run_id) == [line]


def mine(lines: list[str], run_id: str) -> list[str]:
    return [line for line in lines if line.startswith(f"{run_id}/")]
