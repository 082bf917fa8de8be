"""A throwaway PostgreSQL server for the tests: initdb + pg_ctl in a temp dir.

The server listens on 127.0.0.1 only, on a free port, with its unix socket inside the temp
dir, and requires a password over TCP (so a wrong password can be tested). PostgreSQL
refuses to run as root: when the tests run as root (CI), the server runs as the
``postgres`` system user, in a directory handed over to it.

Binaries are looked up in ``$CRASHPROOF_PG_BINDIR``, then on PATH, then in
``/usr/lib/postgresql/*/bin`` (Debian), newest first. ``.ci/run`` installs them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

__all__ = ["PASSWORD", "PostgresServer", "find_bindir", "free_port", "require_bindir"]

PASSWORD = "crashproof-test-pw"  # a test-only cluster on 127.0.0.1, torn down after


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None."""
    candidates = []
    if os.environ.get("CRASHPROOF_PG_BINDIR"):
        candidates.append(Path(os.environ["CRASHPROOF_PG_BINDIR"]))
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = [p for p in debian.iterdir() if p.name.isdigit()]
        candidates += [p / "bin" for p in sorted(versions, key=lambda p: -int(p.name))]
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    return None


def require_bindir() -> Path:
    """The binaries, or: fail in CI (where .ci/run must have installed them), skip locally."""
    bindir = find_bindir()
    if bindir is None:
        reason = (
            "PostgreSQL server binaries (initdb, pg_ctl) not found: install the `postgresql` "
            "package (as .ci/run does) or set CRASHPROOF_PG_BINDIR"
        )
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return bindir


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PostgresServer:
    """One PostgreSQL cluster for a test session; a fresh database per test."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self._as_postgres = os.geteuid() == 0
        # /tmp, not $TMPDIR: the postgres user must be able to reach the directory.
        self.root = Path(
            tempfile.mkdtemp(prefix="crashproof-pg-", dir="/tmp" if self._as_postgres else None)
        )
        self.data = self.root / "data"
        self.port = 0
        self._names = itertools.count(1)
        self._admin: psycopg.Connection[tuple[object, ...]] | None = None
        self._conns: dict[str, psycopg.Connection[tuple[object, ...]]] = {}
        self._creator = ThreadPoolExecutor(1, thread_name_prefix="pg-create-database")
        self._next: Future[str] | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",  # initdb's own final sync only; the server runs with fsync=on
        )
        for _attempt in range(3):  # a free port may be taken between probe and bind
            self.port = free_port()
            started = self._launch()
            if started.returncode == 0:
                break
        else:
            log = (self.root / "log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"PostgreSQL did not start: {started.stderr}\n{log}")
        self._admin = psycopg.connect(self.url("postgres"), autocommit=True)

    def _launch(self) -> subprocess.CompletedProcess[str]:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.root} -c fsync=on -c max_connections=200"
        )
        return self._run(
            "pg_ctl",
            *("-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "60"),
            *("-o", options, "start"),
            check=False,
        )

    def crash(self) -> None:
        """Stop the server as a crash would (``pg_ctl stop -m immediate``: no shutdown
        checkpoint; its clients' connections drop mid-statement). ``restart`` after."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        if self._next is not None:
            with contextlib.suppress(Exception):
                self._next.result()
            self._next = None
        self._creator.shutdown(wait=True)
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if (self.data / "postmaster.pid").exists():
            # "immediate", not "fast": the cluster is deleted next, and a fast shutdown's
            # checkpoint would first write and fsync every test database (about 0.1 s
            # each: several seconds per session, measured) only to throw them away.
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def restart(self, mode: str | None = None, down: float = 0.0) -> None:
        """Start the server again on the same port (after ``crash``: it runs crash
        recovery). With ``mode``, stop it first (``pg_ctl stop -m fast|immediate``: a
        clean shutdown, or a crash that recovers from the WAL on start) and stay down
        ``down`` seconds. Clients' connections are broken; they must reconnect."""
        if mode is not None:
            if mode not in ("fast", "immediate"):
                raise ValueError(f"mode must be fast or immediate, not {mode!r}")
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
            time.sleep(down)
        started = self._launch()
        if started.returncode != 0:
            log = (self.root / "log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"PostgreSQL did not restart: {started.stderr}\n{log}")
        if mode is None:
            self._admin = psycopg.connect(self.url("postgres"), autocommit=True)

    # -- databases -------------------------------------------------------------

    def url(self, database: str, *, password: str = PASSWORD) -> str:
        return f"postgresql://postgres:{password}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """The URL of a new, empty database.

        The next one is created in the background meanwhile: CREATE DATABASE costs about
        0.3 s of server CPU on a small machine, which then overlaps with the test."""
        if self._next is None:
            self._next = self._creator.submit(self._create)
        url = self._next.result()
        self._next = self._creator.submit(self._create)
        return url

    def _create(self) -> str:
        name = f"t{next(self._names)}"
        self.admin().execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def query(self, url: str, sql: str) -> list[tuple[object, ...]]:
        """Rows of ``sql`` run on the database of ``url``, through a connection of its own
        (kept open for the session): it sees what was committed, nothing else."""
        conn = self._conns.get(url)
        if conn is None:
            conn = self._conns[url] = psycopg.connect(url, autocommit=True)
        cur = conn.execute(sql.encode())
        return cur.fetchall() if cur.description is not None else []

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._admin is None:
            raise RuntimeError("the PostgreSQL test server is not running")
        return self._admin

    # -- internals -------------------------------------------------------------

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}")
        return done
