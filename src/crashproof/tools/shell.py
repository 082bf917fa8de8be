"""Shell: a command run in a workspace, once in effect.

``ctx.act("tests", shell, argv=["pytest", "-q"])`` runs ``pytest -q`` in the workspace
under the act protocol. Params (journaled; the intent digest covers them):

- ``argv`` (a non-empty list of strings; no shell: ``["sh", "-c", "..."]`` asks for one);
- ``effect``: ``"workspace"`` (the default: the command changes nothing but files in the
  workspace and its declared paths) or ``"external"`` (it reaches further: a network, a
  database, ``git push``);
- ``cwd`` (relative to the workspace root, default ``"."``), ``env`` (names to values,
  added to the cleaned environment), ``timeout`` (seconds; default the tool's),
  ``paths`` (more declared paths, added to the tool's).

Before the intent commits, ``prepare`` takes a snapshot (``tools/_snapshot.py``: a git
tree of the workspace's non-ignored files and of each declared path such as
``node_modules``, a ``--target`` directory or ``.git``) and journals its id with the argv,
the working directory and the digest of the environment. ``execute`` runs the command in
a process group of its own (``tools/_process.py``), then snapshots again and writes a
completion record into the store before it returns the receipt.

Recovery (the act left in flight by a crash). ``lookup`` finds the completion record:
the command finished, its receipt is returned and it does not run again. Without one:

- a ``workspace`` command is *not done*: its process group, if it outlived the crash, is
  killed, the snapshot is put back exactly (files the half-run added removed, the ones it
  changed restored) and the command runs again from the state it first saw;
- an ``external`` command's outcome is unknown: it is settled as the tool's
  ``on_unknown`` (``cp.OnUnknown``) says; ``review`` (the default) freezes the run.

Result (the receipt's, JSON): ``exit_code`` (a non-zero exit is a result, not a failure;
``-N`` for a kill by signal N), ``duration_s``, ``stdout``/``stderr`` as ``{"head",
"tail", "bytes", "blob"}`` (the first and last ``keep`` bytes as text, invalid UTF-8
backslash-escaped; the whole output as a git blob of the store: ``Shell.output(blob)``),
``delta`` (``{"count", "changes": [{"path", "status", "blob"}], "truncated"}``: the files
the command changed, with their new contents' git blob ids) and the ``before`` and
``after`` snapshot ids.

Refused, with nothing run (``cp.PermanentError``, the act recorded as failed): bad
params, a command that is not found or not executable. A ``workspace`` command that
outlives its timeout, or prints more than ``max_output`` bytes, is killed with its
process group, the workspace is put back, and the act fails permanently the same way
(it did not happen). An ``external`` one killed so has an unknown outcome.

The machine failing under the tool's own bookkeeping (the snapshot store on a full or
read-only disk, an I/O error, a file where one of its directories goes, a git process
in it stalled past its timeout) is not the command's result. Before the command starts
(the snapshot in ``prepare``; in ``execute``, the reap, the restore of a later attempt,
the spool and running marker) it is ``cp.Unavailable``: nothing ran, nothing is
recorded as the act's outcome, and the run stops resumable (``unavailable:<key>:
cp.Shell's snapshot store failed ...``) once the act's retries run out; a resume, or a
worker on its own, tries again. Once the command ran, a store that cannot take its
result (the snapshot after it, its output, the completion record) leaves its outcome
unknown (``cp.OutcomeUnknown``): the act protocol looks it up, and without a completion
record a ``workspace`` command is put back and run again, an ``external`` one settled
by ``on_unknown``. A non-zero exit stays a result.

Controls: the environment is the caller's minus every ``CRASHPROOF_*`` variable (the
ledger's key, its key file, the database URL); a ``cp.Policy`` allow-lists commands by
argv pattern through the ``command`` field (``shlex.join(argv)``):
``scopes={"shell": {"command": ["pytest *", "ruff format *"]}}``. Under an async
workflow the command runs in a worker thread (the loop keeps running), and a cancelled
drive kills its process group (``interrupt``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from crashproof._excerpt import DETAIL, shown
from crashproof.errors import OutcomeUnknown, PermanentError, Unavailable
from crashproof.tools._process import (
    Finished,
    Live,
    NotStarted,
    Output,
    reap,
    reap_orphans,
    run_command,
)
from crashproof.tools._snapshot import (
    SnapshotStore,
    check_relative,
    default_store,
    env_digest,
)
from crashproof.tools.port import Call, Observation, OnUnknown, Receipt, Tool
from crashproof.tools.workspace import ABSENT, Workspace

__all__ = ["Shell"]

_EFFECTS = ("workspace", "external")
_PARAMS = frozenset({"argv", "effect", "cwd", "env", "timeout", "paths"})
_DELTA_LIMIT = 200
# How the machine fails under the store: an OSError (git's exit in the store too, see
# _snapshot.py), or a git process there that outlived its timeout (a stalled disk).
_MACHINE = (OSError, subprocess.SubprocessError)


class Shell(Tool):
    """Commands in a workspace whose effect on it happens once; see the module docstring.

    ``Shell(workspace, paths=["node_modules"], timeout=600)``: ``workspace`` is a
    ``cp.Workspace`` or a directory; ``paths``: directories (relative) that every command
    may change beyond the non-ignored files, snapshotted whole; ``store``: where the
    snapshots and outputs live (default ``<git dir>/crashproof-shell``; required outside a
    git working tree, and never inside the workspace); ``env``: variables every command
    gets; ``keep``: bytes of head and of tail kept in the record per stream;
    ``max_output``: bytes (both streams together) after which a command is killed.
    """

    name: ClassVar[str] = "shell"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = True
    idempotent_execute: ClassVar[bool] = False
    matches_intent: ClassVar[bool] = False  # the completion record carries the intent

    def __init__(
        self,
        workspace: Workspace | str | os.PathLike[str],
        *,
        paths: Sequence[str] = (),
        store: str | os.PathLike[str] | None = None,
        timeout: float = 600.0,
        env: Mapping[str, str] | None = None,
        keep: int = 4096,
        max_output: int = 1 << 30,
        on_unknown: OnUnknown = OnUnknown.REVIEW,
    ) -> None:
        self.workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        self.root = self.workspace.root
        self.paths = tuple(check_relative(p, "path") for p in paths)
        try:
            self.store = Path(store).resolve() if store is not None else default_store(self.root)
        except PermanentError as exc:  # a constructor's bad argument, not an act's
            raise ValueError(str(exc)) from None
        if self.store.is_relative_to(self.root) and not self.store.is_relative_to(
            self.root / ".git"
        ):
            raise ValueError(f"the shell store {self.store} must not be inside the workspace")
        if timeout <= 0 or keep < 0 or max_output <= 0:
            raise ValueError("timeout and max_output must be positive, keep not negative")
        self.timeout = float(timeout)
        self.env = dict(env or {})
        self.keep = keep
        self.max_output = max_output
        self.on_unknown = OnUnknown(on_unknown)
        self.snapshots = SnapshotStore(self.root, self.store)
        self._live = Live()

    # -- the Tool port -----------------------------------------------------

    def prepare(self, call: Call) -> dict[str, Any]:
        params = call.params
        unknown = sorted(set(params) - _PARAMS)
        if unknown:
            raise PermanentError(f"shell does not take {unknown}; it takes {sorted(_PARAMS)}")
        argv = params.get("argv")
        if (
            not isinstance(argv, list)
            or not argv
            or not all(isinstance(a, str) and "\0" not in a for a in argv)
        ):
            raise PermanentError(f"shell needs 'argv', a non-empty list of strings, not {argv!r}")
        effect = params.get("effect", "workspace")
        if effect not in _EFFECTS:
            raise PermanentError(f"shell 'effect' must be one of {_EFFECTS}, not {effect!r}")
        cwd = check_relative(params.get("cwd", "."), "cwd")
        if not (self.root / cwd).is_dir():
            raise PermanentError(f"shell cwd {cwd!r} is not a directory of {self.root}")
        extra = params.get("env", {})
        if not isinstance(extra, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
        ):
            raise PermanentError("shell 'env' must map names to string values")
        timeout = params.get("timeout", self.timeout)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise PermanentError(f"shell 'timeout' must be positive seconds, not {timeout!r}")
        declared = params.get("paths", [])
        if not isinstance(declared, list):
            raise PermanentError("shell 'paths' must be a list of relative paths")
        paths = sorted({*self.paths, *(check_relative(p, "path") for p in declared)})
        env = self._environment(extra)
        _find(argv[0], self.root / cwd, env)
        try:
            snapshot = self.snapshots.snapshot(paths)
        except _MACHINE as exc:  # the machine's, not the intent's: nothing is journaled
            raise self._store_out(exc) from exc
        return {
            "argv": argv,
            "effect": effect,
            "cwd": cwd,
            "timeout": float(timeout),
            "paths": paths,
            "env_digest": env_digest(env),
            "store": str(self.store),
            "snapshot": snapshot,
        }

    def execute(self, call: Call) -> Receipt:
        p = _prepared(call)
        tag = _tag(call.operation_id)
        spool = self.store / "runs"
        try:
            reap(spool, tag)  # a command a crashed attempt left running
            if p["effect"] == "workspace" and call.attempt > 1:
                self.snapshots.restore(p["snapshot"], p["paths"])
        except _MACHINE as exc:  # this attempt ran nothing: not done, tried again later
            raise self._store_out(exc) from exc
        extra = call.params.get("env", {})
        env = self._environment(extra if isinstance(extra, dict) else {})
        self._live.cancelled.clear()
        try:
            done = run_command(
                p["argv"],
                cwd=self.root / p["cwd"],
                env=env,
                timeout=float(p["timeout"]),
                max_output=self.max_output,
                spool=spool,
                tag=tag,
                live=self._live,
            )
        except NotStarted as exc:
            raise self._store_out(exc) from exc
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            raise PermanentError(f"shell could not start {p['argv'][0]!r}: {exc}") from None
        call.crash_point("exited")  # the command ran, nothing recorded of it yet
        if done.stopped is not None:
            self._stopped(p, done)
        try:
            return self._record_run(call, p, done, tag)
        except _MACHINE as exc:  # it ran: an unknown outcome, which lookup settles
            raise OutcomeUnknown(
                f"{p['argv'][0]!r} ran (exit {done.exit_code}) but cp.Shell's store could "
                f"not record it ({type(exc).__name__}: {_short(exc)})"
            ) from exc

    def lookup(self, call: Call) -> Receipt | None:
        p = _prepared(call)
        tag = _tag(call.operation_id)
        spool = self.store / "runs"
        record = self._record(tag)
        if record is not None:
            if record.get("operation_id") != call.operation_id:
                raise PermanentError(f"the completion record {tag} names another operation")
            return Receipt(
                str(record["receipt_id"]),
                record["result"],
                intent_digest=str(record["intent_digest"]),
            )
        reap(spool, tag)
        if p["effect"] == "workspace":
            return None  # not done: execute puts the snapshot back and runs it again
        raise NotImplementedError(
            f"external command {p['argv'][0]!r} left no completion record; whether it "
            "reached beyond the workspace cannot be looked up"
        )

    def overwrites(self, call: Call, result: Any, tool: Tool, earlier: Call) -> bool:
        """The file of ``earlier``, an act of ``tool``, a ``Workspace`` of this root, that
        this command changed (its receipt's delta lists it) or, in flight without a
        completion record, that its snapshot holds as ``earlier`` wrote it: a
        ``workspace`` command puts that back before it runs again. That act is then
        superseded, not drifted (the resume's observation of the workspace still
        compares the files themselves)."""
        if not isinstance(tool, Workspace) or tool.root != self.root or not call.prepared:
            return False
        target = tool.path_of(earlier)  # relative, as the delta and the snapshot name it
        if result is None:
            record = self._record(_tag(call.operation_id))
            if record is None:
                return self._held(_prepared(call), target, tool.result_digest(earlier))
            result = record.get("result")
        delta = result.get("delta") if isinstance(result, dict) else None
        changes = delta.get("changes") if isinstance(delta, dict) else None
        return isinstance(changes, list) and any(
            isinstance(c, dict) and c.get("path") == target for c in changes
        )

    def observe(self) -> Observation:
        """The workspace's own observation (same instance, same fingerprint), so that
        the state a command leaves is what the next workspace act finds recorded. A
        command whose runner died is reaped first: a resume observes the workspace
        before it recovers the command's act, and the orphan would still be writing
        into it (make chaos: "could not observe the environment", a file renamed away
        under the walk; and a codemod still running after its run had finished)."""
        reap_orphans(self.store / "runs")
        return self.workspace.observe()

    def observed_instance(self) -> str:
        return self.workspace.observed_instance()

    def expect(self, call: Call, before: Observation) -> str | None:
        return None  # what a command writes is known once it ran: lookup decides

    # -- more --------------------------------------------------------------

    def output(self, blob: str) -> bytes:
        """The whole of a stream a receipt names (``result["stdout"]["blob"]``)."""
        return self.snapshots.read_blob(blob)

    def interrupt(self) -> None:
        """Kill the process groups of the commands this tool is running (an async drive
        that was cancelled calls it)."""
        self._live.kill_all()

    # -- internals ---------------------------------------------------------

    def _record_run(self, call: Call, p: dict[str, Any], done: Finished, tag: str) -> Receipt:
        """The result of a command that ran, and its completion record in the store."""
        spool = self.store / "runs"
        after = self.snapshots.snapshot(p["paths"])
        result = {
            "exit_code": done.exit_code,
            "signal": _signal_name(done.exit_code),
            "duration_s": round(done.duration, 3),
            "stdout": self._stream(done.stdout),
            "stderr": self._stream(done.stderr),
            "delta": self.snapshots.delta(p["snapshot"], after, _DELTA_LIMIT),
            "before": p["snapshot"],
            "after": after,
        }
        receipt = Receipt(f"{tag}@{after}", result, intent_digest=call.intent_digest)
        _write_json(
            spool / f"{tag}.done.json",
            {
                "operation_id": call.operation_id,
                "intent_digest": call.intent_digest,
                "receipt_id": receipt.receipt_id,
                "result": result,
            },
        )
        call.crash_point("recorded")  # the completion record is durable, no receipt yet
        return receipt

    def _held(self, p: dict[str, Any], target: str | None, digest: str | None) -> bool:
        """The snapshot of a ``workspace`` command holds ``target`` with this content."""
        if p["effect"] != "workspace" or target is None or digest in (None, ABSENT):
            return False
        blob = self.snapshots.blob_of(p["snapshot"], p["paths"], target)
        if blob is None:
            return False
        return hashlib.sha256(self.snapshots.read_blob(blob)).hexdigest() == digest

    def _record(self, tag: str) -> dict[str, Any] | None:
        """The completion record of a command (None: it did not finish recording)."""
        try:
            record: dict[str, Any] = json.loads(
                (self.store / "runs" / f"{tag}.done.json").read_text()
            )
        except FileNotFoundError:
            return None
        return record

    def _store_out(self, exc: Exception) -> Unavailable:
        """The snapshot store failed before the command started (a disk full, a file
        where a directory goes, an I/O error): the machine's fault, not the act's
        answer. ``cp.Unavailable``: nothing recorded as the act's result, the run stops
        resumable once the act's retries run out, and the next drive takes it up again."""
        return Unavailable(
            "cp.Shell's snapshot store failed before the command started, nothing ran in "
            f"this attempt; free or repair it, then resume (store {self.store}; "
            f"{type(exc).__name__}: {_short(exc)})"
        )

    def _environment(self, extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRASHPROOF_")}
        env.update(self.env)
        env.update(extra)
        return env

    def _stream(self, output: Output) -> dict[str, Any]:
        head, tail = output.head_tail(self.keep)
        blob = self.snapshots.store_blob(output.path)
        output.path.unlink(missing_ok=True)
        return {
            "head": head.decode("utf-8", "backslashreplace"),
            "tail": tail.decode("utf-8", "backslashreplace"),
            "bytes": output.size,
            "blob": blob,
        }

    def _stopped(self, p: dict[str, Any], done: Finished) -> None:
        why = {
            "timeout": f"timed out after {p['timeout']:g} s",
            "output": f"printed more than {self.max_output} bytes",
        }.get(str(done.stopped), "was cancelled")
        for stream in (done.stdout, done.stderr):
            stream.path.unlink(missing_ok=True)
        if p["effect"] == "external":
            raise TimeoutError(f"{p['argv'][0]!r} {why}; killed, its outcome is unknown")
        self.snapshots.restore(p["snapshot"], p["paths"])
        raise PermanentError(
            f"{p['argv'][0]!r} {why}; killed with its process group, the workspace is back "
            "as it was before the command"
        )


def _find(program: str, cwd: Path, env: Mapping[str, str]) -> None:
    if "/" in program:
        target = cwd / program
        if not target.is_file() or not os.access(target, os.X_OK):
            raise PermanentError(f"command {program!r} is not an executable file; nothing ran")
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise PermanentError(f"command not found: {program!r} (PATH of the command); nothing ran")


def _short(exc: Exception) -> str:
    # Its start and its end: the why (an errno text, "timed out after N seconds") often
    # follows a long path or argv.
    return shown(str(exc), DETAIL)


def _prepared(call: Call) -> dict[str, Any]:
    if not call.prepared or "snapshot" not in call.prepared:
        raise PermanentError(f"act {call.step!r}: shell intent was journaled unprepared")
    return call.prepared


def _tag(operation_id: str) -> str:
    return hashlib.sha256(operation_id.encode()).hexdigest()[:32]


def _signal_name(code: int) -> str | None:
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    temp = path.with_name(path.name + ".tmp")
    with temp.open("w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
