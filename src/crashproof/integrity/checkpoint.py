"""Signed checkpoints: one run as one JSON document, for export and import. Pure, no I/O.

::

    {"format": "crashproof-checkpoint", "schema_version": 4,
     "run": {"run_id", "workflow", "version", "input_digest", "status", "generation",
             "policy", "limits", "budget_used", "approvals", "open_review_cases"},
     "records": [{"seq", "type", "key", "payload", "value", "created_at", "key_id", "mac"}],
     "key_id": "...", "signature": "<HMAC-SHA256 hex>"}

Each record is the journal record exactly as stored (payload and value are the stored
text), with its own chain MAC, so an import verifies every record with the Sealer
exactly as reading a ledger does. The run header's last five fields (format 2) are
derived from the records (``crashproof.runtime.operations.checkpoint_fields``): the records stay
the source of truth, and a header that disagrees with them is refused naming the field.
A format-1 document (no derived fields) is migrated on import: the fields are derived.

Format 3 (the header is format 2's) says what the document is: a **move** when its last
record is ``run_moved`` (the source journaled that the run left with this document: the
importer holds its one continuation), else a **copy** (read-only: the source may have
gone on). Formats 1 and 2 knew no moves: they are copies. Older readers refuse format 3
(a newer schema), so no crashproof that ignores moves ever installs one.

Format 4 (otherwise format 3) is written since records are sealed with MAC format v2
(``"v2:"`` + hex, crashproof.integrity.seal; earlier records keep their v1 MACs): an older
reader, which knows only v1, refuses it as a newer schema instead of reporting the v2
records as tampered.

Format 5 (otherwise format 4) adds ``"requests": {"<seq>": text}``: the model calls'
requests kept beside their records (``Store.load_requests``), each checked on import
against the ``request_sha256`` its record holds (under the record's MAC). It is written
only for a run that has such requests; a run without any still exports as format 4, which
older readers import.
A checkpoint's identity (``digest``) is the SHA-256 of its canonical bytes without
``key_id`` and ``signature``: the same journal gives the same digest whichever key signs.
The document as a whole is signed with an HMAC over its RFC 8785 canonical bytes
without the ``signature`` field. A checkpoint file is those canonical bytes (plus an
optional final newline) and nothing else: any other spelling of the same JSON is
refused, so no change to a file goes unnoticed.

Verification order: the signature first (before anything else is interpreted), then
format, schema version, unknown or missing fields at every level, field types, each
record's MAC and the chain, the run header against the first record, the generation,
the status and the derived header fields against what the records fold to.
Every refusal is an ``IntegrityError`` subclass naming what differed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import rfc8785

from crashproof.errors import CheckpointRejected, IntegrityError, JournalTampered, UnknownKeyId
from crashproof.integrity.keys import Keyring
from crashproof.integrity.seal import Sealer
from crashproof.journal import payloads
from crashproof.journal.records import BUDGET_KINDS, EventType, RunStatus, request_sha256

__all__ = [
    "DERIVED",
    "FORMAT",
    "SCHEMA_VERSION",
    "WITHOUT_REQUESTS",
    "Checkpoint",
    "Derive",
    "Record",
    "RunHeader",
    "build",
    "digest",
    "parse",
    "serialize",
    "sign",
    "verify",
]

FORMAT = "crashproof-checkpoint"
SCHEMA_VERSION = 5
WITHOUT_REQUESTS = 4  # the format written for a run with no request kept beside it

_TOP = ("format", "schema_version", "run", "records", "key_id", "signature")
_RUN_V1 = ("run_id", "workflow", "version", "input_digest", "status", "generation")
DERIVED = ("policy", "limits", "budget_used", "approvals", "open_review_cases")
_RUN = (*_RUN_V1, *DERIVED)
_RECORD = ("seq", "type", "key", "payload", "value", "created_at", "key_id", "mac")
_STATUSES = frozenset(s.value for s in RunStatus)
_TYPES = frozenset(t.value for t in EventType)


class RunHeader(NamedTuple):
    run_id: str
    workflow: str
    version: str
    input_digest: str
    status: str
    generation: int


class Record(NamedTuple):
    """A journal record exactly as stored (``value``: the text, wherever it is kept)."""

    seq: int
    type: str
    key: str | None
    payload: str
    value: str | None
    created_at: float
    key_id: str | None
    mac: str | None


# The derived header fields of a run's verified records (run id, records) -> fields,
# plus "status": the status those records fold to.
Derive = Callable[[str, Sequence[Record]], Mapping[str, Any]]


class Checkpoint(NamedTuple):
    """A verified document. ``derived``: the header fields its records fold to (for a
    format-1 document: derived now, the migration to format 2). ``move``: a format-3 (or 4)
    document whose last record is ``run_moved`` (else a copy); ``digest``: its identity."""

    run: RunHeader
    records: tuple[Record, ...]
    key_id: str
    schema_version: int
    derived: Mapping[str, Any]
    move: bool = False
    digest: str = ""
    requests: Mapping[int, str] = {}  # format 5: by record seq, each checked


def build(
    run: RunHeader,
    records: Sequence[Record],
    derived: Mapping[str, Any],
    requests: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """The unsigned document (format ``SCHEMA_VERSION``; 4 when ``requests``, the texts
    kept beside the records by seq, is empty)."""
    document: dict[str, Any] = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION if requests else WITHOUT_REQUESTS,
        "run": {**run._asdict(), **{name: derived[name] for name in DERIVED}},
        "records": [r._asdict() for r in records],
    }
    if requests:
        document["requests"] = {str(seq): text for seq, text in sorted(requests.items())}
    return document


def sign(document: Mapping[str, Any], keyring: Keyring) -> dict[str, Any]:
    """A copy of ``document`` signed with the keyring's current key."""
    signed = {k: v for k, v in document.items() if k not in ("key_id", "signature")}
    signed["key_id"] = keyring.current_id
    signed["signature"] = _signature(keyring.current, _canonical(signed))
    return signed


def digest(document: Mapping[str, Any]) -> str:
    """The checkpoint's identity: ``sha256:`` + the SHA-256 of its canonical bytes without
    ``key_id`` and ``signature`` (a re-export of the same journal has the same digest)."""
    body = {k: v for k, v in document.items() if k not in ("key_id", "signature")}
    return "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()


def serialize(document: Mapping[str, Any]) -> bytes:
    """The document's file form: its RFC 8785 canonical bytes."""
    return _canonical(document)


def parse(data: bytes | str) -> dict[str, Any]:
    """A document from its file form; anything but canonical JSON of an object is refused."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    body = raw[:-1] if raw.endswith(b"\n") else raw
    try:
        document = json.loads(
            body.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
    except CheckpointRejected:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointRejected(f"checkpoint is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(document, dict):
        raise CheckpointRejected(
            f"checkpoint is not a JSON object (found {type(document).__name__})"
        )
    if _canonical(document) != body:
        raise CheckpointRejected(
            "checkpoint is not in its canonical form (RFC 8785): it was edited or "
            "reformatted after export; export it again"
        )
    return document


def verify(document: Mapping[str, Any], sealer: Sealer, derive: Derive) -> Checkpoint:
    """Check everything (signature first) and return the run and its records.
    ``derive`` folds the verified records into the derived header fields."""
    if not isinstance(document, Mapping):
        raise CheckpointRejected("checkpoint is not a JSON object")
    kid = _verify_signature(document, sealer.keyring)
    if document.get("format") != FORMAT:
        raise CheckpointRejected(
            f"not a crashproof checkpoint: format is {document.get('format')!r}, "
            f"expected {FORMAT!r}"
        )
    version = document.get("schema_version")
    if type(version) is not int:
        raise CheckpointRejected(f"checkpoint schema_version {version!r} is not an integer")
    if version > SCHEMA_VERSION:
        raise CheckpointRejected(
            f"checkpoint schema version {version} is newer than this crashproof reads "
            f"(up to {SCHEMA_VERSION}); upgrade crashproof to import it"
        )
    if version < 1:
        raise CheckpointRejected(f"checkpoint schema version {version} is not valid")
    _fields(document, (*_TOP, "requests") if version >= 5 else _TOP, "the checkpoint")
    run = _run_header(document["run"], _RUN if version >= 2 else _RUN_V1)
    records = _records(document["records"], run.run_id, sealer)
    _check_first(run, records)
    if run.generation != len(records):
        raise CheckpointRejected(
            f"checkpoint of run {run.run_id!r}: generation {run.generation} does not match "
            f"its {len(records)} record(s); a record was removed or added"
        )
    derived = _derived(run.run_id, records, derive)
    _check_status(run, derived.pop("status"))
    if version >= 2:
        _check_derived(run.run_id, document["run"], derived)
    move = version >= 3 and records[-1].type == EventType.RUN_MOVED.value
    requests = _requests(document["requests"], records) if version >= 5 else {}
    return Checkpoint(run, records, kid, version, derived, move, digest(document), requests)


def _requests(found: Any, records: Sequence[Record]) -> dict[int, str]:
    """Format 5's request texts, each the one its record's ``request_sha256`` names."""
    if not isinstance(found, Mapping):
        raise CheckpointRejected("the checkpoint's requests are not a JSON object")
    kept: dict[int, str] = {}
    for seq_text, text in found.items():
        seq = int(seq_text) if seq_text.isdigit() else -1
        payload = records[seq].payload if 0 <= seq < len(records) else ""
        named = _named_request(payload)
        if not isinstance(text, str) or named is None or named != request_sha256(text):
            raise CheckpointRejected(
                f"the checkpoint's request {seq_text!r} is not the one its record names "
                "(request_sha256): altered, or no such record; refusing it"
            )
        kept[seq] = text
    return kept


def _named_request(payload: str) -> str | None:
    try:
        named = json.loads(payload).get("request_sha256")
    except (ValueError, AttributeError):
        return None
    return named if isinstance(named, str) else None


# -- internals ---------------------------------------------------------------


def _canonical(value: Any) -> bytes:
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise CheckpointRejected(f"checkpoint cannot be canonicalized (RFC 8785): {exc}") from None


def _signature(secret: bytes, canonical: bytes) -> str:
    return hmac.new(secret, canonical, hashlib.sha256).hexdigest()


def _verify_signature(document: Mapping[str, Any], keyring: Keyring) -> str:
    signature, kid = document.get("signature"), document.get("key_id")
    if not isinstance(signature, str) or not isinstance(kid, str):
        raise CheckpointRejected(
            "checkpoint carries no signature or key id (fields 'signature', 'key_id')"
        )
    secret = keyring.get(kid)
    if secret is None:
        raise UnknownKeyId(
            f"checkpoint was signed with key id {kid!r}, which this keyring does not hold "
            f"(it has {keyring.current_id}); wrong key? Nothing was imported."
        )
    unsigned = {k: v for k, v in document.items() if k != "signature"}
    if not hmac.compare_digest(_signature(secret, _canonical(unsigned)), signature):
        raise CheckpointRejected(
            "checkpoint signature does not verify: the document was altered after export; "
            "nothing was imported"
        )
    return kid


def _fields(obj: Any, expected: tuple[str, ...], where: str) -> None:
    if not isinstance(obj, Mapping):
        raise CheckpointRejected(f"{where} is not a JSON object")
    unknown = sorted(set(obj) - set(expected))
    if unknown:
        raise CheckpointRejected(f"{where} has unknown field {unknown[0]!r}; refusing it")
    missing = [name for name in expected if name not in obj]
    if missing:
        raise CheckpointRejected(f"{where} lacks field {missing[0]!r}")


def _text(obj: Mapping[str, Any], name: str, where: str, *, optional: bool = False) -> Any:
    value = obj[name]
    if isinstance(value, str) or (optional and value is None):
        return value
    raise CheckpointRejected(f"{where}: field {name!r} must be a string, not {value!r}")


def _run_header(obj: Any, expected: tuple[str, ...]) -> RunHeader:
    where = "the checkpoint's run"
    _fields(obj, expected, where)
    generation = obj["generation"]
    if type(generation) is not int or generation < 1:
        raise CheckpointRejected(f"{where}: generation {generation!r} is not a positive integer")
    header = RunHeader(
        run_id=_text(obj, "run_id", where),
        workflow=_text(obj, "workflow", where),
        version=_text(obj, "version", where),
        input_digest=_text(obj, "input_digest", where),
        status=_text(obj, "status", where),
        generation=generation,
    )
    if not header.run_id:
        raise CheckpointRejected(f"{where}: run_id is empty")
    if header.status not in _STATUSES:
        raise CheckpointRejected(f"{where}: unknown status {header.status!r}")
    return header


# The shape of each derived header field: "int", "num", "str" (a trailing "?": or null),
# an object (exactly these fields; ``_Some``: a subset of them), [item] (a list of
# items), ``_OrNull(shape)``.
class _OrNull(NamedTuple):
    shape: Any


class _Some(NamedTuple):
    fields: Mapping[str, Any]


_SHAPES: Mapping[str, Any] = {
    "policy": _OrNull({"version": "str", "digest": "str", "identity": "str?"}),
    "limits": _OrNull(_Some(dict.fromkeys(BUDGET_KINDS, "num?"))),
    "budget_used": {"steps": "int", "decisions": "int", "tokens": "int", "cost": "num"},
    "approvals": {"granted": "int", "consumed": "int"},
    "open_review_cases": [
        {"case_id": "str", "fingerprint": "str", "reason": "str", "state": "str"}
    ],
}
_SCALARS: Mapping[str, Callable[[Any], bool]] = {
    "int": lambda v: type(v) is int,
    "num": lambda v: type(v) in (int, float),
    "str": lambda v: isinstance(v, str),
}


def _shape(value: Any, shape: Any, where: str) -> None:
    if isinstance(shape, _OrNull):
        if value is not None:
            _shape(value, shape.shape, where)
    elif isinstance(shape, str):
        if shape.endswith("?") and value is None:
            return
        if not _SCALARS[shape.rstrip("?")](value):
            raise CheckpointRejected(f"{where} must be {shape.rstrip('?')}, not {value!r}")
    elif isinstance(shape, list):
        if not isinstance(value, list):
            raise CheckpointRejected(f"{where} is not a list")
        for index, item in enumerate(value):
            _shape(item, shape[0], f"{where}[{index}]")
    else:
        fields = shape.fields if isinstance(shape, _Some) else shape
        if isinstance(shape, _Some):
            if not isinstance(value, Mapping):
                raise CheckpointRejected(f"{where} is not a JSON object")
            unknown = sorted(set(value) - set(fields))
            if unknown:
                raise CheckpointRejected(f"{where} has unknown field {unknown[0]!r}; refusing it")
        else:
            _fields(value, tuple(fields), where)
        for name, value_shape in fields.items():
            if name in value:
                _shape(value[name], value_shape, f"{where}.{name}")


def _derived(run_id: str, records: Sequence[Record], derive: Derive) -> dict[str, Any]:
    try:
        derived = dict(derive(run_id, records))
    except (IntegrityError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointRejected(
            f"checkpoint of run {run_id!r}: its records cannot be folded ({exc}); "
            "nothing was imported"
        ) from None
    expected = sorted((*DERIVED, "status"))
    if sorted(derived) != expected:
        raise CheckpointRejected(
            f"checkpoint of run {run_id!r}: the derivation gave fields {sorted(derived)}, "
            f"not {expected} (a crashproof bug); nothing was imported"
        )
    return derived


def _check_status(run: RunHeader, folded: Any) -> None:
    """The header's status must be the one its records fold to, like every other field
    (a key holder could re-sign a document saying ``succeeded`` over a failed run)."""
    if run.status == folded:
        return
    raise CheckpointRejected(
        f"checkpoint of run {run.run_id!r}: run header field 'status' is {run.status!r}, "
        f"but its records fold to {folded!r}; the header disagrees with its own records "
        "(the records are the source of truth); nothing was imported"
    )


def _check_derived(run_id: str, header: Mapping[str, Any], derived: Mapping[str, Any]) -> None:
    """A format-2 header must say exactly what its records fold to, field by field."""
    for name in DERIVED:
        _shape(header[name], _SHAPES[name], f"the checkpoint's run: field {name!r}")
        if _canonical(header[name]) != _canonical(derived[name]):
            raise CheckpointRejected(
                f"checkpoint of run {run_id!r}: run header field {name!r} is "
                f"{_short(header[name])}, but its records fold to {_short(derived[name])}; "
                "the header disagrees with its own records (the records are the source of "
                "truth); nothing was imported"
            )


def _short(value: Any) -> str:
    text = _canonical(value).decode("utf-8")
    return text if len(text) <= 200 else text[:197] + "..."


def _records(obj: Any, run_id: str, sealer: Sealer) -> tuple[Record, ...]:
    if not isinstance(obj, list) or not obj:
        raise CheckpointRejected(f"checkpoint of run {run_id!r}: records is not a non-empty list")
    records: list[Record] = []
    prev_mac = ""
    for index, item in enumerate(obj):
        where = f"checkpoint record {index}"
        _fields(item, _RECORD, where)
        seq, created_at = item["seq"], item["created_at"]
        if type(seq) is not int or seq != index:
            raise CheckpointRejected(
                f"{where}: sequence {seq!r} where {index} was expected; records were "
                "removed, added or reordered"
            )
        if type(created_at) not in (int, float):
            raise CheckpointRejected(f"{where}: created_at {created_at!r} is not a number")
        record = Record(
            seq=seq,
            type=_text(item, "type", where),
            key=_text(item, "key", where, optional=True),
            payload=_text(item, "payload", where),
            value=_text(item, "value", where, optional=True),
            created_at=float(created_at),  # RFC 8785 writes 5.0 as 5
            key_id=_text(item, "key_id", where),
            mac=_text(item, "mac", where),
        )
        try:
            sealer.verify(run_id, *record[:6], prev_mac, record.key_id, record.mac)
        except UnknownKeyId:
            raise
        except JournalTampered:
            raise CheckpointRejected(
                f"checkpoint of run {run_id!r}: record {index} does not match its MAC (altered, "
                "moved, copied from another run, or a record before it was removed); nothing "
                "was imported"
            ) from None
        except IntegrityError as exc:
            raise CheckpointRejected(f"{where}: {exc}") from None
        if record.type not in _TYPES:
            raise CheckpointRejected(f"{where}: unknown record type {record.type!r}")
        prev_mac = record.mac or ""
        records.append(record)
    return tuple(records)


def _check_first(run: RunHeader, records: Sequence[Record]) -> None:
    first = records[0]
    if first.type != "run_started":
        raise CheckpointRejected(
            f"checkpoint of run {run.run_id!r}: record 0 is {first.type!r}, not 'run_started'"
        )
    try:
        started = json.loads(first.payload)
    except ValueError:
        started = None
    if not isinstance(started, dict):
        raise CheckpointRejected(f"checkpoint of run {run.run_id!r}: record 0 is unreadable")
    recorded = payloads.of(payloads.RunStarted, started)
    for name in ("workflow", "version", "input_digest"):
        if recorded.get(name) != getattr(run, name):
            raise CheckpointRejected(
                f"checkpoint of run {run.run_id!r}: run {name} {getattr(run, name)!r} differs "
                f"from the journal's {recorded.get(name)!r}"
            )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise CheckpointRejected(f"checkpoint repeats field {name!r}")
        result[name] = value
    return result


def _no_constant(name: str) -> Any:
    raise CheckpointRejected(f"checkpoint holds {name}, which is not JSON")
