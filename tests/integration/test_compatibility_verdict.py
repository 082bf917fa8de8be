"""#28 item 7: a resume under a changed workflow version, ledger schema or tool contract
records a compatibility verdict first; the run goes on only when it is ``resumable``.

On the old main none of this existed: a changed version resumed without any verdict (or
froze on the first mismatch under the new drive's lease), and a tool contract mapping was
reported but could never be applied.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.cli import main
from crashproof.journal.records import Event, EventType
from crashproof.runtime.operations.audit import run_timeline
from crashproof.runtime.replayer.verdict import apply_mappings


class Mailer(cp.Tool):
    """Sends one message per operation id; remembers what it holds, so lookup is real."""

    name = "mailer"
    version = "1"
    sent: ClassVar[dict[str, dict[str, Any]]] = {}
    executed: ClassVar[list[str]] = []

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.executed.append(call.operation_id)
        held = self.sent.setdefault(
            call.operation_id, {"digest": call.intent_digest, "params": dict(call.params)}
        )
        return cp.Receipt(f"m-{call.operation_id}", {"ok": True}, intent_digest=held["digest"])

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        held = self.sent.get(call.operation_id)
        if held is None:
            return None
        return cp.Receipt(f"m-{call.operation_id}", {"ok": True}, intent_digest=held["digest"])


class MailerV2(Mailer):
    """Contract 2 renamed ``to`` into ``recipient``, and declares the mapping."""

    version = "2"
    contract_mappings: ClassVar[Any] = {"1": lambda p: {"recipient": p["to"]}}


class MailerV2Unmapped(Mailer):
    version = "2"


ran: list[str] = []


def make(version: str, tool: cp.Tool, *, arg: int = 1, old: bool = True) -> Any:
    @cp.workflow("mail", version=version, compatible_with=["1"] if version != "1" else [])
    def flow(ctx: cp.Context, who: str) -> list[Any]:
        a = ctx.step("a", lambda n: ran.append("a") or n, arg)
        params = {"to": who} if tool.version == "1" else {"recipient": who}
        sent = ctx.act("send", tool, **params)
        b = ctx.step("b", lambda: ran.append("b") or 2)
        return [a, sent, b]

    return flow


@pytest.fixture(autouse=True)
def fresh() -> None:
    Mailer.sent.clear()
    Mailer.executed.clear()
    ran.clear()


def crashed(path: Path) -> None:
    """Run ``mail`` v1 until it crashes after the act's receipt, before step b."""
    points = cp.CrashPoints(match="after_commit[step_done:send]")
    ledger = cp.Ledger(f"sqlite:///{path}", crash_points=points)
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(make("1", Mailer()), run_id="r", who="ann")
    ledger.close()
    ran.clear()


def records(ledger: cp.Ledger, type_: EventType) -> list[Any]:
    return [e for e in ledger.journal("r") if e.type is type_]


def test_a_changed_workflow_version_records_a_resumable_verdict_first(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    crashed(path)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("2", Mailer()))
        assert ledger.resume("r") == [1, {"ok": True}, 2]
        events = ledger.journal("r")
    verdicts = [e for e in events if e.type is EventType.COMPATIBILITY_VERDICT]
    assert len(verdicts) == 1
    v = verdicts[0].payload
    assert v["decision"] == "resumable"
    assert v["changed"] == {"workflow": ["1", "2"]}
    assert v["replay"]["status"] == "compatible"
    assert v["unresolved"] == []
    assert v["versions"]["tools"] == {"mailer": "1"}
    # The verdict is the new drive's first record: it carries the session and its lease.
    assert v["session"]["workflow_version"] == "2"
    assert v["session"]["lease"]["token"] == 2
    after = events[verdicts[0].seq + 1 :]
    assert all("session" not in e.payload for e in after)
    assert Mailer.executed == ["r/send"]  # the act was not executed again
    # The next drive under the same code has nothing new to judge.
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("2", Mailer()))
        ledger.resume("r")
        assert len(records(ledger, EventType.COMPATIBILITY_VERDICT)) == 1


def test_an_unchanged_version_records_no_verdict(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    crashed(path)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("1", Mailer()))
        ledger.resume("r")
        assert records(ledger, EventType.COMPATIBILITY_VERDICT) == []
        # The session names the schema the drive ran on (the next gate compares it).
        sessions = [e.payload["session"] for e in ledger.journal("r") if "session" in e.payload]
        assert sessions[-1]["schema"] == ledger.store.schema_version()


def test_a_verdict_that_fails_freezes_without_a_drive_lease(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    crashed(path)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("2", Mailer(), arg=5))  # v2 changed step a's argument
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger.resume("r")
        assert frozen.value.status == "needs_review"
        evidence = frozen.value.evidence or {}
        verdict = evidence["compatibility_verdict"]
        assert verdict["decision"] == "needs_review"
        assert verdict["replay"]["status"] == "non_deterministic"
        assert verdict["unresolved"][0].startswith("the replay check: non-deterministic at step 1")
        events = ledger.journal("r")
        assert [e.type for e in events[-2:]] == [
            EventType.COMPATIBILITY_VERDICT,
            EventType.RUN_FROZEN,
        ]
        # No drive started: no session (no lease receipt) after the crash's drive, no
        # step body and no tool ran.
        assert ["session" in e.payload for e in events].count(True) == 1
        assert ran == []
        assert Mailer.executed == ["r/send"]
        assert ledger.get_run("r").status is cp.RunStatus.NEEDS_REVIEW
        # A later resume answers the freeze from the journal: nothing more is written.
        with pytest.raises(cp.RunFrozen):
            ledger.resume("r")
        assert len(ledger.journal("r")) == len(events)


def test_a_refused_verdict_is_judged_again_once_the_code_is_fixed(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    crashed(path)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("2", Mailer(), arg=5))
        with pytest.raises(cp.RunFrozen):
            ledger.resume("r")
        # Still broken: judged again, still refused, nothing written.
        before = len(ledger.journal("r"))
        again = apply_mappings(ledger, ledger.workflows, preview=False, by="ops")
        assert [(e["applied"], e["verdict"]["decision"]) for e in again] == [
            (False, "needs_review")
        ]
        assert len(ledger.journal("r")) == before
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("2", Mailer()))  # v2 fixed: it replays the run's history
        fixed = apply_mappings(ledger, ledger.workflows, preview=False, by="ops")
        assert [(e["applied"], e["thawed"], e["verdict"]["decision"]) for e in fixed] == [
            (True, True, "resumable")
        ]
        assert fixed[0]["verdict"]["changed"] == {"workflow": ["1", "2"]}
        assert ledger.resume("r") == [1, {"ok": True}, 2]
        assert len(records(ledger, EventType.COMPATIBILITY_VERDICT)) == 2  # no third
    assert Mailer.executed == ["r/send"]


def test_the_timeline_shows_the_verdict(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "runs.db"
    crashed(path)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("2", Mailer()))
        ledger.resume("r")
    assert main(["show", "r", "--timeline", "--json", "--db", f"sqlite:///{path}"]) == 0
    timeline = json.loads(capsys.readouterr().out)["timeline"]
    entries = [e for e in timeline if e["type"] == "compatibility_verdict"]
    assert len(entries) == 1
    assert (
        "compatibility verdict resumable: workflow 1 -> 2; replay compatible"
        in (entries[0]["summary"])
    )
    assert entries[0]["workflow_version"] == "2"


def test_a_mapped_contract_change_is_previewed_then_applied(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    crashed(path)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("1", MailerV2()))
        with pytest.raises(cp.RunFrozen):  # the contract changed: the act's intent differs
            ledger.resume("r")
        previewed = apply_mappings(ledger, ledger.workflows, preview=True)
        assert [(p["run_id"], p["applied"], p["thawed"]) for p in previewed] == [("r", False, True)]
        verdict = previewed[0]["verdict"]
        assert verdict["decision"] == "resumable"
        assert verdict["changed"] == {"tools": {"mailer": ["1", "2"]}}
        assert [(m["key"], m["from_version"], m["to_version"]) for m in verdict["mapped"]] == [
            ("send", "1", "2")
        ]
        assert ledger.get_run("r").status is cp.RunStatus.NEEDS_REVIEW  # the preview wrote nothing
        applied = apply_mappings(ledger, ledger.workflows, preview=False, by="ops")
        assert [(p["applied"], p["thawed"]) for p in applied] == [(True, True)]
        assert ledger.resume("r") == [1, {"ok": True}, 2]
        assert Mailer.executed == ["r/send"]  # mapped, never executed again
        assert apply_mappings(ledger, ledger.workflows, preview=True) == []  # applied once
        summary = [e for e in run_timeline(ledger, "r") if e["type"] == "compatibility_verdict"]
        assert summary[0]["operator"]["by"] == "ops"
        assert "1 act(s) mapped to a new tool contract" in summary[0]["summary"]


def test_an_unmapped_contract_change_cannot_be_applied(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    crashed(path)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("1", MailerV2Unmapped()))
        with pytest.raises(cp.RunFrozen):
            ledger.resume("r")
        assert apply_mappings(ledger, ledger.workflows, preview=False) == []
        assert ledger.get_run("r").status is cp.RunStatus.NEEDS_REVIEW


def test_a_version_change_with_an_unapplied_mapping_waits_for_it(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    crashed(path)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("2", MailerV2()))
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger.resume("r")
        verdict = (frozen.value.evidence or {})["compatibility_verdict"]
        assert verdict["changed"] == {"workflow": ["1", "2"], "tools": {"mailer": ["1", "2"]}}
        assert "explained by its declared mapping but not applied" in verdict["unresolved"][0]
        assert Mailer.executed == ["r/send"]
        applied = apply_mappings(ledger, ledger.workflows, preview=False, by="ops")
        assert [(p["applied"], p["thawed"]) for p in applied] == [(True, True)]
        assert ledger.resume("r") == [1, {"ok": True}, 2]
        assert Mailer.executed == ["r/send"]


def test_a_changed_schema_records_its_value_maps_and_defaults(tmp_path: Path) -> None:
    # As a ledger at schema 2 would have left the run: its last judged drive ran on
    # schema 2. Resuming on this crashproof's schema judges the change first, listing
    # what the migrations since declared (schema 3 added the lease columns).
    path = tmp_path / "runs.db"
    crashed(path)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        seq = len(ledger.journal("r"))
        earlier = {"decision": "resumable", "versions": {"workflow": "1", "schema": 2}}
        ledger.append_records(
            [Event("r", seq, EventType.COMPATIBILITY_VERDICT, None, earlier, time.time())], None
        )
        ledger.register(make("1", Mailer()))
        assert ledger.resume("r") == [1, {"ok": True}, 2]
        verdict = records(ledger, EventType.COMPATIBILITY_VERDICT)[-1].payload
        schema = ledger.store.schema_version()
    assert verdict["decision"] == "resumable"
    assert verdict["changed"] == {"schema": [2, schema]}
    assert "runs.fencing_token = 0" in verdict["defaults"]
    assert verdict["value_maps"] == []
    assert verdict["versions"]["schema"] == schema


def test_an_applied_mapping_travels_with_a_moved_run(tmp_path: Path) -> None:
    crashed(tmp_path / "a.db")
    with cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}") as ledger:
        ledger.register(make("1", MailerV2()))
        with pytest.raises(cp.RunFrozen):
            ledger.resume("r")
        apply_mappings(ledger, ledger.workflows, preview=False, by="ops")
        document = ledger.export_run("r", by="ops")
    with cp.Ledger(f"sqlite:///{tmp_path / 'b.db'}") as other:
        other.import_run(document, by="ops")
        other.register(make("1", MailerV2()))
        assert other.resume("r") == [1, {"ok": True}, 2]
    assert Mailer.executed == ["r/send"]


def test_a_verdict_on_postgresql(pg_url: str) -> None:
    points = cp.CrashPoints(match="after_commit[step_done:send]")
    crashing = cp.Ledger(pg_url, crash_points=points)
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(make("1", Mailer()), run_id="r", who="ann")
    crashing.close()
    with cp.Ledger(pg_url) as ledger:
        ledger.register(make("2", Mailer(), arg=5))
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger.resume("r")
        verdict = (frozen.value.evidence or {})["compatibility_verdict"]
        assert verdict["versions"]["schema"] == ledger.store.schema_version()
        assert records(ledger, EventType.COMPATIBILITY_VERDICT)[0].payload == verdict
    assert Mailer.executed == ["r/send"]


@pytest.mark.parametrize("side", ["before_commit", "after_commit"])
def test_a_crash_around_the_verdict_judges_once_and_runs_once(tmp_path: Path, side: str) -> None:
    path = tmp_path / "runs.db"
    crashed(path)
    points = cp.CrashPoints(match=f"{side}[compatibility_verdict]")
    ledger = cp.Ledger(f"sqlite:///{path}", crash_points=points)
    ledger.register(make("2", Mailer()))
    with pytest.raises(cp.SimulatedCrash):
        ledger.resume("r")
    ledger.close()
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.register(make("2", Mailer()))
        assert ledger.resume("r") == [1, {"ok": True}, 2]
        assert len(records(ledger, EventType.COMPATIBILITY_VERDICT)) == 1
    assert Mailer.executed == ["r/send"]
    assert ran == ["b"]
