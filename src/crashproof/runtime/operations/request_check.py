"""``crashproof check`` of the model requests kept beside a run's records (schema 9;
PostgreSQL 6; ``runtime/operations/requests.py``).

A decision's record holds the SHA-256 of its request as ``request_sha256``, under the
record's MAC; the text sits in the store's ``requests`` table, outside the chain. Once the
records have verified, each kept text must be the one its record names: a text whose
digest differs (altered), a record naming a text the store lacks (removed), or a text no
record names (added, or left by a record that is gone) is a finding. A ledger written
with ``store_requests=False`` keeps no texts and its records name none: nothing to find.
Records older than schema 9 hold their request inline (under the MAC): nothing either.

The texts are read as digests only (a store's ``request_digests``, hashed as they stream;
else ``load_requests``), one run at a time, like the records. They are read after the
records, so a run being driven meanwhile may have texts whose records came later: those
are matched against a journal read again, never reported as strays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from crashproof.errors import IntegrityError
from crashproof.journal.records import Event, EventType, request_sha256
from crashproof.store.port import Store

__all__ = ["check_requests"]

_SHOWN = 3  # record seqs named per kind of finding; the rest counted


@runtime_checkable
class _Digests(Protocol):
    """A store that hashes its kept requests as it reads them (SQLite, PostgreSQL)."""

    def request_digests(self, run_id: str) -> dict[int, str]: ...


def check_requests(
    store: Store,
    run_id: str,
    events: Sequence[Event],
    reread: Callable[[], Sequence[Event]],
) -> None:
    """Raise IntegrityError naming every kept request of the run that is not the one its
    record names (see the module docstring). ``events``: the run's journal, every record
    verified already; ``reread``: the journal read (and verified) again, called only when
    texts turn up past its end."""
    named = _named(events)
    if isinstance(store, _Digests):
        kept: Mapping[int, str] = store.request_digests(run_id)
    else:
        kept = {seq: request_sha256(text) for seq, text in store.load_requests(run_id).items()}
    end = events[-1].seq if events else -1
    if any(seq > end for seq in kept):  # appended since: the text and its record together
        later = _named(e for e in reread() if e.seq > end)
        named.update((seq, sha) for seq, sha in later.items() if seq in kept)
    named_seqs = set(named)
    altered = sorted(s for s in named_seqs & set(kept) if named[s] != kept[s])
    missing = sorted(named_seqs - set(kept))
    strays = sorted(set(kept) - named_seqs)
    findings = [
        _finding(altered, "altered (its SHA-256 is not the request_sha256 its record holds)"),
        _finding(missing, "missing (its record names one, the ledger has none)"),
        _finding(strays, "stored, yet its record names none (added, or its record is gone)"),
    ]
    said = "; ".join(f for f in findings if f)
    if said:
        raise IntegrityError(
            f"run {run_id!r}: stored model requests do not match their records: {said}. The "
            "records verify and a resume never reads a request, but these cannot be shown "
            "as the run sent them: restore the ledger's requests from a backup"
        )


def _named(events: Iterable[Event]) -> dict[int, Any]:
    """The digest each decision's record holds of its kept request, by record seq."""
    return {
        event.seq: event.payload["request_sha256"]
        for event in events
        if event.type is EventType.STEP_DONE and event.mentions("request_sha256")
    }


def _finding(seqs: list[int], what: str) -> str:
    if not seqs:
        return ""
    shown = ", ".join(str(seq) for seq in seqs[:_SHOWN])
    more = f" and {len(seqs) - _SHOWN} more" if len(seqs) > _SHOWN else ""
    noun = "record" if len(seqs) == 1 else "records"
    return f"the request of {noun} {shown}{more}: {what}"
