"""Text deltas of large values in a SQLite ledger (schema 7): a value that extends an
earlier large value of its run is stored as the earlier one's digest, a prefix length
and the tail past it, so a step returning a growing history stores each turn once.

A ``blobs`` row is (digest, data, base, prefix): ``digest`` is always the SHA-256 of the
full text; ``data`` is the full text when ``base`` is NULL, else the full text is
``text(base)[:prefix] + data`` (prefix in characters). Every reader gets full texts:
the SQLite read queries call ``crashproof_text`` (a function of each connection,
:class:`Resolver`) for a delta row, in the query, before any MAC is checked over the
text. A row without ``base`` never reaches Python, so a journal without deltas costs
nothing more to read.

Chains stay bounded: a value is stored whole again once its chain would have more than
``MAX_LINKS`` links, and a delta is written only when it at least halves the row (its
prefix is no shorter than its tail). Resolving is a loop, never a recursion; a small
memo of the texts resolved last makes a run's load read each row once, so only a cold
read (a value another run stored first) walks a chain: at most ``MAX_LINKS`` point
reads. A fixed cap costs bytes once per ``MAX_LINKS`` turns (a growing history of
10,000 turns stores ~2x its new bytes); a cap on tail bytes instead stored the history
whole at every tripling (1.6x the new bytes at 300 turns, not 1.0x) for a cold read
that is rare.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections import OrderedDict
from dataclasses import dataclass

from crashproof.errors import IntegrityError
from crashproof.store.sql import load_queries

__all__ = ["MAX_LINKS", "MIN_PREFIX", "DeltaMemo", "Resolver", "common_prefix"]

MIN_PREFIX = 4096  # characters shared with the base: below this, store the value whole
MAX_LINKS = 4096  # links from a delta to its chain's whole value, at most
_CHUNK = 4096  # compare texts this many characters at a time (C memcmp per slice)
_MEMO = 4  # resolved texts a Resolver keeps
_RUNS = 64  # runs whose last large value a DeltaMemo keeps (the oldest is dropped)

_Q = load_queries("sqlite")


def common_prefix(old: str, new: str) -> int:
    """The length of the longest common prefix of ``old`` and ``new``. A list that grew
    (compact JSON: ``old`` less its closing ``]`` starts ``new``) costs one comparison;
    anything else one pass of chunk comparisons, then a binary search in the chunk
    that differs: O(prefix), where a binary search over the whole text would copy
    O(n log n) characters."""
    if old.endswith("]") and new.startswith(old[:-1]):
        return len(old) if new.startswith("]", len(old) - 1) else len(old) - 1
    end = min(len(old), len(new))
    lo = 0
    while lo < end and old[lo : lo + _CHUNK] == new[lo : lo + _CHUNK]:
        lo += _CHUNK
    if lo >= end:
        return end
    hi = min(lo + _CHUNK, end)  # old[:lo] == new[:lo], and they differ before hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if old[lo:mid] == new[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True)
class _Last:
    """A run's last large value as this store wrote it, and its chain so far."""

    digest: str
    text: str
    links: int  # from this value to its chain's whole value (0: stored whole)


class DeltaMemo:
    """The writer's side: each run's last large value, to store the next one as a delta.
    Only a hint: a delta is written only when its base row is found in the same
    transaction, and the store forgets a run (or all) whenever a write is rolled back,
    as it forgets journal ends, and a run once it ended. It holds one text per run, for
    the ``_RUNS`` runs that wrote one last (a run dropped stores its next value whole)."""

    def __init__(self) -> None:
        self._last: dict[str, _Last] = {}

    def forget(self, run_id: str | None = None) -> None:
        if run_id is None:
            self._last.clear()
        else:
            self._last.pop(run_id, None)

    def insert(
        self, conn: sqlite3.Connection | sqlite3.Cursor, run_id: str, digest: str, value: str
    ) -> None:
        """Insert the blob row of ``value`` (``digest``: its SHA-256), as a delta when the
        run's last large value shares a long enough prefix with it (insert_blob)."""
        last = self._last.get(run_id)
        base = prefix = None
        data = value
        if last is not None and last.digest != digest and last.links < MAX_LINKS:
            shared = common_prefix(last.text, value)
            if (
                shared >= MIN_PREFIX
                and shared >= len(value) - shared
                and conn.execute(_Q["has_blob"], (last.digest,)).fetchone() is not None
            ):
                base, prefix, data = last.digest, shared, value[shared:]
        inserted = conn.execute(_Q["insert_blob"], (digest, data, base, prefix)).rowcount
        if not inserted:  # stored before (by this run or another): its chain is unknown
            if last is None or last.digest != digest:
                self._last.pop(run_id, None)
            return
        links = 0 if base is None or last is None else last.links + 1
        self._last.pop(run_id, None)  # to the end of the order: the most recent
        self._last[run_id] = _Last(digest, value, links)
        if len(self._last) > _RUNS:
            del self._last[next(iter(self._last))]


class Resolver:
    """The readers' side: ``crashproof_text(digest, data, base, prefix)`` of one
    connection, the full text of a delta row. A row it cannot resolve (its base
    missing, a prefix past its base's text, a chain too long or circular, or, when
    ``check_digest``, a text whose SHA-256 is not its digest) reads as NULL, so its
    record's MAC fails, and :attr:`fault` says why (the store raises that)."""

    def __init__(self, conn: sqlite3.Connection, *, check_digest: bool) -> None:
        self._conn = conn
        self._check = check_digest
        self._memo: OrderedDict[str, str] = OrderedDict()
        self.fault: IntegrityError | None = None
        conn.create_function("crashproof_text", 4, self._call)

    def reset(self) -> None:
        """Forget the resolved texts and the last fault (after each load)."""
        self._memo.clear()
        self.fault = None

    def check(self) -> None:
        """Raise the first fault met since the last reset or check, if any."""
        fault, self.fault = self.fault, None
        if fault is not None:
            raise fault

    def _call(self, digest: str, data: str, base: str, prefix: int) -> str | None:
        try:
            text = self.resolve(digest, data, base, prefix)
        except IntegrityError as exc:
            if self.fault is None:
                self.fault = exc
            return None
        self._memo[digest] = text
        self._memo.move_to_end(digest)
        if len(self._memo) > _MEMO:
            self._memo.popitem(last=False)
        return text

    def resolve(self, digest: str, data: str, base: str, prefix: int) -> str:
        """The full text of the delta row (digest, data, base, prefix): walks up its
        chain to a whole value or a memoised text, keeping only the pieces needed."""
        pieces = [data]
        limit: object = prefix  # characters wanted of the current base's text
        here = digest
        for _ in range(MAX_LINKS + 1):
            if not isinstance(limit, int) or limit < 0:
                raise _broken(digest, f"blob {here} has an invalid prefix {limit!r}")
            known = self._memo.get(base)
            if known is not None:
                row: tuple[str, str | None, object] = (known, None, None)
            else:
                row = self._conn.execute(_Q["blob_row"], (base,)).fetchone()
                if row is None:
                    raise _broken(digest, f"its base blob {base} is missing")
            row_data, row_base, row_prefix = row
            if row_base is None:
                if limit > len(row_data):
                    raise _past(digest, here, limit, base, len(row_data))
                pieces.append(row_data[:limit])
                break
            if not isinstance(row_prefix, int) or row_prefix < 0:
                raise _broken(digest, f"blob {base} has an invalid prefix {row_prefix!r}")
            if limit > row_prefix + len(row_data):
                raise _past(digest, here, limit, base, row_prefix + len(row_data))
            # text(base)[:limit] = (text(its base)[:row_prefix] + row_data)[:limit]
            pieces.append(row_data[: max(0, limit - row_prefix)])
            here, base, limit = base, row_base, min(limit, row_prefix)
        else:
            raise _broken(digest, f"its chain is longer than {MAX_LINKS} links or circular")
        text = "".join(reversed(pieces))
        if self._check and hashlib.sha256(text.encode()).hexdigest() != digest:
            raise _broken(digest, "the text it resolves to does not have its digest")
        return text


def _past(digest: str, here: str, limit: int, base: str, length: int) -> IntegrityError:
    return _broken(
        digest, f"blob {here} takes {limit} characters of blob {base}, which has {length}"
    )


def _broken(digest: str, why: str) -> IntegrityError:
    return IntegrityError(
        f"stored value {digest} cannot be read: {why}; the ledger file was edited or "
        "damaged, nothing was executed. Restore it from a backup."
    )
