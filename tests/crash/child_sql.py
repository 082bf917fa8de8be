"""A zygote for the SQL tool's crash matrix: for each line ``LEDGER ENGINE TARGET DIR HOW``
it forks a child that applies the migrations of ``DIR`` and one ``Sql`` act to the
database ``TARGET`` (a SQLite file, or a PostgreSQL URL), dying by SIGKILL as ``HOW``
says: ``point=NAME`` at that crash point, ``delay=SECONDS:TRACE`` that long after the
first migration's transaction began (a timer thread), ``measure=TRACE`` never, ``none``
never. ``TRACE``: a file where each crash point passed is appended with its time. The
test imports the workflow too, to resume the run."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.tools.migrations import Migrations
from crashproof.tools.sql import Sql


def connect(engine: str, target: str) -> Any:
    if engine == "sqlite":
        return sqlite3.connect(target)
    import psycopg

    return psycopg.connect(target)


@cp.workflow("sql-migrate", version="1")
def migrate(ctx: cp.Context, engine: str, target: str, directory: str) -> list[int]:
    conn = connect(engine, target)
    try:
        applied = Migrations(conn, directory).apply(ctx)
        logged = ctx.act("log", Sql(conn), sql="INSERT INTO items (label) VALUES ('act')")
    finally:
        conn.close()
    return [r["rows_affected"] for r in applied] + [logged["rows_affected"]]


# Random kills are timed from here: the first migration's transaction has begun.
START = "inside[act:migrate:0001_init.sql:begun]"


class Trace(cp.CrashPoints):
    """Crash points that also append each point passed, with its time since ``START``, to
    a file (``os.write``: in the file before a SIGKILL can take it), so the test knows
    where a random kill landed."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.began: float | None = None

    def hit(self, point: str) -> None:
        if point == START:
            self.began = time.monotonic()
        since = -1.0 if self.began is None else time.monotonic() - self.began
        os.write(self.fd, f"{since:.6f} {point}\n".encode())
        super().hit(point)


def child(ledger: str, engine: str, target: str, directory: str, how: str) -> None:
    kind, _, value = how.partition("=")
    points = None
    if kind == "point":
        points = cp.CrashPoints(match=value, action="sigkill")
    elif kind == "delay":  # delay=SECONDS:TRACE
        seconds, _, trace = value.partition(":")
        timer = threading.Timer(float(seconds), os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        points = Trace(trace, match=START, action=lambda _: timer.start())
    elif kind == "measure":  # measure=TRACE: no kill, the points' times
        points = Trace(value)
    with cp.Ledger(ledger, crash_points=points) as runs:
        runs.run(migrate, run_id="A", engine=engine, target=target, directory=directory)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared zygote
    from zygote import serve

    serve(child)
