"""A zygote for the SQL tool's crash matrix: for each line ``LEDGER ENGINE TARGET DIR HOW``
it forks a child that applies the migrations of ``DIR`` and one ``Sql`` act to the
database ``TARGET`` (a SQLite file, or a PostgreSQL URL), dying by SIGKILL as ``HOW``
says: ``point=NAME`` at that crash point, ``delay=SECONDS`` after that long (a timer
thread), ``none`` never. The workflow is imported by the test too, to resume the run."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import threading
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


def child(ledger: str, engine: str, target: str, directory: str, how: str) -> None:
    kind, _, value = how.partition("=")
    points = None
    if kind == "point":
        points = cp.CrashPoints(match=value, action="sigkill")
    elif kind == "delay":
        timer = threading.Timer(float(value), os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()
    with cp.Ledger(ledger, crash_points=points) as runs:
        runs.run(migrate, run_id="A", engine=engine, target=target, directory=directory)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared zygote
    from zygote import serve

    serve(child)
