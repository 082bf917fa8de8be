"""A child process for the outage crash test: a model out, a stop, a resume, a failure
and a retry, one after the other in one process (so one crash-point numbering covers
the stop record, the retry record and both sides of their commits).

Usage: python child_outage.py URL DURABILITY DIR SPEC   (SPEC: none | at:N)
The "model" is out while DIR/down exists and the step "check" fails while DIR/broken
exists; every body execution appends its key to DIR/counts, and the target keeps its
effects in DIR/target.json, so both survive SIGKILL. ``drive`` is also what the test's
recovery runs: an operator who resumes a stopped or running run once the service is
back, and retries a failed one once the cause is fixed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar

import crashproof as cp

RUN = "o"


class Pulls(cp.Tool):
    """A target that dedupes by operation id (one pull request per key) and counts asks."""

    name: ClassVar[str] = "pulls"
    version: ClassVar[str] = "1"

    def __init__(self, path: Path) -> None:
        self.path = path

    def _state(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}  # type: ignore[no-any-return]

    def execute(self, call: cp.Call) -> cp.Receipt:
        state = self._state()
        pr = state.setdefault(call.operation_id, {"digest": call.intent_digest, "n": 0})
        pr["n"] += 1
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps(state))
        temp.replace(self.path)
        call.crash_point("written")
        return cp.Receipt(call.operation_id, {"number": 1}, pr["digest"])

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        pr = self._state().get(call.operation_id)
        return None if pr is None else cp.Receipt(call.operation_id, {"number": 1}, pr["digest"])


def make(directory: Path) -> cp.Workflow[Any]:
    counts = directory / "counts"
    pulls = Pulls(directory / "target.json")

    def note(key: str) -> None:
        with counts.open("a", encoding="utf-8") as f:
            f.write(key + "\n")

    def ask(task: str) -> cp.Decision:
        note("ask")
        if (directory / "down").exists():
            raise cp.Unavailable("503 model overloaded", retry_after=0.0)
        return cp.Decision(f"plan for {task}", model="m", usage={"total_tokens": 5})

    def check(plan: str) -> int:
        note("check")
        if (directory / "broken").exists():
            raise ValueError("tests failed")
        return len(plan)

    retry = cp.StepOptions(retry=cp.RetryPolicy(attempts=2, backoff=0.0))

    @cp.workflow("outage", version="1")
    def flow(ctx: cp.Context, task: str) -> dict[str, Any]:
        plan = ctx.decide("turn", ask, task, options=retry)
        pr = ctx.act("open-pr", pulls, title=plan)
        return {"plan": plan, "pr": pr, "checked": ctx.step("check", check, plan)}

    return flow


def drive(ledger: cp.Ledger, directory: Path, fix: bool) -> Any:
    """Start, resume or retry the run until it succeeds. ``fix``: bring the service back
    and repair the check whenever the run stops or fails (the recovery); the child's
    first pass leaves them as they are, so it meets the outage and the failure."""
    flow = ledger.register(make(directory))
    for _ in range(6):
        row = ledger.store.get_run(RUN)
        status = None if row is None else ledger.get_run(RUN).status
        try:
            if status is None:
                return ledger.run(flow, run_id=RUN, task="x")
            if status is cp.RunStatus.SUCCEEDED:
                return ledger.get_run(RUN).result
            if status is cp.RunStatus.FAILED:
                return ledger.retry(RUN, by="ops")
            return ledger.resume(RUN)
        except cp.RunStopped:
            (directory / "down").unlink(missing_ok=True)  # the service is back
        except cp.RunFailed:
            (directory / "broken").unlink(missing_ok=True)  # the cause is fixed
        if fix:
            (directory / "down").unlink(missing_ok=True)
            (directory / "broken").unlink(missing_ok=True)
    raise RuntimeError("the run did not succeed")


def main(url: str, durability: str, directory: Path, spec: str) -> None:
    points = cp.CrashPoints(at=int(spec[3:]), action="sigkill") if spec != "none" else None
    (directory / "down").touch()
    (directory / "broken").touch()
    with cp.Ledger(url, durability=durability, crash_points=points) as ledger:
        drive(ledger, directory, fix=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4])
