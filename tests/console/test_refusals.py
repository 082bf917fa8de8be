"""One bad run never breaks the view (#40): a run whose journal fails verification (a
record altered in the file, a journal older than its witness) sits in the same ledger as
healthy runs; every page answers 200, the bad runs are listed and marked with the
refusal's reason, and `crashproof runs` lists the healthy ones beside them. Query values
out of range answer 400, never 500."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")

from starlette.testclient import TestClient

import crashproof as cp
from crashproof.cli import ExitCode, main
from crashproof.console import ConsoleConfig, create_app

HEALTHY = ("ok-1", "ok-2")
TAMPERED = "tampered-1"
ROLLED_BACK = "rolled-back-1"
WITNESSLESS = "witnessless-1"


def _ledger(db: Path) -> cp.Ledger:
    ledger = cp.Ledger(f"sqlite:///{db}")

    @ledger.workflow("greet", version="1")
    def greet(ctx: cp.Context, name: str) -> str:
        return ctx.step("compose", lambda: f"hello {name}")

    return ledger


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    ledger = _ledger(path)
    try:
        for run_id in (*HEALTHY, TAMPERED, ROLLED_BACK, WITNESSLESS):
            ledger.run("greet", run_id=run_id, name=run_id)
    finally:
        ledger.close()
    with sqlite3.connect(path) as conn:  # someone edits the file
        conn.execute(
            "UPDATE events SET value = '\"hello eve\"' WHERE run_id = ? AND seq = 1", (TAMPERED,)
        )
    conn.close()
    with sqlite3.connect(f"{path}.witness") as conn:  # a journal older than its witness
        conn.execute("UPDATE witness SET generation = 99 WHERE run_id = ?", (ROLLED_BACK,))
        conn.execute("DELETE FROM witness WHERE run_id = ?", (WITNESSLESS,))
    conn.close()
    return path


@pytest.fixture
def client(db: Path) -> Iterator[TestClient]:
    ledger = _ledger(db)
    app = create_app(ConsoleConfig(ledger=ledger))
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        yield c
    ledger.close()


def _marked(html: str, run_id: str) -> bool:
    """Whether a row marked refused names ``run_id``."""
    rows = (chunk.split("</tr>")[0] for chunk in html.split('<tr class="refused"')[1:])
    return any(f">{run_id}</a>" in row for row in rows)


def test_the_runs_page_lists_healthy_runs_and_marks_the_bad_ones(client: TestClient) -> None:
    page = client.get("/runs")
    assert page.status_code == 200
    for run_id in (*HEALTHY, TAMPERED, ROLLED_BACK, WITNESSLESS):
        assert f">{run_id}</a>" in page.text  # every run is listed
    assert _marked(page.text, TAMPERED)
    assert _marked(page.text, ROLLED_BACK)
    assert "JournalTampered" in page.text
    assert "JournalRolledBack" in page.text
    assert not any(_marked(page.text, run_id) for run_id in HEALTHY)


@pytest.mark.parametrize("run_id", [TAMPERED, ROLLED_BACK, WITNESSLESS])
def test_a_bad_runs_own_pages_explain_the_refusal(client: TestClient, run_id: str) -> None:
    for url in (f"/run?id={run_id}", f"/run/timeline?id={run_id}"):
        page = client.get(url)
        assert page.status_code == 200, url
    refusal = client.get(f"/run?id={TAMPERED}").text
    assert 'id="refusal"' in refusal
    assert "does not match its MAC" in refusal
    assert "crashproof check" in refusal


def test_needs_attention_lists_the_bad_runs(client: TestClient) -> None:
    page = client.get("/attention")
    assert page.status_code == 200
    assert _marked(page.text, TAMPERED)
    assert _marked(page.text, ROLLED_BACK)
    assert 'data-count="refused">refused: ' in page.text
    assert 'data-count="refused">refused: 0' not in page.text


@pytest.mark.parametrize(
    "query",
    [
        "/runs?offset=9223372036854775808",
        "/runs?offset=-1",
        "/runs?offset=ten",
        "/runs?refresh=99999999999999999999",
        f"/run?id={HEALTHY[0]}&offset=18446744073709551616",
        f"/run/timeline?id={HEALTHY[0]}&offset=-5",
    ],
)
def test_out_of_range_query_values_answer_400(client: TestClient, query: str) -> None:
    page = client.get(query)
    assert page.status_code == 400, query
    assert "Bad request" in page.text


def test_crashproof_runs_lists_the_rest_and_marks_the_bad_ones(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    url = f"sqlite:///{db}"
    capsys.readouterr()
    code = main(["runs", "--db", url])
    out, err = capsys.readouterr()
    assert code == ExitCode.LEDGER_UNUSABLE  # documented: some runs fail verification
    for run_id in HEALTHY:
        assert run_id in out
    assert TAMPERED in out
    assert ROLLED_BACK in out
    assert "refused" in out
    assert "crashproof check" in err
    code = main(["runs", "--db", url, "--json"])
    out, _ = capsys.readouterr()
    assert code == ExitCode.LEDGER_UNUSABLE
    records = {record["run_id"]: record for record in json.loads(out)}
    assert set(HEALTHY) <= set(records)
    assert records[TAMPERED]["refused"]["error"] == "JournalTampered"
    assert records[HEALTHY[0]]["status"] == "succeeded"
    assert "refused" not in records[HEALTHY[0]]
