"""`crashproof review decide CASE --redo | --keep | --abort`: one command, signed with
the operator's identity (made and registered on first use where the ledger has no
approvers), and with --app the run finishes in that same command. Bad input (a case
that does not exist, a decision the case does not take) gets one line, a documented
exit code, and changes nothing."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.cli import ExitCode

Cli = Callable[..., Any]

# A mailer that cannot look its sends up; while lose.txt exists its reply is lost after
# the send (an unknown outcome), so the run freezes for review.
MAILS = """
import pathlib

import crashproof as cp


class Mailer(cp.Tool):
    name = "mailer"
    version = "1"
    supports_lookup = False

    def execute(self, call):
        with open("sent.log", "a") as f:
            f.write(call.operation_id + "\\n")
        if pathlib.Path("lose.txt").exists():
            raise TimeoutError("the reply was lost")
        return cp.Receipt(call.operation_id, {"sent": call.operation_id})


@cp.workflow("mail", version="1")
def mail(ctx):
    try:
        sent = ctx.act("send", Mailer(), to="ops")
    except cp.ActNotDone:
        sent = "not done"
    return {"send": sent}
"""


def frozen_mail(cli: Cli, project: Path, run_id: str) -> tuple[str, str]:
    (project / "mails.py").write_text(MAILS, encoding="utf-8")
    db = f"sqlite:///{project / 'runs.db'}"
    (project / "lose.txt").write_text("")
    assert cli("run", "mails:mail", "--run-id", run_id, "--db", db).code == ExitCode.RUN_FROZEN
    (project / "lose.txt").unlink()  # the target is fine again
    (case,) = cli("review", "list", run_id, "--json", "--db", db).json()
    assert case["decisions"] == ["replan", "keep", "abort"]
    return db, case["case_id"]


def sent(project: Path) -> list[str]:
    return (project / "sent.log").read_text().split()


def journal(cli: Cli, db: str, run_id: str) -> Any:
    return cli("show", run_id, "--json", "--db", db).json()


def test_redo_in_one_command_with_no_key_set_up(cli: Cli, project: Path) -> None:
    db, case = frozen_mail(cli, project, "m1")
    assert not (project / ".config").exists()
    done = cli("review", "decide", case, "--redo", "--app", "mails", "--db", db)
    assert done.code == ExitCode.OK, done.err
    assert "made your operator key" in done.err
    assert "this ledger's first approver" in done.err
    assert done.json() == {"send": {"sent": "m1/send@2"}}
    assert sent(project) == ["m1/send", "m1/send@2"]
    key = project / ".config" / "crashproof" / "operator.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert journal(cli, db, "m1")["status"] == "succeeded"
    # The decision is signed as every decision is: by the registered operator key.
    (approver,) = cli("approvers", "list", "--json", "--db", db).json()
    (decided,) = cli("review", "list", "m1", "--state", "resolved", "--json", "--db", db).json()
    assert decided["decision"]["statement"]["reviewer"] == approver["name"]
    assert decided["decision"]["statement"]["no_reread"] is True


def test_keep_records_not_done_and_the_run_finishes(cli: Cli, project: Path) -> None:
    db, case = frozen_mail(cli, project, "m2")
    assert cli("operator", "init", "--db", db).code == ExitCode.OK
    done = cli("review", "decide", case, "--keep", "--app", "mails", "--db", db)
    assert done.code == ExitCode.OK, done.err
    assert "made your operator key" not in done.err
    assert done.json() == {"send": "not done"}
    assert sent(project) == ["m2/send"]  # never sent again
    step = next(s for s in journal(cli, db, "m2")["steps"] if s["key"] == "send")
    assert (step["status"], step["failure"]) == ("failed", "not_done")
    shown = cli("show", "m2", "--db", db)
    (row,) = [line for line in shown.out.splitlines() if line.split()[:2] == ["send", "act"]]
    assert row.split()[2:4] == ["not", "done"]  # the status column, not only the message
    timeline = cli("show", "m2", "--timeline", "--db", db).out
    assert "act not done (" in timeline  # the decision, with who made it


def test_without_app_the_run_waits_for_a_worker_or_resume(cli: Cli, project: Path) -> None:
    db, case = frozen_mail(cli, project, "m3")
    done = cli("review", "decide", case, "--redo", "--db", db)
    assert done.code == ExitCode.OK, done.err
    assert "crashproof resume m3 --app MODULE" in done.err
    assert cli("resume", "m3", "--app", "mails", "--db", db).code == ExitCode.OK
    assert sent(project) == ["m3/send", "m3/send@2"]


def test_bad_input_changes_nothing(cli: Cli, project: Path) -> None:
    db, case = frozen_mail(cli, project, "m4")
    before = journal(cli, db, "m4")

    missing = cli("review", "decide", "m4#999", "--redo", "--db", db)
    assert missing.code == ExitCode.USAGE
    assert len(missing.err.strip().splitlines()) <= 2  # one error line, one hint
    assert "no review case" in missing.err
    two = cli("review", "decide", case, "--redo", "--keep", "--db", db)
    assert two.code == ExitCode.USAGE
    unknown = cli("review", "decide", case, "maybe", "--db", db)
    assert unknown.code == ExitCode.USAGE

    # A case that takes only abort (non-determinism: a replayed step changed).
    assert cli("run", "flows:flaky", "--run-id", "f1", "--db", db).code == 6
    (project / "swerve.txt").write_text("")
    assert cli("resume", "f1", "--app", "flows", "--db", db).code == ExitCode.RUN_FROZEN
    (flaky,) = cli("review", "list", "f1", "--json", "--db", db).json()
    for flag in ("--redo", "--keep"):
        misfit = cli("review", "decide", flaky["case_id"], flag, "--db", db)
        assert misfit.code == ExitCode.CONFLICT, misfit.err
        assert "accepts --abort" in misfit.err
        assert "Traceback" not in misfit.err

    assert not (project / ".config").exists()  # no key made for a refused decision
    assert cli("approvers", "list", "--json", "--db", db).json() == []
    assert journal(cli, db, "m4") == before
    assert cli("review", "list", "--state", "open", "--json", "--db", db).json() != []


def test_a_ledger_with_approvers_does_not_trust_a_new_operator_silently(
    cli: Cli, project: Path
) -> None:
    db, case = frozen_mail(cli, project, "m5")
    cli("approvers", "keygen", "bob.pem")
    cli("approvers", "add", "bob", "bob.pem.pub", "--db", db)
    refused = cli("review", "decide", case, "--redo", "--app", "mails", "--db", db)
    assert refused.code == ExitCode.CONFLICT
    assert "is not an approver of this ledger, which trusts only bob" in refused.err
    assert "crashproof approvers add" in refused.err
    assert [a["name"] for a in cli("approvers", "list", "--json", "--db", db).json()] == ["bob"]
    assert sent(project) == ["m5/send"]
    assert journal(cli, db, "m5")["status"] == cp.RunStatus.NEEDS_REVIEW.value
    # An approver admits the key explicitly (journaled, attributable); then one command.
    public = project / ".config" / "crashproof" / "operator.pem.pub"
    assert cli("approvers", "add", "alice", str(public), "--by", "bob", "--db", db).code == 0
    done = cli("review", "decide", case, "--redo", "--app", "mails", "--db", db)
    assert done.code == ExitCode.OK, done.err
    assert sent(project) == ["m5/send", "m5/send@2"]
