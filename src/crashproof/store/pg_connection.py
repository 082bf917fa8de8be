"""Talking to a PostgreSQL server: connection URLs, the pool's checkout check, and
psycopg's errors turned into clear crashproof ones (used by the store and the witness)."""

from __future__ import annotations

import contextlib
import select
from collections.abc import Iterator
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from crashproof.errors import IntegrityError, LedgerError
from crashproof.store.port import unencodable

__all__ = [
    "PgUrl",
    "check_connection",
    "first_line",
    "parse_url",
    "translated_errors",
]


@contextlib.contextmanager
def translated_errors(where: str, schema: str, *, opening: bool = False) -> Iterator[None]:
    """Turn psycopg's errors into clear crashproof ones, without a driver traceback."""
    try:
        yield
    except PoolClosed:
        raise LedgerError(f"{where} was closed; open a new Ledger to use it again") from None
    except PoolTimeout as exc:
        raise LedgerError(
            f"{where}: no database connection available ({exc}); is the server up?"
        ) from None
    except psycopg.errors.InsufficientPrivilege as exc:
        raise LedgerError(f"{where}: permission denied ({first_line(exc)})") from None
    except psycopg.errors.UndefinedTable as exc:
        raise IntegrityError(
            f"{where}: ledger tables are missing from schema {schema!r} "
            f"({first_line(exc)}); restore the database from a backup"
        ) from None
    except psycopg.OperationalError as exc:
        if opening:
            raise LedgerError(
                f"{where} is unreachable or refused the connection: {first_line(exc)}. "
                "Check the host, port, database name, user and password; nothing was "
                "written."
            ) from None
        # A commit cut off by a lost connection may or may not have landed: the
        # journal, read again on resume, is the only one who knows.
        raise LedgerError(
            f"{where} failed mid-operation ({first_line(exc)}); the write in progress "
            "may or may not have been committed. Resume the run once the server is back."
        ) from None
    except psycopg.DataError as exc:  # e.g. a NUL character in a run id or step key
        raise LedgerError(
            f"{where} refused a value ({first_line(exc)}): PostgreSQL text cannot hold "
            "NUL characters, so run ids, workflow names and step keys must not contain "
            "them; nothing of this write was kept"
        ) from None
    except psycopg.Error as exc:
        raise LedgerError(f"{where}: {type(exc).__name__}: {first_line(exc)}") from None
    except UnicodeEncodeError as exc:  # psycopg could not send a text (a lone surrogate)
        raise LedgerError(unencodable(where, exc)) from None


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's checkout check without a round trip in the common case: an idle
    connection has nothing to read unless the server closed it (it sends a FATAL message
    and EOF on shutdown, restart, or pg_terminate_backend) or sent a notice; only then
    is it probed with an empty query, which raises when it is broken."""
    if _readable(conn.fileno()):
        ConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    """Whether ``fd`` has something to read, at once. poll(), not select(): select()
    refuses a descriptor numbered 1024 or more, which a process holding many files gets
    for its new connections; the pool took that refusal for a broken connection and
    never handed one out ("no database connection available")."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # Windows: no poll(), no such limit
    return bool(readable)


class PgUrl(NamedTuple):
    """A PostgreSQL ledger URL taken apart: what libpq gets, and crashproof's own
    parameters, which libpq would refuse."""

    conninfo: str  # without schema=, pool_size= and witness_url=
    schema: str | None  # ?schema=NAME
    display: str  # the URL without its password and query, for messages
    pool_size: int | None  # ?pool_size=N: the store's connections (default 4)
    # ?witness_url=URL (percent-encoded): the server of the ledger's generation witness,
    # when not the ledger's own (runtime/driving/urls.py, default_witness)
    witness_url: str | None = None


_OURS = ("schema", "pool_size", "witness_url")


def parse_url(url: str) -> PgUrl:
    """Take a ``postgresql://`` URL apart (PgUrl); a bad ``pool_size`` or a
    ``witness_url`` that is not a PostgreSQL URL is refused."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {parts.scheme}://...")
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), None)
    pool = next((v for k, v in query if k == "pool_size"), None)
    rest = urlencode([(k, v) for k, v in query if k not in _OURS])
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    display = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    pool_size = None
    if pool is not None:
        if not pool.isdecimal() or not 1 <= int(pool) <= 1000:
            raise ValueError(
                f"{display}: pool_size must be a whole number of connections from 1 to "
                f"1000, not {pool!r}; nothing was opened"
            )
        pool_size = int(pool)
    witness_url = next((v for k, v in query if k == "witness_url"), None)
    if witness_url is not None and not witness_url.startswith(("postgresql://", "postgres://")):
        raise ValueError(
            f"{display}: witness_url must be a postgresql:// URL (percent-encoded in the "
            f"ledger URL), not {witness_url.split('://', 1)[0]!r}...; nothing was opened"
        )
    conninfo = urlunsplit((*parts[:3], rest, parts.fragment))
    return PgUrl(conninfo, schema, display, pool_size, witness_url)


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
