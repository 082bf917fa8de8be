"""A stale checkpoint: a run exported at a crash, as a move and as a copy.

After the case's crash (``crash_once``) the run is exported twice: as a read-only copy
(``export --copy``, nothing written), then as a move (the default: the source journals
``run_moved``). Then:

- (move) exporting the moved run again gives the same checkpoint; resuming the source
  is refused (``RunMoved``) with nothing executed and nothing changed in the environment;
  the move imported into a fresh ledger (fresh witness) is the run's one continuation:
  resumed on the same environment it must end with the reference's artifacts, one
  effect per operation, no recorded decision asked again — or stop in an explicit
  state (REFUSED with its reason);
- (copy) the copy is now stale: the run went on (in the ledger the move went to, on the
  same environment). Imported
  (a) into the ledger it came from: refused (another journal: a rollback of the move);
  (b) into a fresh ledger with a copy of the source's witness: refused (a rollback);
  (c) into a fresh ledger with a fresh witness: installed frozen (``needs_review``:
  "imported from a copy ..."), and a resume executes nothing (a copy of a run that had
  already ended is installed as it was: a resume only returns its outcome).

The case's verdict is the continuation's; anything the copy did wrong makes it DIVERGED.
A checkpoint taken before the first act holds no observation of the environment: a
stale *runnable* import of it would repeat every effect (the gap moves close).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from crashproof.errors import CheckpointRejected, RunFailed, RunFrozen, RunMoved
from crashproof.integrity import checkpoint
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
from crashproof.verify.trial_kit import (
    DURABILITY,
    Mode,
    crash_once,
    env_dir,
    open_ledger,
    run_scenario,
)

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
    problems: list[str] = []
    with open_ledger(directory) as ledger:
        copy = ledger.export_run(run_id, copy=True)
        held = recorded_decisions(read_run(ledger, run_id))
        original = intents(read_run(ledger, run_id))
        moved = ledger.export_run(run_id, by=_BY)
        if checkpoint.digest(ledger.export_run(run_id)) != checkpoint.digest(moved):
            problems.append("(move) exporting the moved run again gave another checkpoint")
    problems += _source_refuses(scenario, directory)
    fresh = directory / "fresh"
    fresh.mkdir(exist_ok=True)
    result = _resume_fresh(
        scenario, reference, case, directory, fresh, moved, (held, original), problems
    )
    generation = _generation(copy)
    with open_ledger(directory) as ledger:
        found, same = _import_same(ledger, copy, generation, generation + 1)
    problems += found
    found, witnessed = _import_witnessed(directory, copy, generation, run_id)
    problems += found
    found, frozen = _import_copy(scenario, directory, copy)
    problems += found
    notes = "; ".join(
        n for n in ("(move) the source refused to resume", same, witnessed, frozen) if n
    )
    if problems:
        reason = "; ".join(
            p for p in (result.reason if result.verdict is Verdict.DIVERGED else "", *problems) if p
        )
        return dataclasses.replace(result, verdict=Verdict.DIVERGED, reason=reason)
    return dataclasses.replace(result, reason="; ".join(r for r in (result.reason, notes) if r))


def _source_refuses(scenario: Scenario[Any], directory: Path) -> list[str]:
    """(move) The source, asked to resume the run it moved out, refuses and changes
    nothing: no effect, no model call, the same artifacts."""
    env = scenario.env_factory(env_dir(directory))
    problems = []
    try:
        with open_ledger(directory) as ledger:
            before = observe(scenario, env, ledger)
            try:
                run_scenario(scenario, ledger, env)
            except RunMoved:
                pass
            except Exception as exc:
                problems.append(
                    f"(move) resuming the source raised {type(exc).__name__}: {exc}, not RunMoved"
                )
            else:
                problems.append("(move) the source ran the run on after moving it out")
            after = observe(scenario, env, ledger)
    finally:
        close_env(env)
    if (after.fingerprint, after.effects, after.model_calls) != (
        before.fingerprint,
        before.effects,
        before.model_calls,
    ):
        problems.append("(move) the refused resume of the source changed the environment")
    return problems


def _import_copy(scenario: Scenario[Any], directory: Path, copy: Any) -> tuple[list[str], str]:
    """(c) The stale copy into a fresh ledger: installed frozen; a resume does nothing."""
    there = directory / "copy"
    there.mkdir(exist_ok=True)
    env = scenario.env_factory(env_dir(directory))
    try:
        with open_ledger(there) as ledger:
            before = observe(scenario, env, ledger, fingerprint=True)
            try:
                ledger.import_run(copy, by=_BY)
            except CheckpointRejected as exc:
                return [f"(c) a fresh ledger refused the copy: {exc}"], ""
            status = ledger.get_run(scenario.resolved_run_id).status
            stop: Exception | None = None
            try:
                run_scenario(scenario, ledger, env)
            except Exception as exc:
                stop = exc
            after = observe(scenario, env, ledger)
    finally:
        close_env(env)
    problems = []
    if (after.fingerprint, after.effects, after.model_calls) != (
        before.fingerprint,
        before.effects,
        before.model_calls,
    ):
        problems.append("(c) resuming the imported copy changed the environment")
    if status.terminal:
        return problems, f"(c) the copy of an ended run was installed {status.value}"
    if not isinstance(stop, RunFrozen) or "imported from a copy" not in stop.reason:
        problems.append(
            f"(c) the imported copy was installed {status.value} and its resume "
            f"{'returned' if stop is None else f'raised {type(stop).__name__}: {stop}'}, "
            "not frozen as a copy"
        )
        return problems, ""
    return problems, f"(c) copy REFUSED: {stop.status}: {stop.reason}"


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
    """(move) The stale checkpoint into a fresh ledger, resumed on the same environment.
    ``known``: the decisions the checkpoint holds, the operation ids of the run's acts in
    the original journal."""
    held, original = known
    env = scenario.env_factory(env_dir(directory))
    try:
        with open_ledger(fresh) as ledger:
            try:
                ledger.import_run(document, by=_BY)
            except CheckpointRejected as exc:
                problems.append(f"(move) a fresh ledger refused the checkpoint: {exc}")
                return _result(case, Verdict.DIVERGED, "; ".join(problems))
            before = Counter(scenario.model_calls(env)) if scenario.model_calls else Counter()
            stop: Exception | None = None
            try:
                run_scenario(scenario, ledger, env)
            except Exception as exc:
                stop = exc
            obs = observe(scenario, env, ledger)
    finally:
        close_env(env)
    asked = Counter(obs.model_calls or {}) - before
    again = sorted(k for k in asked if k in held)
    if again:
        problems.append(f"(move) decisions the checkpoint holds were asked again: {again}")
    finished = stop is None
    found, extra = check_effects(reference, obs, finished=finished, other_intents=original)
    problems += [f"(move) {p}" for p in found]
    verdict, reason = Verdict.SAME, ""
    if finished:
        if obs.fingerprint != reference.fingerprint:
            problems.insert(0, f"(move) fingerprint {obs.fingerprint} is not the reference's")
        problems += [f"(move) {p}" for p in check_journal(reference, obs.info)]
    elif isinstance(stop, RunFrozen):
        verdict, reason = Verdict.REFUSED, f"(move) {stop.status}: {stop.reason}"
    elif isinstance(stop, RunFailed):  # a tool refused an act the artifacts already show
        if obs.fingerprint != reference.fingerprint:
            problems.insert(0, f"(move) fingerprint {obs.fingerprint} is not the reference's")
        verdict, reason = Verdict.REFUSED, f"(move) the run failed, nothing redone: {stop}"
    else:
        problems.insert(0, f"(move) the resume raised {type(stop).__name__}: {stop}")
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
