"""The code blocks of a documentation page, in page order (README.md and docs/**/*.md).

The convention every page follows (docs/contributing-docs.md says it to writers):

- A ```python block runs, in the page's order, in one namespace shared by the page's
  blocks (a later block may use an earlier one's names).
- A ```python block with a ``title="NAME"`` is a file the reader saves: it is written to
  NAME in the page's directory, not run in the namespace; a later shell block runs it.
- A ```bash (or ```sh) block runs in bash (``set -euo pipefail``) in the page's
  directory, after the blocks above it. A shell block right after a
  ``<!-- not run: REASON -->`` comment is not run (a reason is required); its
  ``crashproof`` commands are still parsed against the real command tree.
- ``<!-- docs-model: JSON -->`` anywhere in a page replaces the model server's default
  script for that page: a list of turns, each ``{"text": ..., "calls": [[name, args]]}``.
- Other blocks (text, console, toml, mermaid, ...) are shown, never run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>.*?)\s*-->", re.DOTALL)
_MODEL = re.compile(r"<!--\s*docs-model:\s*(?P<script>.*?)-->", re.DOTALL)
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')
SHELLS = ("bash", "sh")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, code, first code line (1-based) and, for a
    python file block, the file it is saved as; for a shell block, why it is not run."""

    lang: str
    code: str
    line: int
    title: str | None = None
    not_run: str | None = None


def pages() -> list[Path]:
    """README.md and every page under docs/, sorted."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` in order. An unclosed fence is a ValueError."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        fence, info, indent = opened["fence"], opened["info"].strip(), len(opened["indent"])
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path}:{start}: a code block is never closed")
        i += 1
        lang = info.split()[0].lstrip("{.").rstrip("}") if info else ""
        title = _TITLE.search(info)
        before = "\n".join(lines[max(0, start - 4) : start - 1])
        skip = _NOT_RUN.search(before) if lang in SHELLS else None
        found.append(
            Block(
                lang=lang,
                code="\n".join(body) + "\n",
                line=start + 1,
                title=title["title"] if title else None,
                not_run=skip["reason"] if skip else None,
            )
        )
    return found


def model_script(path: Path) -> list[dict[str, Any]] | None:
    """The page's ``docs-model`` script, or None for the default."""
    found = _MODEL.search(path.read_text(encoding="utf-8"))
    if found is None:
        return None
    script: list[dict[str, Any]] = json.loads(found["script"])
    return script
