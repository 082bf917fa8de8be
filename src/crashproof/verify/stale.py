"""A stale checkpoint: exported at a crash, imported after the run went further.

After the case's crash (``crash_once``) the run is exported as a checkpoint; then it is
resumed to its end. The checkpoint is now stale, and is imported

- (a) into the same ledger: refused (another journal: a rollback), unless the run wrote
  nothing more after the crash (then it is the same journal: a no-op);
- (b) into a fresh ledger whose witness (a copy of the original's) saw a later
  generation: refused (it would roll the run back), unless the witness saw nothing later;
- (c) into a fresh ledger with a fresh witness: accepted; the run is resumed there, on the
  same environment, where the effects done after the export already are. The tools must
  reconcile by lookup (no effect done twice) and the artifacts must equal the reference's —
  or the resume stops in an explicit state (needs_review...), or fails because a tool
  refuses an act whose effect is already there (the artifacts still the reference's):
  REFUSED with its reason.

Decisions the checkpoint holds must not be asked again in (c); those recorded after the
export are lost with it and may be asked again (once each).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from crashproof.errors import CheckpointRejected, RunFailed, RunFrozen
from crashproof.integrity.witness import SQLiteWitness
from crashproof.runtime.ledger import Ledger
from crashproof.verify.history import (
    check_effects,
    check_journal,
    intents,
    observe,
    read_run,
    recorded_decisions,
)
from crashproof.verify.report import Case, CaseResult, Reference, Verdict
from crashproof.verify.scenario import Scenario, close_env
from crashproof.verify.trials import DURABILITY, Mode, _ledger, _run, crash_once, env_dir

__all__ = ["stale_case"]

_BY = "crashproof verify (stale checkpoint)"
_SUFFIXES = ("", "-wal", "-shm")


def stale_case(
    scenario: Scenario[Any],
    reference: Reference,
    case: Case,
    directory: Path,
    mode: Mode,
    target: str | None,
) -> CaseResult:
    run_id = scenario.resolved_run_id
    crash_once(scenario, directory, case, mode, target)
    with _ledger(directory) as ledger:
        document = ledger.export_run(run_id)
        held = recorded_decisions(read_run(ledger, run_id))
    generation = _generation(document)

    env = scenario.env_factory(env_dir(directory))  # the run goes on to its end
    try:
        with _ledger(directory) as ledger:
            try:
                _run(scenario, ledger, env)
            except RunFrozen as exc:
                return _result(case, Verdict.REFUSED, f"the resume after the crash: {exc}")
            later = _generation(ledger.export_run(run_id))
            original = intents(read_run(ledger, run_id))
            problems, same = _import_same(ledger, document, generation, later)
    finally:
        close_env(env)
    found, witnessed = _import_witnessed(directory, document, generation, run_id)
    problems += found
    fresh = directory / "fresh"
    fresh.mkdir(exist_ok=True)
    result = _resume_fresh(
        scenario, reference, case, directory, fresh, document, (held, original), problems
    )
    notes = "; ".join(n for n in (same, witnessed) if n)
    if result.verdict is Verdict.DIVERGED or not notes:
        return result
    return dataclasses.replace(result, reason="; ".join(r for r in (result.reason, notes) if r))


def _generation(document: Any) -> int:
    """How many records the checkpoint holds (its ``run.generation``)."""
    return int(document["run"]["generation"])


def _result(case: Case, verdict: Verdict, reason: str) -> CaseResult:
    return CaseResult(case=case, verdict=verdict, reason=reason)


def _import_same(
    ledger: Ledger, document: Any, generation: int, later: int
) -> tuple[list[str], str]:
    """(a) The stale checkpoint into the ledger it came from."""
    try:
        ledger.import_run(document, by=_BY)
    except CheckpointRejected as exc:
        if later > generation:
            return [], f"(a) same ledger refused it: {exc}"
        return ["(a) the unchanged journal refused its own export"], ""
    if later > generation:
        return [
            f"(a) the same ledger accepted a checkpoint of generation {generation} while its "
            f"journal holds {later} records: a rollback"
        ], ""
    return [], "(a) same ledger: the same journal, a no-op"


def _import_witnessed(
    directory: Path, document: Any, generation: int, run_id: str
) -> tuple[list[str], str]:
    """(b) The stale checkpoint into a fresh ledger that has the original's witness."""
    there = directory / "witnessed"
    there.mkdir(exist_ok=True)
    source = directory / "ledger.db.witness"
    for suffix in _SUFFIXES:
        kept = source.with_name(source.name + suffix)
        if kept.exists():
            shutil.copyfile(kept, there / f"ledger.db.witness{suffix}")
    witness = SQLiteWitness(there / "ledger.db.witness")
    try:
        seen = witness.get(run_id) or 0
    finally:
        witness.close()
    with Ledger(f"sqlite:///{(there / 'ledger.db').resolve()}", durability=DURABILITY) as b:
        try:
            b.import_run(document, by=_BY)
        except CheckpointRejected as exc:
            if seen > generation:
                return [], f"(b) witnessed ledger refused it: {exc}"
            return [f"(b) refused though its witness saw generation {seen} <= {generation}"], ""
    if seen > generation:
        return [
            f"(b) a ledger whose witness saw generation {seen} accepted a checkpoint of "
            f"generation {generation}: a rollback"
        ], ""
    return [], "(b) witnessed ledger: nothing later witnessed, accepted"


def _resume_fresh(
    scenario: Scenario[Any],
    reference: Reference,
    case: Case,
    directory: Path,
    fresh: Path,
    document: Any,
    known: tuple[frozenset[str], frozenset[str]],
    problems: list[str],
) -> CaseResult:
    """(c) The stale checkpoint into a fresh ledger, resumed on the same environment.
    ``known``: the decisions the checkpoint holds, the operation ids of the run's acts in
    the original journal."""
    held, original = known
    env = scenario.env_factory(env_dir(directory))
    try:
        with _ledger(fresh) as ledger:
            try:
                ledger.import_run(document, by=_BY)
            except CheckpointRejected as exc:
                problems.append(f"(c) a fresh ledger refused the checkpoint: {exc}")
                return _result(case, Verdict.DIVERGED, "; ".join(problems))
            before = Counter(scenario.model_calls(env)) if scenario.model_calls else Counter()
            stop: Exception | None = None
            try:
                _run(scenario, ledger, env)
            except Exception as exc:
                stop = exc
            obs = observe(scenario, env, ledger)
    finally:
        close_env(env)
    asked = Counter(obs.model_calls or {}) - before
    again = sorted(k for k in asked if k in held)
    if again:
        problems.append(f"(c) decisions the checkpoint holds were asked again: {again}")
    finished = stop is None
    found, extra = check_effects(reference, obs, finished=finished, other_intents=original)
    problems += [f"(c) {p}" for p in found]
    verdict, reason = Verdict.SAME, ""
    if finished:
        if obs.fingerprint != reference.fingerprint:
            problems.insert(0, f"(c) fingerprint {obs.fingerprint} is not the reference's")
        problems += [f"(c) {p}" for p in check_journal(reference, obs.info)]
    elif isinstance(stop, RunFrozen):
        verdict, reason = Verdict.REFUSED, f"(c) {stop.status}: {stop.reason}"
    elif isinstance(stop, RunFailed):  # a tool refused an act the artifacts already show
        if obs.fingerprint != reference.fingerprint:
            problems.insert(0, f"(c) fingerprint {obs.fingerprint} is not the reference's")
        verdict, reason = Verdict.REFUSED, f"(c) the run failed, nothing redone: {stop}"
    else:
        problems.insert(0, f"(c) the resume raised {type(stop).__name__}: {stop}")
    if problems:
        verdict, reason = Verdict.DIVERGED, "; ".join(problems)
    result = CaseResult(
        case=case,
        verdict=verdict,
        reason=reason,
        fingerprint=obs.fingerprint,
        effects=obs.effects,
        extra_effects=extra,
        model_calls=None if obs.model_calls is None else sum(obs.model_calls.values()),
        reasked=tuple(sorted(asked)),
    )
    return result
