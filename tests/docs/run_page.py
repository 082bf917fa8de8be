"""Runs one documentation page's code blocks as a reader would, in this process's
working directory (the test gives it a fresh one, a HOME of its own and the model
server's address): ``python run_page.py PAGE``. Exit 0 when every block ran; else the
failing block's page and line, and its traceback, on stderr, and exit 1.

Python blocks share one module namespace (a real module in ``sys.modules``, so type
hints and pickling-free schema generation find the page's names) and may ``await`` at
top level, all on one event loop; shell blocks run in bash. See pages.py for the rules.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import subprocess
import sys
import traceback
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from pages import SHELLS, blocks


def run(page: Path) -> int:
    module = types.ModuleType("docs_page")
    module.__file__ = str(Path.cwd() / "docs_page.py")
    sys.modules["docs_page"] = module
    sys.path.insert(0, str(Path.cwd()))  # files the page saved import as a reader's would
    loop = asyncio.new_event_loop()
    for block in blocks(page):
        where = f"{page}:{block.line}"
        if block.lang == "python" and block.title:
            Path(block.title).write_text(block.code, encoding="utf-8")
        elif block.lang == "python":
            # blank lines first: a traceback's line numbers are the page's own
            source = "\n" * (block.line - 1) + block.code
            try:
                code = compile(source, str(page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                if code.co_flags & inspect.CO_COROUTINE:
                    loop.run_until_complete(eval(code, module.__dict__))
                else:
                    exec(code, module.__dict__)
            except BaseException:
                sys.stderr.write(f"{where}: this python block failed\n")
                traceback.print_exc()
                return 1
        elif block.lang in SHELLS and block.not_run is None:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.code],
                capture_output=True,
                text=True,
                timeout=240,
            )
            sys.stdout.write(done.stdout)
            if done.returncode != 0:
                sys.stderr.write(
                    f"{where}: this shell block exited {done.returncode}\n{done.stderr}"
                )
                return 1
    loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(run(Path(sys.argv[1])))
