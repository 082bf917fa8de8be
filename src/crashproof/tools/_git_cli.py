"""Running the ``git`` command line for ``GitTool``: the subprocess runner, its
environment isolation (configuration, ``GIT_*`` variables, locale, hooks), the ref and
branch-name queries built on it, and the classification of git failures into errors."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from crashproof.errors import DriftError, PermanentError, RetryableError

__all__ = ["GitCommandError", "GitCli"]

# Kept from the caller's environment: how to reach a remote, and where git lives.
_KEPT_GIT_VARS = frozenset({"GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_EXEC_PATH"})
_LOCKED = ".lock': File exists"


class GitCommandError(Exception):
    """A git command exited non-zero; what it means is for the caller to decide."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.command = list(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        detail = stderr.strip() or stdout.strip() or "no output"
        super().__init__(f"git {' '.join(args)} exited {returncode}: {detail}")


class GitCli:
    """Runs git in ``repo_path``; ``GitTool`` sets the attributes in ``__init__``."""

    repo_path: Path
    isolated: bool
    hooks: bool
    timeout: float
    git: str

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


def _outcome(result: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    return result.returncode, result.stdout, result.stderr


def not_done(exc: GitCommandError) -> Exception:
    """A failure before the effect's single step (the ref update): nothing happened."""
    if _LOCKED in exc.stderr:
        return RetryableError(f"another git process holds a lock: {exc}")
    return PermanentError(str(exc))


def ref_failure(exc: GitCommandError) -> Exception:
    """Classify a failed compare-and-swap ``update-ref``."""
    if _LOCKED in exc.stderr:
        return RetryableError(f"another git process holds a lock: {exc}")
    if "but expected" in exc.stderr or "already exists" in exc.stderr:
        return DriftError(f"the ref moved under the act: {exc}")
    return exc  # ambiguous: the runtime looks it up


def push_failure(result: subprocess.CompletedProcess[str], dst: str) -> Exception:
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
