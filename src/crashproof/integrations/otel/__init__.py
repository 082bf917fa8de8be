"""OpenTelemetry for crashproof runs (extra ``crashproof[otel]``): spans and metrics made
from the records a drive commits, so a replay cannot emit anything twice.

    import crashproof as cp
    from crashproof.integrations.otel import instrument

    ledger = cp.Ledger("sqlite:///runs.db")
    instrument(ledger)  # the global providers; or tracer_provider= / meter_provider=

Why from committed records: replay commits nothing (a recorded step, decision or act
returns its recorded value), so the commit is the one place that knows a call ran live,
and it knows it once, in the process that ran it (``Ledger.on_commit``). pydantic-ai's
engines instead re-emit every span on replay (pydantic/pydantic-ai#6974).

Spans, each with the times the journal recorded (a step's ``took_us`` before its record's
time; an act from its first intent in this process to its receipt):

- ``drive <workflow>``: one per drive of a run in this process, from its first committed
  record to its outcome (``succeeded``, ``failed``, ``needs_review``, ``stopped``, ...). A
  drive that dies has no outcome record, and its span is never exported: the children it
  exported name a parent that never arrives, which is what happened;
- ``step KEY``, ``decide KEY``, ``act KEY``, ``check KEY``: one per live call, a child of
  its drive's span.

Attributes: ``crashproof.run_id``, ``crashproof.step_key``, ``crashproof.kind``,
``crashproof.status``, ``crashproof.attempt``, ``crashproof.fencing_token``; acts also
``crashproof.operation_id``, ``crashproof.intent_digest``, ``crashproof.receipt_id``,
``crashproof.tool``, ``crashproof.reconciled``; decisions the GenAI conventions
``gen_ai.operation.name`` (``chat``), ``gen_ai.request.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens`` where the decision recorded them
(``crashproof.models`` does), and ``crashproof.cost``.

Metrics: ``crashproof.runs`` (outcomes, by ``status``), ``crashproof.acts`` (by
``outcome``: ``confirmed``, ``looked_up``, ``unknown``, ``failed``) and
``crashproof.forced_syncs`` (the store's forced syncs, where it counts them).

Not covered: records other processes write (an operator's approval, another worker's
drive); those processes instrument their own ledger.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, Status, StatusCode

import crashproof as cp

__all__ = ["Telemetry", "instrument"]

_OUTCOMES = {
    "run_succeeded": "succeeded",
    "run_failed": "failed",
    "run_frozen": None,  # its payload names the status (needs_review, awaiting_approval)
    "run_stopped": "stopped",
    "run_cancelled": "cancelled",
    "run_moved": "moved",
}
_KINDS = ("step", "decide", "act", "check")  # the calls that get a span (not clocks, markers)


def instrument(
    ledger: cp.Ledger, *, tracer_provider: Any = None, meter_provider: Any = None
) -> Telemetry:
    """Emit spans and metrics for the runs ``ledger`` drives in this process."""
    telemetry = Telemetry(ledger, tracer_provider=tracer_provider, meter_provider=meter_provider)
    ledger.on_commit(telemetry.committed)
    return telemetry


class Telemetry:
    """The commit observer: records in, spans and counts out (thread-safe: an async
    ledger commits from a commit thread)."""

    def __init__(
        self, ledger: cp.Ledger, *, tracer_provider: Any = None, meter_provider: Any = None
    ) -> None:
        self._tracer = trace.get_tracer("crashproof", cp.__version__, tracer_provider)
        meter = metrics.get_meter("crashproof", cp.__version__, meter_provider)
        self._runs = meter.create_counter("crashproof.runs", description="run outcomes")
        self._acts = meter.create_counter("crashproof.acts", description="acts by outcome")
        store = ledger.store

        def syncs(_: CallbackOptions) -> list[Observation]:
            count = getattr(store, "syncs", None)
            return [] if not isinstance(count, int) else [Observation(count)]

        meter.create_observable_counter(
            "crashproof.forced_syncs", [syncs], description="forced syncs of the journal"
        )
        self._lock = threading.Lock()
        self._drives: dict[str, Span] = {}  # run id -> its open drive span
        self._intents: dict[tuple[str, str], float] = {}  # (run, act key) -> first intent

    def committed(self, records: Sequence[Any], fencing_token: int | None) -> None:
        with self._lock:
            for record in records:
                self._record(record, fencing_token)

    def _record(self, record: Any, token: int | None) -> None:
        kind = record.type.value
        run_id = record.run_id
        payload = record.payload
        if kind == "run_started" or "session" in payload or run_id not in self._drives:
            self._begin_drive(record, payload, token)
        if kind == "step_done":
            self._step(record, payload, token)
        elif kind == "act_intent":
            self._intents.setdefault((run_id, str(record.key)), record.created_at)
        elif kind == "act_unknown":
            self._acts.add(1, {"outcome": "unknown"})
        elif kind in _OUTCOMES:
            status = _OUTCOMES[kind] or str(payload.get("status", "needs_review"))
            self._runs.add(1, {"status": status})
            self._end_drive(run_id, status, payload.get("reason"), record.created_at)

    def _begin_drive(self, record: Any, payload: dict[str, Any], token: int | None) -> None:
        run_id = record.run_id
        previous = self._drives.pop(run_id, None)
        if previous is not None:  # a new session of the same run: the last one ended here
            previous.end(end_time=_ns(record.created_at))
        session = payload.get("session") or {}
        workflow = session.get("workflow") or payload.get("workflow") or "run"
        attributes: dict[str, Any] = {"crashproof.run_id": run_id}
        if token is not None:
            attributes["crashproof.fencing_token"] = token
        self._drives[run_id] = self._tracer.start_span(
            f"drive {workflow}", attributes=attributes, start_time=_ns(record.created_at)
        )

    def _end_drive(self, run_id: str, status: str, reason: Any, at: float) -> None:
        span = self._drives.pop(run_id, None)
        if span is None:
            return
        span.set_attribute("crashproof.status", status)
        if status in ("failed", "needs_review"):
            span.set_status(Status(StatusCode.ERROR, str(reason or status)))
        span.end(end_time=_ns(at))

    def _step(self, record: Any, payload: dict[str, Any], token: int | None) -> None:
        kind = str(payload.get("kind"))
        if kind not in _KINDS:
            return
        key = str(record.key)
        ended = record.created_at
        if payload.get("ended_at") is not None:
            ended = float(payload["ended_at"])
        started = ended - int(payload.get("took_us") or 0) / 1e6
        if payload.get("started_at") is not None:
            started = float(payload["started_at"])
        intent = self._intents.pop((record.run_id, key), None)
        if kind == "act" and intent is not None:
            started = min(started, intent)
        status = str(payload.get("status"))
        attributes: dict[str, Any] = {
            "crashproof.run_id": record.run_id,
            "crashproof.step_key": key,
            "crashproof.kind": kind,
            "crashproof.status": status,
            "crashproof.attempt": int(payload.get("attempt") or 0),
        }
        if token is not None:
            attributes["crashproof.fencing_token"] = token
        if kind == "act":
            attributes.update(_act_attributes(payload))
            self._acts.add(1, {"outcome": _act_outcome(payload)})
        elif kind == "decide":
            attributes.update(_decision_attributes(payload))
        parent = self._drives.get(record.run_id)
        context = None if parent is None else trace.set_span_in_context(parent)
        span = self._tracer.start_span(
            f"{kind} {key}", context=context, attributes=attributes, start_time=_ns(started)
        )
        if status != "succeeded":
            error = payload.get("error") or {}
            span.set_status(Status(StatusCode.ERROR, str(error.get("type") or status)))
        span.end(end_time=_ns(ended))


def _act_attributes(payload: dict[str, Any]) -> dict[str, Any]:
    receipt = payload.get("receipt") or {}
    found = {
        "crashproof.operation_id": payload.get("operation_id"),
        "crashproof.intent_digest": payload.get("intent_digest"),
        "crashproof.receipt_id": receipt.get("receipt_id"),
        "crashproof.tool": receipt.get("tool"),
        "crashproof.reconciled": receipt.get("reconciled"),
    }
    return {k: v for k, v in found.items() if v is not None}


def _act_outcome(payload: dict[str, Any]) -> str:
    if payload.get("status") != "succeeded":
        return "failed"
    return "looked_up" if (payload.get("receipt") or {}).get("reconciled") else "confirmed"


def _decision_attributes(payload: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {"gen_ai.operation.name": "chat"}
    if payload.get("model"):
        found["gen_ai.request.model"] = payload["model"]
    usage = payload.get("usage") or {}
    for ours, theirs in (
        ("input_tokens", "gen_ai.usage.input_tokens"),
        ("output_tokens", "gen_ai.usage.output_tokens"),
    ):
        if isinstance(usage.get(ours), int):
            found[theirs] = usage[ours]
    if isinstance(payload.get("cost"), int | float):
        found["crashproof.cost"] = float(payload["cost"])
    return found


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
