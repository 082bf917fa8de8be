"""The Ledger's human-in-the-loop API: the approvers registry, signed approvals and
rejections of pending acts, review cases and signed replan/abort decisions. A mixin of ``Ledger``.

Every operator append (registering an approver, journaling an approval or a decision)
takes the run's lease first, like a worker: it never races a process driving the run
(that raises ``cp.LeaseHeld``, nothing written), and a worker that lost the lease to it
can write nothing more. Everything is checked before anything is written; a refusal
raises ``ApprovalRefused`` / ``DecisionRefused`` with the reason and writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from crashproof.errors import ApprovalRefused, DecisionRefused, RunNotFound
from crashproof.integrity.signing import key_fingerprint, load_private_key
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.runtime.driving.leases import operator_lease
from crashproof.runtime.guards.approvals import (
    awaiting,
    check_approval,
    consumed_nonces,
    expectation,
    sign_approval,
)
from crashproof.runtime.guards.approvers import REGISTRY_RUN, Approver, added_event, registry_of
from crashproof.runtime.guards.budget import operator
from crashproof.runtime.guards.rejections import check_rejection, sign_rejection
from crashproof.runtime.guards.review import (
    ReviewCase,
    abort_events,
    cases_of,
    check_decision,
    continue_events,
    sign_decision,
)
from crashproof.runtime.port import DriveHost
from crashproof.store.port import StatusChange

__all__ = ["LedgerHumans"]

SigningKey = Ed25519PrivateKey | Path | str
Build = Callable[[list[Event]], tuple[list[Event], StatusChange | None]]


def _key(key: SigningKey) -> Ed25519PrivateKey:
    return key if isinstance(key, Ed25519PrivateKey) else load_private_key(key)


class LedgerHumans(DriveHost):
    """Approvers, approvals and review decisions (see the module docstring)."""

    # -- plumbing ------------------------------------------------------------

    def _operator_append(self, run_id: str, build: Build) -> list[Event]:
        """Under the run's lease: read its journal, build records, commit them at once."""
        with operator_lease(self.store, run_id, self.worker_id, self.lease_seconds) as lease:
            events = self.journal(run_id, owner=True)
            added, status = build(events)
            if added:
                self.append_records(added, status, fencing_token=lease.token)
        return added

    def _known_run(self, run_id: str) -> None:
        if self.store.get_run(run_id) is None:
            raise RunNotFound(f"no run {run_id!r} in {self.shown_url}")

    # -- the approvers registry -----------------------------------------------

    def approvers(self) -> dict[str, Approver]:
        """The registered approvers (and reviewers), by name."""
        if self.store.get_run(REGISTRY_RUN) is None:
            return {}
        return registry_of(self.journal(REGISTRY_RUN))

    def add_approver(
        self, name: str, public_key: str | bytes | Path, *, by: str | None = None
    ) -> Approver:
        """Register ``name`` with an Ed25519 public key (PEM text or a PEM file). The same
        name and key again changes nothing; the same name with another key is refused."""
        pem = Path(public_key).read_text() if isinstance(public_key, Path) else public_key
        text = pem.decode("ascii", "replace") if isinstance(pem, bytes) else pem
        who = operator(by)
        if self.store.get_run(REGISTRY_RUN) is None:
            self._create_registry()

        def build(events: list[Event]) -> tuple[list[Event], StatusChange | None]:
            event = added_event(
                registry_of(events), name, text, {**who, "time": time.time()}, len(events)
            )
            return ([event] if event else []), None

        self._operator_append(REGISTRY_RUN, build)
        return self.approvers()[name]

    def _create_registry(self) -> None:
        now = time.time()
        digest = canonical_digest({"workflow": REGISTRY_RUN, "input": {}}, what="the registry")
        row = RunRow(
            run_id=REGISTRY_RUN,
            workflow=REGISTRY_RUN,
            version="1",
            status=RunStatus.RUNNING,
            input_digest=digest,
            created_at=now,
            updated_at=now,
        )
        first = Event(
            run_id=REGISTRY_RUN,
            seq=0,
            type=EventType.RUN_STARTED,
            key=None,
            payload=payloads.as_dict(
                payloads.RunStarted(workflow=REGISTRY_RUN, version="1", input_digest=digest)
            ),
            value_json="{}",
            created_at=now,
        )
        if self.witness is not None:
            self.witness.start(REGISTRY_RUN)
        if self.store.create_run(row, first) is None and self.witness is not None:
            self.witness.advance(REGISTRY_RUN, 1)

    def _signer(self, key: Ed25519PrivateKey, what: type[Exception]) -> str:
        fingerprint = key_fingerprint(key.public_key())
        for approver in self.approvers().values():
            if approver.fingerprint == fingerprint:
                return approver.name
        raise what(
            f"unknown signer: key {fingerprint[:16]}… is not in the approvers registry; "
            "nothing was signed or journaled. Register its public key first: "
            "crashproof approvers add NAME KEY.pub"
        )

    # -- approvals -------------------------------------------------------------

    def approve(
        self,
        run_id: str,
        step: str | None = None,
        *,
        key: SigningKey,
        ttl: float = 900.0,
        by: str | None = None,
    ) -> dict[str, Any]:
        """Sign an approval of the act ``run_id`` waits on (``step``: check it is that
        one) with ``key`` (a registered approver's Ed25519 key), valid ``ttl`` seconds,
        and journal it; returns the signed document. Resume the run to execute the act."""
        private = _key(key)
        approver = self._signer(private, ApprovalRefused)
        self._known_run(run_id)
        freeze = _awaiting_freeze(run_id, self.journal(run_id), step)
        document = sign_approval(private, approver, expectation(freeze), ttl=ttl)
        self.submit_approval(run_id, document, by=by)
        return document

    def submit_approval(
        self, run_id: str, document: dict[str, Any], *, by: str | None = None
    ) -> None:
        """Journal an approval signed elsewhere (``approval_granted`` + ``run_thawed``),
        once it verifies against the act the run waits on; refused otherwise."""
        self._known_run(run_id)
        who = operator(by)
        registry = self.approvers()

        def build(events: list[Event]) -> tuple[list[Event], StatusChange | None]:
            step = None
            if isinstance(document, dict) and isinstance(document.get("statement"), dict):
                step = document["statement"].get("step")
            freeze = _awaiting_freeze(run_id, events, step if isinstance(step, str) else None)
            reason = check_approval(
                document,
                expectation(freeze),
                registry,
                consumed_nonces(events),
                self.store.now(),  # the ledger's clock (the execution adds the skew)
            )
            if reason is not None:
                raise ApprovalRefused(
                    f"approval for run {run_id!r} refused: {reason}; nothing was journaled "
                    "or executed"
                )
            return _decided(run_id, events, freeze.key, who, approval=document)

        self._operator_append(run_id, build)

    def pending_act(self, run_id: str, step: str | None = None) -> dict[str, Any]:
        """What an approval or a rejection of the act ``run_id`` waits on must bind
        (``step``: check it is that one); ``RunNotFound`` / ``ApprovalRefused`` when the
        run is unknown or waits on no such act. Reads only."""
        self._known_run(run_id)
        return expectation(_awaiting_freeze(run_id, self.journal(run_id), step))

    def reject(
        self,
        run_id: str,
        step: str | None = None,
        *,
        key: SigningKey,
        reason: str,
        by: str | None = None,
    ) -> dict[str, Any]:
        """Sign a rejection of the act ``run_id`` waits on (``step``: check it is that
        one) with ``key`` (a registered approver's Ed25519 key) and ``reason``, and
        journal it (``approval_rejected`` + ``run_thawed``); returns the signed document.
        The run is ``running`` again: driven on, the workflow gets ``cp.ApprovalRefused``
        at the act, which never executes (``runtime.guards.rejections``). Refused, with
        nothing written: no such run (``RunNotFound``), not waiting on that act, or
        decided already (``ApprovalRefused``)."""
        private = _key(key)
        approver = self._signer(private, ApprovalRefused)
        self._known_run(run_id)
        freeze = _awaiting_freeze(run_id, self.journal(run_id), step)
        document = sign_rejection(private, approver, expectation(freeze), reason)
        who = operator(by)
        registry = self.approvers()

        def build(events: list[Event]) -> tuple[list[Event], StatusChange | None]:
            now_freeze = _awaiting_freeze(run_id, events, freeze.key)
            why = check_rejection(document, expectation(now_freeze), registry)
            if why is None and any(
                e.type is EventType.ACT_INTENT and e.key == now_freeze.key for e in events
            ):
                why = (
                    "its act is in flight (its approval lapsed before it executed, and a "
                    "lookup must settle it first); approve it again or cancel the run"
                )
            if why is not None:
                raise ApprovalRefused(
                    f"rejection for run {run_id!r} refused: {why}; nothing was journaled"
                )
            return _decided(run_id, events, now_freeze.key, who, rejection=document)

        self._operator_append(run_id, build)
        return document

    # -- review ----------------------------------------------------------------

    def review_cases(
        self, run_id: str | None = None, *, state: str | None = None
    ) -> list[ReviewCase]:
        """The review cases of one run or of every run, optionally only one ``state``
        (``open``, ``decided``, ``resolved``, ``superseded``)."""
        if run_id is not None:
            self._known_run(run_id)
            ids = [run_id]
        else:
            ids = [row.run_id for row in self.store.list_runs() if row.run_id != REGISTRY_RUN]
        cases = [case for rid in ids for case in cases_of(self.journal(rid))]
        return [case for case in cases if state is None or case.state == state]

    def review_case(self, case_id: str) -> ReviewCase:
        """One review case by id (``RUN_ID#SEQ``)."""
        run_id, sep, _ = case_id.rpartition("#")
        if not sep or not run_id:
            raise RunNotFound(f"{case_id!r} is not a review case id (RUN_ID#SEQ)")
        for case in self.review_cases(run_id):
            if case.case_id == case_id:
                return case
        raise RunNotFound(
            f"run {run_id!r} has no review case {case_id!r}; list them: crashproof review list"
        )

    def decide(
        self,
        case_id: str,
        decision: str,
        *,
        key: SigningKey,
        by: str | None = None,
        no_reread: bool = False,
    ) -> dict[str, Any]:
        """Sign ``replan`` or ``abort`` for a review case with ``key`` (a registered
        reviewer's Ed25519 key) and journal it; returns the signed document.
        ``no_reread``: state that the receipt cannot be re-read before the decision is
        consumed (the act's tool has no lookup); a replan of such an act needs it."""
        private = _key(key)
        reviewer = self._signer(private, DecisionRefused)
        case = self.review_case(case_id)
        document = sign_decision(private, reviewer, case, decision, no_reread=no_reread)
        self.submit_decision(case_id, document, by=by)
        return document

    def submit_decision(
        self, case_id: str, document: dict[str, Any], *, by: str | None = None
    ) -> None:
        """Journal a decision signed elsewhere, once it verifies against the case as it is
        now. A replan (or an abort at an act) is consumed when the run resumes, after the
        receipt is re-read; an abort elsewhere is consumed at once (the run fails)."""
        run_id = self.review_case(case_id).run_id
        who = operator(by)
        registry = self.approvers()

        def build(events: list[Event]) -> tuple[list[Event], StatusChange | None]:
            case = next((c for c in cases_of(events) if c.case_id == case_id), None)
            if case is None:
                raise RunNotFound(f"run {run_id!r} has no review case {case_id!r}")
            reason = check_decision(document, case, registry, events)
            if reason is not None:
                raise DecisionRefused(
                    f"decision on review case {case_id} refused: {reason}; nothing was "
                    "journaled or executed"
                )
            now = time.time()
            decided = Event(
                run_id=run_id,
                seq=len(events),
                type=EventType.REVIEW_DECIDED,
                key=case.key,
                payload={**who, "time": now, "case_id": case_id, "decision": document},
                created_at=now,
            )
            if case.imported_copy and document["statement"]["decision"] == "continue":
                added = continue_events(run_id, len(events), case, document)
                return [decided, *added], (RunStatus.RUNNING, None)
            if not case.replannable:  # abort (a replan was refused): nothing to re-read
                added = abort_events(run_id, len(events), case, document)
                failure = payloads.run_failed(added[-1])["error"]
                return [decided, *added], (RunStatus.FAILED, f"ReviewAborted: {failure['message']}")
            thawed = Event(
                run_id=run_id,
                seq=len(events) + 1,
                type=EventType.RUN_THAWED,
                key=None,
                payload=payloads.as_dict(
                    payloads.RunThawed(status="running", by=who["by"], decision_seq=len(events))
                ),
                created_at=now,
            )
            return [decided, thawed], (RunStatus.RUNNING, None)

        self._operator_append(run_id, build)


def _decided(
    run_id: str, events: list[Event], key: str | None, who: dict[str, Any], **signed: Any
) -> tuple[list[Event], StatusChange | None]:
    """A signed decision on a pending act (``approval=`` or ``rejection=`` its document)
    and the thaw that lets the run go on, committed together: the decision record, then
    ``run_thawed`` naming its position."""
    ((field, document),) = signed.items()
    now = time.time()
    decided = Event(
        run_id=run_id,
        seq=len(events),
        type=EventType.APPROVAL_GRANTED if field == "approval" else EventType.APPROVAL_REJECTED,
        key=key,
        payload={**who, "time": now, field: document},
        created_at=now,
    )
    thawed = Event(
        run_id=run_id,
        seq=len(events) + 1,
        type=EventType.RUN_THAWED,
        key=None,
        payload={"status": "running", "by": who["by"], f"{field}_seq": len(events)},
        created_at=now,
    )
    return [decided, thawed], (RunStatus.RUNNING, None)


def _awaiting_freeze(run_id: str, events: list[Event], step: str | None) -> Event:
    """The ``awaiting_approval`` record the run stands on now (of ``step``, if given)."""
    last = None
    for event in events:
        if event.type in (
            EventType.RUN_FROZEN,
            EventType.RUN_THAWED,
            EventType.RUN_FAILED,
            EventType.RUN_SUCCEEDED,
            EventType.RUN_STOPPED,
            EventType.RUN_RETRIED,
        ):
            last = event
    freeze = awaiting(events, step)
    if freeze is None or last is not freeze:
        status = "ended or running" if last is None else last.type.value
        what = f"step {step!r}" if step else "an act"
        raise ApprovalRefused(
            f"run {run_id!r} is not awaiting approval of {what} (its latest state: "
            f"{(payloads.run_state(last).get('status') if last else None) or status}); nothing was "
            "signed or journaled. `crashproof show RUN` says what it waits on"
        )
    return freeze
