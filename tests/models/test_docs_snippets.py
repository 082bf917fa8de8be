"""The model-tool snippets of docs/models.md and of the README's model SDK section run as
written, inside a workflow, with the real ``openai`` client against the local server
(the names they leave to the reader defined: a repository, its tools, a pager)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from apis import Api
from model_server import ModelServer, Turn

import crashproof as cp
from crashproof.tools.git import GitTool
from crashproof.tools.http import HttpTool

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from examples._forge import Forge  # noqa: E402


def blocks(path: Path, heading: str) -> list[str]:
    text = path.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def _run(code: str, names: dict[str, Any], turns: list[Turn], tmp: Path) -> dict[str, Any]:
    """``code`` as the body of a workflow turn: ``ctx``, ``client``, ``llm`` and
    ``messages`` given; returns its namespace."""
    api, out = Api("chat"), {}
    with ModelServer(turns) as server, cp.Ledger(f"sqlite:///{tmp}/runs.db") as ledger:

        def snippet(ctx: cp.Context) -> int:
            client = api.client(server.url, is_async=False)
            namespace = dict(names, ctx=ctx, client=client, MODEL="m", cp=cp, Any=Any)
            namespace["llm"] = cp.models.openai_chat(ctx, client)
            namespace["messages"] = [{"role": "user", "content": "go"}]
            exec(compile(code, "snippet", "exec"), namespace)
            out.update(namespace)
            return len(namespace["messages"])

        ledger.run(ledger.workflow("snippet", version="1")(snippet), run_id="r")
    return out


def test_the_model_tools_snippets_of_docs_models_md(tmp_path: Path) -> None:
    first, template = blocks(ROOT / "docs" / "models.md", "## Model tools from typed functions")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("hello\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    paged: list[str] = []

    class Pager:
        def send(self, text: str) -> str:
            paged.append(text)
            return "paged"

    forge = Forge(tmp_path / "forge.json").start()
    try:
        names = {
            "repo": repo,
            "workspace": cp.Workspace(repo),
            "git": GitTool(repo),
            "pulls": HttpTool(forge.url, "/repos/greeter/pulls"),
            "pager": Pager(),
        }
        calls = (("read_file", '{"path": "a.txt"}'), ("page_oncall", '{"text": "help"}'))
        done = _run(first, names, [Turn("look", calls)], tmp_path)
        assert [m["content"] for m in done["messages"][2:]] == ["hello\n", "paged"]
        assert paged == ["help"]
        shown = {t.name: t.kind for t in (done["apply_patch"], done["create_pull_request"])}
        assert shown == {"apply_patch": "act", "create_pull_request": "act"}
        namespace: dict[str, Any] = {"cp": cp, "Any": Any, "HttpTool": HttpTool}
        exec(compile(template, "template", "exec"), dict(namespace, forge_url=forge.url))
    finally:
        forge.stop()


def test_the_readme_model_sdk_snippet(tmp_path: Path) -> None:
    (code,) = blocks(ROOT / "README.md", "### Model SDKs: `crashproof.models`")[:1]
    names = {"pytest_main": lambda path: f"3 passed in {path}", "forge": cp.Outbox("f", print)}
    turns = [Turn("test", (("run_tests", "{}"),)), Turn("done")]
    done = _run(code, names, turns, tmp_path)
    assert done["messages"][2]["content"] == "3 passed in ."
    assert done["open_pr"].schema["required"] == ["title", "branch"]
