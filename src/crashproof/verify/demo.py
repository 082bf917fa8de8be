"""``crashproof demo``: the whole story in seconds, on the embedded SQLite default.

1. The naive executor of the seed article under the four durability combinations
   of its patch log and receipts: the divergences.
2. The same 8-step patch task on crashproof (``crashproof.verify.patch_scenario``: each step
   asks a model, then appends its line to a real file through a ``Workspace``), verified
   by ``crashproof.verify``: a child process killed by SIGKILL at every crash point the
   runtime exposes, then resumed in a new process; every run ends with the reference's
   artifact fingerprint, one effect per step, and no recorded decision asked again.
3. A crash during the recovery of every crash point that leaves a workspace write in
   flight (in-process, for speed), and the finished run delivered a second time.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from crashproof.verify.naive import naive_matrix
from crashproof.verify.patch_scenario import PATCH_TASK, STEPS
from crashproof.verify.progress import ProgressLine
from crashproof.verify.render import matrix_table, summary_line
from crashproof.verify.report import Case, CaseKind, CaseResult, Reference, Verdict
from crashproof.verify.runner import recovery_candidates, verify
from crashproof.verify.trials import run_case

__all__ = ["run_demo"]

TARGET = "crashproof.verify.patch_scenario:PATCH_TASK"


def _naive(console: Console) -> tuple[int, int]:
    """Print the naive executor's matrix; return (crashes that diverged, crashes)."""
    console.rule("[bold]1. A naive executor: patch log and receipts in separate domains")
    naive = Table("log durable", "receipts durable", "crash after step k = 1..7", "verdict")
    diverged = crashes = 0
    for log_d, rec_d, outcomes in naive_matrix():
        cells = " ".join("[green]S[/]" if ok else "[red]D[/]" for _, ok in outcomes)
        bad = sum(1 for _, ok in outcomes if not ok)
        diverged, crashes = diverged + bad, crashes + len(outcomes)
        verdict = "[green]all SAME[/]" if not bad else f"[red]{bad}/7 DIVERGED[/]"
        naive.add_row(str(log_d), str(rec_d), cells, verdict)
    console.print(naive)
    console.print(
        "S = same artifact as an uninterrupted run, D = diverged (a patch applied twice or "
        "lost). Even with nothing durable it diverges: the cursor restarts at the last "
        "checkpoint (step 3, 6) while the patch log is gone. Checkpointing the cursor does "
        "not save it: the patch and its receipt must commit together.\n"
    )
    return diverged, crashes


def _double_crashes(
    crashed: list[CaseResult], reference: Reference, workdir: Path | None, progress: ProgressLine
) -> list[CaseResult]:
    """For each crash point that leaves an act in flight (intent journaled, receipt not),
    crash again at the first crash point its recovery passes."""
    acts = {key for key, kind, _ in reference.steps if kind == "act"}
    in_flight = {
        point
        for key in acts
        for point in (
            f"after_commit[act_intent:{key}]",
            f"inside[act:{key}:written]",
            f"inside[act:{key}:renamed]",
            f"before_commit[step_done:{key}]",
        )
    }
    cases = [
        Case(
            kind=CaseKind.DOUBLE_CRASH,
            at=r.case.at,
            point=r.case.point,
            recovery_at=candidates[0],
            recovery_point=r.recovery_points[candidates[0] - 1],
        )
        for r in crashed
        if r.case.point in in_flight and (candidates := recovery_candidates(r.recovery_points))
    ]
    results = []
    with tempfile.TemporaryDirectory(prefix="crashproof-demo-", dir=workdir) as tmp:
        for case in cases:
            directory = Path(tmp) / f"double-{case.at}"
            directory.mkdir()
            results.append(run_case(PATCH_TASK, reference, case, directory))
            progress(len(results), len(cases), case.label)
    progress.close()
    return results


def _tour_install() -> str | None:
    """The one install the README's tour needs (the OpenAI SDK), as this install takes it:
    into the checkout's .venv when the demo runs from one (`make demo`), else with pip;
    None when the SDK is already there."""
    if importlib.util.find_spec("openai") is not None:
        return None
    checkout = Path.cwd()
    if (checkout / "pyproject.toml").is_file() and Path(sys.prefix).resolve() == (
        checkout / ".venv"
    ).resolve():
        return ".venv/bin/pip install -e '.[openai]'"
    return "pip install 'crashproof[openai]'"


def run_demo(console: Console, *, workdir: Path | None = None) -> int:
    """Print the demo; return 0 when no crash case DIVERGED."""
    started = time.monotonic()
    naive_bad, naive_crashes = _naive(console)

    console.rule("[bold]2. crashproof: SIGKILL at every crash point, then resume")
    workers = max(1, min(4, os.cpu_count() or 1))
    killed = verify(
        PATCH_TASK,
        mode="subprocess",
        seed=0,
        recovery_points=0,
        contention_points=0,  # kept to the seconds the demo promises; verify runs them
        target=TARGET,
        workdir=workdir,
        workers=workers,
        progress=(progress := ProgressLine(console, "cases: SIGKILL, then resume")),
    )
    progress.close()
    ref = killed.reference
    console.print(
        f"reference run: {STEPS} steps (a decision, then a workspace append, each), "
        f"{sum((ref.model_calls or {}).values())} model calls, "
        f"{len(ref.points)} crash points; artifact fingerprint (patch.txt)\n"
        f"  [bold]{ref.fingerprint}[/]\n"
    )
    console.print(matrix_table(killed))
    console.print(summary_line(killed))
    console.print(
        "Each row: a child process killed by a real SIGKILL at that point (each side of "
        "every journal commit; between a workspace's temp file and its rename; between the "
        "rename and the receipt), then resumed by another process. Effects: each step's line "
        "is in the file exactly once. Model calls: a decision is asked again only when the "
        "kill fell after the model answered and before the answer was committed.\n"
    )

    console.rule("[bold]3. A crash during recovery, and the same run delivered twice")
    crashed = killed.of_kind(CaseKind.CRASH)
    doubles = _double_crashes(
        crashed, ref, workdir, ProgressLine(console, "crashes during recovery, then resume")
    )
    same = sum(1 for r in doubles if r.verdict is Verdict.SAME)
    redelivered = killed.of_kind(CaseKind.REDELIVERY)
    console.print(
        f"In-process, at the {len(doubles)} crash points that leave a workspace write in "
        "flight (intent journaled, receipt not), the recovery itself was crashed at its first "
        f"crash point, then resumed: {same}/{len(doubles)} SAME. After every crash above, "
        "and after the uninterrupted run, the finished run was delivered again to a new "
        f"Ledger: {redelivered[0].verdict.value if redelivered else '-'}, nothing re-executed, "
        "nothing asked again.\n"
    )
    diverged = killed.diverged + [r for r in doubles if r.verdict is Verdict.DIVERGED]
    for r in diverged:
        console.print(Text(f"DIVERGED {r.case.label}: {r.reason}", style="red"))
    elapsed = time.monotonic() - started
    if diverged:
        console.print(f"[red bold]{len(diverged)} case(s) DIVERGED[/] (seed 0). {elapsed:.1f} s.")
        return 1
    reasked = sum(1 for r in crashed if r.reasked)
    console.rule("[bold]In short")
    short = Table.grid(padding=(0, 2))
    short.add_column(no_wrap=True)
    short.add_column()
    short.add_row(
        "naive executor",
        f"[red]diverged[/] after {naive_bad} of {naive_crashes} crashes "
        "(patches applied twice or lost)",
    )
    short.add_row(
        "crashproof",
        f"[green bold]all SAME[/] after {len(crashed)} SIGKILLs, {len(doubles)} crashes "
        "during recovery and a redelivery: every patch written once; a model asked again "
        f"after {reasked} kills, each between its answer and the commit ({elapsed:.0f} s)",
    )
    console.print(short, highlight=False)
    console.print()
    install = _tour_install()
    console.print(
        '[bold]Go on[/]: the 30-second tour in README.md ("The API in 30 seconds") uses the '
        + ("OpenAI SDK, installed here." if install is None else f"OpenAI SDK:\n    {install}"),
        highlight=False,
    )
    console.print(
        "Prove your own workflow: [bold]crashproof verify MODULE:SCENARIO[/] "
        "(e.g. examples.patch_task:SCENARIO)",
        highlight=False,
    )
    return 0
