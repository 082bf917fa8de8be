"""cp.Shell under wall-clock kills (#44): a real command (a 500-file codemod, a
``pip install --target`` of a local wheel, a ``git commit`` + ``git gc``) SIGKILLed with
its run at random moments, the recovery too in some trials; every trial must end with the
uninterrupted run's workspace fingerprint and the command's effect landed once.

``make test`` runs a seeded trial or two per command (``SHELL_KILLS``, default 1);
``make chaos`` runs a long campaign."""

from __future__ import annotations

import os

import pytest

from crashproof.verify import Verdict, verify

pytestmark = pytest.mark.timeout(900)

TRIALS = int(os.environ.get("SHELL_KILLS", "1"))
SEED = int(os.environ.get("SHELL_SEED", "3"))


@pytest.mark.parametrize("scenario", ["CODEMOD_SCENARIO", "PIP_SCENARIO", "GIT_SCENARIO"])
def test_a_killed_command_lands_once(scenario: str) -> None:
    report = verify(f"shell_scenarios:{scenario}", mode="chaos", trials=TRIALS, seed=SEED)
    assert report.ok, [r.reason for r in report.results if r.verdict is not Verdict.SAME]
    counts = report.chaos_counts()
    assert counts["trials"] == TRIALS
    assert (counts["duplicated"], counts["lost"], counts["diverged"]) == (0, 0, 0)
