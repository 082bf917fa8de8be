"""The release check (`make package`, run by .ci/run): what a user installs works.

1. `python -m build` makes the sdist and the wheel; the wheel is pure (py3-none-any:
   no .so, no .c), the sdist carries the C sources.
2. The wheel goes into a clean virtualenv on each of Python 3.11, 3.12 and 3.13, with
   no C compiler on PATH and CC=/bin/false; in each: `import crashproof`,
   `crashproof --version`, `python -m crashproof --version`, `crashproof --help`, and a
   workflow on a SQLite ledger, SIGKILLed mid-run and resumed in a new process.
3. The sdist, on one of them: installed without a compiler ($CRASHPROOF_NATIVE=auto falls
   back to pure Python and works), and with one (the native seal is built and used).

The interpreters are found under pyenv, on PATH or in /usr/bin; a missing one is
installed with apt-get (Debian's python3.X and python3.X-venv) where that is possible,
and otherwise the check fails, naming it. Prints the seconds each part took.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("3.11", "3.12", "3.13")
KEY = "5e" * 32  # the smoke ledger's signing key (a throwaway)

# A workflow on SQLite: a step, SIGKILL, then a new process resumes; the step that was
# recorded does not run again.
SMOKE = """
import json, os, signal, sys
from pathlib import Path
import crashproof as cp

db, mode = Path(sys.argv[1]), sys.argv[2]
calls = db.with_suffix(".calls")
ledger = cp.Ledger(f"sqlite:///{db}")

def effect(n):
    with calls.open("a") as f:
        f.write(f"{n}\\n")
    return n * 2

@ledger.workflow("smoke", version="1")
def smoke(ctx, n):
    a = ctx.step("double", effect, n)
    if mode == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"a": a, "b": ctx.step("again", effect, a)}

if mode == "crash":
    ledger.run(smoke, run_id="smoke-1", n=21)
else:
    print(json.dumps(ledger.resume("smoke-1")))
"""


class Failed(Exception):
    pass


def sh(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Failed(
            f"exit {done.returncode}: {' '.join(cmd)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done.stdout


def find_python(version: str) -> str | None:
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}"))
    candidates += [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    for path in candidates:
        # ensurepip for `python -m venv` (Debian's python3.X needs python3.X-venv); uv's
        # venvs do without it
        check = [path, "-c", "import sqlite3" if UV else "import ensurepip, sqlite3, venv"]
        if os.access(path, os.X_OK) and subprocess.run(check, capture_output=True).returncode == 0:
            return path
    return None


def install_python(version: str) -> str | None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None
    print(f"python{version} missing: apt-get install python{version} python{version}-venv")
    debian_names = [f"python{version}", f"python{version}-venv"]
    subprocess.run(["apt-get", "update", "-qq"], check=False)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *debian_names],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        check=False,
    )
    return find_python(version)


def no_compiler_env(venv: Path) -> dict[str, str]:
    """PATH with the venv and the basic tools only, and CC=/bin/false: no C compiler."""
    bare = venv.parent / f"{venv.name}-tools"  # removed with the check's temp directory
    bare.mkdir()
    for tool in ("sh", "uname", "ls", "cat"):  # what pip and setuptools may shell out to
        found = shutil.which(tool)
        if found:
            (bare / tool).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRASHPROOF", "PYTHON"))}
    env.update(PATH=f"{venv / 'bin'}:{bare}", CC="/bin/false", CXX="/bin/false")
    for compiler in ("gcc", "cc", "clang"):
        if shutil.which(compiler, path=env["PATH"]):
            raise Failed(f"{compiler} is still on the no-compiler PATH")
    return env


# uv (a dev dependency) makes a venv in milliseconds and installs from its cache: the
# three venvs cost seconds instead of minutes; pip and venv where it is missing.
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def install_sdist(venv: Path, sdist: Path, env: dict[str, str]) -> None:
    """Built anew each time: a cache would hand back its first build, whatever the
    compiler and $CRASHPROOF_NATIVE were then."""
    if UV:
        sh([UV, "cache", "clean", "--quiet", "crashproof"])
        pip_install(venv, [str(sdist)], env)
    else:
        pip_install(venv, ["--no-cache-dir", str(sdist)], env)


def make_venv(python: str, where: Path) -> Path:
    if UV:
        sh([UV, "venv", "--quiet", "--python", python, str(where)])
    else:
        sh([python, "-m", "venv", str(where)])
    return where


def pip_install(venv: Path, what: list[str], env: dict[str, str]) -> None:
    py = str(venv / "bin" / "python")
    if UV:
        sh([UV, "pip", "install", "--quiet", "--python", py, *what], env=env)
    else:
        sh([py, "-m", "pip", "install", "--quiet", *what], env=env)


def check_install(venv: Path, env: dict[str, str], version: str, native: bool) -> None:
    """What a user does first, in this venv; `native`: whether the C seal must be in use."""
    py = str(venv / "bin" / "python")
    env = {**env, "CRASHPROOF_KEY": KEY}
    shown = json.loads(
        sh(
            [
                py,
                "-c",
                "import json, sys, crashproof as cp; from crashproof.integrity import seal;"
                "print(json.dumps([cp.__version__, sys.version[:4], seal.NATIVE, cp.__file__]))",
            ],
            env=env,
        )
    )
    if shown[0] != version or shown[2] is not native or not shown[3].startswith(str(venv)):
        raise Failed(f"import crashproof in {venv}: {shown}, wanted {version}, native={native}")
    for cmd in ([str(venv / "bin" / "crashproof")], [py, "-m", "crashproof"]):
        out = sh([*cmd, "--version"], env=env)
        if not out.startswith(f"crashproof {version} (Python {shown[1]}"):
            raise Failed(f"{' '.join(cmd)} --version printed {out!r}")
    if "Usage" not in sh([str(venv / "bin" / "crashproof"), "--help"], env=env):
        raise Failed("crashproof --help printed no usage")
    with tempfile.TemporaryDirectory(prefix="crashproof-smoke-") as tmp:
        script, db = Path(tmp) / "smoke.py", Path(tmp) / "runs.db"
        script.write_text(SMOKE)
        crashed = subprocess.run([py, str(script), str(db), "crash"], env=env, check=False)
        if crashed.returncode != -9:
            raise Failed(f"the smoke workflow was to die by SIGKILL: {crashed.returncode}")
        result = json.loads(sh([py, str(script), str(db), "resume"], env=env))
        calls = (Path(tmp) / "runs.calls").read_text().split()
        if result != {"a": 42, "b": 84} or calls != ["21", "42"]:
            raise Failed(f"smoke workflow: result {result}, calls {calls}")
        sh([str(venv / "bin" / "crashproof"), "show", "smoke-1", "--db", f"sqlite:///{db}"], env)


def timed(label: str, started: float) -> float:
    now = time.monotonic()
    print(f"  {now - started:5.1f} s  {label}", flush=True)
    return now


def main() -> int:
    version = sh(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, 'src');"
            "from crashproof._version import __version__ as v; print(v)",
        ],
        cwd=ROOT,
    ).strip()
    began = t = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="crashproof-package-") as tmp_name:
        tmp = Path(tmp_name)
        dist = tmp / "dist"
        # CRASHPROOF_NATIVE unset: what a release builds (setup.py's default is pure)
        env = {k: v for k, v in os.environ.items() if k != "CRASHPROOF_NATIVE"}
        sh([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], env=env)
        wheel = dist / f"crashproof-{version}-py3-none-any.whl"
        sdist = dist / f"crashproof-{version}.tar.gz"
        if not wheel.exists() or not sdist.exists():
            raise Failed(f"python -m build made {sorted(p.name for p in dist.iterdir())}")
        inside = zipfile.ZipFile(wheel).namelist()
        stray = [n for n in inside if n.endswith((".so", ".c", ".pyd"))]
        if stray or f"crashproof-{version}.dist-info/licenses/LICENSE" not in inside:
            raise Failed(f"the wheel has {stray} or lacks its LICENSE")
        with tarfile.open(sdist) as archive:
            sources = archive.getnames()
        for c in ("src/crashproof/integrity/_seal.c", "src/crashproof/cli/_sigbus.c", "LICENSE"):
            if f"crashproof-{version}/{c}" not in sources:
                raise Failed(f"the sdist lacks {c}")
        t = timed(f"python -m build: {sdist.name}, {wheel.name}", t)

        pythons = {}
        for v in VERSIONS:
            pythons[v] = find_python(v) or install_python(v)
            if pythons[v] is None:
                raise Failed(f"no Python {v} here, and apt-get could not install it")

        for v, python in pythons.items():
            venv = make_venv(python, tmp / f"wheel-{v}")
            bare = no_compiler_env(venv)
            pip_install(venv, [str(wheel)], bare)
            check_install(venv, bare, version, native=False)
            t = timed(f"Python {v} ({python}): the wheel, no compiler", t)

        # The sdist on the newest: with no compiler the native build falls back cleanly.
        newest = pythons[VERSIONS[-1]]
        venv = make_venv(newest, tmp / "sdist-nocc")
        bare = {**no_compiler_env(venv), "CRASHPROOF_NATIVE": "auto"}
        install_sdist(venv, sdist, bare)
        check_install(venv, bare, version, native=False)
        t = timed(f"Python {VERSIONS[-1]}: the sdist, no compiler (CRASHPROOF_NATIVE=auto)", t)
        if shutil.which("gcc") and Path("/usr/include/openssl/sha.h").exists():
            venv = make_venv(newest, tmp / "sdist-cc")
            full = {**env, "CRASHPROOF_NATIVE": "1", "PATH": f"{venv / 'bin'}:{env['PATH']}"}
            install_sdist(venv, sdist, full)
            check_install(venv, full, version, native=True)
            t = timed(f"Python {VERSIONS[-1]}: the sdist, gcc (CRASHPROOF_NATIVE=1)", t)
        else:
            print("  (no gcc or OpenSSL headers: the sdist's native build was not tried)")
    print(f"package check passed in {time.monotonic() - began:.1f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as exc:
        print(f"package check FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
