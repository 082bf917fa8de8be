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
``cp.PermanentError`` with git's stderr; ``cp.RetryableError`` for a lock held by another
git process; ``cp.DriftError`` for a ref that moved, here or on the remote (a push refused
as not a fast-forward). Anything else — a timeout, a dropped connection, an unexpected
failure — propagates as it is: an unknown outcome the runtime resolves with ``lookup``.

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

import hashlib
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, TypeVar

from crashproof.errors import DriftError, PermanentError, RetryableError
from crashproof.tools.port import Call, Receipt, Tool

__all__ = ["GitCommandError", "GitTool", "INTENT_TRAILER", "OPERATION_TRAILER"]

OPERATION_TRAILER = "Crashproof-Operation"
INTENT_TRAILER = "Crashproof-Intent"
_OPS = ("commit", "branch", "push")
_TEMP_EXCLUDE = ":(exclude)*.crashproof-*.tmp"  # the workspace tool's crash leftovers
# Kept from the caller's environment: how to reach a remote, and where git lives.
_KEPT_GIT_VARS = frozenset({"GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_EXEC_PATH"})
_LOCKED = ".lock': File exists"
_RS, _US, _GS = "\x1e", "\x1f", "\x1d"
_MISSING = "missing"

T = TypeVar("T")


class GitCommandError(Exception):
    """A git command exited non-zero; what it means is for the caller to decide."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.command = list(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        detail = stderr.strip() or stdout.strip() or "no output"
        super().__init__(f"git {' '.join(args)} exited {returncode}: {detail}")


class GitTool(Tool):
    """A git working tree whose commits, branches and pushes are journaled acts.

    ``ctx.act("commit", git, op="commit", message="Add x", paths=["x.txt"])``;
    ``ctx.act("branch", git, op="branch", name="feature")``;
    ``ctx.act("push", git, op="push", branch="feature")``.
    """

    name: ClassVar[str] = "git"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = True
    idempotent_execute: ClassVar[bool] = False

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
            raise _not_done(exc) from None

    def execute(self, call: Call) -> Receipt:
        return self._dispatch(call, self._execute_commit, self._execute_branch, self._execute_push)

    def lookup(self, call: Call) -> Receipt | None:
        return self._dispatch(call, self._lookup_commit, self._lookup_branch, self._lookup_push)

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

    # -- commit --------------------------------------------------------------

    def _prepare_commit(self, call: Call) -> dict[str, Any]:
        params = call.params
        message = params.get("message")
        if not isinstance(message, str) or not message.strip():
            raise PermanentError("git commit needs a non-empty 'message'")
        paths = _commit_paths(params)
        allow_empty = params.get("allow_empty", False)
        if not isinstance(allow_empty, bool):
            raise PermanentError("git commit 'allow_empty' must be a boolean")
        author_name = _optional_str(params, "author_name", self.author_name)
        author_email = _optional_str(params, "author_email", self.author_email)
        _check_trailer_value("operation id", call.operation_id)
        _check_trailer_value("intent digest", call.intent_digest)
        ref = self._head_ref()
        if ref is None:
            raise PermanentError(
                f"git commit needs a checked-out branch in {self.repo_path}; HEAD is detached"
            )
        base = self._resolve(ref)
        try:
            if paths is not None:
                self._check_paths_exist(paths, base)
            tree = self._scratch_tree(call, paths, base)
            base_tree = self._tree_of(base)
            full_message = self._with_trailers(message, call)
        except GitCommandError as exc:  # only a scratch index was touched: nothing happened
            raise _not_done(exc) from None
        if tree == base_tree and not allow_empty:
            what = "the working tree" if paths is None else f"the paths {paths}"
            raise PermanentError(f"git commit: nothing to commit, {what} match {ref} at {base}")
        return {
            "op": "commit",
            "ref": ref,
            "base": base,
            "tree": tree,
            "paths": paths,
            "message": full_message,
            "author_name": author_name,
            "author_email": author_email,
        }

    def _execute_commit(self, call: Call, prepared: dict[str, Any]) -> Receipt:
        found = self._find_commit(call, prepared)
        if found is not None:  # done before (or taken by another intent: a conflict)
            return found
        ref, base, tree = prepared["ref"], prepared["base"], prepared["tree"]
        head = self._head_ref()
        if head != ref:
            raise DriftError(f"HEAD is now {head or 'detached'}; the intent commits on {ref}")
        tip = self._resolve(ref)
        if tip != base:
            raise DriftError(
                f"{ref} is at {tip or 'nothing'}, not at {base or 'nothing'} where the intent "
                "was made, and holds no commit for this operation"
            )
        paths = prepared["paths"]
        try:
            if self._scratch_tree(call, paths, base) != tree:
                raise DriftError(
                    f"the files to commit changed since the intent (expected tree {tree})"
                )
            self._stage(paths, None)
            call.crash_point("staged")  # index staged, no commit yet
            staged = self._out("write-tree")
            if staged != tree:
                raise DriftError(f"the index holds tree {staged}, the intent commits {tree}")
            parents = ["-p", base] if base else []
            sha = self._out(
                "commit-tree",
                tree,
                *parents,
                "-F",
                "-",
                input=prepared["message"],
                env=_identity(prepared["author_name"], prepared["author_email"]),
            )
        except GitCommandError as exc:  # the branch has not moved: nothing happened
            raise _not_done(exc) from None
        subject = prepared["message"].splitlines()[0]
        try:
            self._run(
                "update-ref", "-m", f"commit (crashproof): {subject}", "HEAD", sha, base or ""
            )
        except GitCommandError as exc:
            raise _ref_failure(exc) from None
        call.crash_point("committed")  # the branch moved, no receipt yet
        return _commit_receipt(sha, ref, call.intent_digest)

    def _lookup_commit(self, call: Call, prepared: dict[str, Any]) -> Receipt | None:
        if self._resolve(prepared["ref"]) is None and prepared["base"] is not None:
            raise DriftError(f"{prepared['ref']} no longer exists; it was at {prepared['base']}")
        return self._find_commit(call, prepared)

    def _find_commit(self, call: Call, prepared: dict[str, Any]) -> Receipt | None:
        """The commit of the branch's history whose operation trailer is this act's."""
        ref = prepared["ref"]
        if self._resolve(ref) is None:
            return None
        fmt = (
            f"%H{_US}%(trailers:key={OPERATION_TRAILER},valueonly,separator=%x1d)"
            f"{_US}%(trailers:key={INTENT_TRAILER},valueonly,separator=%x1d){_RS}"
        )
        out = self._run(
            "log", "--fixed-strings", f"--grep={call.operation_id}", f"--format={fmt}", ref, "--"
        ).stdout
        matches: list[tuple[str, str]] = []
        for record in out.split(_RS):
            fields = record.strip("\n").split(_US)
            if len(fields) != 3:
                continue
            sha, ops, intents = fields
            if call.operation_id not in [v.strip() for v in ops.split(_GS)]:
                continue  # the id appears in the message, not as the operation trailer
            digests = [v.strip() for v in intents.split(_GS) if v.strip()]
            matches.append((sha, digests[0] if len(digests) == 1 else _MISSING))
        if not matches:
            return None
        if len(matches) > 1:
            shas = ", ".join(sha for sha, _ in matches)
            raise DriftError(
                f"{len(matches)} commits of {ref} carry operation {call.operation_id!r}: {shas}"
            )
        sha, digest = matches[0]
        return _commit_receipt(sha, ref, digest)

    def _check_paths_exist(self, paths: list[str], base: str | None) -> None:
        """A path must be in the working tree, the index or the parent commit (a deletion
        already staged); one that matches nothing anywhere is a bad parameter."""
        missing = [p for p in paths if p not in self._present(paths, None)]
        if missing and base is not None:
            known = self._z("ls-tree", "-r", "-z", "--name-only", base, "--", *_literal(missing))
            missing = [p for p in missing if not _matches(p, known)]
        if missing:
            raise PermanentError(
                f"git commit: {missing} match no file in {self.repo_path}, its index or HEAD"
            )

    def _present(self, paths: list[str], env: Mapping[str, str] | None) -> list[str]:
        """The paths ``git add`` can take: in the working tree or in the index."""
        indexed = self._z("ls-files", "-z", "--cached", "--", *_literal(paths), env=env)
        return [p for p in paths if os.path.lexists(self.repo_path / p) or _matches(p, indexed)]

    def _stage(self, paths: list[str] | None, env: Mapping[str, str] | None) -> None:
        if paths is None:
            self._run("add", "--all", "--", _TEMP_EXCLUDE, env=env)
            return
        present = self._present(paths, env)  # a deletion already staged has nothing to add
        if present:
            self._run("add", "--all", "--", *_literal(present), _TEMP_EXCLUDE, env=env)

    def _scratch_tree(self, call: Call, paths: list[str] | None, base: str | None) -> str:
        """The tree ``git add`` of the paths would stage, computed in a copy of the index."""
        index = self._git_path("index")
        tag = hashlib.sha256(call.operation_id.encode()).hexdigest()[:16]
        scratch = index.with_name(f"crashproof-{tag}.index.tmp")
        scratch.unlink(missing_ok=True)
        env = {"GIT_INDEX_FILE": str(scratch)}
        try:
            if index.exists():
                scratch.write_bytes(index.read_bytes())
            elif base is not None:
                self._run("read-tree", base, env=env)
            self._stage(paths, env)
            return self._out("write-tree", env=env)
        finally:
            scratch.unlink(missing_ok=True)

    def _tree_of(self, commit: str | None) -> str:
        if commit is None:
            return self._out("hash-object", "-t", "tree", "--stdin", input="")
        return self._out("rev-parse", "--verify", f"{commit}^{{tree}}")

    def _with_trailers(self, message: str, call: Call) -> str:
        text = message.rstrip() + "\n"
        trailers = ["--no-divider", "--where", "end", "--if-exists", "add", "--if-missing", "add"]
        full = self._run(
            "interpret-trailers",
            *trailers,
            "--trailer",
            f"{OPERATION_TRAILER}: {call.operation_id}",
            "--trailer",
            f"{INTENT_TRAILER}: {call.intent_digest}",
            input=text,
        ).stdout
        parsed = self._run("interpret-trailers", "--parse", "--no-divider", input=full).stdout
        values: dict[str, list[str]] = {}
        for line in parsed.splitlines():
            key, _, value = line.partition(":")
            values.setdefault(key.strip().lower(), []).append(value.strip())
        if values.get(OPERATION_TRAILER.lower()) != [call.operation_id] or values.get(
            INTENT_TRAILER.lower()
        ) != [call.intent_digest]:
            raise PermanentError(
                f"git commit: the message must not carry {OPERATION_TRAILER} or "
                f"{INTENT_TRAILER} trailers of its own"
            )
        return full

    # -- branch --------------------------------------------------------------

    def _prepare_branch(self, call: Call) -> dict[str, Any]:
        name = self._branch_name(call.params.get("name"), "name")
        start = call.params.get("start", "HEAD")
        if not isinstance(start, str) or not start or start.startswith("-"):
            raise PermanentError(f"git branch 'start' must be a revision, not {start!r}")
        sha = self._resolve(f"{start}^{{commit}}")
        if sha is None:
            raise PermanentError(f"git branch: start {start!r} names no commit")
        return {"op": "branch", "ref": f"refs/heads/{name}", "name": name, "start": sha}

    def _execute_branch(self, call: Call, prepared: dict[str, Any]) -> Receipt:
        found = self._lookup_branch(call, prepared)
        if found is not None:
            return found
        ref, start = prepared["ref"], prepared["start"]
        try:
            self._run("update-ref", "-m", "branch: created by crashproof", ref, start, "")
        except GitCommandError as exc:
            if "already exists" in exc.stderr:
                again = self._lookup_branch(call, prepared)  # DriftError when elsewhere
                if again is not None:
                    return again
            raise _ref_failure(exc) from None
        call.crash_point("created")
        return _branch_receipt(prepared)

    def _lookup_branch(self, call: Call, prepared: dict[str, Any]) -> Receipt | None:
        current = self._resolve(prepared["ref"])
        if current is None:
            return None
        if current != prepared["start"]:
            raise DriftError(
                f"{prepared['ref']} exists at {current}, not at {prepared['start']} where "
                "this intent creates it"
            )
        return _branch_receipt(prepared)

    # -- push ----------------------------------------------------------------

    def _prepare_push(self, call: Call) -> dict[str, Any]:
        branch = self._branch_name(call.params.get("branch"), "branch")
        remote = call.params.get("remote", self.remote)
        if not isinstance(remote, str) or not remote or remote.startswith("-"):
            raise PermanentError(f"git push 'remote' must be a remote name, not {remote!r}")
        try:
            url = self._out("remote", "get-url", "--push", remote)
        except GitCommandError as exc:
            raise PermanentError(f"git push: no remote {remote!r}: {exc.stderr.strip()}") from None
        sha = self._resolve(f"refs/heads/{branch}")
        if sha is None:
            raise PermanentError(f"git push: there is no local branch {branch!r}")
        return {"op": "push", "branch": branch, "remote": remote, "url": url, "sha": sha}

    def _execute_push(self, call: Call, prepared: dict[str, Any]) -> Receipt:
        remote, branch, sha = prepared["remote"], prepared["branch"], prepared["sha"]
        url = self._run("remote", "get-url", "--push", remote, check=False).stdout.strip()
        if url != prepared["url"]:
            raise DriftError(f"remote {remote!r} now pushes to {url!r}, not {prepared['url']!r}")
        if self._remote_sha(remote, branch) == sha:
            return _push_receipt(prepared)  # already there: pushing again would be a no-op
        dst = f"refs/heads/{branch}"
        verify = [] if self.hooks else ["--no-verify"]
        result = self._run("push", "--porcelain", *verify, remote, f"{sha}:{dst}", check=False)
        if result.returncode != 0:
            raise _push_failure(result, dst)
        call.crash_point("pushed")  # the remote moved, no receipt yet
        return _push_receipt(prepared)

    def _lookup_push(self, call: Call, prepared: dict[str, Any]) -> Receipt | None:
        remote, branch, sha = prepared["remote"], prepared["branch"], prepared["sha"]
        current = self._remote_sha(remote, branch)
        if current == sha:
            return _push_receipt(prepared)
        if current is None or self._is_ancestor(current, sha):
            return None  # absent, or behind: the fast-forward is still to do
        raise DriftError(
            f"{remote}/{branch} is at {current}, neither {sha} nor one of its ancestors"
        )

    def _remote_sha(self, remote: str, branch: str) -> str | None:
        ref = f"refs/heads/{branch}"
        out = self._run("ls-remote", "--refs", remote, ref).stdout
        for line in out.splitlines():
            sha, _, name = line.partition("\t")
            if name == ref:
                return sha
        return None

    def _is_ancestor(self, older: str, newer: str) -> bool:
        result = self._run("merge-base", "--is-ancestor", older, newer, check=False)
        return result.returncode == 0  # 1: not an ancestor; 128: unknown here, so not ours

    # -- running git ---------------------------------------------------------

    def _branch_name(self, name: Any, what: str) -> str:
        if not isinstance(name, str) or not name or name.startswith("-"):
            raise PermanentError(f"git needs a branch name in {what!r}, not {name!r}")
        check = self._run("check-ref-format", f"refs/heads/{name}", check=False)
        if check.returncode != 0:
            raise PermanentError(f"{name!r} is not a valid branch name")
        return name

    def _head_ref(self) -> str | None:
        result = self._run("symbolic-ref", "-q", "HEAD", check=False)
        if result.returncode == 1:
            return None  # detached
        if result.returncode != 0:
            raise GitCommandError(["symbolic-ref", "-q", "HEAD"], *_outcome(result))
        ref = result.stdout.strip()
        return ref if ref.startswith("refs/heads/") else None

    def _resolve(self, rev: str) -> str | None:
        result = self._run("rev-parse", "--verify", "-q", rev, check=False)
        if result.returncode == 0:
            return result.stdout.strip()
        if result.returncode == 1 and not result.stderr.strip():
            return None
        raise GitCommandError(["rev-parse", "--verify", "-q", rev], *_outcome(result))

    def _git_path(self, name: str) -> Path:
        path = Path(self._out("rev-parse", "--git-path", name))
        return path if path.is_absolute() else self.repo_path / path

    def _out(self, *args: str, **kw: Any) -> str:
        return self._run(*args, **kw).stdout.strip()

    def _z(self, *args: str, env: Mapping[str, str] | None = None) -> list[str]:
        return [item for item in self._run(*args, env=env).stdout.split("\0") if item]

    def _run(
        self,
        *args: str,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``git args`` in the repository; raise GitCommandError on failure if
        ``check``. Timeouts and OS errors propagate: their outcome is unknown."""
        result = subprocess.run(
            [self.git, *self._config(remote=args[0] in ("push", "ls-remote")), *args],
            cwd=self.repo_path,
            env=self._env(env),
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            capture_output=True,
            encoding="utf-8",
            errors="surrogateescape",
            timeout=self.timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise GitCommandError(args, *_outcome(result))
        return result

    def _config(self, *, remote: bool) -> list[str]:
        """``-c`` options. They reach the receiving side of a local push too, so hooks are
        turned off there with ``--no-verify`` instead: the remote's own hooks still run."""
        options = [
            "commit.gpgSign=false",
            "log.showSignature=false",
            "core.quotePath=false",
            "color.ui=false",
            "gc.auto=0",
            "maintenance.auto=false",
            "push.gpgSign=false",
            "push.followTags=false",
            "push.recurseSubmodules=no",
        ]
        if not self.hooks and not remote:
            options.append(f"core.hooksPath={os.devnull}")
        return [arg for option in options for arg in ("-c", option)]

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in _KEPT_GIT_VARS
        }
        env.update(
            LC_ALL="C",
            LANGUAGE="C",
            GIT_TERMINAL_PROMPT="0",
            GIT_NO_REPLACE_OBJECTS="1",
            GIT_OPTIONAL_LOCKS="0",
        )
        if self.isolated:
            env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
        if extra:
            env.update(extra)
        return env


# -- helpers -------------------------------------------------------------------


def _commit_paths(params: dict[str, Any]) -> list[str] | None:
    """The validated 'paths' (None for all=True)."""
    everything = params.get("all", False)
    paths = params.get("paths")
    if not isinstance(everything, bool):
        raise PermanentError("git commit 'all' must be a boolean")
    if everything:
        if paths is not None:
            raise PermanentError("git commit takes 'paths' or all=True, not both")
        return None
    if not isinstance(paths, list) or not paths:
        raise PermanentError("git commit needs 'paths' (a non-empty list) or all=True")
    clean = []
    for path in paths:
        if not isinstance(path, str) or not path:
            raise PermanentError(f"git commit paths must be non-empty strings, not {path!r}")
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or ".git" in pure.parts:
            raise PermanentError(f"path {path!r} leaves the working tree or touches .git")
        clean.append(pure.as_posix())
    return sorted(set(clean))


def _optional_str(params: dict[str, Any], name: str, default: str) -> str:
    value = params.get(name, default)
    if not isinstance(value, str) or not value or "\n" in value or "<" in value or ">" in value:
        raise PermanentError(f"git commit {name!r} must be a one-line string, not {value!r}")
    return value


def _check_trailer_value(what: str, value: str) -> None:
    if not value or value != value.strip() or any(c in value for c in "\r\n\0"):
        raise PermanentError(f"the {what} {value!r} cannot be written as a one-line git trailer")


def _literal(paths: Sequence[str]) -> list[str]:
    return [f":(literal){path}" for path in paths]


def _matches(path: str, listed: Sequence[str]) -> bool:
    return any(item == path or item.startswith(path + "/") for item in listed)


def _identity(name: str, email: str) -> dict[str, str]:
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }


def _outcome(result: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    return result.returncode, result.stdout, result.stderr


def _not_done(exc: GitCommandError) -> Exception:
    """A failure before the effect's single step (the ref update): nothing happened."""
    if _LOCKED in exc.stderr:
        return RetryableError(f"another git process holds a lock: {exc}")
    return PermanentError(str(exc))


def _ref_failure(exc: GitCommandError) -> Exception:
    """Classify a failed compare-and-swap ``update-ref``."""
    if _LOCKED in exc.stderr:
        return RetryableError(f"another git process holds a lock: {exc}")
    if "but expected" in exc.stderr or "already exists" in exc.stderr:
        return DriftError(f"the ref moved under the act: {exc}")
    return exc  # ambiguous: the runtime looks it up


def _push_failure(result: subprocess.CompletedProcess[str], dst: str) -> Exception:
    """A refused push changed nothing on the remote; anything else is ambiguous."""
    error = GitCommandError(["push", "--porcelain", "..."], *_outcome(result))
    for line in result.stdout.splitlines():
        flag, _, rest = line.partition("\t")
        refs, _, summary = rest.partition("\t")
        if flag != "!" or not refs.endswith(f":{dst}"):
            continue
        if summary.startswith("[rejected]"):
            return DriftError(f"the remote refused a fast-forward of {dst} ({summary}): {error}")
        if summary.startswith("[remote rejected]"):
            return PermanentError(f"the remote refused {dst} ({summary}): {error}")
    return error


def _commit_receipt(sha: str, ref: str, digest: str) -> Receipt:
    branch = ref.removeprefix("refs/heads/")
    return Receipt(receipt_id=sha, result={"sha": sha, "branch": branch}, intent_digest=digest)


def _branch_receipt(prepared: dict[str, Any]) -> Receipt:
    return Receipt(
        receipt_id=f"{prepared['ref']}@{prepared['start']}",
        result={"branch": prepared["name"], "sha": prepared["start"]},
    )


def _push_receipt(prepared: dict[str, Any]) -> Receipt:
    return Receipt(
        receipt_id=f"{prepared['remote']}/refs/heads/{prepared['branch']}@{prepared['sha']}",
        result={"remote": prepared["remote"], "branch": prepared["branch"], "sha": prepared["sha"]},
    )
