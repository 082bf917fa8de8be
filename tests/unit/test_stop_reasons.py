"""How a service's message is cut into a stop reason (runtime/steps/outage.py, with
crashproof/_excerpt.py's ``shown``): one line, its start and its end kept around " … ",
bounded; the whole in the evidence. A tool's detail is cut the same way, smaller."""

from __future__ import annotations

from typing import Any

import pytest

import crashproof as cp
from crashproof._excerpt import DETAIL, shown

BOUND = 563  # 200 characters of the start, " … ", 360 of the end


def test_a_short_message_is_kept_as_it_is() -> None:
    assert shown("503 from the model") == "503 from the model"
    exact = "x" * BOUND
    assert shown(exact) == exact  # at the bound: nothing cut


def test_whitespace_is_collapsed_to_one_line() -> None:
    assert shown("  429\n\ttoo  many\r\nrequests \x0b") == "429 too many requests"
    assert shown(" \n\t") == ""
    long = "a\n" * 400 + "why:\n\n  disk full\n"
    said = shown(long)
    assert "\n" not in said
    assert said.endswith("a a why: disk full")


def test_a_long_message_keeps_what_failed_and_why() -> None:
    """The store path in the middle goes, the start (what failed) and the end (the
    errno text, after the path) stay."""
    path = "/srv/" + "deep/" * 200 + "store"
    message = (
        "cp.Shell's snapshot store failed before the command started, nothing ran in this "
        f"attempt; free or repair it, then resume (store {path}; OSError: [Errno 28] No "
        f"space left on device: '{path[:250]}')"
    )
    said = shown(message)
    assert said.startswith("cp.Shell's snapshot store failed before the command started, ")
    assert "nothing ran in this attempt; free or repair it" in said
    assert said.endswith(f"OSError: [Errno 28] No space left on device: '{path[:250]}')")
    assert " … " in said
    assert len(said) <= BOUND


def test_a_huge_message_stays_bounded() -> None:
    assert len(shown("x" * (BOUND + 1))) == BOUND  # one over: cut
    for size in (400, 10_000, 1_000_000):
        said = shown("h" * size + " " + "t" * size)
        assert said == "h" * 200 + " … " + "t" * 360


def test_a_tool_s_detail_keeps_its_start_and_its_end_within_its_own_bound() -> None:
    """git's stderr (the why after a long path), an OSError (the errno text before it)."""
    path = "/srv/" + "deep/" * 100 + ".git/index.lock"
    git = f"git add exited 128: fatal: Unable to create '{path}': File exists."
    said = shown(git, DETAIL)
    assert said.startswith("git add exited 128: fatal: Unable to create '/srv/deep/")
    assert said.endswith(".git/index.lock': File exists.")
    assert len(said) == DETAIL
    errno = f"[Errno 20] Not a directory: '{path}'"
    assert shown(errno, DETAIL).startswith("[Errno 20] Not a directory: '/srv/deep/")
    assert shown("x" * 400, 5) == "x … x"  # even a tiny bound keeps both ends
    assert shown("x" * 400, 1) == "x … x"


def test_a_tool_s_detail_keeps_both_its_ends_in_a_reason_that_embeds_it() -> None:
    """A tool's message puts its bounded detail last, after its own long path (a store's,
    a repository's): the reason's end holds the whole detail, the errno text before its
    path included (a detail cut only to the reason's bound lost it)."""
    path = "/srv/" + "deep/" * 100 + "store"
    detail = shown(f"NotADirectoryError: [Errno 20] Not a directory: '{path}/objects'", DETAIL)
    message = f"cp.Shell's snapshot store failed (store {path}; {detail})"
    said = shown(message)
    assert said.startswith("cp.Shell's snapshot store failed (store /srv/deep/")
    assert said.endswith(f"; {detail})")
    assert "NotADirectoryError: [Errno 20] Not a directory: '/srv/deep/" in said
    assert len(said) <= BOUND


def test_the_run_stops_with_the_end_of_a_long_message_and_keeps_all_of_it() -> None:
    """A real run: the reason a person reads holds the error after the long path, the
    stop's evidence the whole message."""
    message = "service out at " + "/x" * 400 + ": connection refused (errno 111)"
    with cp.Ledger("memory://") as ledger:

        @ledger.workflow("out", version="1")
        def out(ctx: cp.Context) -> Any:
            return ctx.step("call", _raises, message)

        with pytest.raises(cp.RunStopped) as stopped:
            ledger.run(out, run_id="r")
        info = ledger.get_run("r")
        evidence = info.evidence or {}
    reason = stopped.value.reason
    assert reason == info.reason
    assert reason.startswith("unavailable:call: service out at /x/x")
    assert reason.endswith(": connection refused (errno 111)")
    assert len(reason) <= len("unavailable:call: ") + BOUND
    assert evidence["unavailable"]["error"]["message"] == message


def _raises(message: str) -> Any:
    raise cp.Unavailable(message)
