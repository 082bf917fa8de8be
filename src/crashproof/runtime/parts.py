"""What the Ledger's mixins (care, humans) may use of the Ledger: its store, witness and
identity, and its two journal primitives. Declared once here, provided by ``Ledger``."""

from __future__ import annotations

from collections.abc import Sequence

from crashproof.integrity.witness import Witness
from crashproof.journal.records import Event
from crashproof.store.port import StatusChange, Store

__all__ = ["LedgerParts"]


class LedgerParts:
    _store: Store
    _witness: Witness | None
    url: str
    shown_url: str
    worker_id: str
    lease_seconds: float

    def _journal(self, run_id: str, *, owner: bool = False) -> list[Event]:
        """The run's verified journal (see ``Ledger._journal``)."""
        raise NotImplementedError  # provided by Ledger

    def _commit(
        self,
        events: Sequence[Event],
        status: StatusChange | None,
        *,
        fencing_token: int | None = None,
    ) -> None:
        """Append to the run's journal (see ``Ledger._commit``)."""
        raise NotImplementedError  # provided by Ledger
