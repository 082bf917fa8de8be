"""Operations on what a ledger already holds, outside any drive, for operators.

- ``maintenance``: check, re-anchor, reconcile, outbox delivery, export/import (a
  ``Ledger`` mixin); ``oversight``: approvers, approvals, review decisions (a mixin);
- ``transfer``, ``moving``, ``checkpoint_fields``: signed checkpoints and moves;
- ``audit``: who wrote each record, when, with which versions.

May import everything below ``runtime.context``: ``journal``, ``store``, ``tools``,
``integrity``, ``runtime.port``, ``runtime.options``, ``runtime.workflow`` and the folders
``steps``, ``guards`` and ``driving``. Never ``runtime.context``, ``runtime.drive`` or
``runtime.ledger``.
"""
