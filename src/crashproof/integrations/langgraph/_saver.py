"""CrashproofSaver: a LangGraph checkpointer on a crashproof ledger's database.

One sync core; the async methods run it off the event loop (``asyncio.to_thread``).

- Every stored row (thread head, checkpoint, channel blob, write) carries an HMAC under
  the ledger's keyring (``cp.SealedState``) over its identity and its exact stored
  text, verified before the text is parsed.
- Each thread's head row seals its generation (one per write) and its latest checkpoint
  per namespace; the generation is mirrored in a witness outside the database, so a
  restored older copy is refused (``cp.JournalRolledBack``), and a deleted latest
  checkpoint is refused too.
- Writes are fenced by a lease per thread (owner, expiry, a fencing token that grows with
  every new owner): a second saver writing to a thread another live process holds gets
  ``cp.LeaseHeld``; a saver whose lease was taken over gets ``cp.StaleLeaseError``.
  The holder of a dead process of this host is taken over at once.
- Values are JSON (``_serde.py``); a list channel that grew by appending (a transcript)
  is stored as its new items on top of the previous version (``base_version``), so a
  checkpoint costs O(new bytes); a full copy is kept every ``MAX_DEPTH`` (``_rows.py``) versions to
  bound a read's chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

import crashproof as cp
import crashproof.integrations.langgraph._db as _db
from crashproof.integrations.langgraph._fencing import HOST, Renewal, held_head, renew_lease
from crashproof.integrations.langgraph._rows import Head, SealedRows, config_of
from crashproof.integrations.langgraph._serde import JsonSerde, encode

__all__ = ["CrashproofSaver"]

_Tuples = list[CheckpointTuple]


class CrashproofSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose rows are sealed by a crashproof ledger's key,
    witnessed against rollback and fenced by a per-thread lease.

    >>> saver = CrashproofSaver("sqlite:///runs.db")  # doctest: +SKIP
    >>> graph = builder.compile(checkpointer=saver)  # doctest: +SKIP

    ``url``: the ledger's URL (``sqlite:///…`` or ``postgresql://…``), or pass
    ``ledger=`` (a ``cp.Ledger`` on such a URL); ``key``: the ledger key (default as for
    ``cp.Ledger``); ``lease_seconds``: how long this saver owns a thread after its last
    write; ``durability``: ``"full"`` (fsync each commit, the default) or ``"normal"``."""

    def __init__(
        self,
        url: str | None = None,
        *,
        ledger: cp.Ledger | None = None,
        key: bytes | str | cp.Keyring | None = None,
        lease_seconds: float = 15.0,
        durability: str = "full",
    ) -> None:
        super().__init__(serde=JsonSerde())
        if (url is None) == (ledger is None):
            raise ValueError("CrashproofSaver takes a ledger URL or ledger=, exactly one")
        if durability not in ("full", "normal"):
            raise ValueError(f"durability must be 'full' or 'normal', not {durability!r}")
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be positive, not {lease_seconds!r}")
        self._own_ledger = ledger is None
        self.ledger = ledger if ledger is not None else cp.Ledger(str(url), key=key)
        try:
            self._seals = self.ledger.sealed_state("langgraph")
            self._db = _db.open_database(
                self.ledger.url, synchronous="FULL" if durability == "full" else "NORMAL"
            )
        except BaseException:
            if self._own_ledger:
                self.ledger.close()
            raise
        self.lease_seconds = float(lease_seconds)
        self.owner = f"{HOST}:{os.getpid()}:{secrets.token_hex(4)}"
        self._tokens: dict[str, int] = {}  # thread -> the fencing token this saver holds
        self._rows = SealedRows(self._seals, self._db.dialect)

    # -- LangGraph's interface: the sync core ----------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    def with_allowlist(self, extra_allowlist: Any) -> CrashproofSaver:
        return self  # no msgpack here: JSON with a closed set of tags

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        with self._db.read() as q:
            head = self._rows.head(q, thread_id)
            if head is None:
                return None
            wanted = get_checkpoint_id(config)
            checkpoint_id = wanted or head.latest.get(ns)
            if checkpoint_id is None:
                return None
            rows = q(
                "SELECT checkpoint_id, parent_id, checkpoint, metadata, seal "
                "FROM langgraph_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
                "AND checkpoint_id = ?",
                (thread_id, ns, checkpoint_id),
            )
            if not rows:
                if wanted is None:
                    raise cp.JournalTampered(
                        f"thread {thread_id!r}: its latest checkpoint {checkpoint_id} "
                        f"(namespace {ns!r}) is missing from the database; nothing was read"
                    )
                return None
            return self._rows.checkpoint_tuple(q, thread_id, ns, rows[0])

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        return iter(self._list(config, filter, before, limit))

    def _list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> _Tuples:
        conf = config["configurable"] if config else {}
        found: _Tuples = []
        with self._db.read() as q:
            if "thread_id" in conf:
                threads = [str(conf["thread_id"])]
            else:
                threads = [r[0] for r in q("SELECT thread_id FROM langgraph_threads", ())]
            ns = conf.get("checkpoint_ns")
            wanted = conf.get("checkpoint_id")
            before_id = get_checkpoint_id(before) if before else None
            rows: list[tuple[str, tuple[Any, ...]]] = []
            for thread_id in threads:
                if self._rows.head(q, thread_id) is None:
                    continue
                sql = (
                    "SELECT checkpoint_id, parent_id, checkpoint, metadata, seal, "
                    "checkpoint_ns FROM langgraph_checkpoints WHERE thread_id = ?"
                )
                args: list[Any] = [thread_id]
                if ns is not None:
                    sql, args = sql + " AND checkpoint_ns = ?", [*args, ns]
                if wanted:
                    sql, args = sql + " AND checkpoint_id = ?", [*args, wanted]
                if before_id:
                    sql, args = sql + " AND checkpoint_id < ?", [*args, before_id]
                rows += [(thread_id, r) for r in q(sql, args)]
            rows.sort(key=lambda tr: tr[1][0], reverse=True)
            for thread_id, row in rows:
                if limit is not None and len(found) >= limit:
                    break
                metadata = self._rows.verified_metadata(thread_id, row[5], row)
                if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
                found.append(self._rows.checkpoint_tuple(q, thread_id, row[5], row[:5]))
        return found

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        parent_id = conf.get("checkpoint_id")
        stored = dict(checkpoint)
        values = cast(dict[str, Any], stored.pop("channel_values", {}))
        where = f"checkpoint {checkpoint['id']} of thread {thread_id!r}"
        # Everything is encoded before the transaction: a value JSON cannot hold
        # raises here, and nothing is written.
        checkpoint_text = encode(stored, where)
        full_metadata = get_checkpoint_metadata(config, metadata)
        metadata_text = encode(full_metadata, f"the metadata of {where}")
        run_id = full_metadata.get("run_id")
        blobs = [
            self._rows.blob(
                (thread_id, ns, channel), str(version), values, f"channel {channel!r} of {where}"
            )
            for channel, version in new_versions.items()
        ]
        with self._writing(thread_id) as (q, head):
            kept = [self._rows.store_blob(q, thread_id, ns, blob) for blob in blobs]
            seal = self._seals.seal(
                "checkpoint",
                thread_id,
                ns,
                checkpoint["id"],
                parent_id,
                checkpoint_text,
                metadata_text,
            )
            q(
                "INSERT INTO langgraph_checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
                "parent_id, run_id, checkpoint, metadata, seal) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET "
                "parent_id = excluded.parent_id, run_id = excluded.run_id, "
                "checkpoint = excluded.checkpoint, metadata = excluded.metadata, "
                "seal = excluded.seal",
                (
                    thread_id,
                    ns,
                    checkpoint["id"],
                    parent_id,
                    None if run_id is None else str(run_id),
                    checkpoint_text,
                    metadata_text,
                    seal,
                ),
            )
            if checkpoint["id"] > head.latest.get(ns, ""):
                head.latest[ns] = checkpoint["id"]
        for blob, items in zip(blobs, kept, strict=True):  # committed: remembered
            self._rows.stored(thread_id, ns, blob.channel, items)
        return config_of(thread_id, ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        checkpoint_id = str(conf["checkpoint_id"])
        where = f"a write of task {task_id} at checkpoint {checkpoint_id}"
        rows = [
            (WRITES_IDX_MAP.get(channel, idx), channel, encode(value, f"{channel!r}: {where}"))
            for idx, (channel, value) in enumerate(writes)
        ]
        # Special writes (error, interrupt, ...) replace; regular ones are kept once.
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        conflict = (
            "DO UPDATE SET channel = excluded.channel, task_path = excluded.task_path, "
            "value = excluded.value, seal = excluded.seal"
            if replace
            else "DO NOTHING"
        )
        with self._writing(thread_id) as (q, _head):
            for idx, channel, text in rows:
                seal = self._seals.seal(
                    "write",
                    thread_id,
                    ns,
                    checkpoint_id,
                    task_id,
                    str(idx),
                    channel,
                    task_path,
                    text,
                )
                q(
                    "INSERT INTO langgraph_writes (thread_id, checkpoint_ns, checkpoint_id, "
                    "task_id, idx, channel, task_path, value, seal) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id, checkpoint_ns, "
                    f"checkpoint_id, task_id, idx) {conflict}",
                    (thread_id, ns, checkpoint_id, task_id, idx, channel, task_path, text, seal),
                )

    def delete_thread(self, thread_id: str) -> None:
        thread_id = str(thread_id)
        with self._writing(thread_id, create=False) as (q, head):
            for table in ("checkpoints", "blobs", "writes"):
                q(f"DELETE FROM langgraph_{table} WHERE thread_id = ?", (thread_id,))
            head.latest.clear()  # the head stays: its generation keeps growing
        self._rows.forget(thread_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source, target = str(source_thread_id), str(target_thread_id)
        with self._db.read() as q:
            if self._rows.head(q, source) is None:
                return
            checkpoints = q(
                "SELECT checkpoint_ns, checkpoint_id, parent_id, run_id, checkpoint, "
                "metadata, seal FROM langgraph_checkpoints WHERE thread_id = ?",
                (source,),
            )
            blobs = q(
                "SELECT checkpoint_ns, channel, version, base_version, value, seal "
                "FROM langgraph_blobs WHERE thread_id = ?",
                (source,),
            )
            writes = q(
                "SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, task_path, "
                "value, seal FROM langgraph_writes WHERE thread_id = ?",
                (source,),
            )
        # Every row verified as the source's before any is sealed as the target's.
        for ns, cid, parent, _run, text, meta, seal in checkpoints:
            self._seals.verify(
                seal,
                "checkpoint",
                source,
                ns,
                cid,
                parent,
                text,
                meta,
                what=f"checkpoint {cid} of thread {source!r}",
            )
        for ns, channel, version, base, value, seal in blobs:
            self._seals.verify(
                seal,
                "blob",
                source,
                ns,
                channel,
                version,
                base,
                value,
                what=f"channel {channel!r}@{version} of thread {source!r}",
            )
        for ns, cid, task, idx, channel, path, value, seal in writes:
            self._seals.verify(
                seal,
                "write",
                source,
                ns,
                cid,
                task,
                str(idx),
                channel,
                path,
                value,
                what=f"a write of checkpoint {cid} of {source!r}",
            )
        if not checkpoints:
            return
        with self._writing(target) as (q, head):
            for ns, cid, parent, run, text, meta, _seal in checkpoints:
                q(
                    "INSERT INTO langgraph_checkpoints (thread_id, checkpoint_ns, "
                    "checkpoint_id, parent_id, run_id, checkpoint, metadata, seal) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (
                        target,
                        ns,
                        cid,
                        parent,
                        run,
                        text,
                        meta,
                        self._seals.seal("checkpoint", target, ns, cid, parent, text, meta),
                    ),
                )
                if cid > head.latest.get(ns, ""):
                    head.latest[ns] = cid
            for ns, channel, version, base, value, _seal in blobs:
                q(
                    "INSERT INTO langgraph_blobs (thread_id, checkpoint_ns, channel, version, "
                    "base_version, value, seal) VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (
                        target,
                        ns,
                        channel,
                        version,
                        base,
                        value,
                        self._seals.seal("blob", target, ns, channel, version, base, value),
                    ),
                )
            for ns, cid, task, idx, channel, path, value, _seal in writes:
                q(
                    "INSERT INTO langgraph_writes (thread_id, checkpoint_ns, checkpoint_id, "
                    "task_id, idx, channel, task_path, value, seal) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (
                        target,
                        ns,
                        cid,
                        task,
                        idx,
                        channel,
                        path,
                        value,
                        self._seals.seal(
                            "write", target, ns, cid, task, str(idx), channel, path, value
                        ),
                    ),
                )

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        wanted = [str(r) for r in run_ids]
        if not wanted:
            return
        marks = ", ".join("?" for _ in wanted)
        with self._db.read() as q:
            found = q(
                "SELECT thread_id, checkpoint_ns, checkpoint_id FROM langgraph_checkpoints "
                f"WHERE run_id IN ({marks})",
                wanted,
            )
        by_thread: dict[str, list[tuple[str, str]]] = {}
        for thread_id, ns, cid in found:
            by_thread.setdefault(thread_id, []).append((ns, cid))
        for thread_id, doomed in by_thread.items():
            with self._writing(thread_id, create=False) as (q, head):
                self._rows.delete_checkpoints(q, thread_id, head, doomed)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy must be 'keep_latest' or 'delete', not {strategy!r}")
        for thread_id in map(str, thread_ids):
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            with self._writing(thread_id, create=False) as (q, head):
                rows = q(
                    "SELECT checkpoint_ns, checkpoint_id FROM langgraph_checkpoints "
                    "WHERE thread_id = ?",
                    (thread_id,),
                )
                doomed = [(ns, cid) for ns, cid in rows if head.latest.get(ns) != cid]
                self._rows.delete_checkpoints(q, thread_id, head, doomed)

    @contextlib.contextmanager
    def hold(self, thread_id: str) -> Iterator[None]:
        """Keep this saver's lease on ``thread_id`` alive while the block runs, for
        graphs whose nodes may outlast ``lease_seconds`` (a write renews it too, but
        nothing is written while a node runs):

        >>> with saver.hold("chat-1"):  # doctest: +SKIP
        ...     graph.invoke(inputs, {"configurable": {"thread_id": "chat-1"}})

        Renewed every ``lease_seconds / 3`` once this saver wrote the thread; a lease
        another saver took over meanwhile is not renewed (this saver's next write
        raises ``cp.StaleLeaseError``). After the block the lease expires as usual."""
        thread_id = str(thread_id)

        def renew() -> bool:
            token = self._tokens.get(thread_id)  # None: its first write takes the lease
            return token is None or renew_lease(
                self._db, thread_id, self.owner, token, self.lease_seconds
            )

        with Renewal(renew, self.lease_seconds / 3, thread_id):
            yield

    def release(self, thread_id: str) -> None:
        """Give up this saver's lease on ``thread_id`` (another process may then write to
        it at once); idempotent."""
        token = self._tokens.pop(str(thread_id), None)
        if token is None:
            return
        with self._db.write() as q:
            q(
                "UPDATE langgraph_threads SET owner = NULL WHERE thread_id = ? AND owner = ? "
                "AND token = ?",
                (str(thread_id), self.owner, token),
            )

    def close(self) -> None:
        """Release this saver's leases and close its connection (and the ledger it
        opened)."""
        for thread_id in list(self._tokens):
            with contextlib.suppress(cp.CrashproofError):
                self.release(thread_id)
        self._db.close()
        self._seals.close()
        if self._own_ledger:
            self.ledger.close()

    def __enter__(self) -> CrashproofSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the async shell ---------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for item in await asyncio.to_thread(self._list, config, filter, before, limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    # -- heads, leases and the witness -------------------------------------------

    @contextlib.contextmanager
    def _writing(self, thread_id: str, *, create: bool = True) -> Iterator[tuple[_db.Query, Head]]:
        """One write transaction on a thread under this saver's lease: the head verified,
        the lease taken or checked (LeaseHeld, StaleLeaseError), the generation raised
        and the head re-sealed in the same transaction; the witness after the commit."""
        with self._db.write() as q:
            if self._db.dialect == "postgres":  # a row to lock, for a thread's first write
                q(
                    "INSERT INTO langgraph_threads (thread_id, generation, latest, seal, "
                    "token) VALUES (?, 0, '{}', '', 0) ON CONFLICT DO NOTHING",
                    (thread_id,),
                )
            head = held_head(q, thread_id, self._rows, self._tokens, self.owner, self._db.now)
            if head is None and not create:  # nothing to delete: leave no row behind
                q("DELETE FROM langgraph_threads WHERE thread_id = ? AND seal = ''", (thread_id,))
                yield q, Head(0, {})
                return
            if head is None:
                self._seals.start(thread_id)  # generation 0, before the first commit
                head = Head(0, {}, token=0)
            now = self._db.now(q)
            token = self._tokens.get(thread_id)
            if token is None or token != head.token or head.owner != self.owner:
                token = head.token + 1  # a new owner: the old one is fenced out
            yield q, head
            generation = head.generation + 1
            latest = json.dumps(head.latest, sort_keys=True, separators=(",", ":"))
            seal = self._seals.seal("thread", thread_id, str(generation), latest)
            q(
                "INSERT INTO langgraph_threads (thread_id, generation, latest, seal, owner, "
                "lease_expires, token) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id) "
                "DO UPDATE SET generation = excluded.generation, latest = excluded.latest, "
                "seal = excluded.seal, owner = excluded.owner, "
                "lease_expires = excluded.lease_expires, token = excluded.token",
                (thread_id, generation, latest, seal, self.owner, now + self.lease_seconds, token),
            )
        self._tokens[thread_id] = token
        self._seals.advance(thread_id, generation)

    # -- rows ------------------------------------------------------------------------
