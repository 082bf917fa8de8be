"""The command line: the only place that reads env vars, prints, exits or configures logging."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv``; return the exit code (tests call this in-process)."""
    print("crashproof: CLI not built yet", file=sys.stderr)
    return 2


def run_cli() -> None:
    raise SystemExit(main(sys.argv[1:]))
