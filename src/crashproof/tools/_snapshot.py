"""Workspace snapshots for ``cp.Shell``: a git tree of the files a command may change,
taken before it runs and put back exactly if it is cut short.

The store is a bare git repository of crashproof's own (``Shell(store=...)``; by default
``<git dir>/crashproof-shell`` of the workspace's repository), never the workspace's
object database: a command may run ``git gc --prune=now`` or rewrite ``.git`` itself,
which a snapshot must survive. A snapshot is one tree object (its id is the snapshot id)
with one entry per area:

- ``scope``: the workspace root as ``git add -A`` sees it with the workspace's own ignore
  rules (every ``.gitignore``, the repository's ``info/exclude``), plus the files the
  workspace's repository tracks although a rule ignores them; declared paths left out;
- ``p:<path>`` per declared path (``node_modules``, a ``--target`` directory, ``.git``):
  everything under it, ignore rules not applied; absent when the path did not exist.

Each area keeps a persistent index in the store (``indexes/<area>``), so a snapshot hashes
only the files whose stat data changed since the last one, as ``git status`` does;
beside it a note of the tree that index was last written as: a snapshot that changed
no entry (the usual one before a command) is one git process, ``git add -A``.
Restoring an area reads its tree into that index, refreshes it, checks out the entries
that differ and deletes the files that are not in the tree (then the directories that
emptied); a declared path absent from the snapshot is removed. Restore converges: a
crash in the middle of one is finished by the next. Objects and indexes are not
fsynced (``core.fsync=none``): after a power cut a snapshot may be gone, and the act
then freezes for review instead of restoring (docs/how-to/shell.md, Limits).

Not covered: a nested git repository inside the scope is recorded as a link (git's
gitlink), not its files; an empty directory is not a file and is not restored.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import struct
import subprocess
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from crashproof._excerpt import DETAIL, shown
from crashproof.errors import DriftError, PermanentError

__all__ = [
    "SCOPE",
    "SnapshotStore",
    "area_name",
    "check_relative",
    "default_store",
    "env_digest",
]

SCOPE = "scope"
_TEMP_EXCLUDE = ":(exclude,glob)**/*.crashproof-*.tmp"
_STORE_DIRNAME = "crashproof-shell"
_IGNORED_NOTE = "The following paths are ignored"
_TIMEOUT = 600.0
_CONFIG = (
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.fileMode=true",
    "core.symlinks=true",
    "core.quotePath=false",
    "core.fsync=none",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.addIgnoredFile=false",
)


def default_store(root: Path) -> Path:
    """``<git dir>/crashproof-shell`` for a git working tree at ``root``."""
    dot_git = root / ".git"
    if dot_git.is_dir():
        return dot_git / _STORE_DIRNAME
    if dot_git.is_file():
        text = dot_git.read_text().strip().removeprefix("gitdir:").strip()
        target = Path(text)
        return (target if target.is_absolute() else root / target) / _STORE_DIRNAME
    raise PermanentError(
        f"{root} is not a git working tree: give cp.Shell a store= directory outside it "
        "for its snapshots"
    )


def area_name(path: str) -> str:
    """The snapshot tree's entry name for a declared path (no ``/`` in a tree entry)."""
    return "p:" + path.replace("%", "%25").replace("/", "%2F")


def _area_path(name: str) -> str:
    return name[2:].replace("%2F", "/").replace("%25", "%")


_LOCK = "shell.lock"  # the store's own lock (``SnapshotStore._flock``), never git's


class SnapshotStore:
    """The snapshots of one workspace root, in one store directory."""

    def __init__(self, root: Path, store: Path) -> None:
        self.root = root
        self.store = store
        self._ready = False
        # The descriptor of shell.lock while this thread holds it (``_locked``).
        self._held = threading.local()
        # (the workspace index's stat, excluded paths) -> what was force-added then
        self._forced: tuple[object, list[str]] | None = None

    # -- public --------------------------------------------------------------

    def snapshot(self, paths: Sequence[str]) -> str:
        """The tree id of the workspace now (``scope``) and of each declared path."""
        with self._locked():
            entries = [(SCOPE, self._area_tree(SCOPE, self.root, paths))]
            for rel in sorted(paths):
                where = self.root / rel
                if where.is_dir() and not where.is_symlink():
                    tree = self._area_tree(area_name(rel), where, ())
                    entries.append((area_name(rel), tree))
                elif where.exists() or where.is_symlink():
                    raise PermanentError(f"declared path {rel!r} is not a directory")
            return self._write_tree(entries)

    def restore(self, snapshot: str, paths: Sequence[str]) -> int:
        """Put the workspace and the declared paths back as ``snapshot`` holds them;
        returns how many files were written or deleted."""
        with self._locked():
            areas = self._areas(snapshot)
            if SCOPE not in areas:
                raise DriftError(f"snapshot {snapshot} holds no workspace tree")
            changed = self._restore_area(SCOPE, self.root, areas[SCOPE], paths)
            for rel in paths:
                name = area_name(rel)
                where = self.root / rel
                if name in areas:
                    where.mkdir(parents=True, exist_ok=True)
                    changed += self._restore_area(name, where, areas[name], ())
                elif where.is_symlink() or where.is_file():
                    where.unlink()
                    changed += 1
                elif where.exists():
                    changed += sum(1 for _ in where.rglob("*"))
                    shutil.rmtree(where)
            return changed

    def delta(self, before: str, after: str, limit: int) -> dict[str, Any]:
        """The files that differ between two snapshots: ``{"count", "changes": [{path,
        status (A/M/D/T), blob (the new content's git blob id, or None)}], "truncated"}``,
        at most ``limit`` changes listed (the trees hold them all)."""
        self._open()
        out = self._git(None, None, "diff-tree", "-r", "-z", "--no-renames", before, after)
        fields = out.split("\0")
        changes: list[dict[str, Any]] = []
        count = 0
        for i in range(0, len(fields) - 1, 2):
            meta, path = fields[i], fields[i + 1]
            parts = meta.lstrip(":").split(" ")
            if len(parts) < 5:
                continue
            count += 1
            if len(changes) >= limit:
                continue
            area, _, rest = path.partition("/")
            named = rest if area == SCOPE else f"{_area_path(area)}/{rest}"
            status = parts[4][:1]
            changes.append(
                {"path": named, "status": status, "blob": None if status == "D" else parts[3]}
            )
        return {"count": count, "changes": changes, "truncated": count > len(changes)}

    def blob_of(self, snapshot: str, paths: Sequence[str], rel: str) -> str | None:
        """The blob id of the regular file ``rel`` (relative to the root) in ``snapshot``
        (taken with the declared ``paths``): a restore puts it back so. None: not held."""
        area, inner = SCOPE, rel
        for declared in paths:
            if rel.startswith(declared.rstrip("/") + "/"):
                area, inner = area_name(declared), rel[len(declared.rstrip("/")) + 1 :]
        tree = self._areas(snapshot).get(area)
        if tree is None:
            return None
        listing = self._run(None, None, "ls-tree", "-z", tree, "--", inner)
        for line in _z(listing.stdout) if listing.returncode == 0 else ():
            meta, _, name = line.partition("\t")
            mode, kind, blob = meta.split(" ")
            if name == inner and kind == "blob" and mode in ("100644", "100755"):
                return blob
        return None

    def store_blob(self, path: Path) -> str:
        """Write a file into the store as a git blob; its id."""
        self._open()
        return self._git(None, None, "hash-object", "-w", "--no-filters", "--", str(path)).strip()

    def has(self, object_id: str) -> bool:
        self._open()
        return self._run(None, None, "cat-file", "-e", object_id).returncode == 0

    def read_blob(self, blob: str) -> bytes:
        self._open()
        result = subprocess.run(
            ["git", *self._config(), "cat-file", "blob", blob],
            env=self._env(None, None),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            raise PermanentError(f"blob {blob} is not in the shell store {self.store}")
        return result.stdout

    # -- areas ---------------------------------------------------------------

    def _area_tree(self, name: str, where: Path, excluded: Sequence[str]) -> str:
        index = self._index(name)
        exclude = [f":(exclude,literal){rel}" for rel in excluded]
        if name == SCOPE:
            added = self._run(where, index, "add", "-A", "--", ".", _TEMP_EXCLUDE, *exclude)
            # An excluded declared path that git ignores anyway makes git say so, exit 1,
            # and add everything else.
            if added.returncode != 0 and not (
                added.returncode == 1 and added.stderr.startswith(_IGNORED_NOTE)
            ):
                raise OSError(f"git add in the shell store failed: {shown(added.stderr, DETAIL)}")
            forced = self._tracked_but_ignored(excluded)
            if forced:
                self._git(where, index, "add", "-f", "--", *[f":(literal){p}" for p in forced])
        else:
            inner = [":(exclude)" + _STORE_DIRNAME] if self._inside(where) else []
            self._git(where, index, "add", "-A", "-f", "--", ".", *inner)
        known = _known_tree(index)
        if known is not None and self._loose(known):
            return known  # the index is the one that tree was written from: no git process
        tree = self._git(where, index, "write-tree").strip()
        _remember_tree(index, tree)
        return tree

    def _restore_area(self, name: str, where: Path, tree: str, excluded: Sequence[str]) -> int:
        index = self._index(name)
        if _known_tree(index) != tree:
            current = self._run(where, index, "write-tree")
            if current.returncode != 0 or current.stdout.strip() != tree:
                self._git(where, index, "read-tree", tree)
        self._run(where, index, "update-index", "-q", "--refresh")
        differ = _z(self._git(where, index, "diff-files", "--name-only", "-z"))
        ignores = [p for p in differ if p.rsplit("/", 1)[-1] == ".gitignore"]
        if ignores and name == SCOPE:  # the rules that decide what is "another file"
            self._checkout(where, index, ignores)
        others = ["ls-files", "-z", "--others"]
        if name == SCOPE:
            others += ["--exclude-standard", "--", ".", _TEMP_EXCLUDE]
            others += [f":(exclude,literal){rel}" for rel in excluded]
        elif self._inside(where):
            others += ["--", ".", ":(exclude)" + _STORE_DIRNAME]
        extra = _z(self._git(where, index, *others))
        for rel in extra:
            _remove(where, rel)
        if differ:
            self._checkout(where, index, differ)
        self._run(where, index, "update-index", "-q", "--refresh")
        _remember_tree(index, tree)  # the index holds that tree (a refresh changes no entry)
        return len(differ) + len(extra)

    def _checkout(self, where: Path, index: Path, paths: list[str]) -> None:
        for rel in paths:  # a directory where a file goes back (or the reverse)
            target = where / rel
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
        listing = "".join(p + "\0" for p in paths)
        self._git(where, index, "checkout-index", "-f", "-q", "-z", "--stdin", input=listing)

    def _tracked_but_ignored(self, excluded: Sequence[str]) -> list[str]:
        """Files the workspace's own repository tracks that an ignore rule matches, asked
        once per store object (and declared paths): a file once in the area's index stays
        there (``git add -A`` updates what it holds, ignored or not). One force-added in
        the workspace later joins at the next process's first snapshot."""
        if not (self.root / ".git").exists():
            return []
        key = tuple(excluded)
        if self._forced is not None and self._forced[0] == key:
            return []  # added then, and held by the area's index since
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_OPTIONAL_LOCKS="0")
        result = subprocess.run(
            ["git", "ls-files", "-z", "-c", "-i", "--exclude-standard"],
            cwd=self.root,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            return []
        listed = _z(result.stdout.decode("utf-8", "surrogateescape"))
        skip = tuple(rel.rstrip("/") + "/" for rel in excluded)
        forced = [p for p in listed if not p.startswith(skip) and os.path.lexists(self.root / p)]
        self._forced = (key, forced)
        return forced

    def _write_tree(self, entries: list[tuple[str, str]]) -> str:
        """The snapshot's top tree, written as a loose object (git's documented format:
        zlib of ``tree <size>\\0`` and ``40000 <name>\\0<binary id>`` per entry, in
        git's order): one subprocess fewer per snapshot."""
        ordered = sorted(entries, key=lambda e: e[0].encode() + b"/")
        body = b"".join(b"40000 " + n.encode() + b"\0" + bytes.fromhex(t) for n, t in ordered)
        raw = b"tree %d\0" % len(body) + body
        algorithm = "sha256" if len(ordered[0][1]) == 64 else "sha1"
        tree = hashlib.new(algorithm, raw).hexdigest()
        target = self.store / "objects" / tree[:2] / tree[2:]
        if not target.exists():
            target.parent.mkdir(exist_ok=True)
            temp = target.with_name(f"tmp_{tree[2:]}_{os.getpid()}")
            temp.write_bytes(zlib.compress(raw))
            os.replace(temp, target)
        return tree

    def _areas(self, snapshot: str) -> dict[str, str]:
        self._open()
        listing = self._run(None, None, "ls-tree", "-z", snapshot)
        if listing.returncode != 0:
            raise DriftError(
                f"snapshot {snapshot} is not in the shell store {self.store} (was it "
                "removed?): the workspace cannot be put back, nothing was run"
            )
        areas = {}
        for line in _z(listing.stdout):
            meta, _, name = line.partition("\t")
            areas[name] = meta.split(" ")[2]
        return areas

    def _loose(self, object_id: str) -> bool:
        """The object is in the store (as a loose object: the store is never packed)."""
        return (self.store / "objects" / object_id[:2] / object_id[2:]).is_file()

    def _inside(self, where: Path) -> bool:
        try:
            return self.store.resolve().parent == where.resolve()
        except OSError:
            return False

    # -- the store -----------------------------------------------------------

    def _open(self) -> None:
        if self._ready:
            return
        # ``indexes`` is made last: a store whose ``git init`` a crash cut short (a HEAD
        # but no refs/ or objects/ yet: "not a git repository" for ever after) is
        # initialised again, which is safe (init only adds what is missing). Under the
        # lock, as every git in the store: a killed runner's init still at work is
        # waited for, and a lock file one killed in the middle left (config.lock:
        # "could not lock config file", make chaos-short) is stale, and removed.
        if not (self.store / "indexes").is_dir():
            self.store.mkdir(parents=True, exist_ok=True)
            with self._flock():
                if not (self.store / "indexes").is_dir():  # not made by another meanwhile
                    for stale in self.store.glob("*.lock"):
                        if stale.name != _LOCK:
                            stale.unlink(missing_ok=True)
                    self._git(None, None, "init", "-q", "--bare", str(self.store))
                    (self.store / "indexes").mkdir(exist_ok=True)
        self._ready = True

    def _index(self, name: str) -> Path:
        return self.store / "indexes" / name.encode().hex()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One snapshot or restore at a time per store; a ``.lock`` git left when killed
        in an earlier one is stale under this lock, and removed.

        Every git process started under the lock inherits its descriptor (``_run``), so
        the lock is held until the last of them exits: a runner killed in the middle of
        a snapshot leaves its git running (SIGKILL does not reach a child), and the next
        snapshot waits for that git instead of taking its index.lock for a stale one and
        racing it (make chaos: "the snapshot store failed" after a recovery kill)."""
        self._open()
        with self._flock():
            for stale in (self.store / "indexes").glob("*.lock"):
                stale.unlink(missing_ok=True)
            yield

    @contextmanager
    def _flock(self) -> Iterator[None]:
        """The store's lock (``_locked``), its descriptor kept for the gits started under
        it (``_lock_fds``); a thread that holds it already goes on holding it."""
        if getattr(self._held, "fd", None) is not None:
            yield
            return
        fd = os.open(self.store / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._held.fd = fd
            yield
        finally:
            self._held.fd = None
            os.close(fd)

    def _config(self) -> list[str]:
        return [arg for option in _CONFIG for arg in ("-c", option)]

    def _env(self, where: Path | None, index: Path | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(
            LC_ALL="C",
            GIT_DIR=str(self.store),
            GIT_CONFIG_GLOBAL=os.devnull,
            GIT_CONFIG_NOSYSTEM="1",
            GIT_TERMINAL_PROMPT="0",
        )
        if where is not None:
            env["GIT_WORK_TREE"] = str(where)
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        return env

    def _run(
        self, where: Path | None, index: Path | None, *args: str, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        config = self._config()
        exclude = _repo_exclude(self.root)
        if where == self.root and exclude is not None:
            config += ["-c", f"core.excludesFile={exclude}"]
        return subprocess.run(
            ["git", *config, *args],
            cwd=where or self.store,
            env=self._env(where, index),
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            capture_output=True,
            encoding="utf-8",
            errors="surrogateescape",
            timeout=_TIMEOUT,
            check=False,
            pass_fds=self._lock_fds(),
        )

    def _lock_fds(self) -> tuple[int, ...]:
        """shell.lock's descriptor for a git process started while this thread holds it."""
        fd: int | None = getattr(self._held, "fd", None)
        return () if fd is None else (fd,)

    def _git(
        self, where: Path | None, index: Path | None, *args: str, input: str | None = None
    ) -> str:
        result = self._run(where, index, *args, input=input)
        if result.returncode != 0:
            raise OSError(
                f"git {args[0]} in the shell store failed: {shown(result.stderr, DETAIL)}"
            )
        return result.stdout


def _repo_exclude(root: Path) -> str | None:
    """The workspace repository's ``info/exclude`` (its rules apply to the scope)."""
    try:
        store = default_store(root)
    except (PermanentError, OSError):
        return None
    exclude = store.parent / "info" / "exclude"
    return str(exclude) if exclude.is_file() else None


# The tree an area's index was last written as, keyed by a digest of what the index's
# entries say of the tree (mode, object id, flags, path: not the stat data): a snapshot
# whose ``git add -A`` left those as they were skips ``write-tree``, the second git
# process of every snapshot. Not the file's checksum: an add that re-hashes a racily
# clean file, or a refresh, rewrites the stat data and drops the cache tree, the tree
# unchanged. A stale or torn note never matches; an index of another format is not noted.
def _entries_digest(index: Path) -> str | None:
    try:
        data = index.read_bytes()
    except OSError:
        return None
    if len(data) < 32 or data[:4] != b"DIRC":
        return None
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3):  # 4 compresses paths; the store writes 2 (3 with flags)
        return None
    view = memoryview(data)
    digest = hashlib.sha1(view[:12])
    offset = 12
    for _ in range(count):  # git's index-format: 62 bytes (64 extended), path, padding
        if offset + 62 > len(data):
            return None
        flags = int.from_bytes(view[offset + 60 : offset + 62], "big")
        head = 64 if flags & 0x4000 else 62
        length = flags & 0xFFF
        if length == 0xFFF:
            length = data.find(b"\0", offset + head) - offset - head
            if length < 0:
                return None
        digest.update(view[offset + 24 : offset + 28])  # mode
        digest.update(view[offset + 40 : offset + head + length])  # id, flags, path
        offset += (head + length + 8) & ~7
    return digest.hexdigest() if offset <= len(data) - 20 else None


def _known_tree(index: Path) -> str | None:
    digest = _entries_digest(index)
    try:
        note = index.with_name(index.name + ".tree").read_text().split()
    except OSError:
        return None
    if digest is None or len(note) != 2 or note[0] != digest:
        return None
    return note[1]


def _remember_tree(index: Path, tree: str) -> None:
    digest = _entries_digest(index)
    note = index.with_name(index.name + ".tree")
    if digest is None:
        note.unlink(missing_ok=True)
        return
    temp = note.with_name(note.name + ".tmp")
    temp.write_text(f"{digest} {tree}\n")
    os.replace(temp, note)


def _z(text: str) -> list[str]:
    return [item for item in text.split("\0") if item]


def _remove(where: Path, rel: str) -> None:
    """Delete a file the snapshot does not hold (a nested repository: its directory),
    then the directories above it that it left empty, up to ``where``."""
    target = where / rel.rstrip("/")
    if rel.endswith("/") and target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    else:
        try:
            target.unlink()
        except FileNotFoundError:
            return
    parent = target.parent
    while parent != where and parent.is_relative_to(where):
        try:
            parent.rmdir()
        except OSError:
            return
        parent = parent.parent


def check_relative(path: Any, what: str) -> str:
    """A relative POSIX path inside the workspace (no ``..``), normalized."""
    if not isinstance(path, str) or not path:
        raise PermanentError(f"shell {what} must be a non-empty relative path, not {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise PermanentError(f"shell {what} {path!r} leaves the workspace")
    return pure.as_posix()


def env_digest(env: Mapping[str, str]) -> str:
    """SHA-256 of the command's environment (sorted name/value pairs, as JSON)."""
    text = json.dumps(sorted(env.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
