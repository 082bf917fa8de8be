"""Replaying recorded runs against current code without executing anything (the check
a team runs before deploying, as Temporal's replayer).

- ``check``: a ``Context`` that only matches, and the verdict per run;
- ``sources``: where recorded runs are read from (a ledger, a URL, a checkpoint);
- ``contracts``: what a declared tool-contract mapping says about a mismatch;
- ``verdict``: the compatibility verdict a resume under changed code or schema records
  before it takes the lease, and ``crashproof migrate --app`` applying contract mappings.

The one role folder *above* ``runtime.context``: it is a second driver of workflows
(beside ``runtime.worker``), so it may import it. ``runtime.ledger`` calls ``verdict``
(which sees the ledger only through the ``DriveHost`` port); ``sources`` sits above the
ledger (it opens one). ``tests/unit/test_layers.py`` keeps that free of circles.
"""
