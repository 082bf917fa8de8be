"""The sealed rows of CrashproofSaver: each verified before its text is parsed.

A thread's head seals its generation and latest checkpoint per namespace; a checkpoint
row seals its identity, parent, checkpoint and metadata text; a blob row one channel
version (a full value, or the new items of a list on top of ``base_version``); a write
row one pending write. Every seal binds the thread id, so a row copied into another
thread, checkpoint or version is refused.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

import crashproof as cp
from crashproof.integrations.langgraph._db import Query
from crashproof.integrations.langgraph._serde import decode, encode, encode_item, unchanged

__all__ = ["MAX_DEPTH", "Blob", "Head", "Items", "SealedRows", "config_of"]

MAX_DEPTH = 64  # list deltas on top of a full copy before the next full copy
KEPT = 256  # list channels whose last version this saver remembers (the latest used)

Rows = list[tuple[Any, ...]]


@dataclass(slots=True)
class Head:
    generation: int
    latest: dict[str, str]
    owner: str | None = None
    expires: float | None = None
    token: int = 0


@dataclass(slots=True)
class Items:
    """The item texts of a list channel's version this saver stored last, and the
    objects this process last handed out or was given for them (``seen``: each with a
    parse of its text, to tell it unchanged)."""

    version: str
    items: list[str]
    depth: int
    seen: list[tuple[Any, Any]] | None = None


@dataclass(slots=True)
class Blob:
    channel: str
    version: str
    full: str | None  # None: the channel is empty at this version
    items: list[str] | None = None  # a list value's item texts
    seen: list[tuple[Any, Any]] | None = None  # its objects, each with its parsed text


def config_of(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class SealedRows:
    """Reads and writes of sealed rows within a transaction (``q``) of the saver."""

    def __init__(self, seals: cp.SealedState, dialect: str) -> None:
        self._seals = seals
        self._dialect = dialect
        self._lists: dict[tuple[str, str, str], Items] = {}
        self._lists_lock = threading.Lock()  # puts remember outside the database's lock

    def head(self, q: Query, thread_id: str, *, lock: bool = False) -> Head | None:
        """The thread's head, its seal verified and its generation checked against the
        witness (None: no such thread)."""
        sql = (
            "SELECT generation, latest, seal, owner, lease_expires, token "
            "FROM langgraph_threads WHERE thread_id = ?"
        )
        if lock and self._dialect == "postgres":
            sql += " FOR UPDATE"
        rows = q(sql, (thread_id,))
        # A PostgreSQL write's placeholder (generation 0, no seal; _writing) is no head:
        # it is never committed, and a stored one reads as a missing thread, which the
        # witness refuses once it saw the thread.
        if not rows or (rows[0][0] == 0 and rows[0][2] == ""):
            self._seals.check_generation(thread_id, None)
            return None
        generation, latest, seal, owner, expires, token = rows[0]
        self._seals.verify(
            seal,
            "thread",
            thread_id,
            str(generation),
            latest,
            what=f"the head of thread {thread_id!r}",
        )
        self._seals.check_generation(thread_id, int(generation))
        return Head(int(generation), json.loads(latest), owner, expires, int(token))

    def verified_metadata(self, thread_id: str, ns: str, row: tuple[Any, ...]) -> Any:
        cid, parent, text, meta, seal = row[:5]
        self._seals.verify(
            seal,
            "checkpoint",
            thread_id,
            ns,
            cid,
            parent,
            text,
            meta,
            what=f"checkpoint {cid} of thread {thread_id!r}",
        )
        return decode(meta)

    def checkpoint_tuple(
        self, q: Query, thread_id: str, ns: str, row: tuple[Any, ...]
    ) -> CheckpointTuple:
        cid, parent, text = row[0], row[1], row[2]
        metadata = self.verified_metadata(thread_id, ns, row)
        checkpoint = decode(text)
        checkpoint["channel_values"] = self.values(q, thread_id, ns, checkpoint)
        return CheckpointTuple(
            config=config_of(thread_id, ns, cid),
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=config_of(thread_id, ns, parent) if parent else None,
            pending_writes=self.writes(q, thread_id, ns, cid),
        )

    def values(
        self, q: Query, thread_id: str, ns: str, checkpoint: dict[str, Any]
    ) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for channel, version in checkpoint.get("channel_versions", {}).items():
            known = self._lists.get((thread_id, ns, channel))
            if known is not None and known.version == str(version):
                # A version this process wrote (and committed): its items are known, so
                # its delta chain is neither read nor re-verified.
                text = "[" + ",".join(known.items) + "]"
                value = values[channel] = decode(text)
                seen = list(zip(value, json.loads(text), strict=True))
                items = Items(known.version, known.items, known.depth, seen)
                self.stored(thread_id, ns, channel, items)
                continue
            chain = q(
                "WITH RECURSIVE chain (version, base_version, value, seal, depth) AS ("
                "SELECT version, base_version, value, seal, 0 FROM langgraph_blobs "
                "WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ? "
                "UNION ALL SELECT b.version, b.base_version, b.value, b.seal, c.depth + 1 "
                "FROM langgraph_blobs b JOIN chain c ON b.thread_id = ? "
                "AND b.checkpoint_ns = ? AND b.channel = ? AND b.version = c.base_version "
                f"WHERE c.depth < {MAX_DEPTH + 1}) "
                "SELECT version, base_version, value, seal FROM chain ORDER BY depth",
                (thread_id, ns, channel, str(version), thread_id, ns, channel),
            )
            if not chain:
                continue
            for ver, base, value, seal in chain:
                self._seals.verify(
                    seal,
                    "blob",
                    thread_id,
                    ns,
                    channel,
                    ver,
                    base,
                    value,
                    what=f"channel {channel!r}@{ver} of thread {thread_id!r}",
                )
            if chain[-1][1] is not None:
                raise cp.JournalTampered(
                    f"thread {thread_id!r}: channel {channel!r}@{version} builds on a "
                    "version missing from the database; nothing was read"
                )
            if chain[-1][2] is None:
                continue  # the channel is empty at this version
            value = decode(chain[-1][2])
            for _ver, _base, tail, _seal in reversed(chain[:-1]):
                value.extend(decode(tail))
            values[channel] = value
        return values

    def writes(
        self, q: Query, thread_id: str, ns: str, checkpoint_id: str
    ) -> list[tuple[str, str, Any]]:
        rows = q(
            "SELECT task_id, idx, channel, task_path, value, seal FROM langgraph_writes "
            "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
            (thread_id, ns, checkpoint_id),
        )
        rows.sort(key=lambda r: (r[3], r[0], r[1]))  # writes_sort_key
        out = []
        for task, idx, channel, path, value, seal in rows:
            self._seals.verify(
                seal,
                "write",
                thread_id,
                ns,
                checkpoint_id,
                task,
                str(idx),
                channel,
                path,
                value,
                what=f"a write of checkpoint {checkpoint_id} of {thread_id!r}",
            )
            out.append((task, channel, decode(value)))
        return out

    def blob(
        self, key: tuple[str, str, str], version: str, values: dict[str, Any], where: str
    ) -> Blob:
        channel = key[2]
        if channel not in values:
            return Blob(channel, version, None)
        value = values[channel]
        if not isinstance(value, list):
            return Blob(channel, version, encode(value, where))
        known = self._lists.get(key)
        seen = known.seen if known is not None and known.seen is not None else []
        texts = known.items if known is not None else []  # aligned with seen
        items: list[str] = []
        now: list[tuple[Any, Any]] = []
        for i, item in enumerate(value):
            if i < len(seen) and seen[i][0] is item and unchanged(item, seen[i][1]):
                items.append(texts[i])  # the same object, as it was: its text
                now.append(seen[i])
            else:
                text = encode_item(item, where)
                items.append(text)
                now.append((item, json.loads(text)))
        return Blob(channel, version, "[" + ",".join(items) + "]", items, now)

    def store_blob(self, q: Query, thread_id: str, ns: str, blob: Blob) -> Items | None:
        """Insert the blob's row (a list as its new items where it grew by appending);
        returns what ``stored`` should remember once the transaction committed."""
        key = (thread_id, ns, blob.channel)
        base: str | None = None
        value = blob.full
        known = self._lists.get(key)
        if (
            blob.items is not None
            and known is not None
            and known.depth < MAX_DEPTH
            and len(known.items) <= len(blob.items)
            and blob.items[: len(known.items)] == known.items
            and known.version != blob.version
            and q(
                "SELECT 1 FROM langgraph_blobs WHERE thread_id = ? AND checkpoint_ns = ? "
                "AND channel = ? AND version = ?",
                (thread_id, ns, blob.channel, known.version),
            )
        ):
            base = known.version
            value = "[" + ",".join(blob.items[len(known.items) :]) + "]"
        seal = self._seals.seal("blob", thread_id, ns, blob.channel, blob.version, base, value)
        q(
            "INSERT INTO langgraph_blobs (thread_id, checkpoint_ns, channel, version, "
            "base_version, value, seal) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (thread_id, ns, blob.channel, blob.version, base, value, seal),
        )
        if blob.items is None:
            return None
        depth = 0 if base is None or known is None else known.depth + 1
        return Items(blob.version, blob.items, depth, blob.seen)

    def stored(self, thread_id: str, ns: str, channel: str, items: Items | None) -> None:
        """Remember a committed channel version's items (None: not a list), the base of
        the next delta and a read that needs no database."""
        key = (thread_id, ns, channel)
        with self._lists_lock:
            self._lists.pop(key, None)
            if items is not None:
                self._lists[key] = items  # last in the dict's order: the latest used
                if len(self._lists) > KEPT:
                    del self._lists[next(iter(self._lists))]

    def delete_checkpoints(
        self, q: Query, thread_id: str, head: Head, doomed: list[tuple[str, str]]
    ) -> None:
        """Delete checkpoints and their writes, then the blobs no remaining checkpoint
        reaches (through its versions and their bases)."""
        for ns, cid in doomed:
            for table in ("checkpoints", "writes"):
                q(
                    f"DELETE FROM langgraph_{table} WHERE thread_id = ? AND checkpoint_ns = ? "
                    "AND checkpoint_id = ?",
                    (thread_id, ns, cid),
                )
        for ns in {ns for ns, _ in doomed}:
            top = q(
                "SELECT MAX(checkpoint_id) FROM langgraph_checkpoints WHERE thread_id = ? "
                "AND checkpoint_ns = ?",
                (thread_id, ns),
            )[0][0]
            if top is None:
                head.latest.pop(ns, None)
            else:
                head.latest[ns] = top
        reached: set[tuple[str, str, str]] = set()
        for row in q(
            "SELECT checkpoint_id, parent_id, checkpoint, metadata, seal, checkpoint_ns "
            "FROM langgraph_checkpoints WHERE thread_id = ?",
            (thread_id,),
        ):
            self.verified_metadata(thread_id, row[5], row)
            for channel, version in decode(row[2]).get("channel_versions", {}).items():
                reached.add((row[5], channel, str(version)))
        bases = {
            (ns, ch, ver): base
            for ns, ch, ver, base in q(
                "SELECT checkpoint_ns, channel, version, base_version FROM langgraph_blobs "
                "WHERE thread_id = ?",
                (thread_id,),
            )
        }
        for ns, ch, ver in list(reached):
            base = bases.get((ns, ch, ver))
            while base is not None and (ns, ch, base) not in reached:
                reached.add((ns, ch, base))
                base = bases.get((ns, ch, base))
        for ns, ch, ver in bases:
            if (ns, ch, ver) not in reached:
                q(
                    "DELETE FROM langgraph_blobs WHERE thread_id = ? AND checkpoint_ns = ? "
                    "AND channel = ? AND version = ?",
                    (thread_id, ns, ch, ver),
                )
        self.forget(thread_id)

    def forget(self, thread_id: str) -> None:
        with self._lists_lock:
            for key in [k for k in self._lists if k[0] == thread_id]:
                del self._lists[key]
