"""Fuzzing checkpoint import: every single-byte change of an exported checkpoint, and
random mutations of a larger one, are refused (as a crashproof IntegrityError, never
another exception) and nothing is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import crashproof as cp
from crashproof.integrity import checkpoint

KEY = "ab" * 32


def exported_file(tmp_path: Path, steps: int) -> bytes:
    @cp.workflow("fuzzed", version="1")
    def flow(ctx: cp.Context) -> list[str]:
        return [ctx.step(f"s{k}", lambda k=k: f"value-{k}-é") for k in range(steps)]

    with cp.Ledger(f"sqlite:///{tmp_path / 'source.db'}", key=KEY) as ledger:
        ledger.run(flow, run_id="r")
        return checkpoint.serialize(ledger.export_run("r"))


def import_bytes(ledger: cp.Ledger, data: bytes) -> None:
    ledger.import_run(checkpoint.parse(data), by="fuzz")


@pytest.fixture
def target(tmp_path: Path) -> Iterator[cp.Ledger]:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'target.db'}", key=KEY)
    yield ledger
    ledger.close()


def test_every_single_byte_flip_is_rejected(tmp_path: Path, target: cp.Ledger) -> None:
    original = exported_file(tmp_path, steps=3)
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
