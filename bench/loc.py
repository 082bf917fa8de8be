"""Lines of code of the agents with and without crashproof.

    .venv/bin/python bench/loc.py

Counts the non-blank, non-comment lines (docstrings left out, decorators counted) of
the code agent on six stacks, each against its plain twin: on ``openai.OpenAI``
(``examples/openai_agent.py`` / ``openai_agent_plain.py``), on ``openai.AsyncOpenAI``
(``openai_agent_async.py`` / ``openai_agent_async_plain.py``) and on
``anthropic.Anthropic`` (``anthropic_agent.py`` / ``anthropic_agent_plain.py``), and
the same agent on three frameworks: pydantic-ai (``pydantic_ai_agent.py``), the OpenAI
Agents SDK (``openai_agents_agent.py``) and LangGraph's prebuilt ``create_react_agent``
(``langgraph_agent.py``), each against its ``_plain`` twin:

- the workflow: the decorated loop against the plain ``agent`` function (for a
  framework: the agent built and run, model and workflow included, against the plain
  function that builds and runs it);
- the agent: the workflow with its tools and their schemas (``make_workflow`` and
  ``agent_tools``, whose schemas ``cp.models.tool`` derives, against ``agent``, the
  ``Tools`` class and the hand-written ``TOOLS`` schemas of the plain twin). What both
  share (the server, the script, the test runner, the forge, the environment) is not
  counted.

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
    tree = ast.parse(source)
    for node in ast.walk(tree):
        defined = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if defined and node.name in names:
            found.setdefault(node.name, node)
    for node in tree.body:  # module-level assignments: a schema list
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in names:
                    found.setdefault(target.id, node)
    missing = set(names) - set(found)
    if missing:
        raise LookupError(f"{path.name} defines no {sorted(missing)}")
    counted: set[int] = set()
    for node in found.values():
        decorators = getattr(node, "decorator_list", [])
        first = min([node.lineno, *(d.lineno for d in decorators)])
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


# What is counted, as (file, names) parts: the tools of every crashproof agent
# (agent_tools), those of every plain twin (Tools, TOOLS), and per agent its crashproof
# workflow, its plain workflow, and the crashproof code that wires the tools to it.
Parts = tuple[tuple[str, tuple[str, ...]], ...]
_PLAIN_TOOLS: Parts = (("openai_agent_plain.py", ("Tools", "TOOLS", "_function")),)
_TOOLS: Parts = (("openai_agent.py", ("agent_tools",)),)
AGENTS: dict[str, tuple[Parts, Parts, Parts]] = {
    "openai": (
        (("openai_agent.py", ("openai_agent",)),),
        (("openai_agent_plain.py", ("agent",)),),
        (("openai_agent.py", ("make_workflow",)),),
    ),
    "openai async": (
        (("openai_agent_async.py", ("openai_agent",)),),
        (("openai_agent_async_plain.py", ("agent",)),),
        (("openai_agent_async.py", ("make_workflow",)),),
    ),
    "anthropic": (
        (("anthropic_agent.py", ("anthropic_agent",)),),
        (("anthropic_agent_plain.py", ("agent", "TOOLS")),),
        (("anthropic_agent.py", ("make_workflow",)),),
    ),
    # The frameworks: the agent built and run (the model, the agent with its tools, the
    # workflow or the thread's start and resume) against the plain agent function.
    "pydantic-ai": (
        (("pydantic_ai_agent.py", ("make_workflow",)),),
        (("pydantic_ai_agent_plain.py", ("agent", "_tool")),),
        (("pydantic_ai_agent.py", ("make_workflow",)),),
    ),
    "agents sdk": (
        (("openai_agents_agent.py", ("make_workflow",)),),
        (("openai_agents_agent_plain.py", ("agent",)),),
        (("openai_agents_agent.py", ("make_workflow",)),),
    ),
    "langgraph": (
        (("langgraph_agent.py", ("make_agent", "coder")),),
        (("langgraph_agent_plain.py", ("agent",)),),
        (("langgraph_agent.py", ("make_agent", "coder")),),
    ),
}


def _lines(parts: Parts) -> int:
    return sum(code_lines(EXAMPLES / name, *names) for name, names in parts)


def counts() -> dict[str, tuple[int, int]]:
    """{"<agent> workflow": (crashproof, plain), "<agent> agent": (crashproof, plain)}:
    the agent is the workflow with its tools (``make_workflow`` holds the workflow)."""
    out = {}
    for agent, (ours, plain, wiring) in AGENTS.items():
        out[f"{agent} workflow"] = (_lines(ours), _lines(plain))
        out[f"{agent} agent"] = (_lines(wiring + _TOOLS), _lines(plain + _PLAIN_TOOLS))
    return out


def main() -> None:
    print(f"{'lines of code':<26}{'crashproof':>12}{'plain':>8}")
    for what, (cp_lines, plain_lines) in counts().items():
        print(f"{what:<26}{cp_lines:>12}{plain_lines:>8}")


if __name__ == "__main__":
    main()
