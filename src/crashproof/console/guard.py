"""Who may use the console, and the CSRF token of every write.

- A console bound to a loopback address (127.0.0.1, ::1, localhost) needs no token, but
  answers only requests whose ``Host`` header names the loopback: a web page elsewhere
  that resolves its own name to 127.0.0.1 (DNS rebinding) is refused.
- A console bound to any other address needs a token (``crashproof ui`` refuses to start
  without one). Every request carries it: ``Authorization: Bearer TOKEN``, or the
  ``crashproof_token`` cookie that opening ``/?token=TOKEN`` once sets. A missing or
  wrong token gets 401 and nothing else.
- Every POST carries the form field ``csrf``, a random value made at start and written
  into each page's forms (and nowhere a page of another origin can read it); a POST
  without it, or with another, gets 403 and changes nothing.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets

from starlette.requests import Request

__all__ = ["TOKEN_COOKIE", "Guard", "is_loopback", "new_token"]

TOKEN_COOKIE = "crashproof_token"
_LOOPBACK_NAMES = ("localhost",)


def new_token() -> str:
    """A fresh random token (32 bytes, URL-safe)."""
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the console on this machine."""
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _same(given: str | None, wanted: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), wanted.encode())


class Guard:
    """The access rules of one console (see the module docstring)."""

    def __init__(self, *, token: str | None, loopback: bool) -> None:
        if not loopback and not token:
            raise ValueError("a console bound beyond the loopback needs a token")
        self.token = token
        self.loopback = loopback
        self.csrf = secrets.token_urlsafe(32)

    def host_allowed(self, request: Request) -> bool:
        """A loopback console without a token answers loopback Host headers only."""
        if self.token:
            return True
        host = request.headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0]
        return is_loopback(name)

    def token_of(self, request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.query_params.get("token") or request.cookies.get(TOKEN_COOKIE)

    def authorized(self, request: Request) -> bool:
        return self.token is None or _same(self.token_of(request), self.token)

    def csrf_ok(self, given: object) -> bool:
        return isinstance(given, str) and _same(given, self.csrf)
