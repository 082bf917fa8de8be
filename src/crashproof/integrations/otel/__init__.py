"""OpenTelemetry for crashproof runs (extra ``crashproof[otel]``): one trace per run,
across crashes and resumes, and spans that only live calls make, so a replay cannot emit
anything twice.

    import crashproof as cp
    from crashproof.integrations.otel import instrument

    ledger = cp.Ledger("sqlite:///runs.db")
    instrument(ledger)  # the global providers; or tracer_provider= / meter_provider=

Two hooks of the ledger, nothing else: ``Ledger.on_call`` opens a live call's span around
its body, current in the thread or task the body runs in, so the openai client's or
httpx's own instrumentation nests under it; ``Ledger.on_commit`` ends it when its record
commits, and makes the run's and the drives' spans from the records. Replay commits
nothing and enters no call scope (pydantic-ai's engines instead re-emit every span on
replay, pydantic/pydantic-ai#6974).

The tree, all in one trace whose id is derived from the run id (``_ids.py`` says why each
id is derived, and which process sends each span):

- ``run <workflow>``: the root, sent when ``run_started`` commits (its time);
- ``drive <workflow>``: one per drive (the first, each resume), a child of the run's span,
  from the drive's first live call or record to its outcome (``crashproof.status``:
  ``succeeded``, ``failed``, ``needs_review``, ``stopped``, ...). A drive whose process
  died is sent by the next drive, from its records in the journal, with
  ``crashproof.status`` = ``died`` and an error status;
- ``step KEY``, ``decide KEY`` (live, current while the body runs; one per attempt, a
  failed attempt with an error status), ``act KEY``, ``check KEY`` (from the records):
  children of their drive's span.

Attributes: ``crashproof.run_id``, ``crashproof.step_key``, ``crashproof.kind``,
``crashproof.status``, ``crashproof.attempt``, ``crashproof.fencing_token``; acts also
``crashproof.operation_id``, ``crashproof.intent_digest``, ``crashproof.receipt_id``,
``crashproof.tool``, ``crashproof.reconciled``. Decisions carry the OpenTelemetry GenAI
semantic conventions (semantic-conventions 1.37 and later: ``gen_ai.provider.name``,
which replaced ``gen_ai.system``): ``gen_ai.operation.name`` (``chat``),
``gen_ai.provider.name``, ``gen_ai.request.model`` (the model asked for),
``gen_ai.response.model`` (the model that answered), ``gen_ai.response.id``,
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` / ``output_tokens``
(``crashproof.models`` reports them all; a ``cp.Decision`` of your own reports what its
``attributes`` hold, and its ``model`` as the response model), and ``crashproof.cost``.

Metrics: ``crashproof.runs`` (outcomes, by ``status``), ``crashproof.acts`` (by
``outcome``: ``confirmed``, ``looked_up``, ``unknown``, ``failed``) and
``crashproof.forced_syncs`` (the store's forced syncs, where it counts them).

Derived ids need the SDK's tracer (``opentelemetry-sdk``'s ``TracerProvider``); with
another provider the spans keep their parents but each process draws its own trace id.
``namespace`` (default: the ledger's URL without its password) goes into every id: give
the same one to every process of a ledger that reaches it by different URLs.

Not covered: records other processes write (an operator's approval, another worker's
drive); those processes instrument their own ledger. A span still open when its process
is killed is lost with the process's unexported spans: export promptly
(``SimpleSpanProcessor``, or a short ``BatchSpanProcessor`` delay) where kills are likely.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode, TraceFlags

import crashproof as cp
from crashproof.integrations.otel import _ids

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
# Spans opened around the body (Ledger.on_call), ended when the call's record commits;
# an act's is opened around its tool's execute. A lookup's span ends with the lookup.
_LIVE = ("step", "decide", "check", "act")
_LEFT = ("new", "released")  # lease decisions after a drive that ended in its process


def instrument(
    ledger: cp.Ledger,
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    namespace: str | None = None,
) -> Telemetry:
    """Emit spans and metrics for the runs ``ledger`` drives in this process."""
    telemetry = Telemetry(
        ledger, tracer_provider=tracer_provider, meter_provider=meter_provider, namespace=namespace
    )
    ledger.on_commit(telemetry.committed)
    ledger.on_call(telemetry.call)
    return telemetry


class Telemetry:
    """The call scope and the commit observer: live calls and records in, spans and
    counts out (thread-safe: a body runs in a worker thread, an async ledger commits
    from a commit thread)."""

    def __init__(
        self,
        ledger: cp.Ledger,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        namespace: str | None = None,
    ) -> None:
        self._ledger = ledger
        self._ns = namespace if namespace is not None else ledger.shown_url
        self._tracer = trace.get_tracer("crashproof", cp.__version__, tracer_provider)
        self._chosen: _ids.Chosen | None = None
        inner = getattr(self._tracer, "id_generator", None)
        if inner is not None:  # the SDK's tracer (this one is ours alone): derived ids
            self._chosen = _ids.Chosen(inner)
            self._tracer.id_generator = self._chosen  # type: ignore[attr-defined]
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
        self._drives: dict[str, tuple[int | None, Span]] = {}  # run id -> open drive span
        self._first: dict[tuple[str, int | None], float] = {}  # a drive's first live call
        self._live: dict[tuple[str, str], Span] = {}  # (run, key) -> a call's open span
        self._intents: dict[tuple[str, str], float] = {}  # (run, act key) -> first intent

    # -- spans with derived ids ---------------------------------------------------------

    def _start(
        self,
        name: str,
        run_id: str,
        span_id: int,
        parent_id: int | None,
        at: float,
        attributes: dict[str, Any],
    ) -> Span:
        trace_id = _ids.trace_id(self._ns, run_id)
        context = otel_context.Context()  # no parent: not whatever is current here
        if parent_id is not None:
            parent = SpanContext(trace_id, parent_id, False, TraceFlags(TraceFlags.SAMPLED))
            context = trace.set_span_in_context(NonRecordingSpan(parent), context)
        chosen = _nothing()
        if self._chosen is not None and span_id:  # 0: drawn (a span no other process names)
            chosen = self._chosen.choose(trace_id, span_id)
        with chosen:
            return self._tracer.start_span(
                name, context=context, attributes=attributes, start_time=_ns(at)
            )

    def _drive_parent(self, run_id: str, token: int | None) -> int:
        return _ids.drive_id(self._ns, run_id, token)

    # -- the call scope (Ledger.on_call) -------------------------------------------------

    @contextlib.contextmanager
    def call(self, call: cp.LiveCall) -> Iterator[None]:
        """A live step's or decision's span, current while its body runs; ended when its
        record commits (``committed``), dropped when the body ends in a crash."""
        if call.kind == "lookup":
            with self._lookup(call):
                yield
            return
        if call.kind not in _LIVE:
            yield
            return
        now = time.time()
        attributes: dict[str, Any] = {
            "crashproof.run_id": call.run_id,
            "crashproof.step_key": call.key,
            "crashproof.kind": call.kind,
            "crashproof.attempt": call.attempt,
        }
        if call.fencing_token is not None:
            attributes["crashproof.fencing_token"] = call.fencing_token
        span_id = _ids.call_id(self._ns, call.run_id, call.key, call.attempt, call.seq)
        parent = self._drive_parent(call.run_id, call.fencing_token)
        span = self._start(f"{call.kind} {call.key}", call.run_id, span_id, parent, now, attributes)
        with self._lock:
            self._first.setdefault((call.run_id, call.fencing_token), now)
            self._live[call.run_id, call.key] = span
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False):
                yield
        except Exception:
            raise  # the attempt's record (failed, or failed and retried) ends the span
        except BaseException:  # a crash: never ended here; its resume sends this id
            with self._lock:
                self._live.pop((call.run_id, call.key), None)
            raise
        finally:
            if call.attributes:
                span.set_attributes(call.attributes)

    @contextlib.contextmanager
    def _lookup(self, call: cp.LiveCall) -> Iterator[None]:
        """A lookup's span (an act in flight asked of its target): current while the
        tool asks, ended when it answers, under the drive's span."""
        attributes = {
            "crashproof.run_id": call.run_id,
            "crashproof.step_key": call.key,
            "crashproof.kind": "lookup",
            "crashproof.attempt": call.attempt,
        }
        span_id = _ids.call_id(self._ns, call.run_id, f"{call.key}#lookup", call.attempt, 0)
        parent = self._drive_parent(call.run_id, call.fencing_token)
        span = self._start(
            f"lookup {call.key}", call.run_id, span_id, parent, time.time(), attributes
        )
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False):
                yield
        except Exception as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()

    # -- the commit observer (Ledger.on_commit) -----------------------------------------

    def committed(self, records: Sequence[Any], fencing_token: int | None) -> None:
        with self._lock:
            for record in records:
                self._record(record, fencing_token)

    def _record(self, record: Any, token: int | None) -> None:
        kind = record.type.value
        run_id = record.run_id
        payload = record.payload
        if "session" in payload or run_id not in self._drives:
            self._begin_drive(record, payload, token)
        if kind in ("step_done", "attempt_failed"):
            self._step(record, payload, token, failed_attempt=kind == "attempt_failed")
        elif kind == "act_intent":
            self._intents.setdefault((run_id, str(record.key)), record.created_at)
        elif kind == "act_unknown":
            self._acts.add(1, {"outcome": "unknown"})
            span = self._live.pop((run_id, str(record.key)), None)
            if span is not None:  # its execute's span: what happened is not known
                span.set_status(Status(StatusCode.ERROR, "outcome unknown"))
                span.end(end_time=_ns(record.created_at))
        elif kind in _OUTCOMES:
            status = _OUTCOMES[kind] or str(payload.get("status", "needs_review"))
            self._runs.add(1, {"status": status})
            self._end_drive(run_id, status, payload.get("reason"), record.created_at)

    def _root(self, run_id: str, workflow: str, started: float, at: float) -> None:
        """The run's span, at the first record of its first drive (lease token 1, which
        no other drive of the run holds): sent once, before any child."""
        span = self._start(
            f"run {workflow}",
            run_id,
            _ids.run_id(self._ns, run_id),
            None,
            started,
            {"crashproof.run_id": run_id, "crashproof.workflow": str(workflow)},
        )
        span.end(end_time=_ns(at))

    def _begin_drive(self, record: Any, payload: dict[str, Any], token: int | None) -> None:
        run_id = record.run_id
        previous = self._drives.pop(run_id, None)
        if previous is not None:  # a new session of the same run: the last one ended here
            previous[1].end(end_time=_ns(record.created_at))
        session = payload.get("session") or {}
        workflow = session.get("workflow") or payload.get("workflow") or "run"
        lease = session.get("lease") or {}
        if previous is None and lease.get("decision") not in (*_LEFT, None):
            self._died(run_id, workflow, lease.get("previous_token"), record.seq)
        attributes: dict[str, Any] = {"crashproof.run_id": run_id}
        if token is not None:
            attributes["crashproof.fencing_token"] = token
        started = min(record.created_at, self._first.pop((run_id, token), record.created_at))
        if lease.get("decision") == "new":
            self._root(run_id, str(workflow), started, record.created_at)
        span = self._start(
            f"drive {workflow}",
            run_id,
            self._drive_parent(run_id, token),
            _ids.run_id(self._ns, run_id),
            started,
            attributes,
        )
        self._drives[run_id] = (token, span)

    def _died(self, run_id: str, workflow: str, token: Any, before: int) -> None:
        """The drive under ``token`` ended with its process (the lease was taken over,
        not released): its span, which its spans name as their parent, sent from its
        records. A drive that wrote nothing is parent to nothing sent: no span."""
        if not isinstance(token, int):
            return
        try:
            events = [e for e in self._ledger.journal(run_id, results=False) if e.seq < before]
        except Exception:  # the drive goes on; this span is what is lost
            return
        opened = [i for i, e in enumerate(events) if _token_of(e) == token]
        if not opened:
            return
        first = opened[0]
        last = first
        for i in range(first + 1, len(events)):
            if _token_of(events[i]) is not None:  # the next drive's first record
                break
            last = i
        span = self._start(
            f"drive {workflow}",
            run_id,
            self._drive_parent(run_id, token),
            _ids.run_id(self._ns, run_id),
            events[first].created_at,
            {
                "crashproof.run_id": run_id,
                "crashproof.fencing_token": token,
                "crashproof.status": "died",
            },
        )
        span.set_status(Status(StatusCode.ERROR, "the process driving it died"))
        span.end(end_time=_ns(events[last].created_at))

    def _end_drive(self, run_id: str, status: str, reason: Any, at: float) -> None:
        for live in [k for k in self._live if k[0] == run_id]:  # an act frozen in flight
            span = self._live.pop(live)
            span.set_status(Status(StatusCode.ERROR, f"the run ended {status} first"))
            span.end(end_time=_ns(at))
        found = self._drives.pop(run_id, None)
        if found is None:
            return
        self._first.pop((run_id, found[0]), None)  # a live call begun after its first record
        span = found[1]
        span.set_attribute("crashproof.status", status)
        if status in ("failed", "needs_review"):
            span.set_status(Status(StatusCode.ERROR, str(reason or status)))
        span.end(end_time=_ns(at))

    def _step(
        self, record: Any, payload: dict[str, Any], token: int | None, *, failed_attempt: bool
    ) -> None:
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
        status = "failed" if failed_attempt else str(payload.get("status"))
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
        span = self._live.pop((record.run_id, key), None)
        if span is None:  # made from the record alone (a lookup found the receipt)
            if failed_attempt:
                return
            parent = self._drive_parent(record.run_id, token)
            # An act's id is its attempt's: the killed execute's own spans nest under it.
            span_id = 0
            if kind == "act":
                span_id = _ids.call_id(
                    self._ns, record.run_id, key, attributes["crashproof.attempt"], 0
                )
            span = self._start(f"{kind} {key}", record.run_id, span_id, parent, started, {})
        span.set_attributes(attributes)
        if status != "succeeded":
            error = payload.get("error") or {}
            span.set_status(Status(StatusCode.ERROR, str(error.get("type") or status)))
        span.end(end_time=_ns(ended))


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def _token_of(event: Any) -> Any:
    session = event.payload.get("session") if isinstance(event.payload, dict) else None
    return session.get("fencing_token") if isinstance(session, dict) else None


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
    if payload.get("model"):  # what answered (crashproof.models: the response's model)
        found["gen_ai.response.model"] = payload["model"]
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
