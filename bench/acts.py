"""Acts per second with a no-op tool, against two raw WAL/FULL commits per act; and what a
resume pays to re-read the receipts of N completed acts over HTTP.

Part 1 (acts): an act costs two journal commits (the intent before the effect, the
receipt after), so its natural limit is half the raw single-row commit rate. Printed side
by side, measured in one run on the same disk: raw commits/s, acts/s, and the ratio
acts/s / (raw commits/s / 2) (goal >= 0.5).

Part 2 (re-read): every resume looks the completed acts of tools that support lookup up
again before its first live call, or before its outcome when nothing runs live
(``runtime/steps/reconcile.py``). A run of N ``ctx.act("create", HttpTool(...),
body={"i": i})`` calls and one final ``ctx.step`` crashes just before its run_succeeded
commit (``CrashPoints(match="before_commit[run_succeeded]")``, in process); then a new
Ledger times ``resume`` on a fresh copy of the crashed file, interleaved:

- **re-read**: with ``HttpTool`` as it is: N ``GET /by-key/<key>`` re-reads, each
  compared with the journal's receipt, ``ActSettings.reread_workers`` (8) at a time;
- **none**: with a subclass that sets ``reread_receipts = False``: no request at all;
- **1 worker** (largest N only, ``--compare-workers 1``): re-read, ``reread_workers=1``.

The target is a ``ThreadingHTTPServer`` on 127.0.0.1 in this process (HTTP/1.1,
keep-alive): it stores one resource per ``Idempotency-Key`` on POST and answers
``GET /by-key/<key>`` with it and its ``Crashproof-Intent-Digest``. It shares this
process's GIL and the machine's cores with the resume, so its own work per request is
part of the cost measured (its handlers' CPU is printed apart); a remote target adds its
network round trips, which ``--target-latency-ms`` simulates (a sleep before every
answer: where ``reread_workers`` pays).

Usage: python bench/acts.py [--acts 1000] [--repeats 3] [--dir DIR] [--skip-acts]
       [--reread-sizes 10,100,1000] [--reread-repeats 7] [--compare-workers 1]
       [--target-latency-ms 0] [--skip-reread]
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote

import _common as common

import crashproof as cp
from crashproof.runtime.port import ActSettings
from crashproof.tools.http import HttpTool

# -- part 1: acts/s against raw commits ---------------------------------------


def crashproof_acts(directory: Path, n: int, tag: str) -> float:
    path = directory / f"acts-{tag}.db"
    ledger = cp.Ledger(f"sqlite:///{path}")
    tool = common.NoOp()

    @ledger.workflow("bench-acts", version="1")
    def acts(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            ctx.act("act", tool, i=i)
        return n

    return common.timed_run(ledger, acts, path, n, tag)


def measure_acts(directory: Path, n: int, repeats: int) -> None:
    print(f"\npart 1: {n:,} acts (intent + receipt commits) vs {2 * n:,} raw commits\n")
    results = common.interleaved(
        repeats,
        {
            "raw": lambda tag: common.raw_commits(directory, 2 * n, "FULL", tag),
            "acts": lambda tag: crashproof_acts(directory, n, tag),
        },
    )
    raw, acts = common.median(results["raw"]), common.median(results["acts"])
    common.print_table(
        ["measure", "median/s", "runs"],
        [
            ["raw WAL/FULL commits", common.fmt_rate(raw), common.fmt_runs(results["raw"])],
            [
                "crashproof acts (no-op tool)",
                common.fmt_rate(acts),
                common.fmt_runs(results["acts"]),
            ],
        ],
    )
    print(f"\nratio acts/s / (commits/s / 2) = {acts / (raw / 2):.2f}  (goal >= 0.5)")


# -- part 2: the re-read of N receipts on resume ------------------------------

COLLECTION = "/resources"
BY_KEY = "/by-key/"
DIGEST_HEADER = "Crashproof-Intent-Digest"


def _key(header: str | None) -> str | None:
    """An ``Idempotency-Key`` header: an RFC 8941 sf-string (as HttpTool sends it)."""
    if not header:
        return None
    if len(header) >= 2 and header[0] == header[-1] == '"':
        out, chars = [], iter(header[1:-1])
        for ch in chars:
            out.append(next(chars, "") if ch == "\\" else ch)
        return "".join(out)
    return header


class Target:
    """A minimal idempotent HTTP target on 127.0.0.1 (a free port), served from a thread:
    ``POST /resources`` creates one resource per key (a repeated key gets the stored one),
    ``GET /by-key/<percent-encoded key>`` answers 200 with it, or 404. Both echo the
    stored intent digest. Counts the requests it answers, per method."""

    def __init__(self, latency: float = 0.0) -> None:
        self.latency = latency  # seconds each answer waits (a network round trip), or 0
        self.lock = threading.Lock()
        self.resources: dict[str, tuple[str, bytes]] = {}  # key -> (digest, JSON text)
        self.counts = {"GET": 0, "POST": 0}
        self.cpu = 0.0  # CPU seconds of the handler threads (parse, answer, send)
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as httpx's pool expects
            # Headers and body leave in two writes: with Nagle's algorithm on, the body
            # waits for the client's delayed ACK of the headers, ~40 ms a request.
            disable_nagle_algorithm = True

            def handle_one_request(self) -> None:
                start = time.thread_time()
                try:
                    super().handle_one_request()
                finally:
                    spent = time.thread_time() - start
                    with target.lock:
                        target.cpu += spent

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = _key(self.headers.get("Idempotency-Key"))
                digest = self.headers.get(DIGEST_HEADER)
                if self.path != COLLECTION or key is None or not digest:
                    self.reply(400, b'{"title": "bad request"}', None)
                    return
                with target.lock:
                    target.counts["POST"] += 1
                    stored = target.resources.get(key)
                    if stored is None:
                        resource = {
                            "id": f"res-{len(target.resources) + 1}",
                            "idempotency_key": key,
                            "intent_digest": digest,
                            "body": json.loads(raw) if raw else None,
                        }
                        stored = target.resources[key] = (digest, json.dumps(resource).encode())
                        status = 201
                    elif stored[0] == digest:
                        status = 200
                    else:
                        self.reply(422, b'{"title": "key used"}', stored[0])
                        return
                self.reply(status, stored[1], stored[0])

            def do_GET(self) -> None:
                if not self.path.startswith(BY_KEY):
                    self.reply(404, b'{"title": "no route"}', None)
                    return
                key = unquote(self.path[len(BY_KEY) :])
                with target.lock:
                    target.counts["GET"] += 1
                    stored = target.resources.get(key)
                if stored is None:
                    self.reply(404, b'{"title": "no resource"}', None)
                else:
                    self.reply(200, stored[1], stored[0])

            def reply(self, status: int, data: bytes, digest: str | None) -> None:
                if target.latency:
                    time.sleep(target.latency)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if digest is not None:
                    self.send_header(DIGEST_HEADER, digest)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            # socketserver's default backlog of 5 can overflow when the re-read's workers
            # connect at once: a dropped SYN is sent again after 1 s.
            request_queue_size = 128

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> Target:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def gets(self) -> tuple[int, float]:
        """GET requests answered so far, and the handlers' CPU seconds."""
        with self.lock:
            return self.counts["GET"], self.cpu


class NoRereadHttpTool(HttpTool):
    """The same tool (name, version, intent digests), opted out of the resume's re-read."""

    reread_receipts: ClassVar[bool] = False


def http_tool(url: str, *, reread: bool) -> HttpTool:
    kind = HttpTool if reread else NoRereadHttpTool
    return kind(url, COLLECTION, lookup_path=BY_KEY + "{operation_id}")


def make_http_workflow(ledger: cp.Ledger, tool: HttpTool) -> cp.Workflow[int]:
    """``n`` HTTP creates, then one step (the run's last record before its outcome)."""

    @ledger.workflow("bench-reread", version="1")
    def creates(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            ctx.act("create", tool, body={"i": i})
        return int(ctx.step("last", common.work, n)["i"])

    return creates


def run_id_of(n: int) -> str:
    return f"bench:reread:{n}"


def build_crashed_http_run(path: Path, url: str, n: int) -> float:
    """A run of ``n`` HTTP acts that crashes just before its run_succeeded commit (the
    ledger closed as the process would not); returns the seconds it took."""
    crash = cp.CrashPoints(match="before_commit[run_succeeded]")
    ledger = cp.Ledger(f"sqlite:///{path}", crash_points=crash)
    tool = http_tool(url, reread=True)
    start = time.perf_counter()
    try:
        ledger.run(make_http_workflow(ledger, tool), run_id=run_id_of(n), n=n)
    except cp.SimulatedCrash:
        pass
    else:
        raise SystemExit("the crash point did not fire; the run completed")
    finally:
        ledger.close()
        tool.close()
    return time.perf_counter() - start


def fresh_copy(source: Path, copy: Path) -> None:
    """The crashed file (closed: its WAL is checkpointed) and its generation witness."""
    common.remove_db(copy)
    shutil.copyfile(source, copy)
    shutil.copyfile(f"{source}.witness", f"{copy}.witness")


class Resumes:
    """One resume per call on a fresh copy of one crashed run; keeps the CPU seconds of
    each (this process, every thread: the target's handlers included) beside its wall
    time, and checks that the resume made exactly the re-reads it should."""

    def __init__(self, directory: Path, target: Target, source: Path, n: int) -> None:
        self.directory, self.target, self.source, self.n = directory, target, source, n
        self.cpu: dict[str, list[float]] = {}
        self.served: dict[str, list[float]] = {}  # the target's share of that CPU

    def measure(self, name: str, *, reread: bool, workers: int) -> Callable[[str], float]:
        self.cpu[name], self.served[name] = [], []

        def resume(tag: str) -> float:
            copy = self.directory / f"reread-{self.n}-{tag}.db"
            fresh_copy(self.source, copy)
            ledger = cp.Ledger(
                f"sqlite:///{copy}", act_settings=ActSettings(reread_workers=workers)
            )
            tool = http_tool(self.target.url, reread=reread)
            try:
                make_http_workflow(ledger, tool)
                gets, served = self.target.gets()
                cpu = time.process_time()
                start = time.perf_counter()
                result = ledger.resume(run_id_of(self.n))
                elapsed = time.perf_counter() - start
                spent = time.process_time()
                after, served_after = self.target.gets()
                gets, served = after - gets, served_after - served
                info = ledger.get_run(run_id_of(self.n))
            finally:
                ledger.close()
                tool.close()
            common.remove_db(copy)
            if result != self.n or info.status is not cp.RunStatus.SUCCEEDED:
                raise SystemExit(f"resume of {self.n} acts: {result!r}, {info.status}")
            if gets != (self.n if reread else 0):
                raise SystemExit(f"resume of {self.n} acts ({name}) made {gets} lookups")
            self.cpu[name].append(spent - cpu)
            self.served[name].append(served)
            return elapsed

        return resume


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def reread_row(resumes: Resumes, got: dict[str, list[float]], name: str, workers: int) -> list[str]:
    """One line of the table: measure ``name`` (a re-read) against "none", same rounds."""
    n = resumes.n
    with_, without = common.median(got[name]), common.median(got["none"])
    per = lambda values: common.median(values) / n * 1e6  # noqa: E731  # µs per receipt
    diffs = [a - b for a, b in zip(got[name], got["none"], strict=True)]
    cpu = [a - b for a, b in zip(resumes.cpu[name], resumes.cpu["none"], strict=True)]
    return [
        f"{n:,}",
        str(workers),
        fmt_ms(with_),
        fmt_ms(without),
        fmt_ms(with_ - without),
        f"{per(diffs):,.0f}",
        f"{per(cpu):,.0f}",
        f"{per(resumes.served[name]):,.0f}",
        f"{with_ / without:.1f}",
    ]


def measure_reread(
    directory: Path, sizes: list[int], repeats: int, compare_workers: int, latency_ms: float
) -> None:
    print(
        f"\npart 2: resume of a crashed run of N completed HTTP acts, re-read vs not, "
        f"{repeats} interleaved rounds, medians"
    )
    if latency_ms:
        print(f"  every answer of the target waits {latency_ms:g} ms (a simulated round trip)")
    rows: list[list[str]] = []
    runs: list[str] = []
    with Target(latency_ms / 1e3) as target:
        print(f"  target {target.url} (ThreadingHTTPServer in this process)")
        for n in sizes:
            source = directory / f"reread-source-{n}.db"
            built = build_crashed_http_run(source, target.url, n)
            print(f"  built a crashed run of {n:,} HTTP acts in {built:.2f} s")
            resumes = Resumes(directory, target, source, n)
            workers = ActSettings().reread_workers
            measures = {
                "reread": resumes.measure("reread", reread=True, workers=workers),
                "none": resumes.measure("none", reread=False, workers=workers),
            }
            if compare_workers and n == max(sizes):
                measures["workers"] = resumes.measure(
                    "workers", reread=True, workers=compare_workers
                )
            got = common.interleaved(repeats, measures)
            rows.append(reread_row(resumes, got, "reread", workers))
            if "workers" in got:
                rows.append(reread_row(resumes, got, "workers", compare_workers))
            for name, values in got.items():
                runs.append(f"  N={n:,} {name}: {' / '.join(fmt_ms(v) for v in values)} ms")
    print()
    common.print_table(
        [
            "N",
            "workers",
            "re-read ms",
            "none ms",
            "diff ms",
            "µs/receipt",
            "CPU µs/receipt",
            "of which target",
            "re-read/none",
        ],
        rows,
    )
    print(
        "\nms: medians of the resumes; µs/receipt: median of the rounds' (re-read - none),"
        "\nwall and CPU (this process, all threads), / N; of which target: the HTTP"
        "\nhandlers' CPU per re-read"
    )
    print("\nrounds (wall ms):")
    print("\n".join(runs))


def parse_sizes(text: str) -> list[int]:
    sizes = sorted({int(part.replace("_", "")) for part in text.split(",") if part.strip()})
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive integers, not {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acts", type=int, default=1000, help="acts per run (1000)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions, median kept (3)")
    parser.add_argument("--dir", default=None, help="parent of the temp dir (default: $TMPDIR)")
    parser.add_argument("--skip-acts", action="store_true", help="skip part 1 (acts/s)")
    parser.add_argument(
        "--reread-sizes",
        type=parse_sizes,
        default=[10, 100, 1000],
        help="completed acts per resumed run, comma-separated (10,100,1000)",
    )
    parser.add_argument(
        "--reread-repeats", type=int, default=7, help="resume rounds per size, median kept (7)"
    )
    parser.add_argument(
        "--compare-workers",
        type=int,
        default=1,
        help="also re-read the largest size with this many workers (1; 0: not)",
    )
    parser.add_argument(
        "--target-latency-ms",
        type=float,
        default=0.0,
        help="the target waits this long before every answer (0)",
    )
    parser.add_argument("--skip-reread", action="store_true", help="skip part 2 (re-read)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args(argv)
    directory = common.make_tempdir(args.dir)
    try:
        print("crashproof bench: acts vs raw commits; the resume's re-read of receipts")
        common.print_facts(common.machine_facts(directory))
        if not args.skip_acts:
            measure_acts(directory, args.acts, args.repeats)
        if not args.skip_reread:
            measure_reread(
                directory,
                args.reread_sizes,
                args.reread_repeats,
                args.compare_workers,
                args.target_latency_ms,
            )
        print(f"\nload avg at end: {common.load_average()}")
    finally:
        if args.keep:
            print(f"\nkept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    with common.exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
