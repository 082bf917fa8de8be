"""The compatibility verdict: before a resume under changed code or schema, may the run go on?

003: "only when the old state is explicitly mapped and the replay invariants pass may a
worker take a new fencing token; otherwise human review". So, before a drive claims a
run's lease, :func:`gate` compares what the run's last drive ran under (its session
record, or the last verdict) with what this drive would: the workflow version and the
ledger's schema version. When either changed it computes a verdict, reading only:

- ``changed``: the versions before and now, and every tool whose contract version the
  code now calls differs from the one its recorded acts ran under;
- ``mapped``: recorded acts whose tool contract changed and whose declared mapping
  (``Tool.contract_mappings``) maps the recorded params exactly to the code's;
- ``value_maps`` and ``defaults``: what the schema migrations since the last drive
  declared (``-- map:`` lines, new columns with their default);
- ``replay``: the replay check (runtime/replayer/check.py), tool contracts mapped;
- ``unresolved``: each item that blocks it — the replay check not compatible, an act
  whose contract change is mapped but not yet applied (``crashproof migrate --app``).

``resumable`` (nothing unresolved): the drive claims the lease and journals the verdict
as its first record, session included. ``needs_review``: no drive starts, no workflow
code runs and no tool is called; the verdict and a freeze citing it as evidence are
journaled the way an operator's write is (a short claim, one commit, a release), and
``RunFrozen`` is raised. A run that ended, or is frozen for another reason, is not
gated: its drive answers from the journal. A version the code cannot resume at all
(``compatible_with``) is refused by the drive as before (UnknownWorkflow, nothing written).

A tool contract change alone (same workflow version and schema) is seen only where the
code calls the tool: the drive's replay meets the mismatching act before any live call
and freezes (NonDeterminismError, as before). ``apply_mappings`` (``crashproof migrate
--app``, after ``--preview``) then journals a resumable verdict and lifts such a freeze
when every contract change is mapped and the replay check passes: the fold
(journal/fold.py) matches each mapped act against its mapped intent digest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from crashproof._faults import CrashPoints
from crashproof.errors import CrashproofError, RunFrozen
from crashproof.integrity.witness import Witness
from crashproof.journal import payloads
from crashproof.journal.codec import error_record
from crashproof.journal.fold import index_journal
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.runtime.driving.leases import claim, release, stop_driving
from crashproof.runtime.guards.budget import operator
from crashproof.runtime.port import DriveHost, PendingRecord, RunSession, WrittenBatch
from crashproof.runtime.replayer.check import COMPATIBLE, ReplayVerdict, replay_events
from crashproof.runtime.workflow import Workflow
from crashproof.store.migrate import declared_changes
from crashproof.store.port import StatusChange, Store

__all__ = [
    "RESUMABLE",
    "Gate",
    "apply_mappings",
    "compute",
    "drive_schema",
    "gate",
    "last_versions",
]

RESUMABLE = "resumable"
NEEDS_REVIEW = "needs_review"


@dataclass(slots=True)
class Gate:
    """What :func:`gate` found for one drive: the schema it runs on (named in the
    session), and the resumable verdict the drive journals first (None: nothing changed)."""

    schema: int | None
    verdict: dict[str, Any] | None = None

    def record(self, session: RunSession, info: dict[str, Any] | None) -> None:
        """Under the drive's lease: name the schema in the session ``info``, then journal
        the verdict (it carries the session, as the drive's first record)."""
        if info is not None and self.schema is not None:
            info["schema"] = self.schema
        if self.verdict is not None:
            session.append_event(EventType.COMPATIBILITY_VERDICT, None, self.verdict)


class _ReadOnly:
    """The ledger as the verdict's replay check sees it: reads pass through, any write is
    refused (the check runs no step, so none is expected), no crash point is armed, and a
    draining worker does not stop the check."""

    def __init__(self, host: DriveHost) -> None:
        self._host = host
        self.url, self.shown_url, self.worker_id = host.url, host.shown_url, host.worker_id
        self.lease_seconds, self.durability = host.lease_seconds, host.durability
        self.act_settings, self.store_requests = host.act_settings, host.store_requests
        self.crash_points: CrashPoints | None = None
        self.draining = False
        self.call_scopes: tuple[Any, ...] = ()  # a replay check runs no call live

    @property
    def store(self) -> Store:
        return self._host.store

    @property
    def witness(self) -> Witness | None:
        return self._host.witness

    def journal(self, run_id: str, *, owner: bool = False, results: bool = True) -> list[Event]:
        return self._host.journal(run_id, results=results)

    def append_records(
        self,
        events: Sequence[Event],
        status: StatusChange | None,
        *,
        fencing_token: int | None = None,
        output: bool | None = None,
    ) -> None:
        raise CrashproofError(
            f"run {events[0].run_id!r}: the compatibility verdict's replay check tried to "
            "write a record; nothing was written"
        )

    def commit_batch(
        self, groups: Sequence[Sequence[PendingRecord]]
    ) -> list[tuple[int, Exception] | None]:
        self.append_records(groups[0][0][0], None)
        return []

    def write_batch(self, groups: Sequence[Sequence[PendingRecord]]) -> WrittenBatch:
        self.append_records(groups[0][0][0], None)
        return WrittenBatch([], [], None)

    def wait_durable(self, batches: Sequence[WrittenBatch]) -> None:
        return None

    def conclude_batch(self, written: WrittenBatch, groups: Iterable[int]) -> None:
        return None

    def check_driving(self, run_id: str) -> None:
        return None


def last_versions(events: list[Event]) -> dict[str, Any]:
    """What the run's last drive ran under: workflow and schema versions (schema None when
    no drive named it), from its latest session record or verdict, else its start."""
    for event in reversed(events):
        if event.type is EventType.COMPATIBILITY_VERDICT:
            verdict = payloads.compatibility_verdict(event)
            if verdict.get("decision") == RESUMABLE:  # one that refused changed nothing
                return dict(verdict.get("versions") or {})
            continue
        if event.mentions("session"):
            found: dict[str, Any] = dict(payloads.drive_record(event).get("session") or {})
            return {"workflow": found.get("workflow_version"), "schema": found.get("schema")}
    return {"workflow": payloads.run_started(events[0]).get("version"), "schema": None}


def _dialect(host: DriveHost) -> str:
    return "postgres" if host.url.startswith(("postgresql://", "postgres://")) else "sqlite"


def drive_schema(host: DriveHost) -> int | None:
    """The store's schema version a drive runs on (named in its session)."""
    return host.store.schema_version() if not host.url.startswith("memory:") else None


def gate(host: DriveHost, workflow: Workflow[Any], run_id: str) -> Gate:
    """Before the drive's lease: the verdict, when the workflow or schema version changed
    since the run's last drive. Raises RunFrozen (journaled) when it is not resumable."""
    schema = drive_schema(host)
    events = host.journal(run_id)
    replay = index_journal(events)
    outcome = replay.outcome
    if outcome is not None and not (
        outcome.type is EventType.RUN_STOPPED
        or (outcome.type is EventType.RUN_FROZEN and payloads.run_frozen(outcome).get("retryable"))
    ):
        return Gate(schema)  # ended or frozen: the drive answers from the journal
    if not workflow.can_resume(str(payloads.run_started(replay.started).get("version"))):
        return Gate(schema)  # the drive refuses it (UnknownWorkflow), nothing written
    changed = _changes(events, workflow, schema)
    if not changed:
        return Gate(schema)
    verdict = compute(host, workflow, events, changed, schema)
    if verdict["decision"] == RESUMABLE:
        return Gate(schema, verdict)
    _freeze(host, run_id, verdict)


def _changes(events: list[Event], workflow: Workflow[Any], schema: int | None) -> dict[str, Any]:
    """The workflow and schema versions that changed since the run's last drive."""
    before = last_versions(events)
    changed: dict[str, Any] = {}
    if before.get("workflow") not in (None, workflow.version):
        changed["workflow"] = [before["workflow"], workflow.version]
    if before.get("schema") is not None and schema is not None and before["schema"] != schema:
        changed["schema"] = [before["schema"], schema]
    return changed


def compute(
    host: DriveHost,
    workflow: Workflow[Any],
    events: list[Event],
    changed: dict[str, Any],
    schema: int | None,
    *,
    applying: bool = False,
) -> dict[str, Any]:
    """The verdict for ``events`` under ``workflow`` (reads only; writes nothing).
    ``applying``: an operator applies the mapped contract changes with this verdict, so
    mapped acts do not block it."""
    check: ReplayVerdict = replay_events(workflow, events, _ReadOnly(host), map_contracts=True)
    recorded = _recorded_tools(events)
    tools = {n: [recorded[n], v] for n, v in check.tools if n in recorded and recorded[n] != v}
    if tools:
        changed = {**changed, "tools": tools}
    unresolved = []
    if check.status != COMPATIBLE:
        unresolved.append(f"the replay check: {check.detail}")
    applied = index_journal(events).done  # acts an earlier verdict mapped match already
    pending = [m for m in check.mapped if not applying and not _applied(applied, m)]
    for m in pending:
        unresolved.append(
            f"act {m['key']!r}: tool {m['tool']!r} contract {m['from_version']} -> "
            f"{m['to_version']}, explained by its declared mapping but not applied; preview "
            "with `crashproof migrate --preview --app MODULE`, apply with `crashproof "
            "migrate --app MODULE`"
        )
    since = (changed.get("schema") or [schema, schema])[0]
    maps, defaults = (
        declared_changes(_dialect(host), int(since), int(schema))
        if since is not None and schema is not None
        else ([], [])
    )
    return payloads.as_dict(
        payloads.CompatibilityVerdict(
            decision=NEEDS_REVIEW if unresolved else RESUMABLE,
            changed=changed,
            versions={
                "workflow": workflow.version,
                "schema": schema,
                "tools": dict(check.tools),
            },
            mapped=list(check.mapped),
            value_maps=maps,
            defaults=defaults,
            unresolved=unresolved,
            replay=check.to_json(),
            generation=len(events),
        )
    )


def _recorded_tools(events: list[Event]) -> dict[str, str]:
    """The contract version each tool's latest recorded intent ran under, by name."""
    out: dict[str, str] = {}
    for event in events:
        if event.type is EventType.ACT_INTENT:
            intent = payloads.act_intent(event)
            out[str(intent.get("tool"))] = str(intent.get("tool_version"))
    return out


def _applied(done: list[Event], mapped: dict[str, Any]) -> bool:
    return any(
        e.key == mapped["key"] and payloads.step_done(e).get("digest") == mapped["to_digest"]
        for e in done
    )


def _freeze(host: DriveHost, run_id: str, verdict: dict[str, Any]) -> NoReturn:
    """Journal the verdict and a freeze citing it (one commit, under a short claim that
    drives nothing), then raise RunFrozen."""
    first = verdict["unresolved"][0]
    reason = f"compatibility verdict needs_review: {first}"
    evidence = {"compatibility_verdict": verdict}
    cause = RunFrozen(run_id, RunStatus.NEEDS_REVIEW.value, reason, None, evidence=evidence)
    frozen = payloads.RunFrozen(
        status=RunStatus.NEEDS_REVIEW.value,
        reason=reason,
        evidence=evidence,
        retryable=False,
        error=error_record(cause),
    )

    def build(events: list[Event]) -> list[Event]:
        now, seq = time.time(), len(events)
        return [
            Event(run_id, seq, EventType.COMPATIBILITY_VERDICT, None, verdict, now),
            Event(run_id, seq + 1, EventType.RUN_FROZEN, None, payloads.as_dict(frozen), now),
        ]

    _append(host, run_id, build, (RunStatus.NEEDS_REVIEW, reason))
    raise cause


def _append(
    host: DriveHost,
    run_id: str,
    build: Callable[[list[Event]], list[Event]],
    status: StatusChange | None,
) -> list[Event]:
    """Under a short claim of the run's lease (as an operator's write): read the journal,
    build records, commit them at once, release. A live holder raises LeaseHeld."""
    lease = claim(host.store, run_id, host.worker_id, host.lease_seconds, False).lease
    try:
        added: list[Event] = build(host.journal(run_id, owner=True))
        if added:
            host.append_records(added, status, fencing_token=lease.token)
    except BaseException as exc:
        stop_driving(lease.owner, run_id)
        if isinstance(exc, Exception):
            release(host.store, run_id, lease)
        raise
    stop_driving(lease.owner, run_id)
    release(host.store, run_id, lease)
    return added


def apply_mappings(
    host: DriveHost,
    workflows: dict[str, Workflow[Any]],
    *,
    preview: bool,
    by: str | None = None,
) -> list[dict[str, Any]]:
    """``crashproof migrate --app``: for every run not ended whose replay under the code
    maps a tool contract change, or that a needs_review verdict froze, the verdict under
    the code now (mappings applied); unless ``preview``, a resumable one is journaled
    (with ``by``/``host``), and the freeze it resolves (that verdict's, or the
    non-determinism at a mapped act) is lifted. Returns one entry per such run: run_id,
    verdict, applied, thawed."""
    out = []
    for row in host.store.list_runs():
        workflow = workflows.get(row.workflow)
        if workflow is None or row.status.terminal:
            continue
        events = host.journal(row.run_id)
        started = str(payloads.run_started(events[0]).get("version"))
        if not workflow.can_resume(started):
            continue
        schema = host.store.schema_version() if not host.url.startswith("memory:") else None
        changed = _changes(events, workflow, schema)
        verdict = compute(host, workflow, events, changed, schema, applying=True)
        replay = index_journal(events)
        fresh = [m for m in verdict["mapped"] if not _applied(replay.done, m)]
        thaw = _resolves(replay.outcome, fresh)
        if not fresh and not thaw:
            continue  # nothing to map (or mapped already), no verdict's freeze to lift
        entry = {"run_id": row.run_id, "verdict": verdict, "applied": False, "thawed": thaw}
        out.append(entry)
        if preview or verdict["decision"] != RESUMABLE:
            continue
        who = operator(by)
        build = _applier({**verdict, **who}, thaw, who["by"])
        _append(host, row.run_id, build, (RunStatus.RUNNING, None) if thaw else None)
        entry["applied"] = True
    return out


def _applier(record: dict[str, Any], thaw: bool, by: str) -> Callable[[list[Event]], list[Event]]:
    """The records applying ``record`` (a verdict), and the thaw of a freeze it resolves;
    refused when the journal moved since the verdict was computed."""

    def build(current: list[Event]) -> list[Event]:
        run_id, now, seq = current[0].run_id, time.time(), len(current)
        if seq != record["generation"]:
            raise CrashproofError(
                f"run {run_id!r} changed while its verdict was computed; nothing was "
                "applied. Preview again."
            )
        added = [Event(run_id, seq, EventType.COMPATIBILITY_VERDICT, None, record, now)]
        if thaw:
            thawed = payloads.as_dict(payloads.RunThawed(status="running", by=by))
            added.append(Event(run_id, seq + 1, EventType.RUN_THAWED, None, thawed, now))
        return added

    return build


def _resolves(outcome: Event | None, mapped: list[dict[str, Any]]) -> bool:
    """Whether the run's freeze is one the mappings resolve: a needs_review verdict, or
    the non-determinism at an act they map (the journal's digest and the code's)."""
    if outcome is None or outcome.type is not EventType.RUN_FROZEN:
        return False
    evidence = payloads.run_frozen(outcome).get("evidence") or {}
    if "compatibility_verdict" in evidence:
        return True
    expected, actual = evidence.get("expected"), evidence.get("actual")
    if not isinstance(expected, dict) or not isinstance(actual, dict):
        return False
    return any(
        expected.get("key") == m["key"]
        and expected.get("digest") == m["from_digest"]
        and actual.get("digest") == m["to_digest"]
        for m in mapped
    )
