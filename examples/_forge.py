"""A tiny code forge for the code-agent example: pull requests and notifications over HTTP,
deduplicated by ``Idempotency-Key`` as a real forge (or Stripe) does.

``Forge(state_file).start()`` serves on 127.0.0.1 (a free port) from a daemon thread:

- ``POST /repos/<repo>/pulls`` and ``POST /notifications``: create one resource per
  ``Idempotency-Key`` (pull requests are numbered 1, 2, ...), stored with the request's
  ``Crashproof-Intent-Digest``. The same key again: the stored resource (200); the same key
  with another digest: 422 naming the stored digest.
- ``GET /by-key/<key>``: the resource created for that key (200), or 404.
- ``GET /repos/<repo>``: the repository (``id``, a random id given when it is created,
  ``name``, ``default_branch``, ``head``), or 404: what ``HttpTool(observe_path=...)``
  observes. ``replace_repository`` gives it a new id (as deleting and re-creating a
  repository under the same name does); ``set_head`` moves its default branch.

Every answer about a stored resource echoes its digest. The state (resources, and how many
times each key created something: the forge's own effect count) lives in a JSON file,
replaced atomically after every change, so a forge started again on the same file (after
the process that ran it was killed) finds everything that was acknowledged.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

__all__ = ["Forge"]

DIGEST = "Crashproof-Intent-Digest"


class Forge:
    """See the module docstring. ``start()`` / ``stop()``; ``url`` once started."""

    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file
        self._lock = threading.Lock()
        self.state: dict[str, Any] = {"numbers": {}, "resources": {}, "created": {}}
        if state_file.exists():
            self.state = json.loads(state_file.read_text(encoding="utf-8"))
        self.state.setdefault("repos", {})
        self._server: _Server | None = None

    def start(self) -> Forge:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.forge = self
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        thread.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the forge is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def resources(self) -> list[dict[str, Any]]:
        """Every resource, ordered by id."""
        with self._lock:
            found = [entry["resource"] for entry in self.state["resources"].values()]
        return sorted(found, key=lambda r: str(r["id"]))

    def created(self) -> dict[str, int]:
        """How many resources each idempotency key created (1 each, if the forge works)."""
        with self._lock:
            return dict(self.state["created"])

    def create(self, kind: str, key: str, digest: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self._lock:
            entry = self.state["resources"].get(key)
            if entry is not None:
                if entry["digest"] != digest:
                    return 422, {"error": "key reused", "intent_digest": entry["digest"]}
                return 200, entry["resource"]
            number = self.state["numbers"].get(kind, 0) + 1
            self.state["numbers"][kind] = number
            resource = {"id": f"{kind}/{number}", "number": number, **(body or {})}
            self.state["resources"][key] = {"digest": digest, "resource": resource}
            self.state["created"][key] = self.state["created"].get(key, 0) + 1
            self._save()
            return 201, resource

    def _save(self) -> None:
        temp = self.state_file.with_name(self.state_file.name + ".tmp")
        temp.write_text(json.dumps(self.state, sort_keys=True), encoding="utf-8")
        os.replace(temp, self.state_file)

    def ensure_repository(self, name: str, head: str) -> dict[str, Any]:
        """The repository ``name``, created (with a new id, at ``head``) if missing."""
        with self._lock:
            repo = self.state["repos"].get(name)
            if repo is None:
                repo = {"id": uuid.uuid4().hex, "name": name, "default_branch": "main"}
                repo["head"] = head
                self.state["repos"][name] = repo
                self._save()
            return dict(repo)

    def replace_repository(self, name: str) -> dict[str, Any]:
        """Delete and re-create ``name``: same name and head, a new id."""
        with self._lock:
            repo = {**self.state["repos"][name], "id": uuid.uuid4().hex}
            self.state["repos"][name] = repo
            self._save()
            return dict(repo)

    def set_head(self, name: str, head: str) -> None:
        """Move the default branch of ``name`` (someone pushed to it)."""
        with self._lock:
            self.state["repos"][name]["head"] = head
            self._save()

    def repository(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            repo = self.state["repos"].get(name)
            return None if repo is None else dict(repo)

    def find(self, key: str) -> tuple[str, dict[str, Any]] | None:
        with self._lock:
            entry = self.state["resources"].get(key)
            return None if entry is None else (entry["digest"], entry["resource"])


def _key(header: str | None) -> str | None:
    """An ``Idempotency-Key``: an RFC 8941 sf-string (or a bare token)."""
    if not header:
        return None
    value = header.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    forge: Forge


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        forge = self.server.forge
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        kind = None
        if re.fullmatch(r"/repos/[\w.-]+/pulls", self.path):
            kind = "pull"
        elif self.path == "/notifications":
            kind = "notification"
        key, digest = _key(self.headers.get("Idempotency-Key")), self.headers.get(DIGEST)
        if kind is None or key is None or digest is None:
            self._reply(400, {"error": "unknown route, or no Idempotency-Key / digest"})
            return
        status, payload = forge.create(kind, key, digest, json.loads(raw or b"null"))
        self._reply(status, payload, payload.get("intent_digest") if status == 422 else digest)

    def do_GET(self) -> None:
        forge = self.server.forge
        found = None
        if self.path.startswith("/by-key/"):
            found = forge.find(unquote(self.path[len("/by-key/") :]))
        elif re.fullmatch(r"/repos/[\w.-]+", self.path):
            repo = forge.repository(self.path[len("/repos/") :])
            found = None if repo is None else ("", repo)
        if found is None:
            self._reply(404, {"error": "no such key"})
        else:
            self._reply(200, found[1], found[0])

    def _reply(self, status: int, payload: Any, digest: str | None = None) -> None:
        data = json.dumps(payload).encode()
        with contextlib.suppress(OSError):  # the client may have gone away
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if digest:
                self.send_header(DIGEST, digest)
            self.end_headers()
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None
