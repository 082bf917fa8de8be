"""HttpTool: one HTTP request per act, deduplicated by the target with ``Idempotency-Key``.

``HttpTool("https://api.example.com", "/resources",
lookup_path="/resources/by-key/{operation_id}")`` sends, for
``ctx.act("create", tool, body={...})``::

    POST /resources
    Idempotency-Key: "<run_id>/<step key>"      (an RFC 8941 sf-string, as the IETF draft says)
    Crashproof-Intent-Digest: <64 hex>          (SHA-256 of the act's intent)
    Fencing-Token: <int>                        (only when the run has one)
    Crashproof-Approval-Digest: <64 hex>        (an approved act: the approval's digest
    Crashproof-Approval-Expires: <epoch s>       and expiry, for the target to bind/enforce)
    Content-Type: application/json

    <params["body"] as JSON>

``params`` are ``body`` (any JSON, optional) and ``path`` (optional override of the path).
This module is the only one that imports httpx (``pip install crashproof[http]``); ``import
crashproof`` does not load it.

As a model tool, the request is a template whose parameters are the model's arguments:
a typed function returns the params (``body``, ``path``) for them, and
``crashproof.models.tool(act=...)`` derives the model's schema from its signature::

    @cp.models.tool(act=HttpTool(url, "/repos/greeter/pulls", lookup_path=...))
    def open_pull_request(title: str, branch: str) -> dict[str, Any]:
        # the docstring (its description for the model) goes here
        return {"body": {"title": title, "head": branch, "base": "main"}}

The model's own arguments never reach the tool as params (``title`` is not a param of
``HttpTool``): what it sends is validated against the function's signature, and a call
that does not fit is a tool message for the model (docs/models.md).

What the target must do (draft-ietf-httpapi-idempotency-key-header, and Stripe's practice):
create the effect once per key and store the key with the intent digest (or its own
fingerprint of the payload) *in the same transaction* as the effect; answer a repeated
key with the same digest with the stored response; answer a key reused with another
digest with ``422`` (naming the stored digest in a ``Crashproof-Intent-Digest`` header
or an ``intent_digest`` body field); answer a key whose first request is still being
processed with ``409``. Echo the stored digest on every answer about a key, and, for an
approved act, the approval digest bound to the effect (``Crashproof-Approval-Digest``)
and its commit time (``Crashproof-Committed-At``, epoch seconds). For recovery,
serve ``GET lookup_path``: ``200`` with the stored resource (and digest) when the key was
done, ``404`` only when it definitely was not (and is not in flight: answer ``409`` then).

How responses are read (the runtime's rule: RetryableError/PermanentError only when the
target certainly did not act; anything else is an *unknown outcome*, reconciled by lookup,
never re-sent blindly):

==========================  ==========================================================
2xx                         receipt: ``receipt_id`` = the JSON body's ``id_key`` field,
                            ``result`` = the JSON body, ``intent_digest`` = the digest
                            the target echoes (header, else ``digest_key`` body field)
409                         unknown (``cp.OutcomeUnknown``): the first request with this
                            key is still being processed and may yet commit. Retrying
                            would only get 409 again or race it; the runtime looks the
                            key up instead, and the lookup (409 while in flight) is
                            retried with backoff until the first request has finished.
422 naming a stored digest  a receipt carrying the stored digest: the runtime sees it
                            differs from the journal's and raises ``ReceiptConflict``
                            (run ``needs_review``, both digests kept as evidence)
422 without one             ``cp.DriftError`` (run ``needs_review``): the key is taken by
                            a payload we cannot name, or the request is unprocessable
412 with a fencing token    ``cp.StaleLeaseError``: a newer owner has written
``retryable_statuses``      ``cp.RetryableError``. Default 408, 425, 429: the server
                            refused the request before handling it (timeout waiting for
                            it, too early, rate-limited)
other 4xx                   ``cp.PermanentError``: the target refused the request
5xx, 1xx, 3xx               unknown: a 500 can come after the commit, a 502/504 from a
                            gateway after the origin committed. Add a status to
                            ``retryable_statuses`` only when the target documents that it
                            means "not acted" (e.g. a 503 from a balancer that never
                            forwarded)
connect error / pool wait   ``cp.RetryableError``: no byte of the request was sent
timeout, dropped connection unknown (the exception propagates): the request may have been
                            processed; lookup decides
==========================  ==========================================================

Lookup: ``GET lookup_path`` (a template with ``{operation_id}``, ``{run_id}``, ``{step}``,
each percent-encoded). ``200`` with a JSON object → found (same reading as a 2xx);
``404`` → definitely not done, so the runtime executes once more *with the same key*;
``410`` (the key expired) → ``cp.OutcomeUnknown``, review; anything else or a transport
error → ``LookupFailed``, which the runtime retries with backoff and then stops the run
("lookup unavailable") for a later resume. A misrouted lookup that answers 404 is safe
only because the target dedupes by key: the second POST returns the stored resource.

Fencing: every request carries ``Fencing-Token: N`` when the run has a token (it grows
each time another worker takes the run over). The target keeps, per resource it guards
(here: per collection path, or per row for updates), the highest token it has seen, and
*rejects* a request whose token is lower than that with ``412 Precondition Failed``
without acting; an equal or higher token is accepted and becomes the new highest, stored
atomically with the effect. A worker that lost its lease can then no longer change
anything, even when its requests arrive late; ``HttpTool`` reports such a rejection as
``cp.StaleLeaseError``.

The idempotency key on the wire is the operation id with ``%``, space, control and
non-ASCII characters percent-encoded (UTF-8), so ordinary ids travel unchanged and every
id maps to one printable key.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any, ClassVar
from urllib.parse import quote

import httpx

from crashproof.errors import (
    CrashproofError,
    DriftError,
    OutcomeUnknown,
    PermanentError,
    RetryableError,
    StaleLeaseError,
)
from crashproof.journal.codec import canonical_digest
from crashproof.tools.port import Call, Observation, Receipt, Tool

__all__ = [
    "DIGEST_HEADER",
    "FENCING_HEADER",
    "IDEMPOTENCY_HEADER",
    "HttpTool",
    "LookupFailed",
    "wire_key",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"
DIGEST_HEADER = "Crashproof-Intent-Digest"
FENCING_HEADER = "Fencing-Token"
# An approved act: the approval's statement digest and expiry go to the target, which
# binds the digest to the effect and answers with it and its commit time.
APPROVAL_HEADER = "Crashproof-Approval-Digest"
APPROVAL_EXPIRES_HEADER = "Crashproof-Approval-Expires"
COMMITTED_HEADER = "Crashproof-Committed-At"

_PARAMS = frozenset({"body", "path"})
# Printable ASCII but for space and "%": kept as is in the wire key.
_KEY_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
_SNIPPET = 300


class LookupFailed(Exception):
    """The lookup endpoint gave no definite answer (5xx, 409 while the first request is in
    flight, an unexpected status or body, a transport error). Deliberately not a
    ``cp.OutcomeUnknown``: the runtime retries it with backoff, then stops the run with
    "lookup unavailable" so that a later resume looks again."""


def wire_key(operation_id: str) -> str:
    """The idempotency key as the target sees it (see the module docstring)."""
    return quote(operation_id, safe=_KEY_SAFE)


def _sf_string(value: str) -> str:
    """RFC 8941 sf-string: quoted, with ``\\`` and ``"`` escaped (value is printable)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class HttpTool(Tool):
    """One HTTP request per act, made safe to repeat by ``Idempotency-Key``.

    ``base_url`` and ``path``: where ``method`` (default POST) sends ``params["body"]``.
    ``lookup_path``: a GET template such as ``"/resources/by-key/{operation_id}"``;
    without it the tool cannot look up (``supports_lookup`` is False) and the runtime
    relies on the target's deduplication alone. ``id_key``/``digest_key``: the JSON
    fields naming the resource and its stored intent digest. ``quote_key=False`` sends
    the key bare (as Stripe expects) instead of as an sf-string. ``client`` or
    ``transport``: for tests or custom TLS/proxies (a given client is not closed by
    ``close``). ``observe_path``: a GET returning a JSON object that describes what the
    acts change (e.g. a repository: its id, default branch and head); its
    ``observe_id_key`` field names the instance, the whole document is the state
    fingerprint (so it must not hold what the acts themselves change). Without it the
    tool observes nothing (the base URL alone does not say what is behind it).
    ``idempotency_window``: how long the target remembers a key (Stripe: 24 hours). An
    act left in flight longer than that, whose key the target does not know, freezes for
    review instead of being sent again (the target may have forgotten the key). Every
    request (lookups too) gives up after ``timeout`` seconds: a hung lookup counts as a
    failed one (``lookup_attempts`` of them, then the run stops resumable).
    """

    name: ClassVar[str] = "http"
    version: ClassVar[str] = "1"
    idempotent_execute: ClassVar[bool] = True
    honours_fencing: ClassVar[bool] = True

    def __init__(
        self,
        base_url: str,
        path: str = "/",
        *,
        method: str = "POST",
        lookup_path: str | None = None,
        timeout: float = 10.0,
        id_key: str = "id",
        digest_key: str = "intent_digest",
        retryable_statuses: Iterable[int] = (408, 425, 429),
        quote_key: bool = True,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        client: httpx.Client | None = None,
        observe_path: str | None = None,
        observe_id_key: str = "id",
        idempotency_window: timedelta | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        _check_path(path, "path")
        if lookup_path is not None:
            _check_path(lookup_path, "lookup_path")
        if observe_path is not None:
            _check_path(observe_path, "observe_path")
        if client is not None and transport is not None:
            raise ValueError("pass either client or transport, not both")
        self.base_url = base_url.rstrip("/")
        self.path = path
        self.method = method.upper()
        self.lookup_path = lookup_path
        self.observe_path = observe_path
        self.observe_id_key = observe_id_key
        if idempotency_window is not None and idempotency_window <= timedelta(0):
            raise ValueError(f"idempotency_window must be positive, not {idempotency_window}")
        self._window = idempotency_window
        self.timeout = timeout
        self.id_key = id_key
        self.digest_key = digest_key
        self.retryable_statuses = frozenset(retryable_statuses)
        self.quote_key = quote_key
        self.headers = dict(headers or {})
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=timeout, transport=transport)

    @property
    def supports_lookup(self) -> bool:  # type: ignore[override]  # per instance, not per class
        """True when a ``lookup_path`` is configured."""
        return self.lookup_path is not None

    @property
    def idempotency_window(self) -> timedelta | None:  # type: ignore[override]  # per instance
        """How long the target keeps idempotency keys (Stripe: 24 h); None: forever."""
        return self._window

    # -- the Tool port -----------------------------------------------------

    def prepare(self, call: Call) -> dict[str, Any] | None:
        """Validate the params before the intent is journaled; nothing to record."""
        self._request_parts(call)
        return None

    def execute(self, call: Call) -> Receipt:
        url, path, body, headers = self.request_for(call)
        try:
            response = self._client.request(
                self.method, url, json=body, headers=headers, timeout=self.timeout
            )
        except httpx.HTTPError as exc:
            raise self.not_sent(path, exc) from exc
        call.crash_point("responded")  # the target answered; no receipt journaled yet
        found = self._conflict_lookup(call) if response.status_code == 422 else None
        return self.read_response(call, path, response, found)

    def lookup(self, call: Call) -> Receipt | None:
        url = self.lookup_url(call)
        try:
            response = self._client.get(url, headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise LookupFailed(f"GET {url}: {exc!r}") from exc
        return self.read_lookup(call, url, response)

    def observe(self) -> Observation | None:
        """``GET observe_path``: instance ``http:<the document's id>`` (not the address: a
        target that moved port is the same target), fingerprint the SHA-256 of the
        canonical document, version its ``version`` field; the URL is in the details.
        Raises when the target does not answer 200 with a JSON object holding the id."""
        if self.observe_path is None:
            return None
        url = self.base_url + self.observe_path
        response = self._client.get(url, headers=self.headers, timeout=self.timeout)
        return self.read_observation(url, response)

    # -- the request and the reading of its answers (shared with AsyncHttpTool) ----

    def request_for(self, call: Call) -> tuple[str, str, Any, dict[str, str]]:
        """The act's request: URL, path, JSON body and headers."""
        body, path = self._request_parts(call)
        headers = {
            **self.headers,
            IDEMPOTENCY_HEADER: self._key_header(call),
            DIGEST_HEADER: call.intent_digest,
        }
        if call.fencing_token is not None:
            headers[FENCING_HEADER] = str(call.fencing_token)
        if call.approval is not None:
            headers[APPROVAL_HEADER] = str(call.approval.get("digest"))
            headers[APPROVAL_EXPIRES_HEADER] = repr(call.approval.get("expires_at"))
        return self.base_url + path, path, body, headers

    def not_sent(self, path: str, exc: httpx.HTTPError) -> Exception:
        """What a transport error means: certainly not sent (retryable or permanent), or
        the exception itself (a timeout, a dropped connection: the outcome is unknown)."""
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            # No connection, so no byte of the request left this process.
            return RetryableError(f"{self.method} {path}: not sent ({exc!r})")
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
            return PermanentError(f"{self.method} {path}: not sent ({exc!r})")
        return exc

    def lookup_url(self, call: Call) -> str:
        if self.lookup_path is None:
            raise OutcomeUnknown(f"{self.name} tool has no lookup_path")
        return self.base_url + self.lookup_path.format(
            operation_id=quote(wire_key(call.operation_id), safe=""),
            run_id=quote(call.run_id, safe=""),
            step=quote(call.step, safe=""),
        )

    def read_lookup(self, call: Call, url: str, response: httpx.Response) -> Receipt | None:
        status = response.status_code
        if status == 404:
            return None
        if status == 410:
            raise OutcomeUnknown(
                f"GET {url}: 410, the target no longer remembers key "
                f"{wire_key(call.operation_id)!r}"
            )
        if status != 200:
            raise LookupFailed(f"GET {url}: {status} {_snippet(response)}")
        data = _json(response)
        if not isinstance(data, dict) or data.get(self.id_key) in (None, ""):
            raise LookupFailed(
                f"GET {url}: 200 without a JSON object holding {self.id_key!r}: "
                f"{_snippet(response)}"
            )
        return Receipt(
            receipt_id=str(data[self.id_key]),
            result=data,
            intent_digest=self._stored_digest(response, data),
            committed_at=_committed_at(response),
            approval_digest=response.headers.get(APPROVAL_HEADER) or None,
        )

    def read_observation(self, url: str, response: httpx.Response) -> Observation:
        data = _json(response) if response.status_code == 200 else None
        if not isinstance(data, dict) or data.get(self.observe_id_key) in (None, ""):
            raise LookupFailed(
                f"GET {url}: {response.status_code}, not a JSON object holding "
                f"{self.observe_id_key!r}: {_snippet(response)}"
            )
        version = data.get("version")
        return Observation(
            f"http:{data[self.observe_id_key]}",
            canonical_digest(data, what=f"the document at {url}"),
            version=version if isinstance(version, str) else None,
            details={"url": url, "document": data},
        )

    def _conflict_lookup(self, call: Call) -> Receipt | None:
        """A 422's stored resource, as lookup reads it (None: not available)."""
        if not self.supports_lookup:
            return None
        with contextlib.suppress(CrashproofError, LookupFailed):
            return self.lookup(call)
        return None

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP client this tool made (not one it was given)."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> HttpTool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HttpTool({self.method} {self.base_url}{self.path})"

    # -- internals ---------------------------------------------------------

    def _request_parts(self, call: Call) -> tuple[Any, str]:
        unknown = set(call.params) - _PARAMS
        if unknown:
            raise PermanentError(
                f"http act {call.step!r}: unknown params {sorted(unknown)}; "
                "use body=... and optionally path=..."
            )
        path = call.params.get("path", self.path)
        if not isinstance(path, str) or not path.startswith("/"):
            raise PermanentError(f"http act {call.step!r}: path must start with '/': {path!r}")
        return call.params.get("body"), path

    def _key_header(self, call: Call) -> str:
        key = wire_key(call.operation_id)
        return _sf_string(key) if self.quote_key else key

    def read_response(
        self, call: Call, path: str, response: httpx.Response, found: Receipt | None = None
    ) -> Receipt:
        """Read the act's answer (the module's table). ``found``: for a 422, what lookup
        found under the key."""
        status = response.status_code
        where = f"{self.method} {path} (key {wire_key(call.operation_id)!r})"
        if 200 <= status < 300:
            data = _json(response)
            receipt_id = data.get(self.id_key) if isinstance(data, dict) else None
            return Receipt(
                # An empty id makes the runtime freeze the act: it happened, unnamed.
                receipt_id="" if receipt_id is None else str(receipt_id),
                result=data if data is not None else response.text,
                intent_digest=self._stored_digest(response, data),
                committed_at=_committed_at(response),
                approval_digest=response.headers.get(APPROVAL_HEADER) or None,
            )
        if status == 409:
            raise OutcomeUnknown(
                f"{where}: 409, a request with this key is still in flight and may yet "
                f"commit: {_snippet(response)}"
            )
        if status == 422:
            return self._conflict(call, where, response, found)
        if status == 412 and call.fencing_token is not None:
            raise StaleLeaseError(
                f"{where}: 412, the target rejected fencing token {call.fencing_token} "
                f"(a newer owner has written): {_snippet(response)}"
            )
        if status in self.retryable_statuses:
            raise RetryableError(f"{where}: {status}, not acted: {_snippet(response)}")
        if 400 <= status < 500:
            raise PermanentError(f"{where}: {status}: {_snippet(response)}")
        raise OutcomeUnknown(f"{where}: {status}, may have acted: {_snippet(response)}")

    def _conflict(
        self, call: Call, where: str, response: httpx.Response, found: Receipt | None
    ) -> Receipt:
        """422: the key is held by another payload. A named stored digest becomes a
        receipt the runtime rejects as a ReceiptConflict, with both digests as evidence."""
        data = _json(response)
        stored = self._stored_digest(response, data)
        if stored is None or stored == call.intent_digest:
            raise DriftError(
                f"{where}: 422, the key is taken by another payload (or the request is "
                f"unprocessable), and the target does not name another intent: "
                f"{_snippet(response)}"
            )
        if found is not None and found.intent_digest == stored:
            # The stored resource itself, as lookup reads it, is the receipt a review
            # binds and re-reads later; the 422's body is only an error document.
            return found
        resource = data.get(self.id_key) if isinstance(data, dict) else None
        return Receipt(
            receipt_id=(
                str(resource)
                if resource not in (None, "")
                else f"key:{wire_key(call.operation_id)}"
            ),
            result=data if data is not None else response.text,
            intent_digest=stored,
        )

    def _stored_digest(self, response: httpx.Response, data: Any) -> str | None:
        echoed = response.headers.get(DIGEST_HEADER)
        if isinstance(echoed, str) and echoed:
            return echoed
        if isinstance(data, dict):
            value = data.get(self.digest_key)
            if isinstance(value, str) and value:
                return value
        return None


def _check_path(path: str, what: str) -> None:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"{what} must start with '/', not {path!r}")


def _committed_at(response: httpx.Response) -> float | None:
    """The target's commit time of the effect (epoch seconds), when it says one."""
    value = response.headers.get(COMMITTED_HEADER)
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def _json(response: httpx.Response) -> Any:
    """The body as JSON, or None when it is empty or not JSON."""
    if not response.content:
        return None
    try:
        return json.loads(response.content)
    except ValueError:
        return None


def _snippet(response: httpx.Response) -> str:
    text = response.text
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."
