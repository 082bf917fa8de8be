"""The old home of ``crashproof verify``'s function, kept only for one test outside cli.

tests/verify/test_verify_contention.py imports ``verify_command`` from here to pin the
CLI's --contention-points default to the verifier's; the CLI refactor may not edit
tests/verify. Delete this module once that test imports
``crashproof.cli.commands.proofs.verify_recovery`` instead.
"""

from __future__ import annotations

from crashproof.cli.commands.proofs import verify_recovery as verify_command

__all__ = ["verify_command"]
