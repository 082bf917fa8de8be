"""A child process for the LangGraph code agent's crash test: ``examples.langgraph_agent``
(``create_react_agent`` with ``durable_model`` and ``durable_tools`` over the agent's
``cp.models.tool`` functions, on CrashproofSaver), started or resumed with
``start_or_resume`` in DIR (its repository, model server log and forge state live
there, so the next process finds them).

    python child_langgraph_agent.py serve

reads one JSON line ``[DIR, SPEC]`` at a time and runs it in a process forked from this
one (which imported LangGraph and LangChain once), answering with its exit code (-9:
killed by SIGKILL). SPEC: ``none`` | ``count`` (the crash points passed and the saver's
writes go to DIR/counts.json) | ``ledger:N`` (SIGKILL at the ledger's N-th crash point)
| ``saver:N`` (SIGKILL right after the saver's N-th write). A run that ends writes
DIR/result.json: the result, the fingerprint, the forge's effect counts, the commits per
operation trailer and the model's requests per turn.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2]))
from examples import langgraph_agent, openai_agent
from examples.code_agent import _git

import crashproof as cp
from crashproof.integrations.langgraph import CrashproofSaver
from crashproof.tools.git import OPERATION_TRAILER


class KillingSaver(CrashproofSaver):
    """A CrashproofSaver whose process dies right after its ``at``-th write."""

    at = 0
    writes = 0

    def _wrote(self) -> None:
        KillingSaver.writes += 1
        if KillingSaver.writes == self.at:
            os.kill(os.getpid(), signal.SIGKILL)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        result = super().put(*args, **kwargs)
        self._wrote()
        return result

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        super().put_writes(*args, **kwargs)
        self._wrote()


def main(directory: Path, spec: str) -> None:
    points = cp.CrashPoints() if spec == "count" else None
    if spec.startswith("ledger:"):
        points = cp.CrashPoints(at=int(spec[7:]), action="sigkill")
    KillingSaver.at = int(spec[6:]) if spec.startswith("saver:") else 0
    KillingSaver.writes = 0
    env = langgraph_agent.make_env(directory)
    ledger = cp.Ledger(f"sqlite:///{directory / 'ledger.db'}", crash_points=points)
    with contextlib.closing(env), ledger, KillingSaver(ledger=ledger) as saver:
        result = langgraph_agent.coder(langgraph_agent.make_agent(env, saver), openai_agent.TASK)
        log = _git(
            env.repo, "log", "--all", f"--format=%(trailers:key={OPERATION_TRAILER},valueonly)"
        )
        outcome = {
            "result": result,
            "fingerprint": openai_agent.fingerprint(env),
            "created": env.forge.created(),
            "commits": Counter(line.strip() for line in log.splitlines() if line.strip()),
            "model_calls": env.model.calls(),
        }
    (directory / "result.json").write_text(json.dumps(outcome))
    counts = {"writes": KillingSaver.writes, "points": points.passed if points else []}
    (directory / "counts.json").write_text(json.dumps(counts))


def serve() -> None:
    for line in sys.stdin:
        args = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the crash point's own process: it dies, or ends, here
            code = 1
            try:
                main(Path(args[0]), args[1])
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        main(Path(sys.argv[1]), sys.argv[2])
