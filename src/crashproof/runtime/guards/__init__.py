"""Guards: what must hold before new work of a run starts, and who may lift a stop.

- ``budget``: limits metered before each new step; ``binding``: the limits and policy a
  run is bound to, changed only by journaled operator actions;
- ``policy``: which tools a run may use and which acts need approval (admission);
- ``approvals``, ``approvers``: signed approvals and their trust root;
- ``review``: review cases and signed replan/abort decisions; ``replan``: a decision
  consumed on resume, after the receipt is re-read.

May import: ``journal``, ``tools``, ``integrity``, ``errors``, ``_excerpt``,
``runtime.port``, ``runtime.options`` and ``runtime.steps``. Never ``runtime.context``,
``runtime.drive`` or ``runtime.ledger``.
"""
