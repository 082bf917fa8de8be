"""Call scopes: code of an observer (telemetry) entered around each live call's body, in
the thread or task the body runs in, so what it makes current (an OpenTelemetry span) is
current inside the body: the model SDK's or HTTP client's own instrumentation nests under
it. ``Ledger.on_call`` registers one; ``crashproof.integrations.otel`` is the user.

A scope is entered only for a call that runs live: a replayed call returns its record and
enters none, so nothing an observer makes is made twice. It sees what the runtime knows
before the call (:class:`LiveCall`), and after a decision returns, the attributes the
decision reported (``Decision.attributes``: the GenAI semantic-convention attributes that
``crashproof.models`` fills in). A scope that raises on entry or exit is logged and
skipped; it never becomes the call's outcome.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from crashproof.runtime.steps.handoff import is_async
from crashproof.tools.port import Call

__all__ = ["CallScope", "LiveCall", "act_scoped", "scoped"]

log = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class LiveCall:
    """A call about to run live. ``seq``: the journal position its record would take had
    nothing else been written first (a call a crash interrupted and its resume run again
    share it; a retried run's new attempt does not; 0 for an act's execute and lookup,
    which are told apart by attempt). ``attributes``: filled after the body returned a
    ``cp.Decision`` with attributes, before the scope exits."""

    run_id: str
    kind: str  # step, decide, check, now, random, uuid; act (execute), lookup
    key: str
    attempt: int
    seq: int
    fencing_token: int | None
    attributes: dict[str, Any] = field(default_factory=dict)


CallScope = Callable[[LiveCall], AbstractContextManager[object]]


@contextlib.contextmanager
def _entered(scopes: tuple[CallScope, ...], call: LiveCall) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            try:
                stack.enter_context(scope(call))
            except Exception:
                log.exception("a call scope failed on entry (the call goes on)")
        try:
            yield
        finally:
            try:
                stack.close()
            except Exception:
                log.exception("a call scope failed on exit (the call's outcome stands)")


def _noted(call: LiveCall, out: Any) -> Any:
    attributes = getattr(out, "attributes", None)  # a cp.Decision's (options.py)
    if isinstance(attributes, dict):
        call.attributes.update(attributes)
    return out


def scoped(fn: Callable[..., Any], scopes: tuple[CallScope, ...], call: LiveCall) -> Any:
    """``fn`` with ``scopes`` entered around each call of it: a coroutine function stays
    one (the scope spans its awaits), a plain function stays plain (entered in the thread
    it runs in)."""
    if is_async(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with _entered(scopes, call):
                return _noted(call, await fn(*args, **kwargs))

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _entered(scopes, call):
            return _noted(call, fn(*args, **kwargs))

    return run


def act_scoped(
    fn: Callable[..., Any], scopes: tuple[CallScope, ...], call: Call, kind: str
) -> Callable[..., Any]:
    """A tool's ``execute`` (``kind`` "act") or ``lookup`` ("lookup") with ``scopes``
    entered around it: a span current while the tool talks to its target, so an HTTP
    client's own spans nest under the act. ``seq`` 0: one id per act and attempt, the
    same for a killed execute and the act its resume finishes."""
    if not scopes:
        return fn
    live = LiveCall(
        run_id=call.run_id,
        kind=kind,
        key=call.step,
        attempt=call.attempt,
        seq=0,
        fencing_token=call.fencing_token,
    )
    wrapped: Callable[..., Any] = scoped(fn, scopes, live)
    return wrapped
