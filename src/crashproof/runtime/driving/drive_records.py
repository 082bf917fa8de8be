"""A drive's records besides its calls' (a base of ``Context``): one record appended
with the drive's first-record session and a status change (``append_event``), and the
ways a drive stops: a freeze for review (``freeze``, lifted by ``thaw``), a stop the
caller journaled (``halt``) and the run's outcome (``finish``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from crashproof.errors import CrashproofError, NonDeterminismError
from crashproof.journal import payloads, records
from crashproof.journal.codec import error_record
from crashproof.journal.fold import failed_reason
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.runtime.driving.drive_commits import DriveCommits

__all__ = ["DriveRecords"]


class _Counting(Protocol):  # runtime/guards/budget.py's Meter, as these records use it
    active: bool

    def count(self, payload: dict[str, Any]) -> None: ...


class DriveRecords(DriveCommits):
    _clock: Callable[[], float]
    meter: _Counting
    frozen: CrashproofError | None
    frozen_evidence: dict[str, Any] | None

    def append_event(
        self,
        type_: EventType,
        key: str | None,
        payload: dict[str, Any],
        value_json: str | None = None,
        *,
        status: tuple[RunStatus, str | None] | None = None,
        request: str | None = None,
    ) -> None:
        if self.session is not None:  # the drive's first record names it (operations/audit)
            payload = {**payload, "session": self.session}
        event = Event(self.run_id, self._next_seq, type_, key, payload, self._clock(), value_json)
        event = records.with_request(event, request)  # a decision's request, kept beside its record
        self._commit((event,), status, None)
        self.session = None  # once it landed: a refused record (IntentHeld) names nothing
        self._next_seq += 1
        if type_ is EventType.STEP_DONE and self.meter.active:
            self.meter.count(payload)

    def freeze(
        self,
        reason: str,
        evidence: dict[str, Any],
        *,
        key: str | None = None,
        retryable: bool = False,
        error: type[CrashproofError] = NonDeterminismError,
    ) -> NoReturn:
        """Stop the run in needs_review with evidence; raise ``error`` into the workflow
        (frozen even if it catches it). ``retryable``: a later resume may lift the freeze
        and try again (a lookup was unavailable) instead of waiting for a review."""
        exc = (
            NonDeterminismError(reason, evidence) if error is NonDeterminismError else error(reason)
        )
        if self.frozen is None:
            self.append_event(
                EventType.RUN_FROZEN,
                key,
                payloads.as_dict(
                    payloads.RunFrozen(
                        status=RunStatus.NEEDS_REVIEW.value,
                        reason=reason,
                        evidence=evidence,
                        retryable=retryable,
                        error=error_record(exc),
                    )
                ),
                status=(RunStatus.NEEDS_REVIEW, reason),
            )
            self.frozen = exc
            self.frozen_evidence = evidence
        raise exc

    def thaw(self) -> None:
        """Lift a retryable freeze so that this resume retries (journaled)."""
        self.append_event(
            EventType.RUN_THAWED,
            None,
            payloads.as_dict(payloads.RunThawed(status="running")),
            status=(RunStatus.RUNNING, None),
        )

    def halt(self, exc: CrashproofError, evidence: dict[str, Any] | None = None) -> None:
        """Every later ctx call raises ``exc`` (already journaled), even if the workflow
        catches it; the ledger raises it when the workflow ends."""
        self.frozen = exc
        if evidence is not None:
            self.frozen_evidence = evidence

    def finish(self, type_: EventType, payload: dict[str, Any], value_json: str | None) -> None:
        """Record the run's outcome (used by the ledger once the workflow returns)."""
        status = RunStatus.SUCCEEDED if type_ is EventType.RUN_SUCCEEDED else RunStatus.FAILED
        reason = None
        if type_ is EventType.RUN_FAILED:
            err = payloads.of(payloads.RunFailed, payload)["error"]
            reason = failed_reason(err)  # bounded, the whole in the record
        self.append_event(type_, None, payload, value_json, status=(status, reason))
