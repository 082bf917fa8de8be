"""Opening a ledger's parts from its URL: the store, and the generation witness beside it.

Also the one place that knows how a URL may be shown: messages and logs never carry a
password.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote, unquote

from crashproof.errors import LedgerError
from crashproof.integrity.witness import MemoryWitness, SQLiteWitness, Witness
from crashproof.store.port import RecordSealer, Store

__all__ = [
    "DURABILITY_MODES",
    "default_witness",
    "open_store",
    "sqlite_file",
    "without_password",
]

DURABILITY_MODES = ("output", "full", "normal")


def open_store(
    url: str, *, durability: str = "output", sealer: RecordSealer | None = None
) -> Store:
    """A store from a URL: ``sqlite:///relative.db``, ``sqlite:////abs.db``, ``memory://``,
    ``postgresql://user:password@host:port/dbname[?schema=NAME]`` (or ``postgres://``)."""
    if durability not in DURABILITY_MODES:
        raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
    if url == "memory://":
        from crashproof.store.memory import MemoryStore

        return MemoryStore()
    if url.startswith("sqlite:///"):
        from crashproof.store.sqlite import SQLiteStore

        path = sqlite_file(url)
        if path is None:
            raise ValueError("sqlite URLs need a file path: sqlite:///runs.db")
        return SQLiteStore(path, durability=durability, sealer=sealer)
    if url.startswith(("postgresql://", "postgres://")):
        try:  # imported here: `import crashproof` must work without psycopg
            from crashproof.store.postgres import PostgresStore
        except ImportError as exc:
            raise LedgerError(
                f"PostgreSQL ledgers need psycopg ({exc}); "
                "install them with: pip install 'crashproof[postgres]'"
            ) from None
        return PostgresStore(url, durability=durability, sealer=sealer)
    scheme = url.split(":", 1)[0]
    raise ValueError(
        f"unsupported ledger URL (scheme {scheme!r}); use sqlite:///path.db (relative), "
        "sqlite:////abs/path.db, postgresql://user:password@host/dbname, or memory://"
    )


_QUERY_SECRET = re.compile(r"((?:ssl)?password=)[^&]*", re.IGNORECASE)


_WITNESS_URL = re.compile(r"(witness_url=)([^&#]*)", re.IGNORECASE)


def without_password(url: str) -> str:
    """The URL with any password replaced by ***: errors and logs must not leak it (nor
    the password of a ``witness_url=`` parameter's own URL)."""
    url = _WITNESS_URL.sub(
        lambda m: m.group(1) + quote(without_password(unquote(m.group(2))), safe="*"), url
    )
    url = _QUERY_SECRET.sub(r"\1***", url)  # libpq also takes ?password=...
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{tail}"


def sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (None for another URL, or one without a path).

    A query string or fragment is refused rather than taken into the file name: SQLite's
    ``?mode=ro`` would otherwise open (and create) a second ledger named ``x.db?mode=ro``,
    and a ledger is always opened read-write (read commands never write it)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///") :]  # "sqlite:////abs" leaves "/abs"
    if "?" in path or "#" in path:
        raise ValueError(
            f"sqlite URLs take no query string or fragment ({path!r}): options such as "
            "?mode=ro are not supported; name the file alone, sqlite:///runs.db"
        )
    return Path(path) if path and path != ":memory:" else None


def default_witness(url: str, store: Store, namespace: str | None = None) -> Witness | None:
    """A separate file beside a SQLite ledger (``runs.db.witness``), a separate schema
    beside a PostgreSQL one (``crashproof_witness``). An in-memory ledger has nothing
    that could be rolled back, so it has no witness. ``namespace``: the witness of an
    integration's own sealed state (``Ledger.sealed_state``): ``runs.db.NS.witness``,
    schema ``crashproof_NS_witness``, and one in memory for ``memory://``. A PostgreSQL
    URL's ``witness_url=URL`` (percent-encoded) puts the witness schema on that server
    instead (another database or host: a restore of the ledger's whole database then
    cannot roll the witness back with it); every process opening the ledger by this URL,
    the CLI's too, finds the same witness."""
    infix = "" if namespace is None else f".{namespace}"
    path = sqlite_file(url)
    if path is not None:
        return SQLiteWitness(path.with_name(f"{path.name}{infix}.witness"))
    schema = getattr(store, "schema", None)
    if isinstance(schema, str) and url.startswith(("postgresql://", "postgres://")):
        from crashproof.integrity.pg_witness import PostgresWitness  # needs psycopg
        from crashproof.store.pg_connection import parse_url

        where = parse_url(url).witness_url or url
        return PostgresWitness(where, schema=f"{schema}{infix.replace('.', '_')}_witness")
    if namespace is not None and url == "memory://":
        return MemoryWitness()
    return None
