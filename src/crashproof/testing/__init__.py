"""Crash-proofing in your own test suite.

::

    from crashproof.testing import assert_recovery_equivalent

    def test_agent_recovers() -> None:
        assert_recovery_equivalent(SCENARIO)           # every crash point, seed 0

or, with the pytest plugin crashproof installs (entry point ``crashproof``), the
``crashproof_verify`` fixture, which is the same function. A failure raises AssertionError
whose message holds the whole crash matrix, the seed and the command that replays it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashproof.verify.render import report_text
from crashproof.verify.report import Report
from crashproof.verify.runner import verify
from crashproof.verify.scenario import Scenario
from crashproof.verify.trial_kit import Mode

__all__ = ["assert_recovery_equivalent"]


def assert_recovery_equivalent(
    scenario: Scenario[Any] | str,
    mode: Mode = "inproc",
    seed: int = 0,
    max_points: int | None = None,
    *,
    recovery_points: int = 3,
    refused_ok: bool = True,
    target: str | None = None,
    workdir: Path | None = None,
) -> Report:
    """Verify ``scenario`` (see ``crashproof.verify.verify``) and raise AssertionError, with
    the rendered crash matrix, when a case DIVERGED (or, with ``refused_ok=False``, when a
    case was REFUSED). Returns the report otherwise."""
    report = verify(
        scenario,
        mode,
        seed,
        max_points,
        recovery_points=recovery_points,
        target=target,
        workdir=workdir,
    )
    bad = report.diverged + ([] if refused_ok else report.refused)
    if bad:
        what = ", ".join(f"{len(v)} {k}" for k, v in _by_verdict(bad).items())
        raise AssertionError(
            f"recovery of scenario {report.scenario!r} is not equivalent: {what} "
            f"(seed {report.seed}; replay with `{report.repro()}`)\n\n{report_text(report)}"
        )
    return report


def _by_verdict(results: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in results:
        out.setdefault(r.verdict.value, []).append(r)
    return out
