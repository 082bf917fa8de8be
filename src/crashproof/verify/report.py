"""The verifier's findings: one result per crash case, and the report that holds them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_CONTENTION_POINTS",
    "Case",
    "CaseKind",
    "CaseResult",
    "Reference",
    "Report",
    "Verdict",
]

# Crash points (sampled with the seed) given two recoverers and a stale checkpoint.
# Two recoverers and a stale checkpoint at this many crash points (drawn with the seed)
# unless told otherwise: on by default, bounded (see crashproof verify --contention-points).
DEFAULT_CONTENTION_POINTS = 2


class Verdict(enum.StrEnum):
    """How a crash case ended.

    ``SAME``: the resumed run ended with the reference's fingerprint, one effect per
    operation id, and no recorded decision asked again. ``REFUSED``: the run stopped in an
    explicit, explained state (``needs_review``...) without any unsafe effect: acceptable,
    never silent. ``DIVERGED``: anything else.
    """

    SAME = "SAME"
    REFUSED = "REFUSED"
    DIVERGED = "DIVERGED"


class CaseKind(enum.StrEnum):
    REFERENCE = "reference"  # the uninterrupted run itself
    REDELIVERY = "redelivery"  # the finished reference run delivered once more
    CRASH = "crash"  # one crash, then a resume
    DOUBLE_CRASH = "double-crash"  # a crash, a crash during the recovery, then a resume
    TWO_RECOVERERS = "two-recoverers"  # a crash, then two recoverers at once (race, take-over)
    STALE_CHECKPOINT = "stale-checkpoint"  # a checkpoint exported at a crash, imported late
    CHAOS = "chaos"  # the process group SIGKILLed after a random delay (and its recovery)


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """Where the crashes of one case fall: ``at`` is the 1-based index of the crash point in
    the reference run; ``recovery_at`` the index, in the recovery's own crash points, of a
    second crash (double crash), or where the second recoverer takes over (two recoverers,
    ``variant`` "take-over"); ``variant``: which form of a kind ("race", "take-over").
    Chaos: ``at`` is the trial's number, ``delays`` when each child (the run, then its
    recovery) is killed, as fractions of ``span`` (the seconds a child takes to run the
    scenario through, measured): the seed fixes the fractions, the machine the span."""

    kind: CaseKind
    at: int = 0
    point: str = ""
    recovery_at: int | None = None
    recovery_point: str | None = None
    variant: str | None = None
    delays: tuple[float, ...] = ()
    span: float = 0.0

    @property
    def label(self) -> str:
        if self.kind is CaseKind.CRASH:
            return f"#{self.at} {self.point}"
        if self.kind is CaseKind.DOUBLE_CRASH:
            return f"#{self.at} {self.point} -> recovery #{self.recovery_at} {self.recovery_point}"
        if self.kind is CaseKind.TWO_RECOVERERS:
            where = f" at recovery #{self.recovery_at} {self.recovery_point}"
            return f"#{self.at} {self.point} -> {self.variant}" + (
                where if self.recovery_at is not None else ""
            )
        if self.kind is CaseKind.STALE_CHECKPOINT:
            return f"#{self.at} {self.point} -> stale checkpoint"
        if self.kind is CaseKind.CHAOS:
            if self.variant in ("outage", "restart"):
                what = "outage" if self.variant == "outage" else "store restart"
                return f"chaos #{self.at} {what} at {self.delays[0] * self.span * 1000:.0f} ms"
            kills = " -> recovery ".join(
                f"kill at {d * self.span * 1000:.0f} ms" for d in self.delays
            )
            if self.variant == "powercut":
                kills = kills.replace("kill at", "power cut at")
            worker = " (workers)" if self.variant == "worker" else ""
            return f"chaos #{self.at} {kills}{worker}"
        return self.kind.value

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "at": self.at,
            "point": self.point,
            "recovery_at": self.recovery_at,
            "recovery_point": self.recovery_point,
            "variant": self.variant,
            **({"delays": list(self.delays), "span": self.span} if self.delays else {}),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """The verdict of one case, with what the resumed run left behind."""

    case: Case
    verdict: Verdict
    reason: str = ""  # why REFUSED (the run's own reason) or DIVERGED (what differed)
    fingerprint: str | None = None
    effects: dict[str, int] | None = None  # per operation id, from the targets
    extra_effects: dict[str, int] = field(default_factory=dict)  # vs the reference, != 0
    model_calls: int | None = None  # all calls the trial made, crashed runs included
    reasked: tuple[str, ...] = ()  # decisions asked again because a crash lost the answer
    recovery_points: tuple[str, ...] = ()  # crash points the (last) resume passed
    seconds: float = 0.0
    # chaos: kills, kills_during_tool_child, double_crash, finished_before_kill
    chaos: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case.to_json(),
            "label": self.case.label,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "fingerprint": self.fingerprint,
            "effects": self.effects,
            "extra_effects": self.extra_effects,
            "model_calls": self.model_calls,
            "reasked": list(self.reasked),
            "recovery_points": list(self.recovery_points),
            "seconds": round(self.seconds, 4),
            **({"chaos": self.chaos} if self.chaos is not None else {}),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Reference:
    """The uninterrupted run every trial is compared with."""

    fingerprint: str
    result: Any
    points: tuple[str, ...]  # every crash point the run passed, in order
    effects: dict[str, int] | None
    model_calls: dict[str, int] | None
    steps: tuple[tuple[str, str, str], ...]  # (key, kind, status) per journaled step
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "result": self.result,
            "crash_points": list(self.points),
            "effects": self.effects,
            "model_calls": self.model_calls,
            "steps": [list(s) for s in self.steps],
            "seconds": round(self.seconds, 4),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """Everything ``verify`` found. ``ok`` is true when no case DIVERGED."""

    scenario: str
    target: str | None  # MODULE:ATTRIBUTE, when known
    mode: str
    seed: int
    max_points: int | None
    recovery_points: int
    reference: Reference
    results: tuple[CaseResult, ...]
    seconds: float
    contention_points: int | None = 0  # crash points given two recoverers and a stale
    # checkpoint (None: every one)
    trials: int = 0  # chaos mode: wall-clock kill trials
    faults: tuple[str, ...] = ("kill",)  # chaos mode: the faults drawn per trial

    @property
    def ok(self) -> bool:
        return not self.diverged

    @property
    def diverged(self) -> list[CaseResult]:
        return [r for r in self.results if r.verdict is Verdict.DIVERGED]

    @property
    def refused(self) -> list[CaseResult]:
        return [r for r in self.results if r.verdict is Verdict.REFUSED]

    def counts(self) -> dict[str, int]:
        """Results per verdict (every verdict present, zero included)."""
        counts = {v.value: 0 for v in Verdict}
        for r in self.results:
            counts[r.verdict.value] += 1
        return counts

    def kind_counts(self) -> dict[str, dict[str, int]]:
        """Results per case kind and verdict (kinds with no case left out)."""
        counts: dict[str, dict[str, int]] = {}
        for r in self.results:
            row = counts.setdefault(r.case.kind.value, {v.value: 0 for v in Verdict})
            row[r.verdict.value] += 1
        return counts

    def of_kind(self, kind: CaseKind) -> list[CaseResult]:
        return [r for r in self.results if r.case.kind is kind]

    def chaos_counts(self) -> dict[str, int]:
        """Chaos mode, summed over its trials: kills (and those that hit while a tool's
        child process ran), double crashes, runs that finished before their kill, and the
        outcomes: duplicated or lost effects, recorded decisions asked again, runs stuck
        (REFUSED: frozen with a reason) and any other divergence. With ``--faults``:
        worker trials and the runs the next worker took over, model outages, the trials
        they stopped, the stops workers resumed with nobody's help, power cuts (the
        trials, and the kills that were cuts) and store restarts (the trials, and those
        that came before the run ended)."""
        trials = [r for r in self.results if r.case.kind is CaseKind.CHAOS]
        stats = [r.chaos or {} for r in trials]
        return {
            "trials": len(trials),
            "kills": sum(int(s.get("kills", 0)) for s in stats),
            "kills_during_tool_child": sum(int(s.get("kills_during_tool_child", 0)) for s in stats),
            "double_crashes": sum(bool(s.get("double_crash")) for s in stats),
            "finished_before_kill": sum(bool(s.get("finished_before_kill")) for s in stats),
            "duplicated": sum(any(n > 0 for n in r.extra_effects.values()) for r in trials),
            "lost": sum(any(n < 0 for n in r.extra_effects.values()) for r in trials),
            "reasked": sum("recorded before crash" in r.reason for r in trials),
            "worker_trials": sum(r.case.variant == "worker" for r in trials),
            "taken_over_by_a_worker": sum(bool(s.get("taken_over")) for s in stats),
            "outages": sum(r.case.variant == "outage" for r in trials),
            "stopped_by_outage": sum(bool(s.get("outage_stops")) for s in stats),
            "power_cut_trials": sum(r.case.variant == "powercut" for r in trials),
            "power_cuts": sum(int(s.get("power_cuts", 0)) for s in stats),
            "cuts_that_lost_writes": sum(int(s.get("cuts_that_lost_writes", 0)) for s in stats),
            "store_restart_trials": sum(r.case.variant == "restart" for r in trials),
            "store_restarts": sum(int(s.get("store_restarts", 0)) for s in stats),
            "drives_a_restart_stopped": sum(
                int(s.get("drives", 0)) > 1
                for r, s in zip(trials, stats, strict=True)
                if r.case.variant == "restart"
            ),
            "resumed_by_a_worker": sum(  # stops the workers got past with nobody's resume
                int((r.chaos or {}).get("outage_stops", 0))
                for r in trials
                if r.verdict is Verdict.SAME
            ),
            "stuck": sum(r.verdict is Verdict.REFUSED for r in trials),
            "diverged": sum(r.verdict is Verdict.DIVERGED for r in trials),
        }

    def repro(self) -> str:
        """The command that replays this verification, seed included."""
        target = self.target or "MODULE:SCENARIO"
        cmd = f"crashproof verify {target} --mode {self.mode} --seed {self.seed}"
        if self.mode == "chaos":
            faults = "" if self.faults == ("kill",) else f" --faults {','.join(self.faults)}"
            return cmd + f" --trials {self.trials}{faults}"
        if self.max_points is not None:
            cmd += f" --max-points {self.max_points}"
        if self.recovery_points != 3:
            cmd += f" --recovery-points {self.recovery_points}"
        if self.contention_points != DEFAULT_CONTENTION_POINTS:
            shown = "all" if self.contention_points is None else self.contention_points
            cmd += f" --contention-points {shown}"
        return cmd

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "target": self.target,
            "mode": self.mode,
            "seed": self.seed,
            "max_points": self.max_points,
            "recovery_points": self.recovery_points,
            "ok": self.ok,
            "counts": self.counts(),
            "kind_counts": self.kind_counts(),
            "contention_points": self.contention_points,
            "crash_points": len(self.reference.points),
            "reference": self.reference.to_json(),
            "results": [r.to_json() for r in self.results],
            "seconds": round(self.seconds, 3),
            "repro": self.repro(),
            **({"chaos": self.chaos_counts()} if self.mode == "chaos" else {}),
        }
