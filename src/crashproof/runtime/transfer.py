"""Checkpoint export and import for a Ledger (the document itself:
``crashproof.integrity.checkpoint``).

Export copies a run's journal records exactly as stored, each with its own chain MAC,
and signs the whole. Import verifies everything before it writes anything, refuses a
run that already exists with another journal (an identical one is a no-op), installs
the records without re-sealing them in one transaction, then sets the witness to the
generation and logs who imported.

A document of an older format is migrated on the way in (format 1 → 2: the derived run
header fields are folded from its records); ``preview_import`` says what an import would
do (the run, its generation, the migration, the derived fields, install or nothing to
do) without writing anything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from crashproof.errors import CheckpointRejected, LedgerError, RunNotFound
from crashproof.integrity import checkpoint
from crashproof.integrity.seal import Sealer
from crashproof.integrity.witness import Witness
from crashproof.journal.records import RunRow, RunStatus
from crashproof.runtime.checkpoint_fields import derive_fields
from crashproof.store.port import RecordSealer, Store

__all__ = ["ImportPlan", "export_run", "import_run", "preview_import", "verify_document"]

log = logging.getLogger(__name__)

RawRecord = tuple[int, str, str | None, str, str | None, float, str | None, str | None]


@runtime_checkable
class _Transferable(Protocol):
    """What a store offers for checkpoints beyond the port (SQLite and PostgreSQL)."""

    @property
    def sealer(self) -> RecordSealer | None: ...

    def raw_events(self, run_id: str) -> list[RawRecord]: ...

    def install_run(self, row: RunRow, records: Sequence[RawRecord]) -> bool: ...


@dataclass(frozen=True, slots=True)
class ImportPlan:
    """What importing a verified checkpoint would do. ``action``: ``install`` (a new
    run), ``nothing`` (the same journal is already here) or ``repair-witness`` (already
    here, its witness missing or behind: a crash fell between install and witness)."""

    run_id: str
    workflow: str
    version: str
    status: str
    generation: int
    records: int
    from_format: int
    to_format: int
    derived: Mapping[str, Any]
    key_id: str
    action: str

    @property
    def migrates(self) -> bool:
        return self.from_format != self.to_format

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "version": self.version,
            "status": self.status,
            "generation": self.generation,
            "records": self.records,
            "format": {"from": self.from_format, "to": self.to_format},
            "derived": dict(self.derived),
            "signed_with": self.key_id,
            "action": self.action,
        }


def verify_document(document: Mapping[str, Any], sealer: Sealer) -> checkpoint.Checkpoint:
    """``checkpoint.verify`` with the runtime's derivation of the header fields."""
    return checkpoint.verify(document, sealer, derive_fields)


def _capable(store: Store) -> tuple[_Transferable, Sealer]:
    if not isinstance(store, _Transferable):
        raise LedgerError(
            f"checkpoint export/import is not supported by {type(store).__name__}; "
            "use a SQLite or PostgreSQL ledger"
        )
    sealer = store.sealer
    if not isinstance(sealer, Sealer):
        raise LedgerError("checkpoint export/import needs a ledger that seals its journal")
    return store, sealer


def export_run(store: Store, run_id: str) -> dict[str, Any]:
    """The run as one signed checkpoint document; its records are verified first."""
    raw_store, sealer = _capable(store)
    row = store.get_run(run_id)
    records = [checkpoint.Record(*r) for r in raw_store.raw_events(run_id)]
    if row is None or not records:
        raise RunNotFound(f"no run {run_id!r} to export")
    derived = derive_fields(run_id, records)
    header = checkpoint.RunHeader(
        run_id=run_id,
        workflow=row.workflow,
        version=row.version,
        input_digest=row.input_digest,
        status=row.status.value,
        generation=len(records),
    )
    document = checkpoint.sign(checkpoint.build(header, records, derived), sealer.keyring)
    verify_document(document, sealer)  # never hand out what import would refuse
    return document


def preview_import(
    store: Store, witness: Witness | None, document: Mapping[str, Any]
) -> ImportPlan:
    """Verify ``document`` (migrating an older format) and say what importing it would
    do; writes nothing. Raises what the import would raise."""
    return _plan(store, witness, document)[0]


def _plan(
    store: Store, witness: Witness | None, document: Mapping[str, Any]
) -> tuple[ImportPlan, checkpoint.Checkpoint]:
    raw_store, sealer = _capable(store)
    found = verify_document(document, sealer)
    run, records = found.run, found.records
    action = "install"
    witnessed = witness.get(run.run_id) if witness is not None else None
    if store.get_run(run.run_id) is not None:
        _same_journal(run.run_id, raw_store.raw_events(run.run_id), records)
        behind = witness is not None and (witnessed or 0) < run.generation
        action = "repair-witness" if behind else "nothing"
    elif witnessed is not None and witnessed > run.generation:
        raise CheckpointRejected(
            f"checkpoint of run {run.run_id!r} holds generation {run.generation}, but this "
            f"ledger's witness already saw generation {witnessed}: importing it would roll "
            "the run back; nothing was imported"
        )
    plan = ImportPlan(
        run_id=run.run_id,
        workflow=run.workflow,
        version=run.version,
        status=run.status,
        generation=run.generation,
        records=len(records),
        from_format=found.schema_version,
        to_format=checkpoint.SCHEMA_VERSION,
        derived=found.derived,
        key_id=found.key_id,
        action=action,
    )
    return plan, found


def import_run(
    store: Store, witness: Witness | None, document: Mapping[str, Any], *, by: str
) -> str:
    """Verify ``document`` (migrating an older format) and install its run; returns the
    run id."""
    if not by:
        raise ValueError("import_run needs by=NAME: who takes responsibility")
    raw_store, _ = _capable(store)
    plan, found = _plan(store, witness, document)
    run, records = found.run, found.records
    if plan.action != "install":
        # A crash between installing and setting the witness left it missing or behind:
        # importing the same checkpoint again repairs it.
        if witness is not None and plan.action == "repair-witness":
            witness.advance(run.run_id, run.generation)
            if witness.get(run.run_id) is None:
                witness.reset(run.run_id, run.generation)
        log.info("checkpoint already imported", extra={"run_id": run.run_id, "by": by})
        return run.run_id
    row = RunRow(
        run_id=run.run_id,
        workflow=run.workflow,
        version=run.version,
        status=RunStatus(run.status),
        input_digest=run.input_digest,
        created_at=records[0].created_at,
        updated_at=records[-1].created_at,
    )
    if not raw_store.install_run(row, records):  # created meanwhile by someone else
        _same_journal(run.run_id, raw_store.raw_events(run.run_id), records)
        return run.run_id
    if witness is not None:
        store.sync()  # the witness must never be ahead of what a power cut leaves
        witness.reset(run.run_id, run.generation)
    log.warning(
        "checkpoint imported",
        extra={
            "run_id": run.run_id,
            "by": by,
            "generation": run.generation,
            "signed_with": found.key_id,
            "format": found.schema_version,
        },
    )
    return run.run_id


def _same_journal(
    run_id: str, stored: Sequence[RawRecord], records: Sequence[checkpoint.Record]
) -> None:
    if len(stored) == len(records) and all(
        checkpoint.Record(*s) == r for s, r in zip(stored, records, strict=True)
    ):
        return
    differ = next(
        (
            i
            for i, (s, r) in enumerate(zip(stored, records, strict=False))
            if checkpoint.Record(*s) != r
        ),
        min(len(stored), len(records)),
    )
    raise CheckpointRejected(
        f"run {run_id!r} already exists in this ledger with another journal ({len(stored)} "
        f"record(s) here, {len(records)} in the checkpoint, first difference at record "
        f"{differ}); nothing was imported"
    )
