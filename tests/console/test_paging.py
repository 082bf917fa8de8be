"""A run's page folds only its own steps (browse.steps_page) and the header without
them (fold_run(steps=False)): both must equal what the full fold of the journal shows,
for every run of the console's world (decisions, acts with an unknown outcome and a
receipt conflict, an undelivered outbox message, frozen and stopped runs), at every page
size and offset."""

from __future__ import annotations

from dataclasses import replace

from console.conftest import World
from crashproof.journal.fold import fold_run
from crashproof.runtime.operations.attention import attention
from crashproof.runtime.operations.browse import _acts, steps_page
from crashproof.runtime.operations.folds import Folds


def test_pages_of_steps_equal_the_full_fold(world: World) -> None:
    ledger = world.ledger
    runs = ledger.store.list_runs()
    assert {r.run_id for r in runs} >= {"greet-1", "notify-1", "cleanup-1", "forge-1"}
    kinds: set[str] = set()
    for row in runs:
        events = ledger.journal(row.run_id)
        full = fold_run(row, events)
        assert full.steps, row.run_id
        kinds.update(s.kind.value for s in full.steps)
        for size in (1, 2, 3, 100):
            folds = Folds()  # a new console: nothing kept
            paged = []
            for offset in range(0, len(full.steps) + size, size):
                page = steps_page(ledger, folds, row.run_id, offset=offset, limit=size)
                assert page.total == len(full.steps)
                assert page.info == replace(full, steps=()), row.run_id
                expected = full.steps[offset : offset + size]
                assert page.steps == expected, (row.run_id, size, offset)
                acts = {s.key for s in expected if s.kind.value == "act"}
                assert page.acts == _acts(events, acts)
                paged.extend(page.steps)
            assert tuple(paged) == full.steps
    assert {"step", "decide", "act"} <= kinds
    statuses = {fold_run(r, ledger.journal(r.run_id)).status.value for r in runs}
    assert {"succeeded", "awaiting_approval", "needs_review"} <= statuses
    steps = [s for r in runs for s in fold_run(r, ledger.journal(r.run_id)).steps]
    assert any(s.delivery == "pending" for s in steps)  # the undelivered message


def test_the_outbox_count_reads_only_runs_with_messages(world: World) -> None:
    """The attention count of undelivered messages equals the full folds' (the index
    names the runs with a message; a run without one is never folded for it)."""
    ledger = world.ledger
    folds = Folds()
    assert attention(ledger, folds).counts["outbox"] == 1
    assert set(folds._folds) <= {"notify-1"}  # no other journal folded for the count
    assert set(folds._clean) >= {"greet-1", "cleanup-1"}
    assert attention(ledger, folds).counts["outbox"] == 1  # again: nothing read again
    world.flags["chat_down"] = False
    assert ledger.dispatch_outbox([world.outbox]) == 1
    assert attention(ledger, folds).counts["outbox"] == 0
