"""What a ``cp.Shell`` snapshot and restore cost, beside a ``git status`` of the same tree.

For workspaces of 1,000 and 10,000 files (a git repository, 100 files per directory,
committed), measured interleaved, median of ``--repeats`` rounds:

- ``git status``: the workspace repository's own ``git status --porcelain`` (warm);
- ``snapshot``: ``SnapshotStore.snapshot`` with nothing changed since the last one (warm:
  its own index, as git's, re-hashes nothing), what every ``cp.Shell`` act pays twice;
- ``snapshot, 1% changed``: after 1% of the files were rewritten;
- ``restore``: after a half-run changed 1% of the files, added 1% and deleted 1%;
- ``first snapshot``: once, cold (every file hashed into the store).

Goal (#44): a snapshot costs at most 1.5x a ``git status``.

    .venv/bin/python bench/shell.py [--repeats 7] [--sizes 1000,10000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import load_average, machine_facts, print_facts, print_table

from crashproof.tools._snapshot import SnapshotStore

ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@localhost",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@localhost",
}


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, env=ENV, check=True, capture_output=True, text=True
    ).stdout


def make_tree(root: Path, n: int) -> list[Path]:
    files = []
    for i in range(n):
        path = root / f"pkg_{i // 100:03d}" / f"mod_{i % 100:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {i}\n" + "# filler line\n" * 20)
        files.append(path)
    (root / ".gitignore").write_text("build/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "tree")
    return files


def timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def bench(directory: Path, n: int, repeats: int) -> list[str]:
    root = directory / f"ws{n}"
    root.mkdir()
    files = make_tree(root, n)
    store = SnapshotStore(root, root / ".git" / "crashproof-shell")
    first = timed(lambda: store.snapshot([]))
    status, snap, snap_changed, restore = [], [], [], []
    step = 100  # 1% of the files
    for r in range(repeats):
        status.append(timed(lambda: git(root, "status", "--porcelain")))
        snap.append(timed(lambda: store.snapshot([])))
        for path in files[r % step :: step]:
            path.write_text(path.read_text() + f"# round {r}\n")
        snap_changed.append(timed(lambda: store.snapshot([])))
        base = store.snapshot([])
        # a half-run: 1% rewritten, 1% added, 1% deleted
        for path in files[(r + 1) % step :: step]:
            path.write_text("half-written\n")
        for i in range(n // 100):
            (root / f"pkg_{i:03d}" / f"new_{r}.py").write_text("new\n")
        deleted = files[(r + 2) % step :: step]
        for path in deleted:
            path.unlink()
        restore.append(timed(lambda base=base: store.restore(base, [])))
        if any(not path.exists() for path in deleted):
            raise SystemExit("restore did not put the deleted files back")
    git(root, "status", "--porcelain")
    med = statistics.median
    return [
        f"{n:,}",
        f"{med(status) * 1e3:.1f}",
        f"{med(snap) * 1e3:.1f}",
        f"{med(snap) / med(status):.2f}x",
        f"{med(snap_changed) * 1e3:.1f}",
        f"{med(restore) * 1e3:.1f}",
        f"{first * 1e3:.0f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", default="1000,10000")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="bench-shell-"))
    try:
        print_facts(machine_facts(directory))
        print(f"load average at start: {load_average()}")
        rows = [bench(directory, int(n), args.repeats) for n in args.sizes.split(",")]
        print_table(
            [
                "files",
                "git status ms",
                "snapshot ms",
                "snapshot/status",
                "snapshot, 1% changed ms",
                "restore ms",
                "first snapshot ms",
            ],
            rows,
        )
        print(f"load average at end: {load_average()}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
