"""Small helpers shared by the unit tests."""

from __future__ import annotations

from collections.abc import Callable

import crashproof as cp

# A ledger opener (the ``open_ledger`` fixture): each call gives a NEW Ledger object.
LedgerFactory = Callable[..., cp.Ledger]

# Crash after the last step, before the run's outcome commits: resuming then replays
# the whole journal, which is what most replay tests want to observe.
FINISH = "before_commit[run_succeeded]"
