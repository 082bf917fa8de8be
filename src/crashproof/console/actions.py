"""The console's write actions: each one the Ledger operation its CLI command runs, as
the operator the console was started by.

Who acts. ``crashproof ui`` reads the operator's identity (``crashproof operator
init``: the Ed25519 key under the config directory, registered in the ledger's
approvers registry) when it starts, and hands it over as a ``Signer``. Approvals,
rejections and review decisions are signed with that key; cancel, retry, fork and
resume are journaled with its approver name as ``by``, as the CLI's ``--by`` would.
Without a signer the console is read-only: pages show why, and every action's POST
answers 403 with that reason, nothing done (outbox dispatch excepted: it delivers
what runs already committed, and is attributed to nobody in the CLI either).

Every POST carries the CSRF token (checked first: 403, nothing done), a refusal of
the Ledger is its one line (409; 404 for an unknown run), never a traceback.

Resume and retry drive the run in a background thread of the console, under the
run's lease like any driver, and the request waits at most ``ConsoleConfig.drive_wait``
seconds for it: a quick run answers with its outcome, a longer one answers 202 and
goes on in the background (its page shows the status and this console's last drive
of it). One drive per run at a time; a second Resume while one runs is refused. If
the console stops meanwhile, the drive stops as a crash does: the lease lapses and a
worker, or Resume, takes the run over.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from crashproof.console.guard import Guard
from crashproof.errors import CrashproofError, RunNotFound
from crashproof.runtime.ledger import Ledger
from crashproof.runtime.operations.attention import attention
from crashproof.runtime.operations.folds import Folds
from crashproof.tools.port import Tool

__all__ = ["TTLS", "Actions", "Drives", "Signer", "quote_id"]

# The approval lifetimes the page offers (the CLI's --ttl takes any up to 30 days).
TTLS = {"15m": 900.0, "1h": 3600.0, "8h": 28800.0}
_DECISIONS = ("replan", "keep", "abort", "continue")

Message = Callable[[Request, str, str, int, str], HTMLResponse]
Done = tuple[str, str | None, int]  # what happened, the run to show next (None: its own), status


@dataclass(frozen=True, slots=True)
class Signer:
    """The operator the console acts as: their Ed25519 key and the approver name the
    ledger's registry knows it by."""

    key: Ed25519PrivateKey
    name: str


class _Busy(CrashproofError):
    """This console drives the run already."""


class Drives:
    """Resumes and retries in background threads, one per run (module docstring)."""

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self._lock = threading.Lock()
        self._running: dict[str, threading.Thread] = {}
        self.last: dict[str, str] = {}  # run id -> the outcome of this console's last drive

    def running(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._running

    def start(self, run_id: str, drive: Callable[[], str]) -> str | None:
        """Run ``drive`` in a thread; its outcome if it ends within ``wait`` seconds
        (its error raised here), else None: it goes on in the background."""
        outcome: dict[str, Any] = {}

        def body() -> None:
            try:
                outcome["text"] = drive()
                self.last[run_id] = outcome["text"]
            except BaseException as exc:  # the request (or the page) shows it
                outcome["error"] = exc
                self.last[run_id] = _line(exc)
            finally:
                with self._lock:
                    self._running.pop(run_id, None)

        with self._lock:
            if run_id in self._running:
                raise _Busy(f"this console is driving run {run_id!r} already; nothing was done")
            thread = threading.Thread(target=body, name=f"console-drive:{run_id}", daemon=True)
            self._running[run_id] = thread
        thread.start()
        thread.join(self.wait)
        if thread.is_alive():
            return None
        error = outcome.get("error")
        if isinstance(error, BaseException):
            raise error
        return str(outcome["text"])


class Actions:
    """The POST routes (module docstring), over one console's Ledger and guard."""

    def __init__(
        self,
        ledger: Ledger,
        guard: Guard,
        message: Message,
        *,
        signer: Signer | None,
        read_only: str,
        tools: list[Tool],
        folds: Folds,
        drive_wait: float,
    ) -> None:
        self.ledger = ledger
        self.guard = guard
        self.message = message
        self.signer = signer
        self.read_only = read_only
        self.tools = tools
        self.folds = folds
        self.drives = Drives(drive_wait)

    def routes(self) -> list[Route]:
        acts: dict[str, tuple[str, Callable[[Signer, dict[str, str], str], Done]]] = {
            "approve": ("approved", self._approve),
            "reject": ("rejected", self._reject),
            "decide": ("decided", self._decide),
            "resume": ("resumed", self._resume),
            "retry": ("retried", self._retry),
            "cancel": ("cancelled", self._cancel),
            "fork": ("forked", self._fork),
        }
        out = [
            Route(f"/actions/{name}", self._route(*act), methods=["POST"])
            for name, act in acts.items()
        ]
        out.append(Route("/actions/dispatch", self._dispatch, methods=["POST"]))
        return out

    async def _form(self, request: Request) -> dict[str, str] | None:
        form = await request.form()
        data = {k: v for k, v in form.items() if isinstance(v, str)}
        return data if self.guard.csrf_ok(data.get("csrf")) else None

    def _route(
        self, did: str, act: Callable[[Signer, dict[str, str], str], Done]
    ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            form = await self._form(request)
            if form is None:
                return csrf_refused()
            run_id = form.get("run_id", "")
            back = f"/run{quote_id(run_id)}"
            if self.signer is None:
                text = f"this console is read-only: {self.read_only}; nothing was done"
                return self.message(request, f"Not {did}", text, 403, back)
            try:
                text, shown, status = await asyncio.to_thread(act, self.signer, form, run_id)
            except RunNotFound as exc:
                return self.message(request, "Not found", f"{_line(exc)}; nothing done", 404, back)
            except CrashproofError as exc:
                title = f"Not {did}: the run did not get there"
                return self.message(request, title, _line(exc), 409, back)
            link = back if shown is None else f"/run{quote_id(shown)}"
            return self.message(request, did.capitalize(), text, status, link)

        return endpoint

    # -- signed with the operator's key -----------------------------------------------

    def _approve(self, signer: Signer, form: dict[str, str], run_id: str) -> Done:
        ttl = form.get("ttl", "15m")
        if ttl not in TTLS:
            raise CrashproofError(f"ttl {ttl!r} is not one of {', '.join(TTLS)}; nothing signed")
        step = form.get("step") or None
        document = self.ledger.approve(run_id, step, key=signer.key, ttl=TTLS[ttl], by=signer.name)
        statement = document["statement"]
        return (
            f"approved {statement['operation_id']} as {signer.name}, valid {ttl} (signed, "
            "journaled); resume the run to execute it",
            None,
            200,
        )

    def _reject(self, signer: Signer, form: dict[str, str], run_id: str) -> Done:
        step = form.get("step") or None
        document = self.ledger.reject(
            run_id, step, key=signer.key, reason=form.get("reason", ""), by=signer.name
        )
        statement = document["statement"]
        return (
            f"rejected {statement['operation_id']} as {signer.name}: {statement['reason']} "
            "(signed, journaled); resumed, the workflow gets cp.ApprovalRejected there",
            None,
            200,
        )

    def _decide(self, signer: Signer, form: dict[str, str], run_id: str) -> Done:
        case_id, decision = form.get("case_id", ""), form.get("decision", "")
        if decision not in _DECISIONS:
            raise CrashproofError(f"unknown decision {decision!r}; nothing was signed")
        case = self.ledger.review_case(case_id)
        if case.state != "open" or decision not in case.decisions:
            raise CrashproofError(
                f"case {case_id} is {case.state} and accepts "
                f"{', '.join(case.decisions) or 'nothing'}, not {decision}; nothing was signed"
            )
        no_reread = decision == "replan" and case.no_lookup
        self.ledger.decide(case_id, decision, key=signer.key, by=signer.name, no_reread=no_reread)
        status = self.ledger.get_run(case.run_id).status.value
        return (
            f"{decision} signed for case {case_id} as {signer.name}; the run is now {status}",
            case.run_id,
            200,
        )

    # -- journaled under the operator's name ------------------------------------------

    def _resume(self, signer: Signer, form: dict[str, str], run_id: str) -> Done:
        return self._drive(run_id, None)

    def _retry(self, signer: Signer, form: dict[str, str], run_id: str) -> Done:
        return self._drive(run_id, signer.name)

    def _drive(self, run_id: str, retry_by: str | None) -> Done:
        if self.ledger.store.get_run(run_id) is None:
            raise RunNotFound(f"no run {run_id!r}")
        outcome = self.drives.start(run_id, lambda: _resume(self.ledger, run_id, retry_by))
        if outcome is None:
            return (
                f"run {run_id!r} is being driven in the background by this console, under "
                "its lease; its page shows the status (reload). If the console stops, the "
                "lease lapses and a worker or Resume takes it over",
                None,
                202,
            )
        return f"run {run_id!r}: {outcome}", None, 200

    def _cancel(self, signer: Signer, form: dict[str, str], run_id: str) -> Done:
        self.ledger.cancel(run_id, by=signer.name, reason=form.get("reason", ""))
        return f"run {run_id!r} cancelled by {signer.name}", None, 200

    def _fork(self, signer: Signer, form: dict[str, str], run_id: str) -> Done:
        step, new = form.get("from_step", "").strip(), form.get("new_run_id", "").strip()
        again = self.ledger.fork_preview(run_id, from_step=step)
        self.ledger.fork(run_id, from_step=step, new_run_id=new, by=signer.name)
        acts = ", ".join(a["step"] for a in again) or "none"
        return (
            f"run {new!r} forked from {run_id!r} after step {step!r} by {signer.name}; "
            f"acts it will run again: {acts}; resume it",
            new,
            200,
        )

    async def _dispatch(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None:
            return csrf_refused()
        delivered = await asyncio.to_thread(self.ledger.dispatch_outbox, self.tools)
        left = attention(self.ledger, self.folds).counts["outbox"]
        tools = ", ".join(t.name for t in self.tools) or "none (give --app)"
        text = f"{delivered} message(s) delivered, {left} still pending; outbox tools: {tools}"
        return self.message(request, "Outbox dispatched", text, 200, "/attention")


def quote_id(run_id: str) -> str:
    """``?id=RUN`` for a link, the id percent-encoded."""
    from urllib.parse import quote

    return f"?id={quote(run_id, safe='')}"


def _line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _resume(ledger: Ledger, run_id: str, retry_by: str | None = None) -> str:
    """Resume as ``crashproof resume`` does (an async workflow on a loop of its own); with
    ``retry_by``, retry a failed run as ``crashproof retry --by`` does. Its status."""
    row = ledger.store.get_run(run_id)
    if row is None:
        raise RunNotFound(f"no run {run_id!r}")
    workflow = ledger.workflows.get(row.workflow)
    retry = retry_by is not None
    if workflow is not None and workflow.is_async:
        asyncio.run(ledger.resume_async(run_id, retry=retry, by=retry_by))
    elif retry:
        ledger.retry(run_id, by=retry_by)
    else:
        ledger.resume(run_id)
    return ledger.get_run(run_id).status.value


def csrf_refused() -> Response:
    return HTMLResponse(
        "<h1>403: missing or wrong CSRF token</h1><p>Nothing was changed. Reload the page "
        "and use its button.</p>",
        status_code=403,
    )
