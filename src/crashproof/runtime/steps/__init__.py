"""Recorders of a run in progress: what one ``ctx`` call writes to the journal.

- ``handoff``: where a recorder hands control to user code or a tool (it yields a
  handoff), and the sync and async drivers (``run_sync``, ``run_async``);
- ``live``: a step, a decision or a recorded clock run live, retried, recorded;
- ``acts``: the act protocol (intent, execute, receipt, reconciliation in between);
  ``act_records``: its two record payloads and the digests of its intent; ``holds``: a
  new intent refused while another run holds it unresolved, and the operator's override;
- ``decisions``: what a model's decision reports about itself (model, usage, cost);
- ``outbox``: deferred deliveries, journaled in the step's own commit;
- ``environment``: the world an act saw, observed again on resume;
- ``reconcile``: recorded receipts compared with their tools (by ``crashproof
  reconcile``, and by every resume before its first live call).

May import: ``journal``, ``tools``, ``errors``, ``_excerpt``, ``runtime.port`` and
``runtime.options``.
Never ``runtime.context``, ``runtime.drive`` or ``runtime.ledger``: a recorder sees a run
only through the ``RunSession`` port, so the sync and async shells drive the same recorders.
"""
