"""Checkpoint format 2: the run header carries the policy binding, limits, budget used,
approvals and open review cases, all derived from the records and checked against them
on import; a format-1 checkpoint is migrated (previewed, then applied)."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.cli import main
from crashproof.integrity import checkpoint
from crashproof.integrity.keys import Keyring
from crashproof.integrity.signing import generate_keypair

KEY = "ab" * 32
RUN = "ship:1"
POLICY = cp.Policy(
    "ops-7",
    allow={"notes": "*"},
    identity="bot@example.com",
    risk={"notes": "high"},
    approval_required={"high"},
)
OPTIONS = cp.RunOptions(policy=POLICY, limits=cp.Limits(max_steps=40, max_cost=1.5))


class Notes(cp.Tool):
    """An idempotent in-process tool: one note per operation id."""

    name = "notes"
    version = "1"
    idempotent_execute = True
    sent: ClassVar[dict[str, dict[str, Any]]] = {}

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.sent.setdefault(call.operation_id, dict(call.params))
        return cp.Receipt(call.operation_id, {"title": call.params["title"]}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if call.operation_id not in self.sent:
            return None
        return cp.Receipt(
            call.operation_id, {"title": self.sent[call.operation_id]["title"]}, call.intent_digest
        )


NOTES = Notes()


def plan(topic: str) -> cp.Decision:
    return cp.Decision({"title": f"about {topic}"}, model="m", usage={"total_tokens": 7}, cost=0.25)


def shipping(topic: str) -> cp.Workflow[Any]:
    @cp.workflow("ship", version="1")
    def flow(ctx: cp.Context) -> Any:
        summary = ctx.step("summarize", str.upper, topic)
        choice = ctx.decide("plan", plan, summary)
        note = ctx.act("note", NOTES, title=choice["title"])
        return ctx.step("wrap", lambda: [summary, note])

    return flow


def ledger_at(path: Path, **kw: Any) -> cp.Ledger:
    ledger = cp.Ledger(f"sqlite:///{path}", key=KEY, **kw)
    ledger.register_policy(POLICY)
    return ledger


def rich_run(tmp_path: Path) -> Path:
    """Run RUN in a.db: bound to POLICY with limits; its act approved by alice and
    executed; a crash before 'wrap' commits; resumed by code whose first step changed,
    so it froze on a non-determinism: one open review case."""
    db = tmp_path / "a.db"
    generate_keypair(tmp_path / "alice.pem")
    with ledger_at(db) as ledger:
        with pytest.raises(cp.RunFrozen):
            ledger.run(shipping("ledgers"), run_id=RUN, options=OPTIONS)
        public = (tmp_path / "alice.pem.pub").read_text()
        ledger.add_approver("alice", public, by="root")
        ledger.approve(RUN, "note", key=tmp_path / "alice.pem", ttl=600, by="alice")
    crashing = ledger_at(db, crash_points=cp.CrashPoints(match="before_commit[step_done:wrap]"))
    crashing.register(shipping("ledgers"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.resume(RUN)
    crashing.close()
    with ledger_at(db) as ledger:
        ledger.register(shipping("journals"))
        with pytest.raises(cp.RunFrozen, match="non-determinism"):
            ledger.resume(RUN)
    return db


@pytest.fixture
def rich(tmp_path: Path) -> dict[str, Any]:
    with ledger_at(rich_run(tmp_path)) as ledger:
        document = ledger.export_run(RUN, copy=True)
        document["_cases"] = [c.to_json() for c in ledger.review_cases(RUN)]
    return document


def resign(document: dict[str, Any]) -> dict[str, Any]:
    return checkpoint.sign(
        {k: v for k, v in document.items() if k != "_cases"}, Keyring.from_hex(KEY)
    )


def as_version_1(document: dict[str, Any]) -> dict[str, Any]:
    """The same run as crashproof wrote format 1: no derived header fields."""
    old = copy.deepcopy({k: v for k, v in document.items() if k != "_cases"})
    old["schema_version"] = 1
    old.pop("requests", None)  # (format 5's: the requests kept beside the records)
    for name in checkpoint.DERIVED:
        del old["run"][name]
    return resign(old)


def refused(tmp_path: Path, document: dict[str, Any]) -> str:
    target = tmp_path / "b.db"
    with ledger_at(target) as ledger:
        with pytest.raises(cp.CheckpointRejected) as caught:
            ledger.import_run(document, by="alice")
        assert ledger.runs() == [], "a refused import wrote something"
    assert sqlite3.connect(target).execute("SELECT count(*) FROM events").fetchone() == (0,)
    return str(caught.value)


def test_export_writes_format_2_with_fields_derived_from_the_records(
    rich: dict[str, Any],
) -> None:
    run = rich["run"]
    assert (
        rich["schema_version"] == checkpoint.SCHEMA_VERSION == 5
    )  # its decision's request: format 5
    assert run["status"] == "needs_review"
    assert run["policy"] == POLICY.record()
    assert run["policy"]["identity"] == "bot@example.com"
    assert run["limits"] == OPTIONS.limits.to_json()  # type: ignore[union-attr]
    # summarize, plan (7 tokens, 0.25) and note were recorded; wrap crashed uncommitted.
    assert run["budget_used"] == {"steps": 3, "decisions": 1, "tokens": 7, "cost": 0.25}
    assert run["approvals"] == {"granted": 1, "consumed": 1}
    [case] = [c for c in rich["_cases"] if c["state"] == "open"]
    assert run["open_review_cases"] == [
        {
            "case_id": case["case_id"],
            "fingerprint": case["fingerprint"],
            "reason": case["reason"],
            "state": "open",
        }
    ]
    assert case["case_id"].startswith(f"{RUN}#")
    assert "non-determinism" in case["reason"]


def test_a_rebind_is_what_the_header_shows(tmp_path: Path) -> None:
    @cp.workflow("plain", version="1")
    def flow(ctx: cp.Context) -> str:
        ctx.step("a", str.upper, "x")
        return ctx.step("b", str.upper, "y")

    newer = cp.Policy("ops-8", allow={"notes": "*"})
    db = tmp_path / "p.db"
    crashing = ledger_at(db, crash_points=cp.CrashPoints(match="before_commit[step_done:b]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(flow, run_id="p", options=cp.RunOptions(policy=POLICY))
    crashing.close()
    with ledger_at(db) as ledger:
        ledger.register(flow)
        assert ledger.export_run("p", copy=True)["run"]["policy"]["version"] == "ops-7"
        ledger.resume("p", rebind_policy=newer, by="carol")
        assert ledger.export_run("p", copy=True)["run"]["policy"] == newer.record()


@pytest.mark.parametrize(
    ("field", "lie"),
    [
        ("policy", None),
        ("policy", {"version": "ops-6", "digest": "0" * 64, "identity": None}),
        ("limits", None),
        ("budget_used", {"steps": 2, "decisions": 1, "tokens": 7, "cost": 0.25}),
        ("budget_used", {"steps": 3, "decisions": 1, "tokens": 7, "cost": 0.5}),
        ("approvals", {"granted": 1, "consumed": 0}),
        ("open_review_cases", []),
    ],
)
def test_a_header_that_disagrees_with_its_records_is_refused_naming_the_field(
    tmp_path: Path, rich: dict[str, Any], field: str, lie: Any
) -> None:
    bad = copy.deepcopy(rich)
    bad["run"][field] = lie
    message = refused(tmp_path, resign(bad))
    assert f"run header field {field!r}" in message
    assert "disagrees with its own records" in message


@pytest.mark.parametrize("lie", ["succeeded", "running", "failed", "queued", "moved"])
@pytest.mark.parametrize("version", [1, 4])
def test_a_header_status_that_disagrees_with_its_records_is_refused(
    tmp_path: Path, rich: dict[str, Any], lie: str, version: int
) -> None:
    """#26 item 8: a key holder re-signs the run as succeeded (or running, to make a
    frozen run look runnable); the status is checked like every other header field."""
    bad = copy.deepcopy(rich)
    bad["run"]["status"] = lie
    document = as_version_1(bad) if version == 1 else resign(bad)
    message = refused(tmp_path, document)
    assert "run header field 'status' is " + repr(lie) in message
    assert "fold to 'needs_review'" in message


def test_an_enqueued_run_exports_as_running_and_imports(tmp_path: Path) -> None:
    """A run enqueued and never claimed: its one record folds to running, and so does the
    header export writes."""

    @cp.workflow("later", version="1")
    def later(ctx: cp.Context) -> str:
        return ctx.step("a", str.upper, "x")

    with ledger_at(tmp_path / "q.db") as ledger:
        ledger.register(later)
        ledger.enqueue(later, run_id="q")
        document = ledger.export_run("q", copy=True)
    assert document["run"]["status"] == "running"
    with ledger_at(tmp_path / "r.db") as other:
        assert other.import_run(document, by="alice") == "q"


def test_a_changed_case_fingerprint_is_refused(tmp_path: Path, rich: dict[str, Any]) -> None:
    bad = copy.deepcopy(rich)
    bad["run"]["open_review_cases"][0]["fingerprint"] = "f" * 64
    assert "field 'open_review_cases'" in refused(tmp_path, resign(bad))


@pytest.mark.parametrize("where", ["policy", "budget_used", "approvals", "case", "limits"])
def test_unknown_fields_inside_the_new_header_fields_are_refused(
    tmp_path: Path, rich: dict[str, Any], where: str
) -> None:
    bad = copy.deepcopy(rich)
    run = bad["run"]
    target = run["open_review_cases"][0] if where == "case" else run[where]
    target["extra"] = 1
    assert "unknown field 'extra'" in refused(tmp_path, resign(bad))


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("budget_used", {"steps": True, "decisions": 1, "tokens": 7, "cost": 0.25}, "int"),
        ("approvals", {"granted": 1}, "lacks field 'consumed'"),
        ("open_review_cases", {}, "is not a list"),
        ("policy", "ops-7", "not a JSON object"),
    ],
)
def test_malformed_new_header_fields_are_refused(
    tmp_path: Path, rich: dict[str, Any], field: str, value: Any, says: str
) -> None:
    bad = copy.deepcopy(rich)
    bad["run"][field] = value
    assert says in refused(tmp_path, resign(bad))


def test_a_version_1_checkpoint_is_migrated_on_import(tmp_path: Path, rich: dict[str, Any]) -> None:
    old = as_version_1(rich)
    with ledger_at(tmp_path / "b.db") as target:
        plan = target.preview_import(old)
        assert isinstance(plan, cp.ImportPlan)
        assert (plan.from_format, plan.to_format) == (1, checkpoint.SCHEMA_VERSION)
        assert plan.action == "install"
        assert (plan.transfer, plan.installs_as) == ("copy", "needs_review")  # fail closed
        assert {k: plan.derived[k] for k in checkpoint.DERIVED} == {
            k: rich["run"][k] for k in checkpoint.DERIVED
        }
        assert target.runs() == []  # the preview wrote nothing
        assert target.import_run(old, by="alice") == RUN
        again = target.export_run(RUN, copy=True)  # exported again: current format, same records
        assert again["schema_version"] == checkpoint.WITHOUT_REQUESTS
        n = len(rich["records"])
        assert again["records"][:n] == rich["records"]
        # A format-1 document knew no moves: a copy, frozen on arrival until a decision.
        assert [r["type"] for r in again["records"][n:]] == ["run_imported", "run_frozen"]
        assert {k: again["run"][k] for k in ("policy", "limits", "budget_used")} == {
            k: rich["run"][k] for k in ("policy", "limits", "budget_used")
        }
        (case,) = target.review_cases(RUN, state="open")
        assert case.case_id == f"{RUN}#{n + 1}"
        assert "imported from a copy" in case.reason
        assert target.preview_import(old).action == "nothing"
        assert target.preview_import(again).action == "nothing"


def test_a_version_1_checkpoint_still_refuses_the_new_fields(
    tmp_path: Path, rich: dict[str, Any]
) -> None:
    old = as_version_1(rich)
    old["run"]["policy"] = rich["run"]["policy"]  # a format-1 header has no such field
    assert "unknown field 'policy'" in refused(tmp_path, resign(old))


def test_cli_import_preview_shows_the_migration_and_writes_nothing(
    tmp_path: Path, rich: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setenv("CRASHPROOF_KEY", KEY)
    path = tmp_path / "old.json"
    path.write_bytes(checkpoint.serialize(as_version_1(rich)) + b"\n")
    url = f"sqlite:///{tmp_path / 'b.db'}"
    with ledger_at(tmp_path / "b.db"):
        pass  # an empty ledger
    before = (tmp_path / "b.db").read_bytes()
    assert main(["import", str(path), "--preview", "--db", url]) == 0
    out = capsys.readouterr().out
    case = rich["run"]["open_review_cases"][0]
    assert f"checkpoint of run {RUN!r}" in out
    assert f"generation {rich['run']['generation']}" in out
    assert f"format migration 1 -> {checkpoint.SCHEMA_VERSION}" in out
    assert "policy: ops-7" in out
    assert "budget used: 3 step(s), 1 decision(s), 7 token(s), cost 0.25" in out
    assert "approvals: 1 granted, 1 consumed" in out
    assert f"{case['case_id']} (open)" in out
    assert "would do: install the run" in out
    assert "nothing was written" in out
    assert (tmp_path / "b.db").read_bytes() == before

    assert main(["import", str(path), "--preview", "--json", "--db", url]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["format"] == {"from": 1, "to": checkpoint.SCHEMA_VERSION}
    assert plan["derived"]["open_review_cases"] == rich["run"]["open_review_cases"]

    assert main(["import", str(path), "--db", url]) != 0  # --by is required to apply
    assert "--by" in capsys.readouterr().err
    assert main(["import", str(path), "--by", "alice", "--db", url]) == 0
    assert f"format 1 migrated to {checkpoint.SCHEMA_VERSION}" in capsys.readouterr().err
    assert main(["import", str(path), "--preview", "--db", url]) == 0
    assert "would do: nothing" in capsys.readouterr().out
