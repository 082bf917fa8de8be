"""Which model errors are weather and which are verdicts.

Transient (the call may work later, nothing was decided): HTTP 408, 409, 429 and 5xx
(Anthropic's 529 "overloaded" too), a refused or dropped connection, a timeout. These
become ``cp.Unavailable`` (with the server's ``Retry-After``), retried under the
decision's ``RetryPolicy``. Anything else, a 400-class request error or a refused key
above all, is the SDK's own exception, unchanged: the decision fails and the workflow may
catch it. The SDK's ``x-should-retry`` header overrides the status, as in the SDKs.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import crashproof as cp

__all__ = ["classify", "retry_after"]

# The transport's exceptions by class name, so that neither SDK nor HTTP library is
# imported here (openai runs on httpx2, anthropic on httpx; a stream that breaks raises
# the transport's error, not the SDK's).
_TRANSIENT_CLASSES = {"APIConnectionError", "APITimeoutError", "TransportError", "TimeoutException"}
_TRANSPORT_ROOTS = {"openai", "anthropic", "httpx", "httpx2", "httpcore"}


def retry_after(headers: Any) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, else ``retry-after`` as
    seconds or an HTTP date; None when absent or unreadable."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _is_transport(exc: BaseException) -> bool:
    return any(
        c.__name__ in _TRANSIENT_CLASSES and c.__module__.split(".")[0] in _TRANSPORT_ROOTS
        for c in type(exc).__mro__
    )


def classify(exc: Exception, label: str) -> Exception:
    """``cp.Unavailable`` for a transient failure of the model call ``label``, else
    ``exc`` itself (a permanent error)."""
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if isinstance(status, int):
        should = headers.get("x-should-retry") if headers is not None else None
        transient = status in (408, 409, 429) or status >= 500
        if should in ("true", "false"):
            transient = should == "true"
        if not transient:
            return exc
        wait = retry_after(headers)
        hint = "" if wait is None else f" (the server asks to retry after {wait:g} s)"
        return cp.Unavailable(
            f"{label}: HTTP {status} from the model API{hint}: {exc}", retry_after=wait
        )
    if _is_transport(exc):
        return cp.Unavailable(f"{label}: the model API could not be reached or answer: {exc!r}")
    return exc
