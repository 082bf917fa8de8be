"""Running the ``git`` command line for ``GitTool``: the subprocess runner, its
environment isolation (configuration, ``GIT_*`` variables, locale, hooks), the ref and
branch-name queries built on it, and the classification of git failures into errors."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from crashproof._excerpt import DETAIL, shown
from crashproof.errors import DriftError, OutcomeUnknown, PermanentError, ResourceBusy, Unavailable
from crashproof.tools._git_locks import git_owner

__all__ = ["GitCommandError", "GitCli"]

# Kept from the caller's environment: how to reach a remote, and where git lives.
_KEPT_GIT_VARS = frozenset({"GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_EXEC_PATH"})
_LOCKED = ".lock': File exists"
# What git prints (C locale) when the machine under it failed: its files on a full,
# read-only or failing disk, or a file where one of its directories goes (objects/xx:
# "unable to create temporary file: Not a directory"). Seen from git 2.39 on a real
# tmpfs; never the act's own answer (a bad ref, a path matching nothing, a conflict).
_MACHINE = (
    "No space left on device",
    "Out of diskspace",
    "Disk quota exceeded",
    "Read-only file system",
    "Input/output error",
    "Cannot allocate memory",
    "Too many open files",
    "Permission denied",
    "insufficient permission for adding an object",
    "unable to create temporary",
    "unable to write",
    "couldn't write",
    "failed to write",
    "write error",
)
# The commands that may take a lock file (the index, a ref; a push updates the
# remote-tracking ref): run as the repository's owner (tools/_git_locks.py).
_LOCKING = frozenset({"add", "read-tree", "write-tree", "update-ref", "push"})


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

    def _git_dirs(self) -> tuple[Path, ...]:
        """The common git directory (refs, the owner file) and this worktree's own (its
        index), asked once: a tool works in one repository."""
        cached: tuple[Path, ...] | None = self.__dict__.get("_dirs")
        if cached is None:
            common, own = self._plain("rev-parse", "--git-common-dir", "--absolute-git-dir")
            cached = ((self.repo_path / common).resolve(), Path(own).resolve())
            self.__dict__["_dirs"] = cached
        return cached

    def _plain(self, *args: str) -> list[str]:
        result = self._spawn(args, None, None, ())
        if result.returncode != 0:
            raise GitCommandError(args, *_outcome(result))
        return result.stdout.splitlines()

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
        ``check``. Timeouts and OS errors of git's propagate: their outcome is unknown. A
        command that may take a lock runs as the repository's owner, which first clears
        the locks a dead git command of ours left (tools/_git_locks.py); its owner file
        failing (a full or read-only disk) is ``cp.Unavailable``: git never ran."""
        with ExitStack() as stack:
            fd = None
            if args[0] in _LOCKING:
                common, own = self._git_dirs()
                owner = git_owner(common, (common, own), self.timeout, args[0])
                try:
                    fd = stack.enter_context(owner)
                except OSError as exc:  # its owner file, before git ran: nothing happened
                    raise machine_out(exc) from exc
            result = self._spawn(args, input, env, () if fd is None else (fd,))
        if check and result.returncode != 0:
            raise GitCommandError(args, *_outcome(result))
        return result

    def _spawn(
        self,
        args: Sequence[str],
        input: str | None,
        env: Mapping[str, str] | None,
        pass_fds: tuple[int, ...],
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
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
            pass_fds=pass_fds,
        )

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


def machine_failed(stderr: str) -> bool:
    """Git's own words for a failure of the machine under it (``_MACHINE``)."""
    return any(marker in stderr for marker in _MACHINE)


def not_done(exc: GitCommandError) -> Exception:
    """A failure before the effect's single step (the ref update): nothing happened.
    The act's own (a bad ref, a path matching nothing) is its recorded failure; the
    machine's is no answer at all: the run stops resumable (``machine_out``)."""
    if _LOCKED in exc.stderr:
        return _busy(exc)
    if machine_failed(exc.stderr):
        return machine_out(exc)
    return PermanentError(str(exc))


def machine_out(exc: BaseException) -> Unavailable:
    """The machine failed under git before the commit, branch or push happened (a full or
    read-only disk, an I/O error, git stalled past its timeout): ``cp.Unavailable``, so
    nothing is recorded as the act's result and the run stops resumable."""
    return Unavailable(
        "git could not use the repository's files, nothing was committed or pushed in this "
        f"attempt; free or repair the disk, then resume ({_short(exc)})"
    )


@contextmanager
def reading_before_effect() -> Iterator[None]:
    """``execute``'s reads before the branch moves (the trailer search, HEAD, a ref's
    sha): nothing was done yet, so the machine failing under them (git's words for it,
    an OSError starting git, git stalled past its timeout) is ``cp.Unavailable``, never
    an unknown outcome for a lookup that would meet the same fault. Any other failure
    propagates as it is (the runtime looks the act up)."""
    try:
        yield
    except GitCommandError as exc:
        if machine_failed(exc.stderr):
            raise machine_out(exc) from exc
        raise
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise machine_out(exc) from exc


@contextmanager
def looking_up() -> Iterator[None]:
    """``lookup``'s reads: the machine failing under them (git's words for it, an OSError
    starting git, git stalled past its timeout) is ``cp.Unavailable`` saying so in one
    line, where the runtime's lookup stop showed the raw command line; nothing is decided
    (the runtime retries the lookup, then stops the run resumable). Any other failure
    propagates as it is, and so does a push's ``ls-remote``: its failure or stall is the
    remote's or the network's ("Permission denied (publickey)"), not this machine's."""
    try:
        yield
    except GitCommandError as exc:
        if machine_failed(exc.stderr) and "ls-remote" not in exc.command:
            raise _lookup_out(exc) from exc
        raise
    except subprocess.TimeoutExpired as exc:
        if "ls-remote" in exc.cmd:
            raise
        raise _lookup_out(exc) from exc
    except OSError as exc:  # git could not be started
        raise _lookup_out(exc) from exc


def _lookup_out(exc: BaseException) -> Unavailable:
    return Unavailable(
        "git could not look the act up, the machine failed under it; free or repair the "
        f"disk, then resume ({_short(exc)})"
    )


def ref_failure(exc: GitCommandError) -> Exception:
    """Classify a failed compare-and-swap ``update-ref``."""
    if _LOCKED in exc.stderr:
        return _busy(exc)
    if "but expected" in exc.stderr or "already exists" in exc.stderr:
        return DriftError(f"the ref moved under the act: {exc}")
    if machine_failed(exc.stderr) and ".lock'" in exc.stderr:
        return machine_out(exc)  # its lock could not be made or written: nothing moved
    if machine_failed(exc.stderr):  # the ref may have moved: lookup tells
        return OutcomeUnknown(
            f"the machine failed under git's ref update, which may have landed: {_short(exc)}"
        )
    return exc  # ambiguous: the runtime looks it up


def _short(exc: BaseException) -> str:
    """One line for a message, git's own words (its paths can be long): their start and
    their end, where git says why (``Unable to create '<path>/index.lock': No space left
    on device``)."""
    if isinstance(exc, GitCommandError):
        text = f"git {exc.command[0]} exited {exc.returncode}: {exc.stderr or exc.stdout}"
    elif isinstance(exc, subprocess.TimeoutExpired):  # its message is the command line
        text = f"TimeoutExpired: git {_subcommand(exc.cmd)} ran past its {exc.timeout:g} s timeout"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return shown(text, DETAIL)


def _subcommand(cmd: Any) -> str:
    """The git command of ``[git, -c, option, ..., command, args...]``."""
    args = [str(arg) for arg in cmd[1:]] if isinstance(cmd, list | tuple) else []
    while len(args) >= 2 and args[0] == "-c":
        args = args[2:]
    return args[0] if args else "?"


def _busy(exc: GitCommandError) -> ResourceBusy:
    """A lock that no dead git command of ours explains: someone else's, alive or not."""
    start = exc.stderr.find("Unable to create '")
    lock = exc.stderr[start + 18 :].partition("'")[0] if start >= 0 else "a .lock file"
    return ResourceBusy(
        f"a git process that is not ours holds {lock}; nothing was done. If no git process "
        f"runs in the repository any more, remove {lock} and resume"
    )


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
        if "(unpacker error)" in summary and machine_failed(result.stderr):
            # The remote's disk, not its hooks: it kept nothing (a remote's unpacker error).
            return Unavailable(
                f"the remote could not store {dst} ({summary}), nothing was pushed; free or "
                f"repair its disk, then resume: {_short(error)}"
            )
        if summary.startswith("[remote rejected]"):
            return PermanentError(f"the remote refused {dst} ({summary}): {error}")
    return error
