"""`crashproof runs --version`, `replay` and `migrate` from the command line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import crashproof as cp

Cli = Callable[..., Any]

V1 = """
import crashproof as cp

@cp.workflow("deploy", version="1")
def deploy(ctx, target: str):
    built = ctx.step("build", lambda t: f"built {t}", target)
    return ctx.step("ship", lambda b: f"shipped {b}", built)
"""

V2_CHANGED = """
import crashproof as cp

@cp.workflow("deploy", version="1")
def deploy(ctx, target: str):
    built = ctx.step("build", lambda t: f"built {t}", target.upper())
    return ctx.step("ship", lambda b: f"shipped {b}", built)
"""

V2_NEW = """
import crashproof as cp

@cp.workflow("deploy", version="2")
def deploy(ctx, target: str):
    return ctx.step("build", lambda t: f"built {t}", target)
"""


def crashed(url: str, wf: cp.Workflow[Any], run_id: str) -> None:
    ledger = cp.Ledger(url, crash_points=cp.CrashPoints(match="after_commit[step_done:build]"))
    try:
        ledger.run(wf, run_id=run_id, target=run_id)
    except cp.SimulatedCrash:
        pass
    finally:
        ledger.close()


def workflow(source: str) -> cp.Workflow[Any]:
    scope: dict[str, Any] = {}
    exec(compile(source, "<flows>", "exec"), scope)
    return scope["deploy"]  # type: ignore[no-any-return]


def test_runs_version_counts_runs_in_flight_per_version(project: Path, cli: Cli) -> None:
    url = f"sqlite:///{project / 'l.db'}"
    crashed(url, workflow(V1), "a")
    crashed(url, workflow(V1), "b")
    crashed(url, workflow(V2_NEW), "c")
    with cp.Ledger(url) as ledger:
        ledger.run(workflow(V1), run_id="done", target="x")  # ended: not in flight
    shown = cli("runs", "--version", "--db", url)
    assert shown.code == 0
    lines = [line for line in shown.out.splitlines() if "deploy" in line]
    assert len(lines) == 2
    assert "│ 1 " in lines[0]
    assert "│ 2 " in lines[0]
    assert "running 2" in lines[0]
    assert "│ 2 " in lines[1]
    assert "running 1" in lines[1]
    data = cli("runs", "--version", "--json", "--db", url).json()
    assert [(g["version"], g["runs"], g["run_ids"]) for g in data] == [
        ("1", 2, ["a", "b"]),
        ("2", 1, ["c"]),
    ]


def test_runs_version_with_nothing_in_flight(project: Path, cli: Cli) -> None:
    url = f"sqlite:///{project / 'l.db'}"
    with cp.Ledger(url) as ledger:
        ledger.run(workflow(V1), run_id="done", target="x")
    shown = cli("runs", "--version", "--db", url)
    assert "every workflow version can be retired" in shown.out


def test_replay_exit_codes_json_and_one_run(project: Path, cli: Cli) -> None:
    url = f"sqlite:///{project / 'l.db'}"
    crashed(url, workflow(V1), "a")
    with cp.Ledger(url) as ledger:
        ledger.run(workflow(V1), run_id="done", target="x")
    (project / "flows_v1.py").write_text(V1)
    (project / "flows_changed.py").write_text(V2_CHANGED)
    ok = cli("replay", "flows_v1", "--from", url)
    assert ok.code == 0
    assert "a (deploy@1): compatible" in ok.out
    bad = cli("replay", "flows_changed", "--from", url, "--json")
    assert bad.code == 4
    assert [(v["run_id"], v["status"], v["step"]) for v in bad.json()] == [
        ("a", "non_deterministic", 1),
        ("done", "non_deterministic", 1),
    ]
    one = cli("replay", "flows_v1", "--from", url, "--run", "done", "--json")
    assert [v["run_id"] for v in one.json()] == ["done"]
    missing = cli("replay", "flows_v1", "--from", url, "--run", "nope")
    assert missing.code != 0
    assert "no run 'nope'" in missing.err


def test_migrate_refuses_what_it_cannot_migrate(project: Path, cli: Cli) -> None:
    memory = cli("migrate", "--db", "memory://", "--preview")
    assert memory.code == 2
    assert "SQLite and PostgreSQL" in memory.err
    missing = cli("migrate", "--db", f"sqlite:///{project / 'none.db'}", "--preview")
    assert missing.code == 5
    assert not (project / "none.db").exists()
    url = f"sqlite:///{project / 'l.db'}"
    with cp.Ledger(url) as ledger:
        ledger.run(workflow(V1), run_id="done", target="x")
    current = cli("migrate", "--db", url, "--json")
    assert current.code == 0
    assert current.json()["unresolved"] == []
    assert current.json()["migrations"] == []


MAILER = """
import json
import pathlib

import crashproof as cp

HELD = pathlib.Path("held.json")


class Mailer(cp.Tool):
    name = "mailer"
    version = "{version}"
    contract_mappings = {mappings}

    def execute(self, call):
        held = json.loads(HELD.read_text()) if HELD.exists() else {{}}
        held.setdefault(call.operation_id, call.intent_digest)
        HELD.write_text(json.dumps(held))
        return self.lookup(call)

    def lookup(self, call):
        held = json.loads(HELD.read_text()) if HELD.exists() else {{}}
        if call.operation_id not in held:
            return None
        return cp.Receipt("m-" + call.operation_id, {{"ok": True}}, held[call.operation_id])


@cp.workflow("mail", version="1")
def mail(ctx, who: str):
    sent = ctx.act("send", Mailer(), **{{"{param}": who}})
    return ctx.step("after", lambda s: [s, len(HELD.read_text())], sent)
"""


def test_migrate_previews_then_applies_a_contract_mapping(project: Path, cli: Cli) -> None:
    # #28 item 7: `crashproof replay` reported that the declared mapping explains the
    # change, but nothing could apply it: the run stayed frozen for good.
    url = f"sqlite:///{project / 'l.db'}"
    v1 = MAILER.format(version="1", mappings="{}", param="to")
    v2 = MAILER.format(
        version="2", mappings='{"1": lambda p: {"recipient": p["to"]}}', param="recipient"
    )
    (project / "mail_v2.py").write_text(v2)
    scope: dict[str, Any] = {}
    exec(compile(v1, "<mail_v1>", "exec"), scope)
    ledger = cp.Ledger(url, crash_points=cp.CrashPoints(match="after_commit[step_done:send]"))
    try:
        ledger.run(scope["mail"], run_id="m", who="ann")
    except cp.SimulatedCrash:
        pass
    finally:
        ledger.close()
    held = (project / "held.json").read_text()
    frozen = cli("resume", "m", "--app", "mail_v2", "--db", url)
    assert frozen.code != 0  # the act's intent differs under contract 2
    preview = cli("migrate", "--db", url, "--app", "mail_v2", "--preview")
    assert preview.code == 0
    assert "run m: map act(s) 'send' (mailer 1 -> 2): would be applied" in preview.out
    assert cli("show", "m", "--json", "--db", url).json()["status"] == "needs_review"
    applied = cli("migrate", "--db", url, "--app", "mail_v2", "--json")
    assert applied.code == 0
    contracts = applied.json()["contracts"]
    assert [(c["run_id"], c["applied"], c["thawed"]) for c in contracts] == [("m", True, True)]
    resumed = cli("resume", "m", "--app", "mail_v2", "--db", url, "--json")
    assert resumed.code == 0, resumed.err
    assert (project / "held.json").read_text() == held  # the message was not sent again
    again = cli("migrate", "--db", url, "--app", "mail_v2")
    assert "no run in flight has an act to map or a verdict to revisit" in again.out
