"""AsyncHttpTool: ``HttpTool`` on ``httpx.AsyncClient``, for async workflows.

The same requests, headers, reading of answers and lookups as ``HttpTool`` (``http.py``
holds the protocol and its table); only the I/O is awaited. Its name and version are
``HttpTool``'s, so the journal cannot tell them apart: a run that acted through one may
be resumed through the other (a sync drive uses ``HttpTool``, an async one this).

The client: one given (``client=``) is used as is and never closed here; otherwise one is
made on first use in each event loop (an ``AsyncClient``'s connections belong to the
loop that opened them), and ``aclose()`` closes the current one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import timedelta

import httpx

from crashproof.errors import CrashproofError
from crashproof.tools.http import HttpTool, LookupFailed
from crashproof.tools.port import Call, Observation, Receipt

__all__ = ["AsyncHttpTool"]


class AsyncHttpTool(HttpTool):
    """``HttpTool`` for ``await ctx.act(...)``: see ``HttpTool`` for every parameter but
    ``client`` (an ``httpx.AsyncClient``) and ``transport`` (an async transport)."""

    def __init__(
        self,
        base_url: str,
        path: str = "/",
        *,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        method: str = "POST",
        lookup_path: str | None = None,
        timeout: float = 10.0,
        id_key: str = "id",
        digest_key: str = "intent_digest",
        retryable_statuses: Iterable[int] = (408, 425, 429),
        quote_key: bool = True,
        headers: Mapping[str, str] | None = None,
        observe_path: str | None = None,
        observe_id_key: str = "id",
        idempotency_window: timedelta | None = None,
    ) -> None:
        if client is not None and transport is not None:
            raise ValueError("pass either client or transport, not both")
        # The sync client of the base class is never opened: a no-op transport.
        super().__init__(
            base_url,
            path,
            method=method,
            lookup_path=lookup_path,
            timeout=timeout,
            id_key=id_key,
            digest_key=digest_key,
            retryable_statuses=retryable_statuses,
            quote_key=quote_key,
            headers=headers,
            client=_NO_SYNC_CLIENT,
            observe_path=observe_path,
            observe_id_key=observe_id_key,
            idempotency_window=idempotency_window,
        )
        self._given = client
        self._transport = transport
        self._made: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None

    async def execute(self, call: Call) -> Receipt:  # type: ignore[override]
        url, path, body, headers = self.request_for(call)
        try:
            response = await self._aclient().request(
                self.method, url, json=body, headers=headers, timeout=self.timeout
            )
        except httpx.HTTPError as exc:
            raise self.not_sent(path, exc) from exc
        call.crash_point("responded")  # the target answered; no receipt journaled yet
        found = None
        if response.status_code == 422 and self.supports_lookup:
            try:
                found = await self.lookup(call)
            except (CrashproofError, LookupFailed):
                found = None  # then the 422's own body is the evidence
        return self.read_response(call, path, response, found)

    async def lookup(self, call: Call) -> Receipt | None:  # type: ignore[override]
        url = self.lookup_url(call)
        try:
            response = await self._aclient().get(url, headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise LookupFailed(f"GET {url}: {exc!r}") from exc
        return self.read_lookup(call, url, response)

    async def observe(self) -> Observation | None:  # type: ignore[override]
        if self.observe_path is None:
            return None
        url = self.base_url + self.observe_path
        response = await self._aclient().get(url, headers=self.headers, timeout=self.timeout)
        return self.read_observation(url, response)

    def _aclient(self) -> httpx.AsyncClient:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        if self._made is None or self._made[0] is not loop:
            # A client of a loop that has ended cannot be closed from this one; its
            # sockets went with that loop.
            client = httpx.AsyncClient(timeout=self.timeout, transport=self._transport)
            self._made = (loop, client)
        return self._made[1]

    async def aclose(self) -> None:
        """Close the client this tool made in the running loop (not one it was given)."""
        if self._made is not None and self._made[0] is asyncio.get_running_loop():
            await self._made[1].aclose()
        self._made = None

    def close(self) -> None:
        """Nothing to close synchronously: use ``await tool.aclose()``."""

    async def __aenter__(self) -> AsyncHttpTool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncHttpTool({self.method} {self.base_url}{self.path})"


class _NoTransport(httpx.BaseTransport):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raise RuntimeError("AsyncHttpTool makes no synchronous requests")


_NO_SYNC_CLIENT = httpx.Client(transport=_NoTransport())
