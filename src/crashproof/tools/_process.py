"""Running one command for ``cp.Shell``: its own process group, output spooled to files,
a timeout and an output limit, and the group killed on either, on an interrupt of the
waiting thread, and when a recovery finds it outliving a crashed run.

The child writes straight into two spool files (no pipe, no reader thread): memory stays
bounded whatever it prints, and binary output is kept byte for byte. The caller reads a
head and a tail of each and stores the whole as a blob.

A run leaves ``running/<tag>.json`` (pid, process group, the leader's start time in
clock ticks) beside the spool files while the command runs. A crashed run leaves it
behind; ``reap`` kills that process group if its leader is still the same process (the
start time guards against a reused pid), so a recovery never restores a workspace under
a command still writing into it. The command itself starts only once its marker is in
place (``_GATE``): a crash between the spawn and the marker leaves nothing running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Finished", "NotStarted", "Output", "reap", "reap_orphans", "run_command"]

_POLL = 0.05


class NotStarted(Exception):
    """The command did not start because the machine failed under the runner: its spool
    or running marker could not be written (a disk full, a read-only or broken store), or
    no process could be made. Not the command's failure: nothing of it ran."""


@dataclass(frozen=True, slots=True)
class Output:
    """One stream's spool file and its size."""

    path: Path
    size: int

    def head_tail(self, keep: int) -> tuple[bytes, bytes]:
        """The first ``keep`` bytes and, when there are more, the last ``keep`` after them."""
        with self.path.open("rb") as f:
            head = f.read(keep)
            if self.size <= keep:
                return head, b""
            f.seek(max(keep, self.size - keep))
            return head, f.read(keep)


@dataclass(frozen=True, slots=True)
class Finished:
    """How a command ended. ``stopped``: None when it exited by itself, else why it was
    killed ("timeout", "output", "cancelled")."""

    exit_code: int
    duration: float
    stdout: Output
    stderr: Output
    stopped: str | None = None


class Live:
    """The process groups this process has running, so an interrupt can kill them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: set[int] = set()
        # Set by an interrupt: a command that starts after it (the thread was still
        # spawning it) is killed as soon as its group is known. Cleared per execute.
        self.cancelled = threading.Event()

    def add(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._groups.discard(pgid)

    def kill_all(self) -> None:
        self.cancelled.set()
        with self._lock:
            groups = list(self._groups)
        for pgid in groups:
            _killpg(pgid)


def run_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    max_output: int,
    spool: Path,
    tag: str,
    live: Live,
) -> Finished:
    """Run ``argv`` to its end (or its kill). Nothing ran when it raises
    FileNotFoundError/PermissionError/NotADirectoryError (the program or the working
    directory: exec would fail) or ``NotStarted`` (the machine: see the class)."""
    out_path, err_path = spool / f"{tag}.out", spool / f"{tag}.err"
    marker = spool / f"{tag}.running.json"
    started = time.monotonic()
    _check_startable(argv[0], cwd, env)  # as exec would fail: before anything runs
    try:
        spool.mkdir(parents=True, exist_ok=True)
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [*_GATE, *argv],
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own group: killed as one, with its children
                close_fds=True,
            )
    except OSError as exc:
        if exc.filename is not None and Path(exc.filename) == cwd:
            raise  # the working directory went away since the intent: the act's problem
        # The spool could not be written (no space, a read-only or broken store), or the
        # system had no process to give.
        raise NotStarted(f"the command's spool in {spool}: {exc}") from exc
    pgid = proc.pid
    live.add(pgid)
    try:
        try:
            _write_marker(
                marker,
                {
                    "pid": proc.pid,
                    "pgid": pgid,
                    "start": _start_ticks(proc.pid),
                    # Whose command (pid, start): reaped as an orphan once it died.
                    "runner": [os.getpid(), _start_ticks(os.getpid())],
                },
            )
        except OSError as exc:  # no go-ahead yet: the gate's shell dies with its group
            raise NotStarted(f"the command's running marker: {exc}") from exc
        if proc.stdin is not None:  # the go-ahead: the command may run now
            proc.stdin.write(b"go\n")
            proc.stdin.close()
    except BaseException:
        _killpg(pgid)
        live.discard(pgid)
        raise
    stopped: str | None = None
    try:
        deadline = started + timeout
        while True:
            try:
                proc.wait(timeout=_POLL)
                break
            except subprocess.TimeoutExpired:
                pass
            if live.cancelled.is_set():
                stopped = "cancelled"
            elif time.monotonic() >= deadline:
                stopped = "timeout"
            elif _size(out_path) + _size(err_path) > max_output:
                stopped = "output"
            if stopped is not None:
                _killpg(pgid)
                proc.wait()
                break
    except BaseException:  # an interrupt, a crash point, a cancelled drive: never orphaned
        _killpg(pgid)
        with contextlib.suppress(BaseException):
            proc.wait(timeout=5)
        raise
    finally:
        live.discard(pgid)
    _killpg(pgid)  # a grandchild left running in the group dies with the command
    marker.unlink(missing_ok=True)
    return Finished(
        exit_code=proc.returncode,
        duration=time.monotonic() - started,
        stdout=Output(out_path, _size(out_path)),
        stderr=Output(err_path, _size(err_path)),
        stopped=stopped,
    )


# The command starts only once its marker is written: until the go-ahead on its stdin, the
# process is a shell waiting to exec it (the same pid: exec keeps it). A crash before the
# marker closes the pipe, and the shell exits without running anything, so no command
# ever runs that a recovery could not find and kill before it restores the workspace.
_GATE = ("/bin/sh", "-c", 'IFS= read -r go && [ "$go" = go ] && exec "$@" </dev/null', "sh")


def _check_startable(program: str, cwd: Path, env: Mapping[str, str]) -> None:
    """Raise what exec would (FileNotFoundError, PermissionError), resolving ``program``
    as it would: against ``cwd`` when it names a directory, else along the PATH of
    ``env``. (The gate's shell would only exit 126 or 127 for it.)"""
    if os.sep in program:
        candidates = [Path(cwd, program)]
    else:
        candidates = [Path(cwd, d, program) for d in os.get_exec_path(dict(env))]
    found = [c for c in candidates if c.is_file()]
    if not found:
        raise FileNotFoundError(2, "No such file or directory", program)
    if not any(os.access(c, os.X_OK) for c in found):
        raise PermissionError(13, "Permission denied", program)


def _write_marker(marker: Path, data: dict[str, object]) -> None:
    """Whole or absent: a crash mid-write never leaves a marker reap cannot read."""
    temp = marker.with_name(marker.name + ".tmp")
    temp.write_text(json.dumps(data))
    os.replace(temp, marker)


def reap_orphans(spool: Path) -> int:
    """Reap every command in ``spool`` whose runner died (its marker names the runner:
    pid and start time): such a command is an orphan that its run's resume would kill
    anyway, and until then it writes into the workspace a resume observes first. A live
    runner's command, or a marker naming no runner, is left alone. How many were reaped."""
    try:
        markers = list(spool.glob("*.running.json"))
    except OSError:
        return 0
    reaped = 0
    for marker in markers:
        try:
            runner = json.loads(marker.read_text()).get("runner")
            pid, start = int(runner[0]), runner[1]
        except (OSError, ValueError, TypeError, IndexError, KeyError, AttributeError):
            continue
        if start is None or _start_ticks(pid) == start:
            continue  # its runner is alive (or cannot be told): its command, no orphan
        reaped += reap(spool, marker.name.removesuffix(".running.json"))
    return reaped


def reap(spool: Path, tag: str) -> bool:
    """Kill the process group a crashed run left running for ``tag`` (its marker), and
    wait for it to go; True if there was one."""
    marker = spool / f"{tag}.running.json"
    try:
        data = json.loads(marker.read_text())
        pid, pgid, start = int(data["pid"]), int(data["pgid"]), data.get("start")
    except (OSError, ValueError, KeyError, TypeError):
        return False
    alive = start is not None and _start_ticks(pid) == start
    if alive or (_group_exists(pgid) and _start_ticks(pid) is None):
        _killpg(pgid)
        until = time.monotonic() + 10
        while _group_exists(pgid) and time.monotonic() < until:
            time.sleep(_POLL)
    marker.unlink(missing_ok=True)
    return alive


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22); None
    when it is gone (or a zombie) or this is not Linux."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
