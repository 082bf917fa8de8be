"""``python -m crashproof``: the CLI."""

from crashproof.cli import run_cli

run_cli()
