"""A real HTTP server that dedupes creates by Idempotency-Key, for the HttpTool tests.

``IdempotentServer(state_file).start()`` serves on 127.0.0.1 (a free port) from a
background thread until ``stop()``:

- ``POST /resources``: creates one resource per ``Idempotency-Key`` and stores the key
  with the request's ``Crashproof-Intent-Digest`` (or a SHA-256 of the body); a repeated
  key with the same digest gets the stored resource (200), with another digest 422
  naming the stored digest; a key pre-seeded as in flight gets 409; a ``Fencing-Token``
  lower than the highest seen for the path gets 412. Every answer holding a stored resource
  (and the 422) echoes its stored digest in ``Crashproof-Intent-Digest``.
- ``GET /resources/by-key/<percent-encoded key>``: 200 with the resource, 404 when absent,
  409 while the key is in flight.
- ``POST /_control`` with a JSON object of fault counters (see ``Faults``) arms faults
  from another process; ``arm(**faults)`` does it from this one.

``IdempotentServer(state_file, forget_after=s)`` forgets a key ``s`` seconds after its
resource committed, like Stripe after 24 hours: the lookup answers 404 and a repeated
POST creates a second resource.

``IdempotentServer(state_file, keeps_fingerprints=False)`` is a target that dedupes by
key only, like the README's old example: it stores no intent digest, echoes none, and
answers a repeated key with the stored resource whatever the payload.

Every request is counted per key and method, and recorded with its headers. The state
(resources, counts, requests, fencing) is kept in a JSON file, rewritten atomically after
every change, and reloaded by a server started on the same file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

__all__ = ["Faults", "IdempotentServer", "parse_key"]

COLLECTION = "/resources"
BY_KEY = "/resources/by-key/"
CONTROL = "/_control"
DIGEST_HEADER = "Crashproof-Intent-Digest"
APPROVAL_HEADER = "Crashproof-Approval-Digest"
COMMITTED_HEADER = "Crashproof-Committed-At"


@dataclass
class Faults:
    """Fault counters: each one applies to that many of the next matching requests."""

    throttle_posts: int = 0  # 429 before doing anything
    fail_before_commit: int = 0  # 500 before doing anything
    fail_after_commit: int = 0  # commit the resource, then 500
    drop_after_commit: int = 0  # commit the resource, then close the connection, no reply
    sleep_after_commit: int = 0  # commit the resource, then sleep `sleep_seconds`, then reply
    fail_lookups: int = 0  # 500 on GET by-key
    hang_lookups: int = 0  # GET by-key sleeps `sleep_seconds` before answering (a hung probe)
    sleep_seconds: float = 1.0
    key: str | None = None  # when set, the faults apply only to requests for this key


def parse_key(header: str | None) -> str | None:
    """An Idempotency-Key header: an RFC 8941 sf-string, or a bare token."""
    if header is None:
        return None
    value = header.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        out, chars = [], iter(value[1:-1])
        for ch in chars:
            out.append(next(chars, "") if ch == "\\" else ch)
        return "".join(out)
    return value or None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    app: IdempotentServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # a client that timed out and left: nothing to report


class IdempotentServer:
    """See the module docstring. Use as a context manager or ``start()``/``stop()``."""

    def __init__(
        self,
        state_file: Path,
        faults: Faults | None = None,
        *,
        keeps_fingerprints: bool = True,
        forget_after: float | None = None,
        reports_commit_time: bool = True,
    ) -> None:
        self.state_file = Path(state_file)
        # False: a fingerprinting target that binds the approval but says no commit time.
        self.reports_commit_time = reports_commit_time
        self.forget_after = forget_after
        self.keeps_fingerprints = keeps_fingerprints
        self.clock_offset = 0.0  # seconds added to commit times (a target that commits late)
        self.faults = faults or Faults()
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {
            "next_id": 1,
            "resources": {},  # key -> {"digest": ..., "resource": {...}}
            "in_flight": {},  # key -> {"digest": ..., "body": ..., "lookups_left": n}
            "counts": {},  # key -> {method: n}
            "requests": [],  # {"method", "path", "key", "headers"}
            "fencing": {},  # path -> highest token seen
        }
        if self.state_file.exists():
            self._state.update(json.loads(self.state_file.read_text()))
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> IdempotentServer:
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.app = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> IdempotentServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("server not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # -- control and inspection (thread-safe) ------------------------------

    def arm(self, **faults: Any) -> None:
        with self._lock:
            for name, value in faults.items():
                if name not in {f.name for f in fields(Faults)}:
                    raise TypeError(f"unknown fault {name!r}")
                setattr(self.faults, name, value)

    def seed(self, key: str, digest: str, body: Any) -> dict[str, Any]:
        """Store a resource for ``key`` as if an earlier request had created it."""
        with self._lock:
            resource = self._create(key, digest, body)
            self._save()
            return resource

    def edit(self, key: str, body: Any) -> dict[str, Any]:
        """Change the stored resource of ``key`` in place: same id, same stored digest,
        another body (the target's own later edit of the result)."""
        with self._lock:
            resource: dict[str, Any] = self._state["resources"][key]["resource"]
            resource["body"] = body
            self._save()
            return dict(resource)

    def forget(self, key: str) -> None:
        """Delete the stored resource of ``key`` (someone removed it at the target)."""
        with self._lock:
            del self._state["resources"][key]
            self._save()

    def restore(self, key: str, entry: dict[str, Any]) -> None:
        """Put back a stored entry taken with ``entry_of`` (someone restored a backup)."""
        with self._lock:
            self._state["resources"][key] = entry
            self._save()

    def entry_of(self, key: str) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self._state["resources"][key]))  # type: ignore[no-any-return]

    def seed_in_flight(self, key: str, digest: str, body: Any, lookups: int) -> None:
        """Mark ``key`` as being processed by an earlier request: POSTs get 409, lookups
        409 until ``lookups`` of them have been answered, then the resource commits."""
        with self._lock:
            self._state["in_flight"][key] = {
                "digest": digest,
                "body": body,
                "lookups_left": lookups,
            }
            self._save()

    def resources(self) -> list[dict[str, Any]]:
        with self._lock:
            return [entry["resource"] for entry in self._state["resources"].values()]

    def resource(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._state["resources"].get(key)
            return None if entry is None else dict(entry["resource"])

    def creates(self) -> int:
        """How many resources were ever created (forgotten keys included)."""
        with self._lock:
            return int(self._state["next_id"]) - 1

    def count(self, key: str, method: str) -> int:
        with self._lock:
            return int(self._state["counts"].get(key, {}).get(method, 0))

    def requests(self, key: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self._state["requests"] if key is None or r["key"] == key]

    def total_requests(self) -> int:
        with self._lock:
            return len(self._state["requests"])

    # -- internals (called with the lock held) -----------------------------

    def _save(self) -> None:
        temp = self.state_file.with_name(self.state_file.name + ".tmp")
        temp.write_text(json.dumps(self._state, sort_keys=True))
        os.replace(temp, self.state_file)

    def _note(self, method: str, path: str, key: str | None, headers: dict[str, str]) -> None:
        if key is not None:
            per_key = self._state["counts"].setdefault(key, {})
            per_key[method] = per_key.get(method, 0) + 1
        self._state["requests"].append(
            {"method": method, "path": path, "key": key, "headers": headers}
        )

    def _create(
        self, key: str, digest: str, body: Any, approval: str | None = None
    ) -> dict[str, Any]:
        number = self._state["next_id"]
        self._state["next_id"] = number + 1
        resource = {"id": f"res-{number}", "idempotency_key": key, "body": body}
        if self.keeps_fingerprints:
            resource["intent_digest"] = digest
        stored = digest if self.keeps_fingerprints else None
        self._state["resources"][key] = {
            "digest": stored,
            "resource": resource,
            # The approval bound to the effect and when it committed (a fingerprinting
            # target keeps both; the plain one neither).
            "approval": approval if self.keeps_fingerprints else None,
            "committed_at": time.time() + self.clock_offset
            if self.keeps_fingerprints and self.reports_commit_time
            else None,
            "created": time.time(),  # the target's own clock, for forget_after
        }
        return resource

    def lose_digest(self, key: str) -> None:
        """The target loses the intent digest it kept with ``key``'s effect (a migration,
        a restore from an older backup): its answers no longer carry it in the digest
        header (the resource body stays as it was)."""
        with self._lock:
            self._state["resources"][key]["digest"] = None
            self._save()

    def _expire(self, key: str | None) -> None:
        """A target with a window forgets old keys (the resource stays, unkeyed)."""
        entry = self._state["resources"].get(key) if key is not None else None
        if entry is None or self.forget_after is None:
            return
        if time.time() - entry.get("created", time.time()) > self.forget_after:
            self._state.setdefault("forgotten", []).append(entry["resource"])
            del self._state["resources"][key]

    def _take(self, name: str, key: str | None) -> bool:
        if self.faults.key is not None and key != self.faults.key:
            return False
        left = getattr(self.faults, name)
        if left > 0:
            setattr(self.faults, name, left - 1)
            return True
        return False

    # -- request handling --------------------------------------------------

    def handle_post(self, handler: _Handler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        if handler.path == CONTROL:
            self.arm(**json.loads(raw or b"{}"))
            handler.reply(204, None)
            return
        key = parse_key(handler.headers.get("Idempotency-Key"))
        headers = {k: v for k, v in handler.headers.items()}
        with self._lock:
            self._note("POST", handler.path, key, headers)
            self._save()
        if handler.path != COLLECTION:
            handler.reply(404, {"title": f"no route {handler.path}"})
            return
        if key is None:
            handler.reply(400, {"title": "Idempotency-Key is missing"})
            return
        digest = handler.headers.get(DIGEST_HEADER) or hashlib.sha256(raw).hexdigest()
        body = json.loads(raw) if raw else None
        after = None
        with self._lock:
            token = handler.headers.get("Fencing-Token")
            if token is not None:
                highest = self._state["fencing"].get(handler.path)
                if highest is not None and int(token) < highest:
                    handler.reply(412, {"title": f"fencing token {token} < {highest}"})
                    return
                self._state["fencing"][handler.path] = int(token)
                self._save()
            if self._take("throttle_posts", key):
                self._save()
                handler.reply(429, {"title": "slow down"})
                return
            if self._take("fail_before_commit", key):
                self._save()
                handler.reply(500, {"title": "failed before doing anything"})
                return
            if key in self._state["in_flight"]:
                handler.reply(409, {"title": "A request is outstanding for this Idempotency-Key"})
                return
            self._expire(key)
            entry = self._state["resources"].get(key)
            if entry is not None:
                if entry["digest"] is not None and entry["digest"] != digest:
                    handler.reply(
                        422,
                        {
                            "title": "Idempotency-Key is already used",
                            "id": entry["resource"]["id"],
                            "intent_digest": entry["digest"],
                        },
                        digest=entry["digest"],
                    )
                else:
                    handler.reply(200, entry["resource"], digest=entry["digest"], entry=entry)
                return
            resource = self._create(key, digest, body, handler.headers.get(APPROVAL_HEADER))
            created = self._state["resources"][key]
            for name in ("drop_after_commit", "sleep_after_commit", "fail_after_commit"):
                if self._take(name, key):
                    after = name
                    break
            self._save()
            pause = self.faults.sleep_seconds
        if after == "drop_after_commit":
            handler.drop()
        elif after == "sleep_after_commit":
            time.sleep(pause)
            handler.reply(201, resource, digest=resource.get("intent_digest"), entry=created)
        elif after == "fail_after_commit":
            handler.reply(500, {"title": "failed after committing"})
        else:
            handler.reply(201, resource, digest=resource.get("intent_digest"), entry=created)

    def handle_get(self, handler: _Handler) -> None:
        key = unquote(handler.path[len(BY_KEY) :]) if handler.path.startswith(BY_KEY) else None
        with self._lock:
            self._note("GET", handler.path, key, {k: v for k, v in handler.headers.items()})
            if key is None:
                self._save()
                handler.reply(404, {"title": f"no route {handler.path}"})
                return
            if self._take("fail_lookups", key):
                self._save()
                handler.reply(500, {"title": "lookup unavailable"})
                return
            if self._take("hang_lookups", key):
                self._save()
                hang = self.faults.sleep_seconds
            else:
                hang = 0.0
        if hang:
            time.sleep(hang)  # outside the lock: other requests go on
            handler.reply(404, {"title": "answered too late"})
            return
        with self._lock:
            flight = self._state["in_flight"].get(key)
            if flight is not None:
                flight["lookups_left"] -= 1
                if flight["lookups_left"] >= 0:
                    self._save()
                    handler.reply(409, {"title": "in flight"})
                    return
                del self._state["in_flight"][key]
                self._create(key, flight["digest"], flight["body"])
            self._expire(key)
            self._save()
            entry = self._state["resources"].get(key)
            if entry is None:
                handler.reply(404, {"title": f"no resource for key {key!r}"})
            else:
                handler.reply(200, entry["resource"], digest=entry["digest"], entry=entry)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self.server.app.handle_post(self)

    def do_GET(self) -> None:
        self.server.app.handle_get(self)

    def reply(
        self,
        status: int,
        payload: Any,
        *,
        digest: str | None = None,
        entry: dict[str, Any] | None = None,
    ) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        with contextlib.suppress(OSError):  # the client may have given up (timeout)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if digest is not None:
                self.send_header(DIGEST_HEADER, digest)
            if entry is not None and entry.get("approval"):
                self.send_header(APPROVAL_HEADER, entry["approval"])
            if entry is not None and entry.get("committed_at") is not None:
                self.send_header(COMMITTED_HEADER, repr(entry["committed_at"]))
            self.end_headers()
            self.wfile.write(data)

    def drop(self) -> None:
        """Close the connection without a byte of response."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        return None
