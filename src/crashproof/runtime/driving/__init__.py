"""Driving runs: who drives a run, and when its commits must be durable.

- ``leases``: one driver per run (claims, takeovers, the heartbeat);
- ``durability``: which records are output points, forced to disk before they leave;
- ``commits``, ``drive_commits``: records reaching the store, the ledger's side and one
  drive's; a failed commit stops its drive (journal order); ``drive_records``: a drive's
  records besides its calls' (a freeze, a thaw, a halt, the outcome);
- ``queue``: the ledger as a work queue for workers (a ``Ledger`` mixin);
- ``lifecycle``: a run's start record, and the answer of a run that already ended;
- ``urls``: opening a ledger's store and witness from its URL, and showing a URL safely.

May import: ``journal``, ``store``, ``integrity``, ``errors``, ``runtime.port``,
``runtime.options`` and ``runtime.workflow``. Never ``runtime.context``, ``runtime.drive``
or ``runtime.ledger``.
"""
