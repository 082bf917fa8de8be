"""The operator's identity: the Ed25519 key a person signs review decisions with, kept
under their own config directory, so deciding a case needs no key set-up at the
moment of an incident.

Where: ``$CRASHPROOF_OPERATOR_KEY``, else ``$XDG_CONFIG_HOME/crashproof/operator.pem``
(``~/.config/...``), mode 0600 in a 0700 directory, with ``operator.pem.pub`` beside it.
Made on first use (``crashproof operator init``, or the first ``review decide``), never
overwritten; a key file others can read is refused.

Trust. A ledger trusts a key only through its approvers registry (a journaled,
attributable ``approver_added`` record). The operator's key is registered without
being asked only while the registry is **empty**: the first person to configure a
ledger becomes its first approver, exactly what ``crashproof approvers add`` let anyone
holding the ledger's key do before. Once a ledger has approvers, the set is
restricted: an unregistered operator key is refused (one line, exit 4, nothing signed)
and an existing approver admits it explicitly with ``crashproof approvers add``. The
ledger's HMAC key is symmetric, so whoever holds it could forge any record; what this
guarantees is that nobody becomes an approver *silently*, as a side effect of deciding.
"""

from __future__ import annotations

import getpass
import os
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.render import safe
from crashproof.integrity.signing import generate_keypair, key_fingerprint, load_private_key
from crashproof.runtime.ledger import Ledger

__all__ = [
    "ENV_OPERATOR_KEY",
    "Operator",
    "configured_operator",
    "key_path",
    "operator_key",
    "trusted_operator",
]

ENV_OPERATOR_KEY = "CRASHPROOF_OPERATOR_KEY"


@dataclass(frozen=True, slots=True)
class Operator:
    """The operator's key, and the approver name the ledger knows it by."""

    key: Ed25519PrivateKey
    name: str
    path: Path
    fingerprint: str


def key_path() -> Path:
    """Where the operator's private key lives (see the module docstring)."""
    given = os.environ.get(ENV_OPERATOR_KEY)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "crashproof" / "operator.pem"


def operator_key(path: Path) -> tuple[Ed25519PrivateKey, bool]:
    """The key at ``path``, made first if there is none (True when it was just made)."""
    made = False
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        generate_keypair(path)
        made = True
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise CliError(
            ExitCode.USAGE,
            f"operator key {path} is readable by others (mode {mode:04o}); nothing was signed",
            f"chmod 600 {path}",
        )
    return load_private_key(path), made


def _default_name() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a bare container)
        user = "operator"
    return f"{user}@{socket.gethostname()}"


def trusted_operator(ledger: Ledger, name: str | None) -> Operator:
    """The operator's identity as ``ledger``'s approvers registry knows it: the key is
    made if missing, and registered only in a ledger that has no approvers yet; a key
    the registry does not know is refused where it has some. ``name``: the approver
    name to register under (default ``user@host``)."""
    path = key_path()
    key, made = operator_key(path)
    fingerprint = key_fingerprint(key.public_key())
    if made:
        _say(f"made your operator key {fingerprint[:16]}… at {path} (mode 0600)")
    registry = ledger.approvers()
    for approver in registry.values():
        if approver.fingerprint == fingerprint:
            return Operator(key, approver.name, path, fingerprint)
    wanted = name or _default_name()
    public = path.with_name(path.name + ".pub")
    if registry:
        raise CliError(
            ExitCode.CONFLICT,
            f"your operator key {fingerprint[:16]}… ({path}) is not an approver of this "
            f"ledger, which trusts only {', '.join(sorted(registry))}; nothing was signed",
            f"an approver admits you: crashproof approvers add {wanted} {public}",
        )
    pem = public.read_text() if public.exists() else None
    if pem is None:
        raise CliError(
            ExitCode.USAGE,
            f"the public half of your operator key is missing ({public}); nothing was signed",
            f"move {path} aside and run `crashproof operator init` to make a new key",
        )
    approver = ledger.add_approver(wanted, pem, by=name)
    _say(
        f"registered your operator key {fingerprint[:16]}… as {approver.name!r}, this "
        "ledger's first approver"
    )
    return Operator(key, approver.name, path, fingerprint)


def configured_operator(ledger: Ledger) -> Operator | str:
    """The operator's identity as it is configured now, for a process that acts for
    them (``crashproof ui``): their key, when it exists, is private to them and the
    ledger's registry knows it; else the reason it cannot act, one line with what to do.
    Reads only: it never makes or registers a key."""
    path = key_path()
    if not path.exists():
        return f"no operator identity at {path}: run `crashproof operator init`, then restart"
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return f"the operator key {path} is readable by others (mode {mode:04o}): chmod 600 it"
    try:
        key = load_private_key(path)
    except (OSError, ValueError) as exc:
        return f"the operator key {path} cannot be read ({exc})"
    fingerprint = key_fingerprint(key.public_key())
    for approver in ledger.approvers().values():
        if approver.fingerprint == fingerprint:
            return Operator(key, approver.name, path, fingerprint)
    return (
        f"the operator key {fingerprint[:16]}… ({path}) is not an approver of this ledger: "
        f"an approver admits it with `crashproof approvers add NAME {path}.pub` "
        "(or `crashproof operator init` on a ledger without approvers), then restart"
    )


def _say(line: str) -> None:
    sys.stderr.write("crashproof: " + safe(line) + "\n")
