"""``crashproof run --max-steps/--max-decisions/--max-tokens/--max-cost/--max-wall``: the
options, and their mapping to ``cp.RunOptions(limits=cp.Limits(...))``."""

from __future__ import annotations

from typing import Annotated

import typer

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.journal.records import Limits
from crashproof.runtime.options import RunOptions

__all__ = ["MaxCost", "MaxDecisions", "MaxSteps", "MaxTokens", "MaxWall", "run_options"]

MaxSteps = Annotated[
    int | None,
    typer.Option(
        "--max-steps",
        metavar="N",
        show_default=False,
        help="Stop cleanly (status stopped) before the step, decision or act past N.",
    ),
]
MaxDecisions = Annotated[
    int | None,
    typer.Option("--max-decisions", metavar="N", show_default=False, help="At most N decisions."),
]
MaxTokens = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        metavar="N",
        show_default=False,
        help="At most N tokens, as the decisions report them (cp.Decision usage).",
    ),
]
MaxCost = Annotated[
    float | None,
    typer.Option(
        "--max-cost",
        metavar="X",
        show_default=False,
        help="At most X in total cost, as the decisions report it.",
    ),
]
MaxWall = Annotated[
    float | None,
    typer.Option(
        "--max-wall",
        metavar="SECONDS",
        show_default=False,
        help="At most SECONDS of wall-clock time since the run first started. Limits are "
        "recorded when the run starts; raise them later with crashproof resume "
        "--raise-budget KIND=LIMIT.",
    ),
]


def run_options(
    steps: int | None,
    decisions: int | None,
    tokens: int | None,
    cost: float | None,
    wall: float | None,
) -> RunOptions | None:
    """The --max-* options as ``cp.RunOptions(limits=cp.Limits(...))``; None without any."""
    if all(value is None for value in (steps, decisions, tokens, cost, wall)):
        return None
    try:
        limits = Limits(
            max_steps=steps,
            max_decisions=decisions,
            max_tokens=tokens,
            max_cost=cost,
            max_wall_seconds=wall,
        )
    except ValueError as exc:
        raise CliError(
            ExitCode.USAGE,
            f"{exc}; nothing was started",
            "limits are non-negative, e.g. --max-steps 50 --max-tokens 20000 --max-cost 1.5",
        ) from None
    return RunOptions(limits=limits)
