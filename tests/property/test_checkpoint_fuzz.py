"""Fuzzing checkpoint import: every single-byte change of an exported checkpoint (format
2, and the same run as format 1, which import migrates), random mutations of a larger
one, and random values in the derived run-header fields (re-signed by a key holder, so
only the check against the records can tell) are refused (as a crashproof
IntegrityError, never another exception) and nothing is written."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import crashproof as cp
from crashproof.integrity import checkpoint
from crashproof.integrity.keys import Keyring

KEY = "ab" * 32
POLICY = cp.Policy("fuzz-1", allow={"notes": "*"}, identity="fuzzer")
OPTIONS = cp.RunOptions(policy=POLICY, limits=cp.Limits(max_steps=99, max_cost=2.5))


def exported(tmp_path: Path, steps: int) -> dict[str, Any]:
    @cp.workflow("fuzzed", version="1")
    def flow(ctx: cp.Context) -> list[str]:
        return [ctx.step(f"s{k}", lambda k=k: f"value-{k}-é") for k in range(steps)]

    with cp.Ledger(f"sqlite:///{tmp_path / 'source.db'}", key=KEY) as ledger:
        ledger.run(flow, run_id="r", options=OPTIONS)
        return ledger.export_run("r")


def exported_file(tmp_path: Path, steps: int) -> bytes:
    return checkpoint.serialize(exported(tmp_path, steps))


def as_version_1(document: dict[str, Any]) -> dict[str, Any]:
    old = copy.deepcopy(document)
    old["schema_version"] = 1
    for name in checkpoint.DERIVED:
        del old["run"][name]
    return checkpoint.sign(old, Keyring.from_hex(KEY))


def import_bytes(ledger: cp.Ledger, data: bytes) -> None:
    ledger.import_run(checkpoint.parse(data), by="fuzz")


@pytest.fixture
def target(tmp_path: Path) -> Iterator[cp.Ledger]:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'target.db'}", key=KEY)
    yield ledger
    ledger.close()


@pytest.mark.parametrize("version", [2, 1])
def test_every_single_byte_flip_is_rejected(
    tmp_path: Path, target: cp.Ledger, version: int
) -> None:
    document = exported(tmp_path, steps=3)
    assert document["run"]["policy"] == POLICY.record()
    if version == 1:
        document = as_version_1(document)
    original = checkpoint.serialize(document)
    accepted: list[tuple[int, int]] = []
    tried = 0
    for index in range(len(original)):
        for mask in (0x01, 0x20, 0x80, 0xFF):  # a low bit, ASCII case, high bit, all bits
            data = bytearray(original)
            data[index] ^= mask
            tried += 1
            try:
                import_bytes(target, bytes(data))
            except cp.IntegrityError:
                continue
            accepted.append((index, mask))
    assert tried == 4 * len(original)
    assert accepted == [], f"{len(accepted)} of {tried} mutated checkpoints were accepted"
    assert target.runs() == []
    import_bytes(target, original)  # the untouched document still imports
    assert [info.run_id for info in target.runs()] == ["r"]


@pytest.fixture(scope="module")
def larger(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return exported_file(tmp_path_factory.mktemp("larger"), steps=12)


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**9), st.integers(1, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10**9), st.integers(1, 64)),
    st.tuples(st.just("insert"), st.integers(0, 10**9), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("copy"), st.integers(0, 10**9), st.integers(0, 10**9)),
)


def mutate(data: bytes, steps: list[tuple[str, int, object]]) -> bytes:
    out = bytearray(data)
    for kind, at, arg in steps:
        at %= len(out) + 1
        if kind == "flip" and at < len(out) and isinstance(arg, int):
            out[at] ^= arg
        elif kind == "delete" and isinstance(arg, int):
            del out[at : at + arg]
        elif kind == "insert" and isinstance(arg, bytes):
            out[at:at] = arg
        elif kind == "copy" and isinstance(arg, int) and out:
            start = arg % len(out)
            out[at:at] = out[start : start + 40]
        if not out:
            out.append(0x7B)
    return bytes(out)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(mutation, min_size=1, max_size=4))
def test_random_mutations_are_rejected(
    larger: bytes, target: cp.Ledger, steps: list[tuple[str, int, object]]
) -> None:
    data = mutate(larger, steps)
    assume(data not in (larger, larger + b"\n"))  # the file form allows one final newline
    with pytest.raises(cp.IntegrityError):
        import_bytes(target, data)
    assert target.runs() == []


# Any JSON value a forger might put in a derived header field.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _nudged(value: Any, path: list[int], replacement: Any) -> Any:
    """``value`` with one nested leaf (chosen by ``path``) replaced, or the whole value."""
    if not path or not isinstance(value, dict | list) or not value:
        return replacement
    keys = sorted(value) if isinstance(value, dict) else list(range(len(value)))
    key = keys[path[0] % len(keys)]
    out = copy.deepcopy(value)
    out[key] = _nudged(value[key], path[1:], replacement)
    return out


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    field=st.sampled_from(checkpoint.DERIVED),
    path=st.lists(st.integers(0, 50), max_size=3),
    replacement=json_values,
    extra=st.one_of(st.none(), st.tuples(st.text(min_size=1, max_size=8), json_values)),
)
def test_random_derived_header_fields_are_rejected(
    header_document: dict[str, Any],
    target: cp.Ledger,
    field: str,
    path: list[int],
    replacement: Any,
    extra: tuple[str, Any] | None,
) -> None:
    forged = copy.deepcopy(header_document)
    value = _nudged(forged["run"][field], path, replacement)
    if extra is not None and isinstance(value, dict):
        value[extra[0]] = extra[1]
    forged["run"][field] = value
    assume(checkpoint.serialize(value) != checkpoint.serialize(header_document["run"][field]))
    with pytest.raises(cp.CheckpointRejected, match=f"field {field!r}"):
        target.import_run(checkpoint.sign(forged, Keyring.from_hex(KEY)), by="fuzz")
    assert target.runs() == []


@pytest.fixture(scope="module")
def header_document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return exported(tmp_path_factory.mktemp("header"), steps=2)
