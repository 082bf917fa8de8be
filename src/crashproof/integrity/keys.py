"""Keys for the HMAC-chained journal.

A key never enters the ledger, a checkpoint, a log line or an error message: only its
key id (a hash of it) is stored beside each record. A ``Keyring`` holds the current key
(new records are sealed with it) and older ones (records sealed with them still verify),
so keys can be rotated without rewriting journals.

Where a key comes from, first match wins: ``key=`` in code; ``CRASHPROOF_KEY`` (hex);
``CRASHPROOF_KEY_FILE`` (a file of hex, which must not be readable by group or others);
else the default key file in the user's config directory (``~/.config/crashproof/key``),
if it exists. A library call never creates one: a key that signs every ledger is made
on purpose, once (``crashproof keygen --default``), and backed up; without any key the
Ledger refuses to open with what to do (``KeyUnusable``). This module is the one place
outside the CLI that reads the environment: a key must not have to travel through
application code.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from crashproof.errors import KeyUnusable

__all__ = [
    "KEY_BYTES",
    "Keyring",
    "create_key_file",
    "default_key_file",
    "key_id",
    "load_key_file",
    "resolve_keyring",
]

log = logging.getLogger(__name__)

KEY_BYTES = 32


def key_id(key: bytes) -> str:
    """A stable, non-secret name for a key: 16 hex digits of a domain-separated hash."""
    return hashlib.sha256(b"crashproof-key-id\x00" + key).hexdigest()[:16]


class Keyring:
    """The current key plus older ones, by key id."""

    def __init__(self, current: bytes, older: Mapping[str, bytes] | None = None) -> None:
        if len(current) < 16:
            raise KeyUnusable("a crashproof key must be at least 16 bytes (32 recommended)")
        self.current = current
        self.current_id = key_id(current)
        self._keys = {key_id(k): k for k in (older or {}).values()}
        self._keys[self.current_id] = current

    def get(self, kid: str) -> bytes | None:
        return self._keys.get(kid)

    def __repr__(self) -> str:  # never show key material
        return f"Keyring(current={self.current_id}, known={sorted(self._keys)})"

    @classmethod
    def from_hex(cls, current: str, *older: str) -> Keyring:
        return cls(
            _parse_hex(current, "key"), {str(i): _parse_hex(k, "key") for i, k in enumerate(older)}
        )


def _parse_hex(text: str, what: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise KeyUnusable(f"the {what} is not valid hex (the value is not shown)") from None
    if len(key) < 16:
        raise KeyUnusable(f"the {what} is too short: at least 16 bytes (32 hex pairs recommended)")
    return key


def load_key_file(path: Path) -> bytes:
    """Read a hex key file, refusing one that group or others may read or write."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise KeyUnusable(f"key file {path} does not exist") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyUnusable(
            f"key file {path} is accessible by group or others (mode {stat.filemode(mode)}); "
            f"refusing it. Fix with: chmod 600 {path}"
        )
    return _parse_hex(path.read_text(encoding="ascii", errors="replace"), f"key in {path}")


def default_key_file() -> Path:
    from platformdirs import user_config_path

    return user_config_path("crashproof") / "key"


def create_key_file(path: Path) -> bytes:
    """Make a new random key in ``path`` (mode 0600, its directory 0700), never over an
    existing file (``FileExistsError``). For ``crashproof keygen``: the library never
    calls it on its own."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_bytes(KEY_BYTES)
    # Written in full to a private temp file, then linked into place: the key file either
    # does not exist or holds a whole key, even if we crash or race another first opener
    # (os.link fails with FileExistsError when someone else won).
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(key.hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return key


def resolve_keyring(key: bytes | str | Keyring | None = None) -> Keyring:
    """The keyring to use: ``key=`` first, then the environment, then the default file."""
    if isinstance(key, Keyring):
        return key
    if isinstance(key, bytes):
        return Keyring(key)
    if isinstance(key, str):
        return Keyring(_parse_hex(key, "key"))
    env_key = os.environ.get("CRASHPROOF_KEY")
    if env_key:
        return Keyring(_parse_hex(env_key, "CRASHPROOF_KEY"))
    env_file = os.environ.get("CRASHPROOF_KEY_FILE")
    if env_file:
        return Keyring(load_key_file(Path(env_file)))
    path = default_key_file()
    if path.exists():
        return Keyring(load_key_file(path))
    raise KeyUnusable(
        "no journal key: crashproof signs every journal record and needs a key to open a "
        f"ledger; set CRASHPROOF_KEY (hex) or CRASHPROOF_KEY_FILE, pass key=, or make the "
        f"default key file once with `crashproof keygen --default` ({path}, mode 0600; "
        "back it up: without it existing ledgers cannot be verified)"
    )
