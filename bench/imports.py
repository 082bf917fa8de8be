"""What importing an integration costs, next to importing its framework alone.

    .venv/bin/python bench/imports.py [--runs 7]

Each figure is the median CPU time (user + system) of a fresh interpreter importing the
module (the interpreter's own start-up subtracted: ``python -c pass`` is measured the
same way). CPU time, not wall time: on a machine shared with other work the wall time
of an import swings by 2x from run to run, its CPU time much less. The load average is
printed with the figures.
The goal (issue #41) is at most 1.2x the framework's own import for each integration.
A stack the agent does not use (MCP under pydantic-ai) must not be imported.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

# (integration, the framework import it stands beside)
PAIRS = [
    ("crashproof.models", "openai"),
    ("crashproof.integrations.pydantic_ai", "pydantic_ai"),
    ("crashproof.integrations.openai_agents", "agents"),
    ("crashproof.integrations.langgraph", "langgraph.graph"),
]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall(code: str, runs: int) -> float:
    """Median CPU seconds of ``python -c code`` in a fresh interpreter."""
    times = []
    for _ in range(runs):
        start = _children_cpu()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(_children_cpu() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print("load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    base = wall("pass", args.runs)
    crashproof = wall("import crashproof", args.runs) - base
    print(f"python start-up {base * 1000:.0f} ms; import crashproof {crashproof * 1000:.0f} ms")
    print(f"{'integration':40} {'framework':>10} {'both':>10} {'ratio':>7}")
    worst = 0.0
    for integration, framework in PAIRS:
        alone = wall(f"import {framework}", args.runs) - base
        both = wall(f"import {framework}, {integration}", args.runs) - base
        ratio = both / alone
        worst = max(worst, ratio)
        print(f"{integration:40} {alone * 1000:8.0f}ms {both * 1000:8.0f}ms {ratio:6.2f}x")
    mcp = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, crashproof.integrations.pydantic_ai; "
            "print('pydantic_ai.mcp' in sys.modules)",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"MCP stack imported by the pydantic-ai integration: {mcp}")
    print(f"worst ratio {worst:.2f}x (goal <= 1.2x)")
    return 0 if worst <= 1.2 and mcp == "False" else 1


if __name__ == "__main__":
    sys.exit(main())
