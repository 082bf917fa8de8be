"""``crashproof ui``: a local web console over one ledger, server-rendered.

- ``app``: the Starlette application and its routes (pages and the two actions);
- ``guard``: who may talk to it (the token of a non-loopback bind, the Host header of a
  loopback one) and the CSRF token every POST carries;
- ``text``: how recorded values reach a page (Jinja autoescape, control characters
  escaped as the CLI escapes them, times, JSON);
- ``templates/``: the pages.

It reads through ``crashproof.runtime.operations`` (``browse``, ``attention``, ``folds``)
and acts through the Ledger's own operations (``resume``, ``dispatch_outbox``); it never
holds a signing key: approvals and review decisions are signed with ``crashproof
approve`` / ``review decide``, whose exact command each page shows. Needs the
``crashproof[ui]`` extra (starlette, jinja2, uvicorn); ``import crashproof`` never
imports this package.
"""

from __future__ import annotations

from crashproof.console.app import ConsoleConfig, create_app
from crashproof.console.guard import is_loopback, new_token

__all__ = ["ConsoleConfig", "create_app", "is_loopback", "new_token"]
