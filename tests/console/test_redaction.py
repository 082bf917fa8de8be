"""Values a policy marks secret never reach a person (#40): the run page, a step's page,
a pending approval, a review case, `crashproof show` and its `--json`. The journal keeps
them (replay and digests are over the real values), and fields that hold credentials
by convention (Authorization, api_key, ...) are hidden under any policy or none."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("starlette")

from starlette.testclient import TestClient

import crashproof as cp
from crashproof.cli import ExitCode, main
from crashproof.console import ConsoleConfig, create_app

SECRETS = ("sk-live-0451", "Bearer tok-9931", "sess-7788", "hunter2", "pin-2468")


class Vault(cp.Tool):
    """A target that answers with a credential in its receipt."""

    name = "vault"
    version = "1"
    idempotent_execute = True
    done: ClassVar[dict[str, dict[str, Any]]] = {}

    def execute(self, call: cp.Call) -> cp.Receipt:
        result = {"issued": call.params["user"], "api_key": "sk-live-0451"}
        self.done[call.operation_id] = result
        return cp.Receipt(call.operation_id, result, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        found = self.done.get(call.operation_id)
        return None if found is None else cp.Receipt(call.operation_id, found, call.intent_digest)


POLICY = cp.Policy(
    "secrets-1",
    allow={"vault": "1"},
    risk={"vault": lambda tool, params: "high" if params.get("user") == "root" else "low"},
    approval_required={"high"},
    secret_fields=["X-Session*"],
    secret_steps=["login"],
)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[cp.Ledger]:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'runs.db'}")
    vault = Vault()

    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context, user: str) -> dict[str, Any]:
        pin = ctx.step("login", lambda: {"pin": "pin-2468", "note": "plain"})
        headers = {"Authorization": "Bearer tok-9931", "X-Session-Id": "sess-7788"}
        issued = ctx.act("issue", vault, user=user, headers=headers, password="hunter2")
        return {"x-session-id": "sess-7788", "user": user, "pin": pin["pin"] != "", **issued}

    options = cp.RunOptions(policy=POLICY)
    ledger.run(agent, user="ana", run_id="ok", options=options)
    with pytest.raises(cp.RunFrozen):
        ledger.run(agent, user="root", run_id="held", options=options)
    yield ledger
    ledger.close()


def _clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} was shown"


def test_the_journal_keeps_what_people_are_not_shown(ledger: cp.Ledger) -> None:
    raw = json.dumps([e.value for e in ledger.journal("ok") if e.value_json is not None])
    assert all(s in raw for s in ("sk-live-0451", "pin-2468")), "the values are journaled"
    assert ledger.get_run("ok").result["x-session-id"] == "sess-7788"  # the API is untouched


def test_console_pages_redact(ledger: cp.Ledger) -> None:
    app = create_app(ConsoleConfig(ledger=ledger))
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        pages = {
            "run": client.get("/run?id=ok"),
            "login": client.get("/run/step?id=ok&key=login"),
            "issue": client.get("/run/step?id=ok&key=issue"),
            "held": client.get("/run?id=held"),
        }
    for name, page in pages.items():
        assert page.status_code == 200, name
        _clean(page.text)
        assert "[redacted]" in page.text, name
    assert "plain" not in pages["login"].text  # a secret step is hidden whole
    assert "ana" in pages["issue"].text  # what is not secret is still shown
    assert "root" in pages["held"].text  # the pending act, less its secrets


def _cli(ledger: cp.Ledger, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    code = main(["--db", ledger.url, *argv])
    out = capsys.readouterr().out
    assert code == ExitCode.OK, out
    return out


def test_cli_show_redacts(ledger: cp.Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ("show", "ok"),
        ("show", "ok", "--json"),
        ("show", "ok", "--step", "login", "--json"),
        ("show", "ok", "--step", "issue"),
        ("show", "held", "--json"),
    ):
        out = _cli(ledger, capsys, *argv)
        _clean(out)
    shown = json.loads(_cli(ledger, capsys, "show", "ok", "--json"))
    assert shown["result"]["x-session-id"] == "[redacted]"
    assert shown["result"]["api_key"] == "[redacted]"
    assert shown["result"]["user"] == "ana"


def test_policy_secrets_do_not_change_other_policies_digest() -> None:
    plain = cp.Policy("d-1", allow={"vault": "1"})
    marked = cp.Policy("d-1", allow={"vault": "1"}, secret_fields=["token"])
    assert "secrets" not in plain.record()
    assert "secrets" not in plain.declaration()
    assert marked.digest != plain.digest  # what is hidden is part of the binding
    with pytest.raises(ValueError, match="secret_fields"):
        cp.Policy("d-2", allow={}, secret_fields=[""])
