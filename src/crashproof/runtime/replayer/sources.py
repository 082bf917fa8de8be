"""Where ``crashproof replay`` reads recorded runs from, without writing to it.

- a SQLite ledger (a path or ``sqlite:///...``): copied first with SQLite's online backup
  from a read-only connection, then opened (and, if purely additive, migrated) as the copy;
  the source file is never opened for writing;
- a checkpoint document (JSON, from ``crashproof export``): verified and installed into a
  scratch ledger in a temporary directory, exactly as ``crashproof import`` would;
- a PostgreSQL ledger URL: read through the store (opening it applies pending additive
  migrations, as every crashproof process that opens it would).

Every record's MAC and chain are verified on the way (the key: ``CRASHPROOF_KEY`` etc.).
The witness is not consulted: nothing is executed, so a rollback cannot cause an effect.
"""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from crashproof.errors import CrashproofError, LedgerError, NotALedger
from crashproof.integrity import checkpoint
from crashproof.integrity.keys import Keyring, resolve_keyring
from crashproof.integrity.seal import Sealer
from crashproof.journal.records import Event
from crashproof.runtime.ledger import Ledger, open_store
from crashproof.runtime.operations.transfer import import_run
from crashproof.runtime.replayer.check import ReplayVerdict, replay_runs
from crashproof.runtime.workflow import Workflow

__all__ = ["read_journals", "replay_check"]

_SQLITE_HEADER = b"SQLite format 3\x00"


def replay_check(
    workflows: Iterable[Workflow[Any]],
    source: str | Path,
    *,
    run_ids: Sequence[str] | None = None,
    key: bytes | str | Keyring | None = None,
) -> list[ReplayVerdict]:
    """Replay the runs recorded in ``source`` (a ledger path or URL, or an exported
    checkpoint) against ``workflows``, executing nothing; one verdict per run.
    ``run_ids``: only these runs (default: all)."""
    journals = read_journals(source, run_ids=run_ids, key=key)
    scratch = Ledger("memory://")  # only its settings are read; nothing is written to it
    try:
        return replay_runs(workflows, journals, scratch)
    finally:
        scratch.close()


def read_journals(
    source: str | Path,
    *,
    run_ids: Sequence[str] | None = None,
    key: bytes | str | Keyring | None = None,
) -> list[list[Event]]:
    """Every run's verified journal in ``source``, oldest run first."""
    sealer = Sealer(resolve_keyring(key))
    text = str(source)
    with tempfile.TemporaryDirectory(prefix="crashproof-replay-") as scratch:
        if text.startswith(("postgresql://", "postgres://")):
            store = open_store(text, sealer=sealer)
        else:
            path = Path(text[len("sqlite:///") :] if text.startswith("sqlite:///") else text)
            store = _open_copy(path, Path(scratch), sealer)
        with contextlib.closing(store):
            rows = store.list_runs()
            wanted = [r.run_id for r in rows] if run_ids is None else list(run_ids)
            known = {r.run_id for r in rows}
            missing = [r for r in wanted if r not in known]
            if missing:
                raise CrashproofError(
                    f"no run {missing[0]!r} in {text} (it holds {len(known)} run(s)); "
                    "nothing was replayed"
                )
            return [store.load_events(run_id) for run_id in wanted]


def _open_copy(path: Path, scratch: Path, sealer: Sealer) -> Any:
    if not path.is_file():
        raise LedgerError(f"cannot replay from {path}: no such file; nothing was replayed")
    with path.open("rb") as f:
        head = f.read(16)
    copy = scratch / "replay.db"
    if head == _SQLITE_HEADER:
        _backup(path, copy)
        return open_store(f"sqlite:///{copy}", sealer=sealer)
    try:
        document = checkpoint.parse(path.read_bytes())
    except CrashproofError as exc:
        if head.lstrip().startswith(b"{"):
            raise  # a checkpoint document that does not verify: say exactly why
        raise NotALedger(
            f"{path} is neither a SQLite ledger nor a checkpoint document ({exc}); "
            "nothing was replayed"
        ) from None
    store = open_store(f"sqlite:///{copy}", sealer=sealer)
    try:
        import_run(store, None, document, by="crashproof replay")
    except BaseException:
        store.close()
        raise
    return store


def _backup(path: Path, copy: Path) -> None:
    """A consistent copy of the ledger (WAL included), read through a read-only handle."""
    try:
        with (
            contextlib.closing(
                sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            ) as source,
            contextlib.closing(sqlite3.connect(copy)) as target,
        ):
            source.backup(target)
    except sqlite3.Error as exc:
        raise LedgerError(f"cannot read ledger {path} ({exc}); nothing was replayed") from None
