"""The three git operations of ``GitTool`` (commit, branch, push): for each, the
``prepare`` that fixes the intent, the ``execute`` that does it once, and the ``lookup``
that finds it done, with their parameter checks and receipts."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from crashproof.errors import DriftError, PermanentError
from crashproof.tools._git_cli import (
    GitCli,
    GitCommandError,
    machine_out,
    not_done,
    push_failure,
    reading_before_effect,
    ref_failure,
)
from crashproof.tools.port import Call, Receipt

__all__ = ["GitOps", "INTENT_TRAILER", "OPERATION_TRAILER"]

OPERATION_TRAILER = "Crashproof-Operation"
INTENT_TRAILER = "Crashproof-Intent"
_TEMP_EXCLUDE = ":(exclude)*.crashproof-*.tmp"  # the workspace tool's crash leftovers
_RS, _US, _GS = "\x1e", "\x1f", "\x1d"
_MISSING = "missing"


class GitOps(GitCli):
    """The commit, branch and push steps; ``GitTool`` dispatches to them."""

    remote: str
    author_name: str
    author_email: str

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
            raise not_done(exc) from None
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
        ref, base, tree = prepared["ref"], prepared["base"], prepared["tree"]
        with reading_before_effect():
            found = self._find_commit(call, prepared)
            if found is not None:  # done before (or taken by another intent: a conflict)
                return found
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
            raise not_done(exc) from None
        except (OSError, subprocess.TimeoutExpired) as exc:  # the machine's, still before
            raise machine_out(exc) from exc
        subject = prepared["message"].splitlines()[0]
        try:
            self._run(
                "update-ref", "-m", f"commit (crashproof): {subject}", "HEAD", sha, base or ""
            )
        except GitCommandError as exc:
            raise ref_failure(exc) from None
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
                # With the index's own mtime: git re-reads a file whose stat data dates
                # from the index's second or later ("racily clean"). A copy dated now
                # would trust a same-size in-place rewrite made in that second (git
                # compares whole seconds) and stage the old blob: another tree than the
                # index's own `git add`. Taken before the read: an older date is safer.
                stamp = index.stat()
                scratch.write_bytes(index.read_bytes())
                os.utime(scratch, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
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
        with reading_before_effect():
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
            raise ref_failure(exc) from None
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
            raise push_failure(result, dst)
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
