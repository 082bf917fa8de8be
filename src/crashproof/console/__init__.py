"""``crashproof ui``: a local web console over one ledger, server-rendered.

- ``app``: the Starlette application and its page routes;
- ``actions``: the write actions, signed or attributed as the operator (``Signer``);
- ``guard``: who may talk to it (the token of a non-loopback bind, the Host header of a
  loopback one) and the CSRF token every POST carries;
- ``text``: how recorded values reach a page (Jinja autoescape, control characters
  escaped as the CLI escapes them, times, JSON);
- ``templates/``: the pages.

It reads through ``crashproof.runtime.operations`` (``browse``, ``attention``, ``folds``)
and acts through the Ledger's own operations (``approve``, ``reject``, ``decide``,
``resume``, ``retry``, ``cancel``, ``fork``, ``dispatch_outbox``), signing with the
operator identity ``crashproof ui`` read at start (``crashproof operator init``);
without one it is read-only and says why. Each page also shows the equivalent CLI
command. Needs the
``crashproof[ui]`` extra (starlette, jinja2, uvicorn); ``import crashproof`` never
imports this package.
"""

from __future__ import annotations

from crashproof.console.actions import Signer
from crashproof.console.app import ConsoleConfig, create_app
from crashproof.console.guard import is_loopback, new_token

__all__ = ["ConsoleConfig", "Signer", "create_app", "is_loopback", "new_token"]
