"""Migrations: a directory of ``.sql`` files, each applied once to a database, ever.

``Migrations(connection, "migrations/").apply(ctx)`` makes one act per file, in order of
file name (``0001_init.sql``, ``0002_users.sql``...), step key ``migrate:<file name>``.
Each runs like a ``crashproof.tools.sql.Sql`` act (module docstring there): its
statements and its receipt row commit in one transaction, so a crash anywhere leaves
the file applied exactly when its receipt exists.

A migration's receipt is keyed by its file name (``migration:<name>`` in the receipt
table), not by the run: a migration applied by one run is never applied by another, which
finds the receipt and gets the recorded result back. What the receipt compares is the
file's SHA-256: a file changed after it was applied is a conflict (the run freezes for
review, naming both digests), never a second application. The file's text and digest are
in the act's params, so the journal holds exactly what was applied.

A file that fails rolls back (nothing of it applied, no receipt) and fails the act:
fix the file, then ``crashproof retry``. The files after it are not attempted.

``plan()`` lists the acts as ``(step name, params)`` for a workflow that drives them
itself, e.g. an async one: ``for name, params in m.plan(): await ctx.act(name, m, **params)``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar, Protocol

from crashproof.errors import PermanentError
from crashproof.tools._sql_dialects import Dialect, dialect_for
from crashproof.tools.port import Call, Receipt, Tool
from crashproof.tools.sql import RECEIPTS_TABLE, Change, apply_once, checked, look_up

__all__ = ["Migrations"]

_PARAMS = frozenset({"file", "sql", "sha256"})


class _Acts(Protocol):
    def act(self, name: str, tool: Tool, /, **params: Any) -> Any: ...


class Migrations(Tool):
    """The ``.sql`` files of ``directory`` (not its subdirectories), applied in order of
    name to ``connection`` (sqlite3 or psycopg 3, the caller's), each once."""

    name: ClassVar[str] = "sql.migration"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = True
    idempotent_execute: ClassVar[bool] = True
    honours_fencing: ClassVar[bool] = True

    def __init__(
        self, connection: Any, directory: str | Path, *, table: str = RECEIPTS_TABLE
    ) -> None:
        self._db: Dialect = dialect_for(connection, table)
        self.directory = Path(directory)

    def plan(self) -> list[tuple[str, dict[str, Any]]]:
        """One ``(step name, params)`` per file, in order. A directory that cannot be read,
        or a file that is not UTF-8, raises ``ValueError`` naming it."""
        try:
            files = sorted(
                p for p in self.directory.iterdir() if p.suffix == ".sql" and p.is_file()
            )
        except OSError as exc:
            raise ValueError(
                f"cannot read the migrations directory {str(self.directory)!r}: "
                f"{exc.strerror or exc}"
            ) from exc
        acts = []
        for path in files:
            data = path.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"migration {str(path)!r} is not UTF-8 text ({exc})") from exc
            digest = hashlib.sha256(data).hexdigest()
            acts.append(
                (f"migrate:{path.name}", {"file": path.name, "sql": text, "sha256": digest})
            )
        return acts

    def apply(self, ctx: _Acts) -> list[Any]:
        """Apply every file not yet applied, in order (a sync workflow's ``ctx``); the
        results, one per file: ``{"migration", "sha256", "statements", "rows_affected"}``."""
        return [ctx.act(name, self, **params) for name, params in self.plan()]

    def prepare(self, call: Call) -> dict[str, Any] | None:
        self._change(call)
        return None

    def execute(self, call: Call) -> Receipt:
        return apply_once(self._db, call, self._change(call))

    def lookup(self, call: Call) -> Receipt | None:
        return look_up(self._db, call, self._change(call))

    def _change(self, call: Call) -> Change:
        params = call.params
        if set(params) != _PARAMS:
            raise PermanentError(
                f"a migration act takes exactly {sorted(_PARAMS)} (made by Migrations.plan)"
            )
        name, sql, digest = params["file"], params["sql"], params["sha256"]
        if not (isinstance(name, str) and isinstance(sql, str) and isinstance(digest, str)):
            raise PermanentError("a migration's file, sql and sha256 must be strings")
        if hashlib.sha256(sql.encode()).hexdigest() != digest:
            raise PermanentError(f"migration {name!r}: its sql does not match its sha256")
        checked(self._db, sql)
        return Change(
            key=f"migration:{name}",
            intent=digest,
            kind="migration",
            sql=sql,
            args=None,
            describe={"migration": name, "sha256": digest},
        )
