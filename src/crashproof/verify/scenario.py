"""What the verifier needs to know about a workflow: a ``Scenario``.

A scenario is everything a crash trial needs to start from nothing and judge the end:
the workflow (made against an environment), its input and run id, a factory for a fresh
environment in a directory, and functions that read the artifacts and the targets' own
records out of an environment.

The environment factory is called once per trial on an empty directory, and again on the
same directory after every crash (in another process, in subprocess mode): it must then
reopen what is there — as a restarted machine finds its disk — never reset it. Keep every
record an environment has to keep (a model stub's call log, a server's state) in files
under that directory. If the environment has a ``close()`` method, the verifier calls it
before the next process would start (it stops servers, closes clients).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from crashproof.runtime.workflow import Workflow

__all__ = ["Scenario", "ScenarioError", "close_env", "load_scenario", "scenario_target"]

E = TypeVar("E")


class ScenarioError(Exception):
    """The scenario cannot be verified as given (it cannot be imported, or its reference
    run without any crash does not succeed): a problem of the scenario, not a verdict."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario(Generic[E]):
    """A workflow with everything needed to run it from scratch and judge its artifacts.

    - ``workflow_factory(env)``: the workflow (``@cp.workflow``), its tools bound to ``env``;
      the verifier registers it on the ledgers it creates.
    - ``env_factory(directory)``: a fresh environment in an empty ``directory`` (temporary
      workspace, model stub counting its calls in a file, local servers), or the one found
      there after a crash (see the module docstring).
    - ``fingerprint(env)``: a digest of the artifacts (``Workspace.fingerprint()``, a git
      tree, a server's records...): equal fingerprints mean equal outcomes.
    - ``effects(env)``, optional: how many times each operation id's effect landed,
      from the targets' own records (``{operation_id: count}``); an uninterrupted run shows
      exactly one per operation id.
    - ``model_calls(env)``, optional: how many times each decision was asked, from the
      model stub's own log (``{decision key: count}``).
    - ``outage(directory, down)``, optional: make the services the run calls (its model)
      unavailable (``down``: they raise ``cp.Unavailable``, as a model API's 503 or a
      refused connection does) or available again, for the environment in
      ``directory``, from another process (a flag file the model stub reads). Chaos mode's
      ``outage`` fault needs it. A call that met the outage must not count in
      ``model_calls``: it was never answered.
    """

    name: str
    workflow_factory: Callable[[E], Workflow[Any]]
    env_factory: Callable[[Path], E]
    fingerprint: Callable[[E], str]
    inputs: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None  # default: "verify:<name>"
    effects: Callable[[E], dict[str, int]] | None = None
    model_calls: Callable[[E], dict[str, int]] | None = None
    outage: Callable[[Path, bool], None] | None = None

    @property
    def resolved_run_id(self) -> str:
        return self.run_id or f"verify:{self.name}"


def close_env(env: object) -> None:
    """Call ``env.close()`` when the environment has one."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


def load_scenario(target: str) -> Scenario[Any]:
    """The Scenario named by ``MODULE:ATTRIBUTE`` (the attribute may be dotted)."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ScenarioError(f"{target!r} does not name a scenario: use MODULE:ATTRIBUTE")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ScenarioError(f"cannot import {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ScenarioError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    if not isinstance(obj, Scenario):
        raise ScenarioError(f"{target} is a {type(obj).__name__}, not a crashproof Scenario")
    return obj


def scenario_target(scenario: Scenario[Any]) -> str | None:
    """``MODULE:ATTRIBUTE`` under which ``scenario`` can be imported by a child process, if
    it is a global of the module that defines its workflow factory; else None."""
    module_name = getattr(scenario.workflow_factory, "__module__", None)
    module = sys.modules.get(module_name or "")
    if module is None or module_name == "__main__":
        return None
    for attr, value in vars(module).items():
        if value is scenario:
            return f"{module_name}:{attr}"
    return None
