"""Git: commits, branches and pushes as acts that cannot happen twice.

``GitTool(repo)`` runs the ``git`` command line (no library) in a working tree. Three ops,
chosen by ``params["op"]``:

- ``commit(message, paths=[...] | all=True, author_name=, author_email=, allow_empty=False)``
  commits on the branch checked out when the intent was journaled. The message ends with
  two trailers, ``Crashproof-Operation: <operation id>`` and ``Crashproof-Intent: <intent
  digest>``: the repository itself is the idempotency record. ``prepare`` fixes, before the
  intent commits, the branch, its tip (the parent), the tree to commit (computed in a
  scratch index, so the real index is untouched) and the full message. ``execute`` first
  searches the branch history for the operation trailer (found: that commit is the receipt,
  and a different intent trailer is a receipt conflict), then stages the paths, checks the
  staged tree is the prepared one, writes the commit with ``git commit-tree`` and moves the
  branch with a compare-and-swap ``git update-ref`` from the prepared parent. A crash after
  staging leaves an index that re-staging reproduces exactly; a crash after the ref moved is
  found by ``lookup``. The branch moved by someone else, or files changed since the intent,
  is drift (``needs_review``), never a commit on top. Receipt: the commit sha; result
  ``{"sha", "branch"}``.
- ``branch(name, start="HEAD")`` creates ``refs/heads/<name>`` at the commit ``start``
  resolved when the intent was journaled. Lookup: the branch at that commit → done; absent →
  not done; elsewhere → drift. Result ``{"branch", "sha"}``.
- ``push(branch, remote=<the tool's remote>)`` pushes the commit the local branch held when
  the intent was journaled to ``refs/heads/<branch>`` of a configured remote (no force).
  Lookup (``git ls-remote``): the remote branch at that commit → done; absent, or at an
  ancestor of it (the fast-forward is still to do) → not done; anywhere else → drift.
  Result ``{"remote", "branch", "sha"}``.

Errors: a git failure that proves the effect did not happen (a pathspec that matches
nothing, nothing to commit, an invalid name, a push the remote's hooks refused) raises
``cp.PermanentError`` with git's stderr; ``cp.ResourceBusy`` for a lock held by a git
process that is not ours (a lock a dead git command of ours left is cleared first, see
``tools/_git_locks.py``; a busy act is frozen for a later resume, never failed);
``cp.DriftError`` for a ref that moved, here or on the remote (a push refused
as not a fast-forward). Anything else — a timeout, a dropped connection, an unexpected
failure — propagates as it is: an unknown outcome the runtime resolves with ``lookup``.

The machine failing under the repository is not the act's answer: a full, read-only or
failing disk, or a file where one of git's directories goes, met by the scratch index,
the owner file or git itself ("No space left on device", "unable to write loose object
file", "unable to create temporary file: Not a directory", "insufficient permission for
adding an object", a ref's lock that cannot be written: ``_MACHINE`` in
``tools/_git_cli.py``), or git stalled past ``timeout``. Before the branch or the
remote moves (all of ``prepare``; in ``execute`` the reads first, the trailer search,
HEAD and the branch's sha, then the staging and ``commit-tree``; a
remote that could not store the pack, "[remote rejected] (unpacker error)" with its
disk's error) it is ``cp.Unavailable``: nothing recorded as the act's result, the run
stops resumable (``unavailable:<key>: git could not use the repository's files ...``)
and a resume, with the disk freed or repaired, commits once. Where the ref update itself
failed so it may have landed, the outcome is unknown (``cp.OutcomeUnknown``) and
``lookup`` settles it. The machine failing under a lookup is ``cp.Unavailable`` too
("git could not look the act up, the machine failed under it ..."): nothing decided,
the run stops resumable and a resume looks again (a push's ``ls-remote`` is the
remote's: its failure stays as it is). A bad argument (a path matching nothing, an
invalid name, a revision that names no commit) stays a ``cp.PermanentError``.

Isolation: every command runs with ``GIT_CONFIG_GLOBAL=/dev/null`` and
``GIT_CONFIG_NOSYSTEM=1`` (``isolated=False`` keeps the user's and system's configuration,
for credentials or ``insteadOf`` rules), without inherited ``GIT_*`` variables (``GIT_DIR``,
``GIT_INDEX_FILE``... set by an enclosing hook), in the C locale (stderr is classified), and
without hooks (``hooks=True`` enables them): a hook could rewrite the message and drop the
trailers, or have effects outside the act protocol. The repository's own configuration
applies. A push skips the local ``pre-push`` hook (``--no-verify``); the remote's own hooks
run, and a push they refuse is a permanent failure.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from crashproof.errors import PermanentError
from crashproof.tools._git_cli import GitCommandError, looking_up, machine_out, not_done
from crashproof.tools._git_ops import INTENT_TRAILER, OPERATION_TRAILER, GitOps
from crashproof.tools.port import Call, Observation, Receipt, Tool

__all__ = ["GitCommandError", "GitTool", "INTENT_TRAILER", "OPERATION_TRAILER"]

_OPS = ("commit", "branch", "push")

T = TypeVar("T")


class GitTool(GitOps, Tool):
    """A git working tree whose commits, branches and pushes are journaled acts.

    ``ctx.act("commit", git, op="commit", message="Add x", paths=["x.txt"])``;
    ``ctx.act("branch", git, op="branch", name="feature")``;
    ``ctx.act("push", git, op="push", branch="feature")``.
    """

    name: ClassVar[str] = "git"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = True
    idempotent_execute: ClassVar[bool] = False
    # A commit is found by its trailer, which carries the intent digest; a branch or a
    # push is found only at the very sha its intent names (state-addressed).
    matches_intent: ClassVar[bool] = True

    def __init__(
        self,
        repo_path: str | os.PathLike[str],
        *,
        remote: str = "origin",
        author_name: str = "crashproof",
        author_email: str = "crashproof@localhost",
        isolated: bool = True,
        hooks: bool = False,
        timeout: float = 120.0,
        git: str = "git",
    ) -> None:
        self.repo_path = Path(repo_path).resolve()
        self.remote = remote
        self.author_name = author_name
        self.author_email = author_email
        self.isolated = isolated
        self.hooks = hooks
        self.timeout = timeout
        self.git = git

    # -- the Tool port -----------------------------------------------------

    def prepare(self, call: Call) -> dict[str, Any]:
        op = call.params.get("op")
        step = {
            "commit": self._prepare_commit,
            "branch": self._prepare_branch,
            "push": self._prepare_push,
        }.get(str(op))
        if step is None:
            raise PermanentError(f"git op must be one of {_OPS}, not {op!r}")
        try:
            return step(call)
        except GitCommandError as exc:  # prepare only reads (and uses a scratch index)
            raise not_done(exc) from None
        except (OSError, subprocess.TimeoutExpired) as exc:  # the scratch index, a stall
            raise machine_out(exc) from exc

    def execute(self, call: Call) -> Receipt:
        return self._dispatch(call, self._execute_commit, self._execute_branch, self._execute_push)

    def lookup(self, call: Call) -> Receipt | None:
        with looking_up():
            return self._dispatch(call, self._lookup_commit, self._lookup_branch, self._lookup_push)

    def observe(self) -> Observation:
        """Instance: the repository's path and its root commit (another repository at the
        same path is another instance); fingerprint: the checked-out branch and its HEAD
        commit (``refs/heads/main@<sha>``, ``detached@<sha>``; ``@none`` before the first
        commit)."""
        head = self._resolve("HEAD")
        branch = self._head_ref() or "detached"
        root = self._root_commit(head)
        return Observation(
            f"git:{self.repo_path}#{root}",
            f"{branch}@{head or 'none'}",
            details={"repo": str(self.repo_path), "root_commit": root, "branch": branch},
        )

    def observed_instance(self) -> str:
        """``git:<repo path>#<root commit>``, as ``observe`` names it."""
        return f"git:{self.repo_path}#{self._root_commit(self._resolve('HEAD'))}"

    def _root_commit(self, head: str | None) -> str:
        roots = self._out("rev-list", "--max-parents=0", "HEAD").split() if head else []
        return min(roots) if roots else "none"

    def expect(self, call: Call, before: Observation) -> str | None:
        """Branches and pushes leave HEAD where it is; a commit moves it to a commit whose
        id is known only once written (its lookup decides)."""
        return None if call.params.get("op") == "commit" else before.fingerprint

    def _dispatch(
        self,
        call: Call,
        commit: Callable[[Call, dict[str, Any]], T],
        branch: Callable[[Call, dict[str, Any]], T],
        push: Callable[[Call, dict[str, Any]], T],
    ) -> T:
        op = call.params.get("op")
        prepared = call.prepared
        if not prepared or prepared.get("op") != op:
            raise PermanentError(f"act {call.step!r}: git intent was journaled unprepared")
        handler = {"commit": commit, "branch": branch, "push": push}.get(str(op))
        if handler is None:
            raise PermanentError(f"git op must be one of {_OPS}, not {op!r}")
        return handler(call, prepared)
