"""Reconciliation that journals and repeats (runtime/operations/reconciling.py), against
the real loopback HTTP target: a resource deleted behind the run's back is journaled
``drifted`` (the run keeps its status), ``runs`` sees it, and after the resource is put
back the next pass journals ``confirmed`` and the mark clears; the worker's periodic pass
does the same, bounded in lookups."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.tools.http import HttpTool

from .http_server import IdempotentServer

KEY = "ab" * 32


def created(ledger: cp.Ledger, tool: HttpTool, run_id: str, n: int = 2) -> None:
    @ledger.workflow("create")
    def create(ctx: cp.Context) -> list[str]:
        return [
            ctx.act(f"create-{k}", tool, body={"name": f"{run_id}-{k}"})["id"] for k in range(n)
        ]

    ledger.run(create, run_id=run_id)


def test_a_deleted_resource_is_journaled_drifted_then_confirmed_once_restored(
    server: IdempotentServer, tool: HttpTool, tmp_path: Path
) -> None:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=KEY)
    created(ledger, tool, "r")
    before = ledger.journal("r")
    gone = server.entry_of("r/create-0")
    server.forget("r/create-0")  # deleted behind the run's back
    checks = ledger.reconcile("r", [tool], record=True, by="alice")
    assert [c.status for c in checks] == ["drifted", "confirmed"]
    info = ledger.get_run("r")
    assert info.status is cp.RunStatus.SUCCEEDED  # an ended run stays ended
    assert info.drifted == ["create-0"]
    finding = info.reconciled["create-0"]
    assert finding["by"] == "alice"
    assert finding["finding"] == "drifted"
    assert finding["checked_at"] is not None
    assert info.reconciled["create-1"]["receipt"]["receipt_id"] == checks[1].receipt["receipt_id"]
    assert [i.run_id for i in ledger.runs() if i.drifted] == ["r"]
    added = ledger.journal("r")[len(before) :]
    assert [(e.type.value, e.key) for e in added] == [
        ("act_reconciled", "create-0"),
        ("act_reconciled", "create-1"),
    ]
    assert ledger.check("r") == [("r", None)]  # MACs, chain, witness

    server.restore("r/create-0", gone)  # put back: the same resource, the same id
    checks = ledger.reconcile("r", [tool], record=True, by="bob")
    assert [c.status for c in checks] == ["confirmed", "confirmed"]
    info = ledger.get_run("r")
    assert info.drifted == []
    assert info.reconciled["create-0"]["by"] == "bob"
    assert info.to_json()["drifted"] == []
    # A replay of the run is unchanged by the records: they are not calls.
    resumed = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=KEY)
    created(resumed, tool, "r")
    assert server.creates() == 2


def test_the_findings_travel_with_an_export(
    server: IdempotentServer, tool: HttpTool, tmp_path: Path
) -> None:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}", key=KEY)
    created(ledger, tool, "r", n=1)
    server.forget("r/create-0")
    ledger.reconcile("r", [tool], record=True, by="alice")
    document = ledger.export_run("r", copy=True)
    target = cp.Ledger(f"sqlite:///{tmp_path / 'b.db'}", key=KEY)
    target.import_run(document, by="alice")
    assert target.get_run("r").drifted == ["create-0"]


def test_a_run_being_driven_is_not_reconciled_in_its_place(
    server: IdempotentServer, tool: HttpTool, tmp_path: Path
) -> None:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=KEY)
    created(ledger, tool, "r", n=1)
    other = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=KEY)
    other.store.claim("r", "someone-else", 30.0)  # another process drives it
    before = len(ledger.journal("r"))
    with pytest.raises(cp.LeaseHeld):
        ledger.reconcile("r", [tool], record=True, by="alice")
    assert len(ledger.journal("r")) == before


def test_the_workers_periodic_pass_journals_findings_bounded_in_lookups(
    server: IdempotentServer, tool: HttpTool, tmp_path: Path
) -> None:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=KEY)
    for n in range(3):
        created(ledger, tool, f"r{n}")  # 3 runs of 2 acts
    server.forget("r1/create-1")
    gets = lambda: sum(1 for r in server.requests() if r["method"] == "GET")  # noqa: E731
    looked = gets()
    worker = cp.Worker(
        ledger,
        poll=0.05,
        log=io.StringIO(),
        reconcile=[tool],
        reconcile_every=1.5,  # long enough that a loaded machine's first pass is not due again
        reconcile_limit=4,  # two runs a pass
    )
    first = worker.reconciling.tick()
    assert sum(first.values()) == 4
    assert gets() - looked == 4  # the bound: 4 lookups, not 6
    assert worker.reconciling.tick() == {}  # not due yet
    time.sleep(1.55)
    second = worker.reconciling.tick()  # goes on with the run the first pass left
    assert sum(second.values()) >= 2
    infos = {i.run_id: i for i in ledger.runs()}
    assert [r for r, i in infos.items() if i.drifted] == ["r1"]
    assert all(i.reconciled for i in infos.values())
    finding = infos["r1"].reconciled["create-1"]
    assert finding["by"] == ledger.worker_id
    # Through serve(): the loop ticks the pass between claims; its event is logged.
    entry = server.entry_of("r0/create-0")
    server.forget("r0/create-0")
    out = io.StringIO()
    serving = cp.Worker(
        ledger,
        poll=0.05,
        until_idle=True,
        log=out,
        reconcile=[tool],
        reconcile_every=60,
        reconcile_limit=100,
    )
    serving.serve()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert any(e["event"] == "reconciled" for e in events)
    assert ledger.get_run("r0").drifted == ["create-0"]
    server.restore("r0/create-0", entry)
