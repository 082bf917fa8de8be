"""Hypothesis: whatever a step's large list value does turn after turn (grow, shrink, an
item edited, inserted or removed), a SQLite store that keeps it as text deltas
(store/deltas.py) reads every value back exactly, sealed or not, in the process that
wrote it and after a reopen, and never writes a delta whose base is missing."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crashproof.integrity.keys import Keyring
from crashproof.integrity.seal import Sealer
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.store import deltas
from crashproof.store.sqlite import SQLiteStore

ITEM = st.builds(
    lambda unit, n: unit * n,
    st.text(alphabet='aé🙂"\\\n', min_size=1, max_size=6),
    st.integers(min_value=100, max_value=1500),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(ITEM, min_size=1, max_size=3)),
        st.tuples(st.just("pop"), st.integers(min_value=1, max_value=3)),
        st.tuples(st.just("edit"), st.integers(min_value=0), ITEM),
        st.tuples(st.just("insert"), st.integers(min_value=0), ITEM),
        st.tuples(st.just("remove"), st.integers(min_value=0)),
        st.tuples(st.just("same"), st.none()),
    ),
    min_size=1,
    max_size=12,
)


def apply(value: list[str], op: tuple[str, Any, Any] | tuple[str, Any]) -> list[str]:
    kind, arg = op[0], op[1]
    if kind == "append":
        return [*value, *arg]
    if kind == "pop":
        return value[: max(1, len(value) - arg)]
    if kind == "same":
        return list(value)
    at = arg % len(value)
    if kind == "edit":
        return [*value[:at], op[2], *value[at + 1 :]]  # type: ignore[misc]
    if kind == "insert":
        return [*value[:at], op[2], *value[at:]]  # type: ignore[misc]
    return value[:at] + value[at + 1 :] if len(value) > 1 else value


def values_of(first: list[str], ops: list[Any]) -> list[list[str]]:
    out = [first]
    for op in ops:
        out.append(apply(out[-1], op))
    return out


def open_store(path: Path, sealed: bool) -> SQLiteStore:
    return SQLiteStore(path, sealer=Sealer(Keyring(b"k" * 32)) if sealed else None)


def record(run_id: str, seq: int, value: list[str]) -> Event:
    return Event(
        run_id,
        seq,
        EventType.STEP_DONE,
        "turn",
        {"kind": "step", "status": "succeeded"},
        1000.0 + seq,
        value_json=json.dumps(value, ensure_ascii=False, separators=(",", ":")),
    )


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "unsealed"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(ITEM, min_size=6, max_size=12), ops=OPS, links=st.sampled_from([2, 4096]))
def test_list_values_of_one_step_read_back_exactly(
    sealed: bool, first: list[str], ops: list[Any], links: int
) -> None:
    values = values_of(first, ops)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(deltas, "MAX_LINKS", links)
        path = Path(tmp) / "l.db"
        start = Event("r", 0, EventType.RUN_STARTED, None, {"input": "r"}, 1000.0)
        row = RunRow(
            run_id="r",
            workflow="wf",
            version="1",
            status=RunStatus.RUNNING,
            input_digest="d" * 64,
            created_at=1000.0,
            updated_at=1000.0,
        )
        written = [start] + [record("r", seq, v) for seq, v in enumerate(values, 1)]
        store = open_store(path, sealed)
        try:
            store.create_run(row, start)
            for event in written[1:]:
                store.append([event])
            loaded = store.load_events("r")
            assert loaded == written
            assert [e.value for e in loaded[1:]] == values
        finally:
            store.close()
        store = open_store(path, sealed)  # a new process: no memo of any kind
        try:
            assert [e.value for e in store.load_events("r")[1:]] == values
        finally:
            store.close()
        with contextlib.closing(sqlite3.connect(path)) as conn:
            orphans = conn.execute(
                "SELECT count(*) FROM blobs AS b WHERE b.base IS NOT NULL AND NOT EXISTS "
                "(SELECT 1 FROM blobs AS a WHERE a.digest = b.base)"
            ).fetchone()[0]
        assert orphans == 0


@given(
    old=st.text(alphabet="ab]é", max_size=12000),
    new=st.text(alphabet="ab]é", max_size=12000),
    cut=st.integers(min_value=0, max_value=12000),
)
@settings(max_examples=200, deadline=None)
def test_common_prefix_is_the_longest_common_prefix(old: str, new: str, cut: int) -> None:
    new = old[:cut] + new  # often a long shared prefix
    expected = 0
    while expected < min(len(old), len(new)) and old[expected] == new[expected]:
        expected += 1
    assert deltas.common_prefix(old, new) == expected
