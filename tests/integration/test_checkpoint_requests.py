"""A run's model requests, kept beside its records, travel with its checkpoint (format
5) and show in the ledger it is imported into; a request altered in the document is
refused on import (each is checked against the digest its record holds); a run without
requests still exports as format 4, which older crashproofs import. A fork carries its
prefix's requests too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.integrity import checkpoint
from crashproof.integrity.keys import Keyring
from crashproof.runtime.operations.contents import step_contents

KEY = "ab" * 32


def _agent(ledger: cp.Ledger) -> None:
    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> int:
        history: list[Any] = [{"role": "system", "content": "be brief"}]
        for n in range(3):
            history.append({"role": "user", "content": f"question {n}"})
            history.append(
                ctx.decide("turn", lambda messages: {"n": len(messages)}, messages=history)
            )
        return len(history)


def _prompt(ledger: cp.Ledger, key: str) -> Any:
    contents = step_contents(ledger.journal("r"), [key], lambda: ledger.store.load_requests("r"))
    return contents[key].prompt


def test_requests_travel_with_the_checkpoint(tmp_path: Path) -> None:
    a = cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}", key=KEY)
    _agent(a)
    a.run("agent", run_id="r")
    document = a.export_run("r", copy=True)
    assert document["schema_version"] == 5
    assert len(document["requests"]) == 3
    shown = _prompt(a, "turn#3")
    a.close()
    b = cp.Ledger(f"sqlite:///{tmp_path / 'b.db'}", key=KEY)
    b.import_run(document, by="test")
    moved = _prompt(b, "turn#3")
    assert moved.refused is None
    assert moved == shown
    assert [m["text"] for m in moved.messages][-1] == "question 2"
    b.close()


def test_an_altered_request_in_a_checkpoint_is_refused(tmp_path: Path) -> None:
    a = cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}", key=KEY)
    _agent(a)
    a.run("agent", run_id="r")
    document = a.export_run("r", copy=True)
    a.close()
    seq = next(iter(document["requests"]))
    document["requests"][seq] = document["requests"][seq].replace("question", "QUESTION")
    resigned = checkpoint.sign(document, Keyring.from_hex(KEY))  # a key holder's edit
    b = cp.Ledger(f"sqlite:///{tmp_path / 'b.db'}", key=KEY)
    with pytest.raises(cp.CheckpointRejected, match="is not the one its record names"):
        b.import_run(resigned, by="test")
    assert b.store.get_run("r") is None
    b.close()


def test_a_run_without_requests_exports_as_format_4(tmp_path: Path) -> None:
    a = cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}", key=KEY, store_requests=False)
    _agent(a)
    a.run("agent", run_id="r")
    document = a.export_run("r", copy=True)
    assert document["schema_version"] == 4
    assert "requests" not in document
    a.close()


def test_a_fork_carries_its_prefix_requests(tmp_path: Path) -> None:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}", key=KEY)
    _agent(ledger)
    ledger.run("agent", run_id="r")
    ledger.fork("r", from_step="turn#2", new_run_id="f", by="test")
    events = ledger.journal("f")
    contents = step_contents(events, ["turn#2"], lambda: ledger.store.load_requests("f"))
    prompt = contents["turn#2"].prompt
    assert prompt is not None
    assert prompt.refused is None
    assert prompt == _prompt(ledger, "turn#2")
    ledger.close()
