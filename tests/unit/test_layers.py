"""The direction of imports in ``src/crashproof``, pinned (STYLE.md: dependencies point
downward only). Every import counts: module level, function-local and under
``TYPE_CHECKING``, since a type-only import up is the first step of a knot.

The layers, bottom first:

- ``errors``, ``_version``, ``_faults``, ``_excerpt``: leaves (the one exception tree, and
  what everyone shares: a foreign message bounded for a reason, ``_excerpt.shown``);
- ``journal``: pure domain, nothing of ours but the leaves;
- ``store``, ``tools``, ``integrity``: never ``runtime``, ``verify``, ``testing`` or ``cli``;
- ``runtime``: ``port`` (the seams) under the role folders ``steps``, ``guards``,
  ``driving``, ``operations``, which never import ``context``, ``drive``, ``ledger``,
  ``worker`` or ``replayer``; ``replayer`` sits above ``context`` and ``ledger`` (a second driver of
  workflows, like ``worker``);
- ``verify``, ``testing``: above ``runtime``;
- ``console`` (``crashproof ui``): above ``runtime``, beside ``verify``; never ``cli``,
  and only the ``ui`` command imports it (inside the command: starlette stays optional);
- ``cli``: on top; nothing else imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "crashproof"

LEAVES = {"crashproof.errors", "crashproof._version", "crashproof._faults", "crashproof._excerpt"}
EDGE = ("crashproof.models", "crashproof.integrations")  # public names only
ROLE_FOLDERS = ("steps", "guards", "driving", "operations")
ABOVE_ROLES = ("context", "drive", "ledger", "worker", "replayer")
UPPER_PACKAGES = tuple(
    f"crashproof.{p}"
    for p in ("store", "tools", "integrity", "runtime", "verify", "testing", "console", "cli")
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module of ours that ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        out.update(t for t in targets if t in MODULES and t != name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _native(name: str) -> bool:
    """A module of ours built from C (``integrity/_seal.c``)."""
    *package, leaf = name.split(".")
    return (SRC.joinpath(*package) / f"{leaf}.c").exists()


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(importer: str, rule: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{name} imports {target} ({rule})"
        for name, targets in GRAPH.items()
        if _under(name, importer)
        for target in sorted(targets)
        if _under(target, *forbidden)
    ]


def test_the_walk_sees_every_kind_of_import() -> None:
    # A function-local import and a TYPE_CHECKING one are both found (the walk is live).
    assert "crashproof.runtime.port" in GRAPH["crashproof.runtime.steps.acts"]
    assert len(MODULES) > 80


def test_the_leaves_import_nothing_but_leaves() -> None:
    # Every layer imports them: a leaf that reached up would tie the layers in a knot.
    assert {leaf: GRAPH[leaf] - LEAVES for leaf in sorted(LEAVES)} == {
        leaf: set() for leaf in sorted(LEAVES)
    }


def test_no_import_circle_anywhere() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    assert circles == []


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        ("crashproof.errors", ("crashproof.journal", "crashproof.store", "crashproof.runtime")),
        ("crashproof.journal", UPPER_PACKAGES),
        ("crashproof.store", ("crashproof.runtime", "crashproof.verify", "crashproof.cli")),
        ("crashproof.tools", ("crashproof.runtime", "crashproof.verify", "crashproof.cli")),
        ("crashproof.integrity", ("crashproof.runtime", "crashproof.verify", "crashproof.cli")),
        (
            "crashproof.runtime",
            ("crashproof.verify", "crashproof.testing", "crashproof.console", "crashproof.cli"),
        ),
        ("crashproof.console", ("crashproof.verify", "crashproof.testing", "crashproof.cli")),
        ("crashproof.verify", ("crashproof.cli",)),
        ("crashproof.testing", ("crashproof.cli",)),
    ],
)
def test_lower_layers_never_import_upper_ones(importer: str, forbidden: tuple[str, ...]) -> None:
    assert _violations(importer, "points up", forbidden) == []


def test_no_module_imports_the_package_itself() -> None:
    """``import crashproof`` from inside runs ``__init__`` (which imports everything).
    The integrations at the edge are the exception: they sit above everything."""
    inside = [n for n, targets in GRAPH.items() if "crashproof" in targets]
    assert [n for n in inside if not _under(n, *EDGE)] == []


def test_the_integrations_use_public_names_only() -> None:
    """DESIGN §14: an adapter uses ``crashproof.__all__`` (``import crashproof as cp``)
    and its own modules, nothing else of ours; nothing of ours imports it. An
    integration may use ``crashproof.models``' public names too (the model tools its
    agent is given), never its private modules."""
    bad = [
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if _under(name, *EDGE)
        for target in sorted(targets)
        if target != "crashproof"
        and not (target == "crashproof.models" and _under(name, "crashproof.integrations"))
        and not _under(target, name.split(".")[0] + "." + name.split(".")[1])
    ]
    assert bad == []
    users = [
        n
        for n, targets in GRAPH.items()
        if not _under(n, *EDGE) and any(_under(t, *EDGE) for t in targets)
    ]
    assert users == []


def test_nothing_but_the_entry_points_imports_the_cli() -> None:
    entry = {"crashproof.__main__"}
    bad = [
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if not _under(name, "crashproof.cli") and name not in entry
        for target in targets
        if _under(target, "crashproof.cli")
    ]
    assert bad == []


def test_only_the_ui_command_imports_the_console() -> None:
    users = {
        name
        for name, targets in GRAPH.items()
        if not _under(name, "crashproof.console")
        and any(_under(t, "crashproof.console") for t in targets)
    }
    assert users == {"crashproof.cli.commands.console"}


@pytest.mark.parametrize("folder", ROLE_FOLDERS)
def test_role_folders_see_a_run_only_through_the_ports(folder: str) -> None:
    above = tuple(f"crashproof.runtime.{m}" for m in ABOVE_ROLES)
    assert _violations(f"crashproof.runtime.{folder}", "use runtime.port", above) == []


def test_the_port_imports_nothing_of_the_runtime() -> None:
    inside = [t for t in GRAPH["crashproof.runtime.port"] if _under(t, "crashproof.runtime")]
    assert inside == []


def test_no_private_name_crosses_a_module() -> None:
    """``from crashproof.x import _name`` or ``module._name`` of another module of ours."""
    bad = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("crashproof"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in MODULES or _native(full):
                        aliases[alias.asname or alias.name] = full
                    elif alias.name.startswith("_") and not alias.name.startswith("__"):
                        bad.append(f"{name} imports {node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in MODULES and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                bad.append(f"{name} reads {aliases[node.value.id]}.{node.attr}")
    assert bad == []


def test_runtime_top_level_stays_small_and_modules_short() -> None:
    # The drivers and their seams: context and its async shell, ledger (opening, entry
    # points) and drive (one drive of a run), worker, workflow, options, port; the rest
    # lives in the role folders.
    top = sorted(p.name for p in (PKG / "runtime").glob("*.py"))
    assert len(top) <= 9, top
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert {n: lines for n, lines in long.items() if lines > 600} == {}


def test_every_role_folder_says_what_it_may_import() -> None:
    for folder in (*ROLE_FOLDERS, "replayer"):
        doc = ast.get_docstring(ast.parse((PKG / "runtime" / folder / "__init__.py").read_text()))
        assert doc is not None, folder
        assert "import" in doc, folder


def test_the_ledger_defines_every_drive_host_member_itself() -> None:
    """A member the Ledger inherited from the Protocol would be its empty stub (None),
    silently: every one must be in the Ledger's body (or a mixin's, before the Protocol
    in its MRO) or set in its __init__."""
    from crashproof.runtime.ledger import Ledger
    from crashproof.runtime.port import DriveHost

    members = {n for n in vars(DriveHost) if not n.startswith("_")} | set(DriveHost.__annotations__)
    ledger = Ledger("memory://")
    try:
        for name in sorted(members):
            owner = next((c for c in Ledger.__mro__ if name in vars(c)), None)
            assert name in vars(ledger) or owner not in (None, DriveHost), name
    finally:
        ledger.close()
