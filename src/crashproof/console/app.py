"""The console's Starlette application: its pages over one Ledger, and its actions.

Pages (GET, read-only): ``/runs`` (filters ``status``, ``workflow``, search ``q``, paged
by ``offset``), ``/run?id=RUN`` (its steps paged by ``offset``), ``/run/timeline?id=RUN``
(its audit timeline, paged), ``/run/step?id=RUN&key=KEY``, ``/run/fork?id=RUN&from_step=
STEP`` (the acts a fork would run again, and the form that forks), ``/attention``.
Actions (POST, with the CSRF token; ``console/actions.py``): approve, reject, decide,
resume, retry, cancel, fork, dispatch. Every page carries the attention counts in its
header, and says who acts (or why the console is read-only).

Page endpoints are plain functions: Starlette runs them in its thread pool, and the
store serializes its own connection.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from crashproof.console.actions import TTLS, Actions, Signer, quote_id
from crashproof.console.guard import TOKEN_COOKIE, Guard
from crashproof.console.text import environment
from crashproof.errors import CrashproofError, RunNotFound
from crashproof.journal.records import RunStatus
from crashproof.runtime.ledger import Ledger
from crashproof.runtime.operations.attention import ATTENTION_STATUSES, attention
from crashproof.runtime.operations.browse import (
    parse_when,
    runs_page,
    step_page,
    steps_page,
    timeline_page,
)
from crashproof.runtime.operations.folds import Folds, RefusedRun
from crashproof.store.queue import LeaseInfo, QueueStore, retryable_stop
from crashproof.tools.port import Tool

__all__ = ["ConsoleConfig", "create_app"]

RUNS_PER_PAGE = 50
STEPS_PER_PAGE = 100
TIMELINE_PER_PAGE = 200
# Runs a resume can move on: the ended ones answer their recorded outcome, nothing more.
_RESUMABLE = tuple(
    s
    for s in (RunStatus.RUNNING, RunStatus.QUEUED, *ATTENTION_STATUSES)
    if s is not RunStatus.FAILED
)  # a failed run is retried


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleConfig:
    """What ``crashproof ui`` hands the console: an open Ledger (workflows and policies
    of ``--app`` registered), the outbox tools, who acts (``signer``: the operator's key
    and approver name; None: read-only, ``read_only`` says why), and the access rules."""

    ledger: Ledger
    tools: Sequence[Tool] = ()
    token: str | None = None
    loopback: bool = True
    db_flag: str = ""  # `--db URL` for the commands a page shows, as the operator gave it
    app_flags: str = ""  # `--app M …` likewise
    folds: Folds = field(default_factory=Folds)
    signer: Signer | None = None  # who acts (console/actions.py); None: read-only
    read_only: str = "no operator identity was given to this console"  # why, when no signer
    # Seconds a Resume/Retry request waits for the drive before it goes on in the background.
    drive_wait: float = 2.0


# The largest offset or refresh a page takes: far past any real ledger, far below what
# SQLite's 64-bit integers (and the page's arithmetic) hold.
_MAX_QUERY_INT = 10**12


class _BadQuery(ValueError):
    """A query value out of range or not a number: answered 400, never 500."""


def _when(text: str, name: str) -> float | None:
    """A time filter (``since``, ``until``): an age or an ISO date or time, as the
    ``datetime-local`` field sends it; empty: none."""
    if not text:
        return None
    try:
        return parse_when(text)
    except ValueError as exc:
        raise _BadQuery(f"{name}: {exc}") from None


def _int(request: Request, name: str, default: int = 0) -> int:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise _BadQuery(f"{name}={value!r} is not a whole number") from None
    if not 0 <= number <= _MAX_QUERY_INT:
        raise _BadQuery(f"{name}={value!r} is out of range (0 to {_MAX_QUERY_INT})")
    return number


def create_app(config: ConsoleConfig) -> Starlette:
    """The console application (see the module docstring)."""
    guard = Guard(token=config.token, loopback=config.loopback)
    env = environment()
    ledger = config.ledger

    def page(
        request: Request,
        name: str,
        status: int = 200,
        counts: dict[str, int] | None = None,
        **context: Any,
    ) -> HTMLResponse:
        if counts is None:
            counts = attention(ledger, config.folds).counts
        html = env.get_template(name).render(
            request=request,
            counts=counts,
            csrf=guard.csrf,
            signer=config.signer.name if config.signer is not None else None,
            read_only=config.read_only,
            drives=actions.drives,
            ttls=list(TTLS),
            db_flag=config.db_flag,
            app_flags=config.app_flags,
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def message(request: Request, title: str, text: str, status: int, back: str) -> HTMLResponse:
        return page(request, "message.html", status, title=title, text=text, back=back)

    actions = Actions(
        ledger,
        guard,
        message,
        signer=config.signer,
        read_only=config.read_only,
        tools=list(config.tools),
        folds=config.folds,
        drive_wait=config.drive_wait,
    )

    def runs(request: Request) -> Response:
        fields = ("status", "workflow", "q", "since", "until")
        args = {k: request.query_params.get(k, "") for k in fields}
        status = None
        if args["status"]:
            try:
                status = RunStatus(args["status"])
            except ValueError:
                return message(
                    request, "Unknown status", f"no status {args['status']!r}", 400, "/runs"
                )
        found = runs_page(
            ledger,
            config.folds,
            status=status,
            workflow=args["workflow"] or None,
            search=args["q"] or None,
            since=_when(args["since"], "since"),
            until=_when(args["until"], "until"),
            offset=_int(request, "offset"),
            limit=RUNS_PER_PAGE,
        )
        refresh = _int(request, "refresh")
        return page(
            request,
            "runs.html",
            page_=found,
            args=args,
            statuses=[s.value for s in RunStatus],
            refresh=min(max(refresh, 2), 600) if refresh else 0,
        )

    def run(request: Request) -> Response:
        run_id = request.query_params.get("id", "")
        try:
            found = steps_page(
                ledger,
                config.folds,
                run_id,
                offset=_int(request, "offset"),
                limit=STEPS_PER_PAGE,
            )
        except RunNotFound:
            return message(
                request, "No such run", f"no run {run_id!r} in this ledger", 404, "/runs"
            )
        if isinstance(found, RefusedRun):
            return page(request, "refused.html", bad=found)
        lease = ledger.leases().get(run_id) if isinstance(ledger.store, QueueStore) else None
        retry = None  # a retryable stop: when a worker tries it again, and how often it did
        if retryable_stop(found.info.status.value, found.info.reason):
            retry = lease if lease is not None else LeaseInfo(None, None, 0)
        return page(
            request,
            "run.html",
            found=found,
            lease=lease,
            resumable=found.info.status in _RESUMABLE,
            retry=retry,
            now=time.time(),
        )

    def run_timeline(request: Request) -> Response:
        run_id = request.query_params.get("id", "")
        offset = _int(request, "offset")
        try:
            found = timeline_page(
                ledger, config.folds, run_id, offset=offset, limit=TIMELINE_PER_PAGE
            )
        except RunNotFound:
            return message(
                request, "No such run", f"no run {run_id!r} in this ledger", 404, "/runs"
            )
        if isinstance(found, RefusedRun):
            return page(request, "refused.html", bad=found)
        info, entries, total = found
        return page(
            request,
            "timeline.html",
            info=info,
            entries=entries,
            total=total,
            offset=offset,
            limit=TIMELINE_PER_PAGE,
        )

    def run_step(request: Request) -> Response:
        run_id, key = request.query_params.get("id", ""), request.query_params.get("key", "")
        try:
            found = step_page(ledger, config.folds, run_id, key)
        except RunNotFound:
            return message(
                request, "No such run", f"no run {run_id!r} in this ledger", 404, "/runs"
            )
        if isinstance(found, RefusedRun):
            return page(request, "refused.html", bad=found)
        if found is None:
            text = f"run {run_id!r} has no recorded step {key!r}"
            return message(request, "No such step", text, 404, f"/run{_query_id(run_id)}")
        return page(request, "step.html", run_id=run_id, c=found)

    def needs_attention(request: Request) -> Response:
        seen = attention(ledger, config.folds, detail=True)
        return page(request, "attention.html", counts=seen.counts, seen=seen)

    def fork_preview(request: Request) -> Response:
        run_id = request.query_params.get("id", "")
        step = request.query_params.get("from_step", "").strip()
        back = f"/run{quote_id(run_id)}"
        try:
            again = ledger.fork_preview(run_id, from_step=step)
        except RunNotFound:
            return message(
                request, "No such run", f"no run {run_id!r} in this ledger", 404, "/runs"
            )
        except CrashproofError as exc:
            return message(request, "No fork from there", _line(exc), 409, back)
        return page(request, "fork.html", run_id=run_id, step=step, again=again)

    async def bad_query(request: Request, exc: Exception) -> Response:
        return message(request, "Bad request", str(exc), 400, "/runs")

    routes = [
        Route("/", lambda request: RedirectResponse("/runs", status_code=303)),
        Route("/runs", runs),
        Route("/run", run),
        Route("/run/timeline", run_timeline),
        Route("/run/step", run_step),
        Route("/attention", needs_attention),
        Route("/run/fork", fork_preview),
        *actions.routes(),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(_Gate, guard=guard)],
        exception_handlers={_BadQuery: bad_query},
    )


def _query_id(run_id: str) -> str:
    return quote_id(run_id)


def _line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


class _Gate(BaseHTTPMiddleware):
    """The access rules of ``guard`` in front of every route."""

    def __init__(self, app: Any, guard: Guard) -> None:
        super().__init__(app)
        self.guard = guard

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        guard = self.guard
        if not guard.host_allowed(request):
            return HTMLResponse(
                "<h1>403: this console answers only on 127.0.0.1 / localhost</h1>",
                status_code=403,
            )
        if not guard.authorized(request):
            return HTMLResponse(
                "<h1>401: this console needs its token</h1><p>Open the URL "
                "<code>crashproof ui</code> printed at start (it ends in ?token=…).</p>",
                status_code=401,
            )
        if guard.token and request.query_params.get("token") and request.method == "GET":
            # The token moves into a cookie, out of the address bar and the history.
            response: Response = RedirectResponse(request.url.path, status_code=303)
            response.set_cookie(
                TOKEN_COOKIE, guard.token, httponly=True, samesite="strict", path="/"
            )
            return response
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = (
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
            "frame-ancestors 'none'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response
