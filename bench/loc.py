"""Lines of code of the OpenAI agent with and without crashproof.

    .venv/bin/python bench/loc.py

Counts the non-blank, non-comment lines (docstrings left out, decorators counted) of:

- the workflow: ``openai_agent`` in ``examples/openai_agent.py`` (the decorated loop)
  and ``agent`` in ``examples/openai_agent_plain.py``;
- the agent: the workflow with the code that wires its tools to it (``make_workflow``,
  which holds ``openai_agent``, against ``agent`` plus the ``Tools`` class the plain
  agent writes by hand). What both share (the server, the script, the tool schemas, the
  test runner, the forge) is not counted.

``tests/verify/test_openai_agent.py`` checks that crashproof's are no longer.
"""

from __future__ import annotations

import ast
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def code_lines(path: Path, *names: str) -> int:
    """Non-blank, non-comment lines of the named top-level or nested definitions."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found: dict[str, ast.AST] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
            found.setdefault(node.name, node)
    missing = set(names) - set(found)
    if missing:
        raise LookupError(f"{path.name} defines no {sorted(missing)}")
    counted: set[int] = set()
    for node in found.values():
        if not isinstance(node, ast.FunctionDef | ast.ClassDef):
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        span = set(range(first, (node.end_lineno or node.lineno) + 1))
        for inner in ast.walk(node):  # docstrings are documentation, not code
            body = getattr(inner, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                value = body[0].value
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    span -= set(range(body[0].lineno, (body[0].end_lineno or 0) + 1))
        counted |= span
    return sum(
        1 for n in counted if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#")
    )


def counts() -> dict[str, tuple[int, int]]:
    """{"workflow": (crashproof, plain), "agent": (crashproof, plain)}."""
    ours, plain = EXAMPLES / "openai_agent.py", EXAMPLES / "openai_agent_plain.py"
    return {
        "workflow": (code_lines(ours, "openai_agent"), code_lines(plain, "agent")),
        "agent": (code_lines(ours, "make_workflow"), code_lines(plain, "agent", "Tools")),
    }


def main() -> None:
    print(f"{'lines of code':<16}{'crashproof':>12}{'plain':>8}")
    for what, (cp_lines, plain_lines) in counts().items():
        print(f"{what:<16}{cp_lines:>12}{plain_lines:>8}")


if __name__ == "__main__":
    main()
