"""What each hand-built JSON text buys a whole run, against codec.encode/canonical_digest.

    .venv/bin/python bench/handbuilt.py [--steps 2000] [--acts 500] [--replay-steps 20000]
                                        [--replay-acts 5000] [--loops 20000] [--repeats 15]
                                        [--dir /tmp]

Several hot paths build a record's stored JSON text (or a digest's canonical text) by
hand instead of calling ``codec.encode`` / ``canonical_digest``. The rule: a hand-built
text stays only where a whole run shows it still buys >= 5 %. For each kept site, in one
run:

(a) whole runs on the real path, durability ``output``, a fresh SQLite ledger each:
    N ``ctx.step`` calls, N ``ctx.decide`` calls returning a ``cp.Decision`` (model, usage,
    cost), M ``ctx.act`` calls with a no-op tool, and the resume of a crashed run of R
    recorded steps (and of one of RA recorded acts: site 5 runs on replay too) -> wall
    (and process CPU) time per call;
(b) the site's hand-built text against the alternative on the same inputs, in a loop of
    ``--loops`` iterations (gc enabled, as in a run) -> ns per call;
(c) the share: (alternative - hand-built) / whole-run wall time per call;
(d) a whole-run A/B: the same run with the site replaced, in this process only (src/ is
    not touched), by what the code would be without it: the lines of ``Context.record_done``
    / ``Context.begin_call`` rewritten from their own source (the bench refuses to run if the
    line it replaces is not found exactly once), the module-level functions swapped.
    Printed as the median over rounds of (variant time / base time - 1).

The sites:
  1 runtime/context.py ``record_done``: a successful step's payload text as an f-string
    (alternative: ``encode({"kind", "digest", "status", "attempt", "took_us"})``);
  2 runtime/context.py ``begin_call``: replay's ``text.startswith(prefix + digest + ...)`` on
    the stored text (alternative: ``_replay``, which decodes the payload and compares);
  5 runtime/steps/act_records.py ``_flat_intent`` (alternative: ``canonical_digest`` of the
    intent);
  6 journal/codec.py ``args_digest``'s spelled-out args (alternative:
    ``canonical_digest({"args": [...], "kwargs": {...}})``).

Sites 3 and 4 were dropped from the code on 2026-12-01 (they now take ``codec.encode``),
and so from this bench, on this script's figures: 3, runtime/steps/act_records.py's
hand-built intent + receipt texts of an act, bought ~2.4 µs of a ~360 µs act (0.7 %);
4, runtime/steps/decisions.py ``spend_text`` (a decision's model/usage/cost), ~0.23 µs
of a ~19 µs decision (1.2 %). The site numbers are kept as they were.

Every measure (whole runs and loops) is taken once per round, the order reversed every
other round; medians over rounds are reported. Every database lives in one fresh
temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import shutil
import sys
import textwrap
import time
import timeit
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _common as common

import crashproof as cp
from crashproof.journal.codec import args_digest, canonical_digest, decode, encode
from crashproof.journal.records import Event, StepKind, StepStatus
from crashproof.runtime import context as context_mod
from crashproof.runtime.context import Context
from crashproof.runtime.steps import arguments as arguments_mod
from crashproof.runtime.steps.act_records import intent_digest
from crashproof.tools.port import Tool

REPLAY_RUN = "bench:handbuilt-replay"
_SUCCEEDED = StepStatus.SUCCEEDED.value
_RESULT_WHAT = "the result of step"


# -- the alternatives: what each site's code would be without the hand-built text -------


def intent_digest_canonical(tool: Tool, params: dict[str, Any], key: str) -> str:
    """``act_records.intent_digest`` without ``_flat_intent``."""
    return canonical_digest(
        {"tool": tool.name, "tool_version": tool.version, "params": params},
        what=f"the params of act {key!r}",
    )


def args_digest_canonical(
    args: tuple[Any, ...], kwargs: dict[str, Any], *, what: str, key: str | None = None
) -> str:
    """``codec.args_digest`` without its spelled-out args."""
    return canonical_digest({"args": list(args), "kwargs": kwargs}, what=what, key=key)


def _rewritten(method: Callable[..., Any], old: str, new: str) -> Callable[..., Any]:
    """``method`` compiled again from its own source with the one line ``old`` replaced
    by ``new``, in a copy of its module's globals: the variant differs from the real code
    in that line alone. Refuses if ``old`` is not found exactly once (src/ changed)."""
    source = textwrap.dedent(inspect.getsource(method))
    if source.count(old) != 1:
        raise SystemExit(f"{method.__qualname__}: the line to replace was not found once: {old}")
    namespace = dict(vars(sys.modules[method.__module__]))
    code = compile(
        source.replace(old, new),
        f"<{method.__qualname__}, rewritten by bench/handbuilt.py>",
        "exec",
        flags=annotations.compiler_flag,  # the __future__ feature this file imports
        dont_inherit=True,
    )
    exec(code, namespace)  # the project's own source, one line replaced
    function: Callable[..., Any] = namespace[method.__name__]
    return function


_RECORD_DONE_ENCODED = _rewritten(
    Context.record_done,
    """text = f'{_DONE_PREFIX[kind]}{digest}{_DONE_STATUS}{attempt},"took_us":{took_us}}}'""",
    'text = encode({"kind": kind._value_, "digest": digest, "status": _SUCCEEDED, '
    '"attempt": attempt, "took_us": took_us}, what="a journal record", key=key)',
)
_CALL_DECODED = _rewritten(
    Context.begin_call,
    'text.startswith(f"{_DONE_PREFIX[kind]}{digest}{_REPLAYS}")',
    "False",
)


@contextmanager
def patched(changes: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set ``(owner, name, value)`` attributes for the duration; restore them after."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in changes]
    try:
        for owner, name, value in changes:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


# What each variant replaces (the base run replaces nothing).
VARIANTS: dict[str, list[tuple[Any, str, Any]]] = {
    "1": [(Context, "record_done", _RECORD_DONE_ENCODED)],
    "2": [(Context, "begin_call", _CALL_DECODED)],
    "5": [(context_mod, "intent_digest", intent_digest_canonical)],
    "6": [(arguments_mod, "args_digest", args_digest_canonical)],
}


# -- whole runs ---------------------------------------------------------------------------


def _answer(i: int) -> cp.Decision:
    """A model's decision as a client reports it: model, token usage and cost."""
    return cp.Decision(
        {"i": i}, model="stub-model", usage={"input_tokens": 812, "output_tokens": 64}, cost=0.0012
    )


def _register(ledger: cp.Ledger, what: str) -> cp.Workflow[int]:
    if what == "step":
        return common.make_workflow(ledger)
    if what == "decide":

        @ledger.workflow("bench-decide", version="1")
        def decide(ctx: cp.Context, n: int) -> int:
            for i in range(n):
                ctx.decide("plan", _answer, i)
            return n

        return decide
    tool = common.NoOp()

    @ledger.workflow("bench-acts", version="1")
    def flow(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            ctx.act("act", tool, i=i)
        return n

    return flow


class Runs:
    """The whole-run measures; each returns wall seconds per call and keeps the process's
    CPU seconds per call (user + system) in ``cpu``. ``recorded``: how many calls the
    crashed runs to resume hold, per kind ("step", "act")."""

    def __init__(self, directory: Path, recorded: dict[str, int], prefix: str = "") -> None:
        self.directory = directory
        self.recorded = recorded
        self.cpu: dict[str, list[float]] = {}
        self.sources = {what: directory / f"{prefix}replay-{what}-source.db" for what in recorded}

    def live(self, what: str, n: int, variant: str | None, tag: str) -> float:
        path = self.directory / f"{tag}.db"
        ledger = cp.Ledger(f"sqlite:///{path}", durability="output")
        try:
            workflow = _register(ledger, what)
            with patched(VARIANTS[variant] if variant else []):
                cpu, start = time.process_time(), time.perf_counter()
                result = ledger.run(workflow, run_id=f"bench:{tag}", n=n)
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        finally:
            ledger.close()
        if result != n:
            raise SystemExit(f"benchmark run returned {result!r}")
        common.remove_db(path)
        return self._keep(tag, wall, cpu, n)

    def build_crashed(self, what: str) -> float:
        """Record the calls of a run that crashes just before run_succeeded (the base code,
        durability normal: building is not measured). Seconds taken."""
        crash = cp.CrashPoints(match="before_commit[run_succeeded]")
        source = self.sources[what]
        ledger = cp.Ledger(f"sqlite:///{source}", durability="normal", crash_points=crash)
        start = time.perf_counter()
        try:
            ledger.run(_register(ledger, what), run_id=REPLAY_RUN, n=self.recorded[what])
        except cp.SimulatedCrash:
            pass
        else:
            raise SystemExit("the crash point did not fire; the run completed")
        finally:
            ledger.close()
        return time.perf_counter() - start

    def replay(self, what: str, variant: str | None, tag: str) -> float:
        """Resume a fresh copy of the crashed run with a new Ledger (output): load the
        journal, replay every recorded call, commit run_succeeded."""
        path = self.directory / f"{tag}.db"
        source = self.sources[what]
        shutil.copyfile(source, path)  # closed cleanly: the WAL is checkpointed
        shutil.copyfile(f"{source}.witness", f"{path}.witness")
        ledger = cp.Ledger(f"sqlite:///{path}", durability="output")
        n = self.recorded[what]
        try:
            _register(ledger, what)
            with patched(VARIANTS[variant] if variant else []):
                cpu, start = time.process_time(), time.perf_counter()
                result = ledger.resume(REPLAY_RUN)
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            info = ledger.get_run(REPLAY_RUN)
        finally:
            ledger.close()
        if result != n or info.status is not cp.RunStatus.SUCCEEDED or len(info.steps) != n:
            raise SystemExit(f"the resume went wrong: {result!r}, {info.status}")
        common.remove_db(path)
        return self._keep(tag, wall, cpu, n)

    def _keep(self, tag: str, wall: float, cpu: float, n: int) -> float:
        name = tag.rsplit("-", 1)[0]
        self.cpu.setdefault(name, []).append(cpu / n)
        return wall / n


# Payload fields whose values differ from one run to the next (timings, the worker).
_VOLATILE = frozenset({"took_us", "started_at", "ended_at", "started_by", "session"})


def _fields(payload: dict[str, Any]) -> list[tuple[str, Any]]:
    """A payload's fields in their stored order, the volatile ones without their value."""
    return [(k, None if k in _VOLATILE else v) for k, v in payload.items()]


def sanity(directory: Path) -> None:
    """Each variant makes the same journal as the real code: every record's stored text
    is codec.encode of its payload, the records (type, key, the payload's fields in order
    with their values but timings and worker, the value) are equal, the chain checks."""
    for what, variants in (("step", "16"), ("decide", "16"), ("act", "5")):
        journals = {}
        for variant in ("", *variants):
            path = directory / f"sanity-{what}-{variant}.db"
            ledger = cp.Ledger(f"sqlite:///{path}", durability="output")
            try:
                workflow = _register(ledger, what)
                with patched(VARIANTS[variant] if variant else []):
                    ledger.run(workflow, run_id="bench:sanity", n=20)
                report = ledger.check()
                journal = ledger.journal("bench:sanity")
            finally:
                ledger.close()
            common.remove_db(path)
            if report != [("bench:sanity", None)]:
                raise SystemExit(f"variant {variant} of {what}: check failed: {report}")
            for event in journal:
                if event.payload_text != encode(event.payload, what="a record"):
                    raise SystemExit(f"variant {variant} of {what}: {event.payload_text}")
            journals[variant] = [(e.type, e.key, _fields(e.payload), e.value_json) for e in journal]
        for variant in variants:
            if journals[variant] != journals[""]:
                raise SystemExit(f"variant {variant} of {what}: another journal")
    # Site 2: the rewritten _call replays through _replay, every recorded step.
    replayed = [0]
    real_replay = Context._replay

    def counting(self: Context, *args: Any) -> Any:
        replayed[0] += 1
        return real_replay(self, *args)

    runs = Runs(directory, {"step": 50, "act": 20}, prefix="sanity-")
    runs.build_crashed("step")
    runs.build_crashed("act")
    with patched([(Context, "_replay", counting)]):
        runs.replay("step", None, "sanity-replay-base-0")
        if replayed[0] != 0:
            raise SystemExit(f"the base replay took _replay {replayed[0]} times, not 0")
        runs.replay("step", "2", "sanity-replay-2-0")
    if replayed[0] != 50:
        raise SystemExit(f"variant 2 took _replay {replayed[0]} times, not 50")
    # Site 5 on the replay of acts: every recorded act matched with the canonical digest.
    runs.replay("act", "5", "sanity-replay-act-5-0")
    for source in runs.sources.values():
        common.remove_db(source)


# -- the sites in a loop ------------------------------------------------------------------


def loop_inputs() -> dict[str, Any]:
    """The inputs each site sees in the whole runs above (the 8th call of each)."""
    tool = common.NoOp()
    run_id = "bench:handbuilt-live-0"
    step_key, act_key = "step#8", "act#8"
    params = {"i": 7}
    step_digest = args_digest((7,), {}, what="arguments of step", key=step_key)
    value_json = encode({"i": 7, "ok": True}, what=_RESULT_WHAT)
    stored = (
        f'{{"kind":"step","digest":"{step_digest}","status":"{_SUCCEEDED}",'
        f'"attempt":1,"took_us":3}}'
    )
    replayer = Context.__new__(Context)  # only _cursor is read by _replay/_match
    replayer._cursor = 0
    return {
        # site 1
        "_DONE_PREFIX": context_mod._DONE_PREFIX,
        "_DONE_STATUS": context_mod._DONE_STATUS,
        "_SUCCEEDED": _SUCCEEDED,
        "kind": StepKind.STEP,
        "digest": step_digest,
        "attempt": 1,
        "took": 3,
        "key": step_key,
        "encode": encode,
        # site 2
        "_REPLAYS": context_mod._REPLAYS,
        "recorded": Event.read(run_id, 9, "step_done", step_key, stored, 1.7e9, value_json),
        "ctx": replayer,
        "decode": decode,
        # site 5
        "tool": tool,
        "params": params,
        "act_key": act_key,
        "intent_digest": intent_digest,
        "intent_digest_canonical": intent_digest_canonical,
        # site 6
        "args": (7,),
        "kwargs": {},
        "args_digest": args_digest,
        "args_digest_canonical": args_digest_canonical,
        "what": "arguments of step",
    }


# (site, hand-built statement, alternative statement): both give the same. Site 2 resets
# the record's decoded payload on both sides: a record is decoded once, at its replay.
_FAST_REPLAY = """\
recorded._payload = None
cursor = ctx._cursor
text = recorded.payload_json
if recorded.key == key and text is not None and text.startswith(
    f"{_DONE_PREFIX[kind]}{digest}{_REPLAYS}"
):
    ctx._cursor = cursor + 1
    value_json = recorded.value_json
    out = None if value_json is None else decode(value_json)
else:
    raise AssertionError("the fast path missed")
"""
_DECODED_REPLAY = """\
recorded._payload = None
out = ctx._replay(recorded, key, kind, digest)
"""
LOOPS: list[tuple[str, str, str]] = [
    (
        "1",
        """out = f'{_DONE_PREFIX[kind]}{digest}{_DONE_STATUS}{attempt},"took_us":{took}}}'""",
        'out = encode({"kind": kind._value_, "digest": digest, "status": _SUCCEEDED, '
        '"attempt": attempt, "took_us": took}, what="a journal record", key=key)',
    ),
    ("2", _FAST_REPLAY, _DECODED_REPLAY),
    (
        "5",
        "out = intent_digest(tool, params, act_key)",
        "out = intent_digest_canonical(tool, params, act_key)",
    ),
    (
        "6",
        "out = args_digest(args, kwargs, what=what, key=key)",
        "out = args_digest_canonical(args, kwargs, what=what, key=key)",
    ),
]


def check_loops(inputs: dict[str, Any]) -> None:
    """Both statements of a site give the same result on the same inputs."""
    for site, hand, alternative in LOOPS:
        outs = []
        for statement in (hand, alternative):
            namespace = dict(inputs)
            exec(statement, namespace)
            outs.append(namespace["out"])
        if outs[0] != outs[1]:
            raise SystemExit(f"site {site}: the two statements differ: {outs}")


def loop_ns(statement: str, inputs: dict[str, Any], loops: int) -> float:
    """ns per execution of ``statement`` over ``loops`` iterations, gc enabled (timeit
    disables it; a run does not)."""
    timer = timeit.Timer(statement, setup="gc.enable()", globals={**inputs, "gc": gc})
    return timer.timeit(loops) / loops * 1e9


# -- the report ---------------------------------------------------------------------------

# (site, what it is, the whole run it is measured against, the loop rows, the A/B measure)
SITES: list[tuple[str, str, str, list[str], str]] = [
    ("1", "step payload f-string (record_done)", "step", ["1"], "step-1"),
    ("1", "  the same, in a decision's text", "decide", ["1"], ""),
    ("2", "replay startswith fast path (_call)", "replay", ["2"], "replay-2"),
    ("5", "act _flat_intent digest text", "act", ["5"], "act-5"),
    ("5", "  the same, on replay of acts", "replay_act", ["5"], "replay_act-5"),
    ("6", "args_digest spelled-out args", "step", ["6"], "step-6"),
    ("6", "  the same, on replay", "replay", ["6"], "replay-6"),
    ("6", "  the same, in a decision", "decide", ["6"], ""),
]


def _pct(value: float) -> str:
    return f"{value * 100:+.1f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps/decisions per run (2000)")
    parser.add_argument("--acts", type=int, default=500, help="acts per run (500)")
    parser.add_argument("--replay-steps", type=int, default=20000, help="recorded steps (20000)")
    parser.add_argument("--replay-acts", type=int, default=5000, help="recorded acts (5000)")
    parser.add_argument("--loops", type=int, default=20000, help="iterations per loop (20000)")
    parser.add_argument("--repeats", type=int, default=15, help="rounds, medians kept (15)")
    parser.add_argument("--dir", default=None, help="parent of the temp dir (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args(argv)
    directory = common.make_tempdir(args.dir)
    n, m = args.steps, args.acts
    try:
        print("crashproof bench: hand-built JSON texts vs codec.encode / canonical_digest")
        common.print_facts(common.machine_facts(directory))
        sanity(directory)
        inputs = loop_inputs()
        check_loops(inputs)
        runs = Runs(directory, {"step": args.replay_steps, "act": args.replay_acts})
        built = [runs.build_crashed(what) for what in ("step", "act")]
        print(
            "\nvariants checked (same journals, digests, results); built crashed runs of "
            f"{args.replay_steps:,} steps and {args.replay_acts:,} acts in {built[0]:.1f} s "
            f"and {built[1]:.1f} s"
        )
        print(
            f"N = {n:,} steps / decisions, {m:,} acts, {args.replay_steps:,} replayed steps, "
            f"{args.replay_acts:,} replayed acts, {args.loops:,} loop iterations; "
            f"{args.repeats} interleaved rounds\n"
        )
        measures: dict[str, Callable[[str], float]] = {}
        for what, count, variants in (("step", n, "16"), ("decide", n, ""), ("act", m, "5")):
            for variant in ("", *variants):
                name = f"{what}-{variant}" if variant else what
                measures[name] = lambda tag, w=what, c=count, v=variant: runs.live(
                    w, c, v or None, tag
                )
        for what, name, variants in (("step", "replay", "26"), ("act", "replay_act", "5")):
            for variant in ("", *variants):
                key = f"{name}-{variant}" if variant else name
                measures[key] = lambda tag, w=what, v=variant: runs.replay(w, v or None, tag)
        for site, hand, alternative in LOOPS:
            for side, statement in (("hand", hand), ("alt", alternative)):
                measures[f"loop{site}-{side}"] = lambda _tag, s=statement: loop_ns(
                    s, inputs, args.loops
                )
        results = common.interleaved(args.repeats, measures)
        med = {name: common.median(values) for name, values in results.items()}

        print("whole runs (durability output), per call:")
        whole = [
            ("step", "ctx.step"),
            ("decide", "ctx.decide -> cp.Decision"),
            ("act", "ctx.act, no-op tool"),
            ("replay", "replayed step (resume)"),
            ("replay_act", "replayed act (resume)"),
        ]
        rows = []
        for what, label in whole:
            for name in [k for k in measures if k == what or k.startswith(f"{what}-")]:
                variant = name.partition("-")[2]
                rows.append(
                    [
                        label if not variant else f"  site {variant} replaced",
                        f"{med[name] * 1e6:.2f}",
                        f"{common.median(runs.cpu[name]) * 1e6:.2f}",
                        f"{min(results[name]) * 1e6:.2f}-{max(results[name]) * 1e6:.2f}",
                    ]
                )
        common.print_table(["run", "wall us/call", "CPU us/call", "wall rounds"], rows)

        print(f"\nthe sites in a loop ({args.loops:,} iterations, gc on), ns per call:")
        rows = []
        diffs: dict[str, list[float]] = {}
        for site, _, _ in LOOPS:
            hand, alt = results[f"loop{site}-hand"], results[f"loop{site}-alt"]
            diffs[site] = [a - h for a, h in zip(alt, hand, strict=True)]
            rows.append(
                [
                    site,
                    f"{common.median(hand):.0f}",
                    f"{common.median(alt):.0f}",
                    f"{common.median(diffs[site]):+.0f}",
                    f"{common.median(common.round_ratios(alt, hand)):.2f}",
                ]
            )
        common.print_table(["site", "hand-built", "alternative", "alt - hand", "alt/hand"], rows)

        print(
            "\nshare = (alternative - hand-built) / whole-run wall per call (of its CPU per "
            "call); A/B = the\nwhole run with the site replaced: median of rounds' "
            "(variant / base - 1), wall (CPU), [rounds' range]:"
        )
        rows = []
        for site, label, what, loops, ab in SITES:
            saved = sum(common.median(diffs[loop]) for loop in loops) * 1e-9
            wall, cpu = med[what], common.median(runs.cpu[what])
            ab_text = ""
            if ab:
                walls = [v / b - 1 for v, b in zip(results[ab], results[what], strict=True)]
                cpus = [v / b - 1 for v, b in zip(runs.cpu[ab], runs.cpu[what], strict=True)]
                ab_text = (
                    f"{_pct(common.median(walls))} ({_pct(common.median(cpus))}) "
                    f"[{_pct(min(walls))}..{_pct(max(walls))}]"
                )
            verdict = "KEEP" if saved / wall >= 0.05 else "DROP"
            rows.append(
                [
                    site,
                    label,
                    what,
                    f"{saved * 1e9:+.0f} ns",
                    f"{_pct(saved / wall)} ({_pct(saved / cpu)})",
                    ab_text,
                    verdict,
                ]
            )
        common.print_table(
            ["site", "hand-built text", "run", "buys", "share", "A/B", ">= 5 %?"], rows
        )
        keep = sorted({row[0] for row in rows if row[-1] == "KEEP"})
        drop = sorted({row[0] for row in rows} - set(keep))
        print(
            f"\nper site (KEEP where some whole run shows >= 5 %): keep {', '.join(keep) or '-'}; "
            f"drop {', '.join(drop) or '-'}"
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
