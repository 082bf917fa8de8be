"""Workspace: file writes that cannot apply twice.

Writes are *state-addressed*: before the intent commits, ``prepare`` reads the file's
base hash ("absent" if missing), computes the result and its hash, and all of it is
journaled with the intent. ``execute`` then compares the file with both: already the
result → done (no second write); still the base → write atomically; anything else →
drift, frozen for review. ``lookup`` is the same comparison, so a crash between the
file write and the receipt is always reconcilable.

A path that cannot name a file is the act's own bad argument: a directory, a path that
goes through a file, a name too long, a symlink loop, a NUL byte, the root itself. It is
``cp.PermanentError`` (one line saying what to do; recorded as the act's failure, the
workflow gets ``cp.ActFailed``). The machine failing under a read or a write (a full or
read-only disk, an I/O error) is not the act's result: before the file is replaced it is
``cp.Unavailable`` (nothing changed; retried, then the run stops resumable: free or
repair the disk, then resume), and once the rename is done but its directory could not
be synced, ``cp.OutcomeUnknown``, settled by ``lookup``. The machine failing under a
lookup is ``cp.Unavailable`` too (nothing decided; the run stops resumable), and a
lookup writes nothing unless a crash left a temporary copy: on a read-only disk it
still answers.

Artifact fingerprint (``Workspace.fingerprint``): SHA-256 over one line per file,
``relpath NUL sha256-hex-of-content NUL x|- LF``, sorted by POSIX relative path, for
every regular file in scope (``.git`` and crashproof temp files excluded; ``x`` when
the owner-executable bit is set, the only mode bit git tracks). To recompute by hand::

    find . -type f ! -path './.git/*' ! -name '*.crashproof-*.tmp' | sed 's|^\\./||' \\
      | LC_ALL=C sort | while IFS= read -r f; do
          printf '%s\\0%s\\0%s\\n' "$f" "$(sha256sum < "$f" | cut -d' ' -f1)" \\
                 "$([ -x "$f" ] && echo x || echo -)"; done | sha256sum
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from crashproof.errors import DriftError, OutcomeUnknown, PermanentError, Unavailable
from crashproof.tools._diff import PatchError, apply_unified_diff
from crashproof.tools._scope import GitIgnored, Scope
from crashproof.tools.port import Call, Observation, Receipt, Tool

__all__ = ["ABSENT", "Workspace"]

ABSENT = "absent"
_TEMP_GLOB = "*.crashproof-*.tmp"
_OPS = ("write", "append", "patch", "delete")
_RACY_NS = 2_000_000_000  # files changed this recently are re-read on every observation
_NAME_MAX = 255  # bytes in one name: Linux's and macOS's file systems
# The errnos that say the act's path cannot name a file (its argument, not the machine),
# and what to do about it.
_PATH_ERRNOS = {
    errno.EISDIR: "names a directory, not a file: name a file (a workspace act changes one)",
    errno.ENOTDIR: "goes through a file where a directory should be: name a path whose "
    "folders are directories",
    errno.ENAMETOOLONG: "is too long for the file system: use shorter names",
    errno.ELOOP: "leads through a symlink loop: name a path without one",
}


class Workspace(Tool):
    """A directory whose files change only through journaled, state-addressed acts.

    ``ctx.act("edit", ws, op="append", path="notes.txt", text="+line\\n")``; ops:
    ``write(path, content)``, ``append(path, text)``, ``patch(path, diff)`` (a strict
    unified diff), ``delete(path)``.
    """

    name: ClassVar[str] = "workspace"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = True
    idempotent_execute: ClassVar[bool] = True
    # State-addressed: lookup answers only when the file holds this intent's result hash.
    matches_intent: ClassVar[bool] = True

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        observe_ignore: Sequence[str] = (),
        observe_all: bool = False,
    ) -> None:
        """What an observation (the environment check on resume) covers: every file but
        caches (``__pycache__``, ``.pytest_cache``, ``node_modules/.cache``... see
        ``crashproof.tools._scope``), the untracked files git ignores (in a git working
        tree, by its own rules) and ``observe_ignore``: fnmatch globs on the POSIX
        relative path, e.g. ``["build/*"]``. A change there never pauses a resume.
        ``observe_all=True`` drops the cache list and .gitignore (``observe_ignore``
        still applies). The artifact fingerprint always covers the whole tree."""
        self.root = Path(root).resolve()
        self.observe_ignore = tuple(observe_ignore)
        self.observe_all = observe_all
        self._observed: tuple[str, dict[str, str], Scope] | None = None
        self._git_ignored = GitIgnored()
        # relpath -> ((size, mtime_ns, ctime_ns, inode), sha256): see ``_lines``.
        self._hashes: dict[str, tuple[tuple[int, int, int, int], str]] = {}

    # -- the Tool port -----------------------------------------------------

    def prepare(self, call: Call) -> dict[str, Any]:
        params = call.params
        op = params.get("op")
        if op not in _OPS:
            raise PermanentError(f"workspace op must be one of {_OPS}, not {op!r}")
        rel = self._relpath(params.get("path"))
        target = self.root / rel
        try:
            current = _read(target)
        except OSError as exc:
            raise self._fault(rel, exc, "read") from None
        if op == "write":
            result: str | None = _text(params, "content")
        elif op == "append":
            result = (current or "") + _text(params, "text")
        elif op == "patch":
            try:
                result = apply_unified_diff(current or "", _text(params, "diff"))
            except PatchError as exc:
                raise PermanentError(f"patch does not apply to {rel}: {exc}") from None
        else:
            result = None
        return {
            "path": rel,
            "base": _digest(current),
            "result": _digest(result),
            "content": result,
        }

    def target_of(self, call: Call) -> str | None:
        """The act's file as an absolute path (the root's and the recorded relative path):
        every workspace shares the tool name, so two roots' ``x.py`` are two targets, and
        one file reached from nested roots is one. Computed afresh from the call's
        ``prepared`` (never recorded), so a journal written before reads the same way."""
        return str(self.root / _prepared(call)["path"]) if call.prepared else None

    def path_of(self, call: Call) -> str | None:
        """The act's file relative to the root, as it was prepared (a ``cp.Shell``
        command's delta names its files so)."""
        return str(_prepared(call)["path"]) if call.prepared else None

    def result_digest(self, call: Call) -> str | None:
        """The SHA-256 of what act ``call`` leaves in its file (``ABSENT``: deleted)."""
        return str(_prepared(call)["result"]) if call.prepared else None

    def execute(self, call: Call) -> Receipt:
        prepared = _prepared(call)
        rel = str(prepared["path"])
        target = self.root / rel
        try:
            current = _digest(_read(target))
        except OSError as exc:
            raise self._fault(rel, exc, "read") from None
        if current != prepared["result"]:
            if current != prepared["base"]:
                raise DriftError(_drift(prepared, current))
            self._apply(target, rel, prepared["content"], call)
        return self._receipt(call, prepared)

    def lookup(self, call: Call) -> Receipt | None:
        """The file compared with the intent's result and base, a crash's leftover
        temporary copy removed first. A path that no longer names a file (a directory
        there now, a symlink loop) is drift; one through a file, an absent file. The
        machine failing under the lookup (a read-only disk, an I/O error) is
        ``cp.Unavailable``: nothing is decided, a later resume looks again."""
        prepared = _prepared(call)
        rel = str(prepared["path"])
        target = self.root / rel
        temp = _temp_path(target, call.operation_id)
        try:
            # Only when there: unlink meets EROFS on a read-only disk even for no file.
            if os.path.lexists(temp):
                temp.unlink(missing_ok=True)
        except OSError as exc:
            raise self._lookup_fault(rel, exc, "remove the leftover temporary copy of") from None
        try:
            current = _digest(_read(target))
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:  # a file where a folder was: no file here
                current = ABSENT
            elif exc.errno in _PATH_ERRNOS:
                raise DriftError(
                    f"{rel} {_PATH_ERRNOS[exc.errno].split(':', 1)[0]}, neither the base "
                    f"{prepared['base']} nor the result {prepared['result']} of this intent"
                ) from None
            else:
                raise self._lookup_fault(rel, exc, "read") from None
        if current == prepared["result"]:
            return self._receipt(call, prepared)
        if current == prepared["base"]:
            return None
        raise DriftError(_drift(prepared, current))

    def observe(self) -> Observation:
        """Instance: this workspace's root path; fingerprint: the fingerprint (same line
        format as the artifact's) of the files the observation covers (see
        ``__init__``); details: the file count, the scope (what was left out and how
        git's rules applied) and, in a git working tree, the HEAD (evidence only: a
        commit does not change the files)."""
        lines, left_out, scope = self._scoped_lines()
        self._observed = (_tree_digest(lines), lines, scope)
        details: dict[str, Any] = {
            "root": str(self.root),
            "files": len(lines),
            "scope": scope.to_json(left_out),
        }
        head = _git_head(self.root)
        if head is not None:
            details["git_head"] = head
        return Observation(self.observed_instance(), self._observed[0], details=details)

    def observed_instance(self) -> str:
        """``workspace:<root>``: the root as resolved, as every observation names it."""
        return f"workspace:{self.root}"

    def expect(self, call: Call, before: Observation) -> str | None:
        """The tree fingerprint once this prepared write has applied."""
        prepared = call.prepared
        if not prepared or "result" not in prepared:
            return None
        cached = getattr(self, "_observed", None)
        if cached and cached[0] == before.fingerprint:
            lines, scope = dict(cached[1]), cached[2]
        else:
            lines, _, scope = self._scoped_lines()
        rel = str(prepared["path"])
        if rel.rsplit("/", 1)[-1] == ".gitignore" and not self.observe_all:
            return None  # it moves the scope's line itself: the act's lookup decides
        if not scope.covers(rel):
            return before.fingerprint
        if prepared["result"] == ABSENT:
            lines.pop(rel, None)
        else:
            old = lines.get(rel)
            executable = old.rsplit("\0", 1)[1].strip() if old else "-"
            lines[rel] = f"{rel}\0{prepared['result']}\0{executable}\n"
        return _tree_digest(lines)

    def observed_files(self) -> list[str]:
        """The relative paths an observation made now covers, sorted as the fingerprint
        sorts them."""
        lines = self._scoped_lines()[0]
        return sorted(lines, key=lambda rel: rel.encode("utf-8", "surrogateescape"))

    def _scoped_lines(self) -> tuple[dict[str, str], int, Scope]:
        """The observation's lines, how many files it left out, and its scope."""
        everything = getattr(self, "observe_all", False)
        scope = Scope(globs=self.observe_ignore, defaults=not everything)
        files, left_out = self._walk(scope)
        if everything:
            scope = scope.with_git("not applied (observe_all)")
        else:
            ignored = getattr(self, "_git_ignored", None) or GitIgnored()
            scope = scope.with_git(ignored.answer(self.root, [(r, st) for r, _, st in files]))
            kept = [entry for entry in files if not scope.git_ignores(entry[0])]
            left_out += len(files) - len(kept)
            files = kept
        return self._lines(cached=True, files=files), left_out, scope

    # -- artifacts ---------------------------------------------------------

    def fingerprint(
        self, include: Sequence[str] | None = None, exclude: Sequence[str] | None = None
    ) -> str:
        """SHA-256 (64 hex) of the files in scope; see the module docstring for the format.
        ``include``/``exclude`` are fnmatch globs on the POSIX relative path."""
        return _tree_digest(self._lines(include, exclude))

    def _lines(
        self,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        *,
        cached: bool = False,
        files: list[tuple[str, str, os.stat_result]] | None = None,
    ) -> dict[str, str]:
        """One fingerprint line per file in scope. ``cached`` (observations): a file
        whose size, mtime, ctime and inode are those of its last hashing is not read
        again, as git's index does; a file changed less than ``_RACY_NS`` before it was
        hashed is always read again (a write within one timestamp tick keeps them)."""
        lines = {}
        now = time.time_ns()
        memo: dict[str, tuple[tuple[int, int, int, int], str]] = {}
        known = getattr(self, "_hashes", {}) if cached else {}
        for rel, path, st in self._files() if files is None else files:
            if include is not None and not any(fnmatch.fnmatchcase(rel, g) for g in include):
                continue
            if exclude is not None and any(fnmatch.fnmatchcase(rel, g) for g in exclude):
                continue
            executable = "x" if st.st_mode & stat.S_IXUSR else "-"
            key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            entry = known.get(rel)
            digest = entry[1] if entry is not None and entry[0] == key else _sha256_file(path)
            if now - max(st.st_mtime_ns, st.st_ctime_ns) > _RACY_NS:
                memo[rel] = (key, digest)
            lines[rel] = f"{rel}\0{digest}\0{executable}\n"
        if cached:
            self._hashes = memo
        return lines

    # -- internals ---------------------------------------------------------

    def _files(self) -> list[tuple[str, str, os.stat_result]]:
        """(relpath, path, lstat) of every regular file in the tree: no symlinks, no
        ``.git`` directory (at any depth), no crashproof temp files."""
        return self._walk(None)[0]

    def _walk(self, scope: Scope | None) -> tuple[list[tuple[str, str, os.stat_result]], int]:
        """``_files``, less what ``scope`` leaves out (pruned: an ignored
        ``node_modules`` is never entered), and how many entries that was. ``os.scandir``
        rather than pathlib: an observation walks the tree twice per act."""
        found = []
        left_out = 0
        pending = [(str(self.root), "")]
        while pending:
            directory, prefix = pending.pop()
            with os.scandir(directory) as entries:
                for entry in entries:
                    rel = prefix + entry.name
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name == ".git":
                            continue
                        if scope is not None and scope.skips_dir(rel, entry.name):
                            left_out += 1
                            continue
                        pending.append((entry.path, rel + "/"))
                    elif entry.is_file(follow_symlinks=False) and not fnmatch.fnmatchcase(
                        entry.name, _TEMP_GLOB
                    ):
                        if scope is not None and scope.skips_file(rel, entry.name):
                            left_out += 1
                            continue
                        found.append((rel, entry.path, entry.stat(follow_symlinks=False)))
        return found, left_out

    def _relpath(self, path: Any) -> str:
        if not isinstance(path, str) or not path:
            raise PermanentError("workspace acts need a relative 'path'")
        if "\0" in path:
            raise PermanentError(f"workspace path {path!r} holds a NUL byte: name a file")
        try:
            encoded = path.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise PermanentError(
                f"workspace path {path!r} is no file name (a lone surrogate): name it in UTF-8"
            ) from None
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or ".git" in pure.parts:
            raise PermanentError(f"path {path!r} leaves the workspace or touches .git")
        if not pure.parts:
            raise PermanentError(f"workspace path {path!r} names the workspace itself: name a file")
        if len(encoded) > 4000 or any(
            len(p.encode(errors="surrogateescape")) > _NAME_MAX for p in pure.parts
        ):
            shown = path if len(path) <= 80 else f"{path[:60]}...{path[-12:]}"
            raise PermanentError(f"workspace path {shown!r} {_PATH_ERRNOS[errno.ENAMETOOLONG]}")
        # The string is inside; a symlinked directory or file could still lead outside.
        target = self.root / pure
        try:
            outside = not target.parent.resolve().is_relative_to(self.root)
            if target.is_symlink() or outside:
                raise PermanentError(f"path {path!r} leaves the workspace through a symlink")
        except RuntimeError:  # Python before 3.13 on a symlink loop (then: OSError ELOOP)
            raise PermanentError(f"workspace path {path!r} {_PATH_ERRNOS[errno.ELOOP]}") from None
        except OSError as exc:
            raise self._fault(pure.as_posix(), exc, "resolve") from None
        return pure.as_posix()

    def _apply(self, target: Path, rel: str, content: str | None, call: Call) -> None:
        """Replace or delete the file. A failure before the file changed is the path's
        (``PermanentError``) or the machine's (``cp.Unavailable``); the directory not
        synced once it changed leaves the outcome to ``lookup``."""
        if content is None:
            try:
                target.unlink(missing_ok=True)
            except OSError as exc:
                raise self._fault(rel, exc, "delete") from None
            _sync_changed(target.parent, rel)
            return
        temp = _temp_path(target, call.operation_id)
        try:
            _make_dirs_durably(target.parent)
            with temp.open("wb") as f:
                f.write(content.encode("utf-8", "surrogateescape"))
                f.flush()
                os.fsync(f.fileno())
            if target.exists():  # the rename must not reset the mode (git tracks the x bit)
                os.chmod(temp, stat.S_IMODE(target.stat().st_mode))
        except OSError as exc:  # the file untouched: nothing happened
            with contextlib.suppress(OSError):  # else lookup's: a crash's leftover
                temp.unlink(missing_ok=True)
            raise self._fault(rel, exc, "write") from None
        call.crash_point("written")  # temp file durable, target untouched
        try:
            os.replace(temp, target)  # atomic: failed, the file is as it was
        except OSError as exc:
            with contextlib.suppress(OSError):
                temp.unlink(missing_ok=True)
            raise self._fault(rel, exc, "write") from None
        _sync_changed(target.parent, rel)
        call.crash_point("renamed")  # effect done, no receipt yet

    def _fault(self, rel: str, exc: OSError, doing: str) -> Exception:
        """An OSError before the file changed: the act's own path (``PermanentError``,
        recorded as its failure) or the machine under it (``cp.Unavailable``)."""
        hint = _PATH_ERRNOS.get(exc.errno or 0)
        if hint is not None:
            return PermanentError(f"workspace path {rel!r} {hint}")
        return Unavailable(  # the error first: a run's reason is cut short
            f"cp.Workspace could not {doing} {rel!r} ({type(exc).__name__}: "
            f"{exc.strerror or exc}), nothing was changed in this attempt; free or repair "
            f"the disk under {self.root}, then resume"
        )

    def _lookup_fault(self, rel: str, exc: OSError, doing: str) -> Unavailable:
        return Unavailable(
            f"cp.Workspace could not {doing} {rel!r} ({type(exc).__name__}: "
            f"{exc.strerror or exc}) to look the act up; repair the disk under "
            f"{self.root}, then resume"  # the root last: a stop's reason is cut short
        )

    def _receipt(self, call: Call, prepared: dict[str, Any]) -> Receipt:
        return Receipt(
            receipt_id=f"{prepared['path']}@{prepared['result']}",
            result={"path": prepared["path"], "sha256": prepared["result"]},
            intent_digest=call.intent_digest,
        )


def _tree_digest(lines: dict[str, str]) -> str:
    ordered = sorted(
        lines.values(), key=lambda line: line.split("\0", 1)[0].encode("utf-8", "surrogateescape")
    )
    return hashlib.sha256("".join(ordered).encode("utf-8", "surrogateescape")).hexdigest()


def _git_head(root: Path) -> str | None:
    """The commit HEAD names in a git working tree at ``root`` (read from .git, no
    subprocess); None when it is not one or HEAD cannot be resolved."""
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head or None
        ref = head[5:]
        loose = git / ref
        if loose.is_file():
            return loose.read_text().strip() or None
        for line in (git / "packed-refs").read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    except OSError:
        return None
    return None


def _prepared(call: Call) -> dict[str, Any]:
    if not call.prepared or "result" not in call.prepared:
        raise PermanentError(f"act {call.step!r}: workspace intent was journaled unprepared")
    return call.prepared


def _text(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str):
        raise PermanentError(f"workspace op {params.get('op')!r} needs a string {name!r}")
    return value


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None


def _digest(content: str | None) -> str:
    if content is None:
        return ABSENT
    return hashlib.sha256(content.encode("utf-8", "surrogateescape")).hexdigest()


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def _temp_path(target: Path, operation_id: str) -> Path:
    tag = hashlib.sha256(operation_id.encode()).hexdigest()[:16]
    return target.with_name(f".{target.name}.crashproof-{tag}.tmp")


def _make_dirs_durably(directory: Path) -> None:
    """mkdir -p, and fsync each new directory's parent, so a power cut cannot lose the
    directory of a file whose receipt is already committed."""
    missing = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for new in reversed(missing):
        new.mkdir(exist_ok=True)
        _fsync_dir(new.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_changed(directory: Path, rel: str) -> None:
    """fsync the directory of a file just replaced or deleted: failing, the change may
    not survive a power cut, so the outcome is unknown (``lookup`` compares the file)."""
    try:
        _fsync_dir(directory)
    except OSError as exc:
        raise OutcomeUnknown(
            f"{rel!r} changed but its directory could not be synced ({exc}); looked up"
        ) from exc


def _drift(prepared: dict[str, Any], current: str) -> str:
    return (
        f"{prepared['path']} is {current}, neither the base {prepared['base']} nor the "
        f"result {prepared['result']} of this intent"
    )
