"""Proving recovery: crash every crash point of a scenario, resume, compare with a run that
never crashed.

::

    from crashproof.verify import Scenario, verify

    report = verify(SCENARIO, mode="inproc")      # or "subprocess": real SIGKILLs
    report.ok                                      # no case DIVERGED

``crashproof verify MODULE:SCENARIO`` prints the crash matrix; ``crashproof.testing``
asserts it in a test suite. See ``crashproof.verify.runner`` for what is run and
``crashproof.verify.history`` for how a trial is judged.
"""

from crashproof.verify.report import Case, CaseKind, CaseResult, Reference, Report, Verdict
from crashproof.verify.runner import MODES, verify
from crashproof.verify.scenario import Scenario, ScenarioError, load_scenario
from crashproof.verify.trials import run_case, run_reference

__all__ = [
    "MODES",
    "Case",
    "CaseKind",
    "CaseResult",
    "Reference",
    "Report",
    "Scenario",
    "ScenarioError",
    "Verdict",
    "load_scenario",
    "run_case",
    "run_reference",
    "verify",
]
