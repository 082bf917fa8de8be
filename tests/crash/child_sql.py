"""A zygote for the SQL tool's crash matrix: for each line ``LEDGER ENGINE TARGET DIR HOW``
it forks a child that applies the migrations of ``DIR`` and one ``Sql`` act to the
database ``TARGET`` (a SQLite file, or a PostgreSQL URL), dying by SIGKILL as ``HOW``
says: ``point=NAME`` at that crash point, ``delay=SECONDS`` that long after the first
migration's transaction began (a timer thread), ``measure=FILE`` never (writing how long
the acts took from that moment to FILE), ``none`` never. The test imports the workflow
too, to resume the run."""

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


def child(ledger: str, engine: str, target: str, directory: str, how: str) -> None:
    kind, _, value = how.partition("=")
    points = None
    began: list[float] = []
    if kind == "point":
        points = cp.CrashPoints(match=value, action="sigkill")
    elif kind == "delay":
        timer = threading.Timer(float(value), os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        points = cp.CrashPoints(match=START, action=lambda _: timer.start())
    elif kind == "measure":  # how long the migrations take, for the delays' range
        points = cp.CrashPoints(match=START, action=lambda _: began.append(time.monotonic()))
    with cp.Ledger(ledger, crash_points=points) as runs:
        runs.run(migrate, run_id="A", engine=engine, target=target, directory=directory)
    if kind == "measure":
        Path(value).write_text(str(time.monotonic() - began[0]), encoding="utf-8")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared zygote
    from zygote import serve

    serve(child)
