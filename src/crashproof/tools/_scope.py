"""Which files a workspace *observation* covers: the tree, less what git ignores and the
caches that tools leave behind.

A code agent runs its tests in a ``ctx.step``; the test runner leaves ``__pycache__``,
``.pytest_cache`` or ``node_modules/.cache`` in the workspace. Those are not acts, so on
resume they looked like someone else's edit and froze the run for environment drift,
while a run that never crashed did not notice. An observation therefore leaves out:

- ``DEFAULT_CACHE_DIRS`` (directory names, at any depth), ``DEFAULT_CACHE_PATHS``
  (directories by their trailing path) and ``DEFAULT_CACHE_FILES`` (file-name globs);
- in a git working tree, the untracked files git ignores, by git's own rules
  (``git ls-files --others --ignored --exclude-standard --directory``: every
  ``.gitignore``, ``.git/info/exclude`` and the repository's ``core.excludesFile``; not
  the user's or the system's git configuration, so that every host draws the same line).
  A tracked file is covered even where a pattern matches it, as git does;
- the ``observe_ignore`` globs of the ``Workspace``.

git is asked again only when its answer could differ: when the set of paths in the tree,
a ``.gitignore`` (in the tree or above it), the index, ``info/exclude`` or the
repository's config changed since it was last asked (an act that appends to a file costs
no subprocess). Not seen: a ``core.excludesFile`` outside the repository edited in place.

``Workspace(root, observe_all=True)`` observes every file instead. The artifact
fingerprint (``Workspace.fingerprint``, the verifier's measure of equivalence) is not
affected: its scope stays the whole tree but ``.git`` and crashproof's temp files. If git
cannot be run (not installed, a repository owned by someone else), only the defaults
apply, and the observation says so in its details.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CACHE_DIRS",
    "DEFAULT_CACHE_FILES",
    "DEFAULT_CACHE_PATHS",
    "GitIgnored",
    "Scope",
]

DEFAULT_CACHE_DIRS = frozenset(
    {
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".hypothesis",
        ".tox",
        ".nox",
        ".parcel-cache",
    }
)
DEFAULT_CACHE_PATHS = ("node_modules/.cache", ".next/cache")
DEFAULT_CACHE_FILES = ("*.pyc", "*.pyo", ".coverage", ".coverage.*", ".eslintcache")
_GIT_TIMEOUT = 60.0
_SELF_IGNORED = "not applied: git ignores the workspace itself"
_NO_REPO = "not a git working tree"

_CACHE_FILE = re.compile("|".join(fnmatch.translate(g) for g in DEFAULT_CACHE_FILES))


@functools.lru_cache(maxsize=64)
def _any_glob(globs: tuple[str, ...]) -> re.Pattern[str]:
    """One regex for many fnmatch globs: a walk tests every file against all of them."""
    return re.compile("|".join(fnmatch.translate(g) for g in globs))


_Answer = tuple[frozenset[str], frozenset[str]] | str  # (dirs, files) git ignores, or why not


@dataclass(frozen=True, slots=True)
class Scope:
    """What an observation leaves out (relative POSIX paths; directories without their
    trailing slash)."""

    globs: tuple[str, ...] = ()
    defaults: bool = True
    git: str = _NO_REPO  # how git's rules applied, for the observation's details
    git_dirs: frozenset[str] = frozenset()
    git_files: frozenset[str] = frozenset()

    def skips_dir(self, rel: str, name: str) -> bool:
        """A default cache directory: never entered."""
        return self.defaults and (
            name in DEFAULT_CACHE_DIRS
            or any(rel == p or rel.endswith("/" + p) for p in DEFAULT_CACHE_PATHS)
        )

    def skips_file(self, rel: str, name: str) -> bool:
        """A default cache file, or one ``observe_ignore`` names."""
        if self.defaults and _CACHE_FILE.match(name):
            return True
        return bool(self.globs) and _any_glob(self.globs).match(rel) is not None

    def git_ignores(self, rel: str) -> bool:
        if rel in self.git_files:
            return True
        if not self.git_dirs:
            return False
        cut = rel.rfind("/")
        while cut > 0:
            if rel[:cut] in self.git_dirs:
                return True
            cut = rel.rfind("/", 0, cut)
        return False

    def covers(self, rel: str) -> bool:
        """Whether a file at ``rel`` is observed (for ``Workspace.expect``)."""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if self.skips_dir("/".join(parts[:depth]), parts[depth - 1]):
                return False
        return not self.skips_file(rel, parts[-1]) and not self.git_ignores(rel)

    def with_git(self, answer: _Answer) -> Scope:
        if isinstance(answer, str):
            return replace(self, git=answer)
        return replace(self, git="applied", git_dirs=answer[0], git_files=answer[1])

    def to_json(self, left_out: int) -> dict[str, Any]:
        """The observation's account of its scope; ``left_out``: how many files (and
        default cache directories, each counted once) it did not cover."""
        return {
            "excluded": [".git", "*.crashproof-*.tmp"]
            + (["default caches"] if self.defaults else [])
            + (["git-ignored files"] if self.git == "applied" else [])
            + list(self.globs),
            "gitignore": self.git,
            "left_out": left_out,
        }


class GitIgnored:
    """git's answer for one workspace, asked again only when it could have changed."""

    def __init__(self) -> None:
        self._last: tuple[object, _Answer] | None = None

    def answer(self, root: Path, walked: Sequence[tuple[str, os.stat_result]]) -> _Answer:
        """The untracked paths git ignores under ``root``; ``walked``: (relpath, lstat) of
        every file the observation's walk found (caches pruned)."""
        repo = _repository(root)
        if repo is None:
            return _NO_REPO
        git_dir, parent_ignores = repo
        rules = [_key(path) for path in parent_ignores]
        rules += [_key(git_dir / name) for name in ("index", "info/exclude", "config")]
        signature = (
            frozenset(rel for rel, _ in walked),
            tuple(rules),
            tuple(sorted((rel, _stat_key(st)) for rel, st in walked if _is_ignore_file(rel))),
        )
        if self._last is not None and self._last[0] == signature:
            return self._last[1]
        answer = _ask_git(root)
        self._last = (signature, answer)
        return answer


def _is_ignore_file(rel: str) -> bool:
    return rel == ".gitignore" or rel.endswith("/.gitignore")


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _key(path: Path) -> tuple[str, tuple[int, int, int, int] | None]:
    try:
        return str(path), _stat_key(path.stat())
    except OSError:
        return str(path), None


def _repository(root: Path) -> tuple[Path, list[Path]] | None:
    """The git directory of the working tree holding ``root`` (following a ``.git``
    file, as worktrees and submodules have), and the ``.gitignore`` files above
    ``root`` up to the working tree's top; None outside any working tree."""
    above: list[Path] = []
    for directory in (root, *root.parents):
        if directory != root:
            above.append(directory / ".gitignore")
        dot_git = directory / ".git"
        if dot_git.is_dir():
            return dot_git, above
        if dot_git.is_file():
            try:
                text = dot_git.read_text().strip()
            except OSError:
                return dot_git, above
            target = Path(text.removeprefix("gitdir:").strip())
            return (target if target.is_absolute() else directory / target), above
    return None


def _ask_git(root: Path) -> _Answer:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(LC_ALL="C", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    env["GIT_OPTIONAL_LOCKS"] = "0"  # an observation never takes (or refreshes) the index
    listing = ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"]
    try:
        result = _git(root, env, "-c", "core.quotePath=false", *listing)
        if result.returncode != 0:
            # git 2.39 fails this way deep inside an ignored directory: say so plainly.
            if _git(root, env, "check-ignore", "-q", ".").returncode == 0:
                return _SELF_IGNORED
            detail = " ".join(result.stderr.decode("utf-8", "replace").split())[:200]
            return f"unavailable (git: {detail}); only the defaults apply"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({type(exc).__name__}); only the defaults apply"
    dirs, files = set(), set()
    for item in result.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if item == "./":  # git ignores the workspace itself: its rules would leave nothing
            return _SELF_IGNORED
        if item.endswith("/"):
            dirs.add(item.rstrip("/"))
        elif item:
            files.add(item)
    return frozenset(dirs), frozenset(files)


def _git(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", *args],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=_GIT_TIMEOUT,
        check=False,
    )
