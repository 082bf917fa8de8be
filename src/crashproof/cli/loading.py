"""Import the user's workflows and parse ``--arg KEY=VALUE`` input.

Modules are imported the way ``python -m`` does: the current directory comes
first on ``sys.path``, so ``crashproof run flows:upgrade`` finds ``./flows.py``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.errors import CrashproofError
from crashproof.journal.codec import canonical_digest
from crashproof.runtime.guards.policy import Policy
from crashproof.runtime.workflow import RESERVED_PARAMS, Workflow
from crashproof.tools.port import Tool

__all__ = [
    "app_policies",
    "app_tools",
    "app_workflows",
    "import_module",
    "load_workflow",
    "parse_args",
    "workflows_in",
]

_TARGET_HINT = "name it as MODULE:WORKFLOW, e.g. `crashproof run flows:upgrade --run-id ID`"
_ARG_HINT = (
    "pass --arg KEY=VALUE, e.g. --arg repo=x --arg retries=3 "
    '--arg \'tags=["a","b"]\' (VALUE is JSON when it parses as JSON, else a string)'
)


def _check_module_name(name: str) -> None:
    if name and all(part.isidentifier() for part in name.split(".")):
        return
    hint = "use a dotted module name such as `flows` or `pkg.flows`"
    if name.endswith(".py") or "/" in name or os.sep in name:
        stem = os.path.splitext(os.path.basename(name))[0]
        hint = f"use the module name (`{stem}`), not a file path, and run from its directory"
    raise CliError(ExitCode.USAGE, f"{name!r} is not a module name", hint)


def import_module(name: str) -> ModuleType:
    """Import ``name`` with the current directory first on ``sys.path``."""
    _check_module_name(name)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # files written since the last import must be seen
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            hint = "run crashproof from the directory that holds the module, or install its package"
            if name.endswith(".py"):
                hint = f"name the module (`{name[:-3]}`), not its file"
            raise CliError(
                ExitCode.USAGE,
                f"cannot import module {name!r}: no module named {missing!r} "
                f"(searched {cwd} first, then sys.path)",
                hint,
            ) from exc
        raise CliError(
            ExitCode.USAGE,
            f"importing module {name!r} failed: {exc}",
            f"install the missing dependency {missing!r}, or fix the import in {name!r}",
        ) from exc
    except Exception as exc:
        raise CliError(
            ExitCode.USAGE,
            f"importing module {name!r} raised {type(exc).__name__}: {exc}",
            "fix the module; --verbose shows the traceback",
        ) from exc


def workflows_in(module: ModuleType) -> list[tuple[str, Workflow[Any]]]:
    """``(attribute name, workflow)`` for every Workflow in the module's globals."""
    return [(attr, obj) for attr, obj in vars(module).items() if isinstance(obj, Workflow)]


def _listing(module: ModuleType) -> str:
    found = workflows_in(module)
    if not found:
        return f"module {module.__name__!r} defines no crashproof workflows"
    names = ", ".join(f"{attr} ({wf.name}@{wf.version})" for attr, wf in found)
    return f"workflows in {module.__name__!r}: {names}"


def load_workflow(target: str) -> Workflow[Any]:
    """The Workflow named by ``MODULE:ATTRIBUTE`` (the attribute may be dotted)."""
    module, obj = _attribute(target, "workflow", _TARGET_HINT)
    if not isinstance(obj, Workflow):
        raise CliError(
            ExitCode.USAGE,
            f"{target} is a {type(obj).__name__}, not a crashproof workflow",
            "decorate the function with @cp.workflow(name, version) or @ledger.workflow(...); "
            + _listing(module),
        )
    return obj


def load_policy(target: str) -> Policy:
    """The cp.Policy named by ``MODULE:ATTRIBUTE`` (``crashproof run --policy``)."""
    _, obj = _attribute(target, "policy", "name it as MODULE:ATTRIBUTE, e.g. --policy flows:POLICY")
    if not isinstance(obj, Policy):
        raise CliError(
            ExitCode.USAGE,
            f"{target} is a {type(obj).__name__}, not a cp.Policy",
            "point --policy at a module-level cp.Policy(...) instance",
        )
    return obj


def _attribute(target: str, what: str, hint: str) -> tuple[ModuleType, Any]:
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise CliError(ExitCode.USAGE, f"{target!r} does not name a {what}", hint)
    module = import_module(module_name)
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(
                ExitCode.USAGE,
                f"module {module_name!r} has no attribute {attr_path!r}",
                _listing(module),
            ) from None
    return module, obj


def app_workflows(module_names: Sequence[str]) -> list[Workflow[Any]]:
    """Every Workflow defined in the given modules (``resume --app``), one per name."""
    by_name: dict[str, tuple[str, Workflow[Any]]] = {}
    for module_name in module_names:
        module = import_module(module_name)
        found = workflows_in(module)
        if not found:
            raise CliError(
                ExitCode.USAGE,
                f"module {module_name!r} defines no crashproof workflows",
                "pass --app MODULE naming the module that defines the run's workflow",
            )
        for attr, wf in found:
            where = f"{module_name}:{attr}"
            seen = by_name.get(wf.name)
            if seen is not None and seen[1] is not wf:
                raise CliError(
                    ExitCode.USAGE,
                    f"workflow {wf.name!r} is defined twice ({seen[0]} at version "
                    f"{seen[1].version!r}, {where} at version {wf.version!r})",
                    "pass only the --app modules of one deployment",
                )
            by_name.setdefault(wf.name, (where, wf))
    return [wf for _, wf in by_name.values()]


def app_tools(module_names: Sequence[str]) -> list[Tool]:
    """Every Tool instance in the given modules' globals (``reconcile --app``), one per
    name and instance (``Tool.observed_instance``): two workspaces on two roots are two
    tools, each reconciling its own acts; one imported by two modules is one."""
    tools: dict[tuple[str, str | None], Tool] = {}
    for module_name in module_names:
        module = import_module(module_name)
        for obj in vars(module).values():
            if isinstance(obj, Tool):
                tools.setdefault((obj.name, _instance(obj)), obj)
    return list(tools.values())


def _instance(tool: Tool) -> str | None:
    """The tool's instance; None when it cannot be told here (a repository git cannot
    read): loading the app must not fail on it, the tool's own lookups say what is wrong."""
    try:
        return tool.observed_instance()
    except Exception:
        return None


def app_policies(module_names: Sequence[str]) -> list[Policy]:
    """Every cp.Policy instance in the given modules' globals (``resume``/``worker --app``)."""
    found: dict[int, Policy] = {}
    for name in module_names:
        for obj in vars(import_module(name)).values():
            if isinstance(obj, Policy):
                found.setdefault(id(obj), obj)
    return list(found.values())


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_value(raw: str, key: str = "VALUE") -> Any:
    """``raw`` as JSON when it parses as JSON (NaN and Infinity excluded), else the string."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        return raw
    except RecursionError:  # the parser recurses once per level of nesting
        raise CliError(
            ExitCode.USAGE,
            f"--arg {key}: its JSON value is nested too deeply to be read; nothing was started",
            "pass a flatter value, or read the data from a file inside the workflow",
        ) from None


def parse_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``["k=v", ...]`` as a workflow's keyword arguments."""
    args: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CliError(ExitCode.USAGE, f"--arg {pair!r} is not KEY=VALUE", _ARG_HINT)
        if not key.isidentifier():
            raise CliError(
                ExitCode.USAGE, f"--arg key {key!r} is not a Python identifier", _ARG_HINT
            )
        if key in RESERVED_PARAMS:
            raise CliError(
                ExitCode.USAGE,
                f"--arg {key} is reserved by crashproof",
                "give the run id with --run-id; a workflow cannot take run_id or options",
            )
        if key in args:
            raise CliError(ExitCode.USAGE, f"--arg {key} is given twice", _ARG_HINT)
        args[key] = parse_value(raw, key)
    try:  # the run's input must have a canonical digest (e.g. no int beyond 2**53)
        canonical_digest(args, what="the --arg values")
    except CrashproofError as exc:
        raise CliError(
            ExitCode.USAGE,
            str(exc),
            "pass such a value as a JSON string, e.g. --arg n='\"12345678901234567890\"'",
        ) from exc
    except RecursionError:  # parsed, but too deep for the canonical form's encoder
        raise CliError(
            ExitCode.USAGE,
            "the --arg values are nested too deeply to be recorded; nothing was started",
            "pass a flatter value, or read the data from a file inside the workflow",
        ) from None
    return args
