"""A zygote for SIGKILL matrices: a process that imports a framework once (seconds on a
loaded machine), then forks one real child per crash point asked of it.

The child script ends with ``serve(child)``: for each line of fields read from stdin it
forks ``child(*fields)`` (which arms a SIGKILL at one crash point and drives the run),
and writes back the child's exit code (``-SIGKILL`` when the point fired). A test takes
the zygote with ``started(script)`` (a module-scoped fixture) and asks ``kill(zygote,
*fields)``. The zygote itself runs nothing of the workflow."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def serve(child: Callable[..., None]) -> None:
    """In the child script: fork ``child(*fields)`` for each line of stdin."""
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            try:
                child(*line.split())
            finally:
                os._exit(0)  # reached only when no point fired
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


def started(script: Path) -> Iterator[subprocess.Popen[str]]:
    """The zygote of ``script``, for a fixture: ``yield from started(CHILD)``."""
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield proc
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=30)


def kill(zygote: subprocess.Popen[str], *fields: Any) -> int:
    """Fork one child with these fields; its exit code."""
    if zygote.stdin is None or zygote.stdout is None:
        raise RuntimeError("the zygote has no pipes")
    zygote.stdin.write(" ".join(map(str, fields)) + "\n")
    zygote.stdin.flush()
    return int(zygote.stdout.readline())
