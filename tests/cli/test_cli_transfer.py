"""`crashproof export` moves a run (the source refuses it from then on, a second export
writes the same checkpoint); `export --copy` writes nothing and its import stays frozen
until a signed decision."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cli.conftest import Result
from crashproof.cli.exitcodes import ExitCode
from crashproof.integrity import checkpoint

Cli = Callable[..., Result]


def interrupted(cli: Cli, project: Path, run_id: str) -> str:
    """A run of flows:flaky stopped before its end (resumable once ready.txt exists)."""
    db = f"sqlite:///{project / 'a.db'}"
    assert cli("run", "flows:flaky", "--run-id", run_id, "--db", db).code == 6
    return db


def test_export_moves_the_run_and_the_source_refuses_it(cli: Cli, project: Path) -> None:
    db = interrupted(cli, project, "m1")
    moved = cli("export", "m1", "--out", "m1.json", "--by", "alice", "--db", db)
    assert moved.code == ExitCode.OK, moved.err
    digest = checkpoint.digest(json.loads((project / "m1.json").read_bytes()))
    assert "run 'm1' moved out at generation" in moved.err
    assert digest in moved.err
    assert "this ledger no longer runs it" in moved.err

    (project / "ready.txt").write_text("")
    calls = (project / "calls.log").read_text()
    refused = cli("resume", "m1", "--app", "flows", "--db", db)
    assert refused.code == ExitCode.CONFLICT
    assert "run 'm1' was exported at generation" in refused.err
    assert f"(checkpoint {digest})" in refused.err
    assert "by alice" in refused.err
    assert "resume` it there" in refused.err
    assert cli("run", "flows:flaky", "--run-id", "m1", "--db", db).code == ExitCode.CONFLICT
    assert (project / "calls.log").read_text() == calls, "the source ran something"
    assert cli("show", "m1", "--json", "--db", db).json()["status"] == "moved"

    again = cli("export", "m1", "--db", db)  # to stdout: the very same checkpoint
    assert again.code == ExitCode.OK
    assert again.out.encode() == (project / "m1.json").read_bytes()
    exists = cli("export", "m1", "--out", "m1.json", "--db", db)
    assert exists.code == ExitCode.USAGE
    assert "writes the same checkpoint" in exists.err

    other = f"sqlite:///{project / 'b.db'}"
    preview = cli("import", "m1.json", "--preview", "--db", other)
    assert "a move (the run's one continuation)" in preview.out
    assert "the run would be running here" in preview.out
    imported = cli("import", "m1.json", "--by", "bob", "--db", other)
    assert imported.code == ExitCode.OK, imported.err
    assert imported.err.rstrip().endswith(": running")
    done = cli("resume", "m1", "--app", "flows", "--db", other)
    assert done.code == ExitCode.OK, done.err
    assert (project / "calls.log").read_text() == calls, "a recorded step ran again"


def test_export_copy_writes_nothing_and_its_import_is_frozen(cli: Cli, project: Path) -> None:
    db = interrupted(cli, project, "c1")
    before = cli("show", "c1", "--json", "--db", db).json()
    copied = cli("export", "c1", "--copy", "--out", "c1.json", "--db", db)
    assert copied.code == ExitCode.OK, copied.err
    assert "a copy at generation" in copied.err
    assert "nothing was written" in copied.err
    assert cli("show", "c1", "--json", "--db", db).json() == before

    other = f"sqlite:///{project / 'b.db'}"
    preview = cli("import", "c1.json", "--preview", "--db", other)
    assert "a copy (the source may have gone on)" in preview.out
    assert "the run would be needs_review here" in preview.out
    imported = cli("import", "c1.json", "--by", "bob", "--db", other)
    assert imported.code == ExitCode.OK, imported.err
    assert "frozen: imported from a copy" in imported.err
    assert "crashproof review decide CASE continue" in imported.err
    (project / "ready.txt").write_text("")
    frozen = cli("resume", "c1", "--app", "flows", "--db", other)
    assert frozen.code == ExitCode.RUN_FROZEN
    (case,) = cli("review", "list", "c1", "--json", "--db", other).json()
    assert case["decisions"] == ["continue", "abort"]

    cli("approvers", "keygen", "rita.pem")
    cli("approvers", "add", "rita", "rita.pem.pub", "--db", other)
    go = cli("review", "decide", case["case_id"], "continue", "--key", "rita.pem", "--db", other)
    assert go.code == ExitCode.OK, go.err
    assert "now running" in go.err
    assert cli("resume", "c1", "--app", "flows", "--db", other).code == ExitCode.OK
    # The source was never moved: it still runs its own copy of the run.
    assert cli("resume", "c1", "--app", "flows", "--db", db).code == ExitCode.OK
