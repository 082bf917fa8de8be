"""Screenshots of the built site (``mkdocs build`` first): its front page and one
reference page, in headless Chromium (Debian's ``chromium`` through Playwright, as
bench/console_screenshots.py drives it), written to docs/images/.

    .venv/bin/python docs_build/screenshots.py [--site site] [--out docs/images]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

PAGES = {
    "site-home.png": "/",
    "site-reference-cli.png": "/reference/cli/",
    "site-reference-api.png": "/reference/api/",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=Path("site"))
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    options = parser.parse_args()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(options.site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{server.server_address[1]}"
    binary = next(p for p in map(shutil.which, ("chromium", "chromium-browser")) if p)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=binary, headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for name, path in PAGES.items():
                page.goto(root + path, wait_until="networkidle")
                page.screenshot(path=str(options.out / name))
                print(options.out / name)
            browser.close()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
