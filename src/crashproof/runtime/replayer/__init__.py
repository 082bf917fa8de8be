"""Replaying recorded runs against current code without executing anything (the check
a team runs before deploying, as Temporal's replayer).

- ``check``: a ``Context`` that only matches, and the verdict per run;
- ``sources``: where recorded runs are read from (a ledger, a URL, a checkpoint);
- ``contracts``: what a declared tool-contract mapping says about a mismatch.

The one role folder *above* ``runtime.context`` and ``runtime.ledger``: it is a second
driver of workflows (beside ``runtime.worker``), so it may import them; nothing under
``runtime`` imports it back.
"""
