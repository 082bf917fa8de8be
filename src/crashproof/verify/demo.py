"""``crashproof demo``: the whole story in seconds, on the embedded SQLite default.

1. The naive executor of the seed article under the four durability combinations
   of its patch log and receipts: the divergences.
2. The same 8-step patch scenario on crashproof, killed with a real SIGKILL at every
   crash point the runtime exposes (each side of every journal commit) and inside a
   decision and a step, then resumed in a new process: every run ends with the same
   artifact fingerprint, and no recorded decision is asked again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import crashproof as cp
from crashproof.verify.naive import naive_matrix
from crashproof.verify.patch_scenario import RUN_ID, STEPS, ModelStub, build

__all__ = ["CrashOutcome", "crash_and_resume", "crash_points_of", "run_demo"]


@dataclass(frozen=True, slots=True)
class CrashOutcome:
    spec: str  # at:N or inside:KEY
    point: str  # the crash point's name
    killed: bool  # the child died by SIGKILL
    fingerprint: str
    model_calls: int
    reasked: list[str]  # decision keys asked more than once
    expected_reask: str | None  # the one decision whose answer the crash lost, if any
    rerun: list[str]  # step bodies executed more than once
    expected_rerun: str | None  # the one step whose result the crash lost, if any

    @property
    def same(self) -> bool:
        return (
            self.killed
            and self.reasked == ([self.expected_reask] if self.expected_reask else [])
            and self.rerun == ([self.expected_rerun] if self.expected_rerun else [])
        )


def crash_points_of(workdir: Path) -> tuple[list[str], str, int]:
    """Run the scenario once without faults: its crash points, fingerprint, model calls."""
    points = cp.CrashPoints()
    ledger = cp.Ledger(f"sqlite:///{(workdir / 'reference.db').resolve()}", crash_points=points)
    model = ModelStub(workdir / "reference.calls")
    result = ledger.run(build(ledger, model), run_id=RUN_ID, steps=STEPS)
    ledger.close()
    return points.passed, str(result["fingerprint"]), len(model.calls())


def crash_and_resume(workdir: Path, spec: str, point: str) -> CrashOutcome:
    """Kill a child process at ``spec``, then resume the run in a fresh ledger here."""
    case = Path(tempfile.mkdtemp(prefix="case-", dir=workdir))
    db, calls = case / "ledger.db", case / "model.calls"
    child = subprocess.run(
        [sys.executable, "-m", "crashproof.verify.patch_scenario", str(db), str(calls), spec],
        capture_output=True,
        text=True,
        check=False,
    )
    killed = child.returncode == -signal.SIGKILL
    ledger = cp.Ledger(f"sqlite:///{db.resolve()}")
    model = ModelStub(calls)
    result = ledger.run(build(ledger, model), run_id=RUN_ID, steps=STEPS)
    ledger.close()
    asked, ran = Counter(model.calls()), Counter(model.bodies())
    # The only work a crash may repeat: the call whose result it lost before the commit.
    lost = None
    if point.startswith("before_commit[step_done:"):
        lost = point[len("before_commit[step_done:") : -1]
    elif spec.startswith("inside:"):
        lost = spec[len("inside:") :]
    return CrashOutcome(
        spec=spec,
        point=point,
        killed=killed,
        fingerprint=str(result["fingerprint"]),
        model_calls=sum(asked.values()),
        reasked=sorted(k for k, n in asked.items() if n > 1),
        expected_reask=lost if lost and lost.endswith(":plan") else None,
        rerun=sorted(k for k, n in ran.items() if n > 1),
        expected_rerun=lost if lost and lost.endswith(":apply") else None,
    )


def run_demo(console: Console, *, workdir: Path | None = None) -> int:
    """Print the demo; return 0 when every crashproof crash point ends SAME."""
    started = time.monotonic()
    console.rule("[bold]1. A naive executor: patch log and receipts in separate domains")
    naive = Table("log durable", "receipts durable", "crash after step k = 1..7", "verdict")
    for log_d, rec_d, outcomes in naive_matrix():
        cells = " ".join("[green]S[/]" if ok else "[red]D[/]" for _, ok in outcomes)
        bad = sum(1 for _, ok in outcomes if not ok)
        verdict = "[green]all SAME[/]" if not bad else f"[red]{bad}/7 DIVERGED[/]"
        naive.add_row(str(log_d), str(rec_d), cells, verdict)
    console.print(naive)
    console.print(
        "S = same artifact as an uninterrupted run, D = diverged (a patch applied twice or "
        "lost). Checkpointing the cursor does not save it: the patch and its receipt must "
        "commit together.\n"
    )

    with tempfile.TemporaryDirectory(prefix="crashproof-demo-") as tmp:
        root = workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        points, reference, ref_calls = crash_points_of(root)
        console.rule("[bold]2. crashproof: SIGKILL at every crash point, then resume")
        console.print(
            f"reference run: {STEPS} steps, {ref_calls} model calls, artifact fingerprint\n"
            f"  {reference}\n"
        )
        specs = [(f"at:{n}", name) for n, name in enumerate(points, start=1)]
        specs += [("inside:s3:plan", "inside[s3:plan]"), ("inside:s5:apply", "inside[s5:apply]")]
        table = Table("#", "crash point", "killed", "model calls", "re-asked", "re-run", "outcome")
        diverged = 0
        for n, (spec, point) in enumerate(specs, start=1):
            outcome = crash_and_resume(root, spec, point)
            ok = outcome.same and outcome.fingerprint == reference
            diverged += not ok
            table.add_row(
                str(n),
                escape(point),
                "SIGKILL" if outcome.killed else "[red]no[/]",
                str(outcome.model_calls),
                ", ".join(outcome.reasked) or "-",
                ", ".join(outcome.rerun) or "-",
                "[green]SAME[/]" if ok else "[red]DIVERGED[/]",
            )
        console.print(table)
    elapsed = time.monotonic() - started
    if diverged:
        console.print(f"[red bold]{diverged} crash point(s) DIVERGED[/]")
        return 1
    console.print(
        f"[green bold]all {len(specs)} crash points: SAME[/] — same artifact fingerprint, "
        "no recorded decision asked again (a decision killed before its answer was recorded "
        f"is asked exactly once more). {elapsed:.1f} s."
    )
    return 0
