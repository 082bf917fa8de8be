"""The README's 30-second tour runs as written: its first code block, unchanged, with the
real ``openai`` client pointed at the local model server by the SDK's own environment
variables (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), and the two helpers it leaves to the
reader (``scan_repo``, ``run_tests``) defined. Run again, as the same program started
once more would be, it replays: the model is not asked again."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer, Turn

README = Path(__file__).resolve().parents[2] / "README.md"


def tour() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## The API in 30 seconds") :]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "the tour has no python block"
    return found.group(1)


def test_the_tour_runs_against_a_local_model_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tour()
    assert "from openai import OpenAI" in code
    assert "cp.models.openai_chat(ctx, client)" in code
    monkeypatch.chdir(tmp_path)  # sqlite:///runs.db is relative
    monkeypatch.setenv("CRASHPROOF_KEY", "42" * 32)
    monkeypatch.setenv("OPENAI_API_KEY", "local")
    with ModelServer([Turn("bump the lockfile, then run the tests")]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        helpers: dict[str, Any] = {
            "scan_repo": lambda repo: [f"{repo}/pyproject.toml"],
            "run_tests": lambda repo: {"passed": 3},
        }
        first = dict(helpers, __name__="tour")
        exec(compile(code, str(README), "exec"), first)
        assert first["result"]["plan"].startswith("bump the lockfile")
        assert first["result"]["files"] == ["x/pyproject.toml"]
        assert first["info"].status.value == "succeeded"
        assert first["info"].budget.decisions == 1
        again = dict(helpers, __name__="tour")  # the same program once more: all replayed
        exec(compile(code, str(README), "exec"), again)
        assert again["result"] == first["result"]
        assert server.count == 1  # the decision was asked once, ever
