# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck docs unit bench bytecode chaos chaos-short package clean

# Wall-clock kills of the examples' whole process groups (crashproof verify --mode chaos):
# `make chaos` is the long campaign, `make chaos-short` the one CI runs.
CHAOS_TRIALS ?= 1000
CHAOS_SEED ?= 1
# PostgreSQL server crashes under load (tests/integration/test_postgres_crash.py); make test: 2.
PG_CRASHES ?= 7
PG_CRASH_RUNS ?= 50
# The fleet with nobody at the keyboard (tests/integration/test_fleet.py): `make test`
# runs 12 runs and 4 worker kills per backend; `make chaos` this many.
FLEET_RUNS ?= 120
FLEET_KILLS ?= 40

RUNTIME := $(VENV)/.runtime
# The native seal and SIGBUS message (setup.py): built where a compiler is, else pure
# Python; .ci/run asks for 1 (build them or fail). A wheel from `python -m build` is pure.
CRASHPROOF_NATIVE ?= auto
export CRASHPROOF_NATIVE

# The demo needs the runtime only; the dev tools (pytest, mypy, ruff, psycopg) come with
# the first target that uses them.
$(RUNTIME): pyproject.toml setup.py src/crashproof/integrity/_seal.c src/crashproof/cli/_sigbus.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(BIN)/python -m pip install --quiet -e . --group dev
	touch $(STAMP)

demo: $(RUNTIME)
	$(BIN)/python -m compileall -q src examples >/dev/null
	$(BIN)/crashproof demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples docs_build
	$(BIN)/ruff format --check src tests bench examples docs_build

typecheck: $(STAMP)
	$(BIN)/mypy --strict src

unit: $(STAMP)
	$(BIN)/pytest -q

# Bytecode written once, for both optimisation levels: the suite starts hundreds of child
# processes, and where PYTHONDONTWRITEBYTECODE is set each one would compile crashproof
# from source (~0.25 s of CPU a child). Stale files are recompiled; up to date, ~1 s.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -o 0 -o 1 src examples tests bench >/dev/null

# The crash tests run once, under -O: runtime invariants are `if ... raise`, never
# `assert`, and this is where a missing one would show (pytest's own asserts still check).
test: lint typecheck docs bytecode
	$(BIN)/pytest -q --ignore=tests/crash
	$(BIN)/python -O -m pytest -q tests/crash

# The documentation site, built as CI builds it: a broken link, anchor or reference fails
# (tests/docs runs every code block of the pages; it is part of the suite above).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

chaos: bytecode
	$(BIN)/crashproof verify examples.code_agent:SCENARIO --mode chaos --trials $(CHAOS_TRIALS) --seed $(CHAOS_SEED)
	$(BIN)/crashproof verify examples.patch_task:SCENARIO --mode chaos --trials $(CHAOS_TRIALS) --seed $(CHAOS_SEED)
	# PostgreSQL killed (pg_ctl stop -m immediate) and restarted under 50 in-flight runs, the
	# real witness in its cluster and on a server of its own crashed with it (#38)
	CRASHPROOF_PG_CRASHES=$(PG_CRASHES) CRASHPROOF_PG_CRASH_RUNS=$(PG_CRASH_RUNS) $(BIN)/pytest -q tests/integration/test_postgres_crash.py
	POWERCUT_TRIALS=24 $(BIN)/python -O -m pytest -q tests/crash/test_powercut_image.py
	$(BIN)/crashproof verify examples.patch_task:SCENARIO --mode chaos --trials 200 --seed $(CHAOS_SEED) --faults worker,outage,powercut
	# PostgreSQL restarted while a worker drives the run (verify --faults restart, #38)
	CRASHPROOF_CHAOS_RESTARTS=32 $(BIN)/pytest -q tests/verify/test_verify_chaos.py -k store_restarts
	# a kill at every event of each framework's stream (make test: a seeded sample) (#41)
	STREAM_KILLS=1000 $(BIN)/python -O -m pytest -q tests/crash/test_sigkill_streams.py tests/crash/test_sigkill_langgraph_prebuilt.py
	GROUP_KILLS=4 $(BIN)/python -O -m pytest -q tests/crash/test_sigkill_group.py
	FLEET_SEED=$(CHAOS_SEED) FLEET_RUNS=$(FLEET_RUNS) FLEET_KILLS=$(FLEET_KILLS) FLEET_BUDGET=1800 \
		$(BIN)/pytest -q -s tests/integration/test_fleet.py
	# a migration SIGKILLed at random moments, SQLite and PostgreSQL (#44)
	SQL_KILLS=60 $(BIN)/python -O -m pytest -q -s tests/crash/test_sigkill_sql.py -k random
	# cp.Shell: a codemod, pip install --target and git commit+gc SIGKILLed at random (#44)
	SHELL_KILLS=100 SHELL_SEED=$(CHAOS_SEED) $(BIN)/pytest -q tests/verify/test_shell_chaos.py
	# The SDK agents (OpenAI sync and async, Anthropic) and the framework agents (pydantic-ai,
	# the Agents SDK, LangGraph) SIGKILLed at every crash point (#41)
	CRASHPROOF_FULL_MATRIX=1 $(BIN)/pytest -q tests/verify/test_openai_agent.py -k sigkill
	LANGGRAPH_AGENT_KILLS=all $(BIN)/pytest -q tests/crash/test_sigkill_langgraph_agent.py
	# Matrices make test samples: power cuts of the other scenarios, completion evidence
	# as child processes and power cuts (every point here)
	CRASHPROOF_FULL_MATRIX=1 $(BIN)/pytest -q tests/verify/test_verify_powercut.py \
		tests/verify/test_verify_completion.py
	# The async code agent at every crash point (make test: a seeded 12 and inside each
	# of its cp.Shell commands; the sync agent runs every point there) (#44)
	CRASHPROOF_FULL_MATRIX=1 $(BIN)/pytest -q tests/verify/test_verify_examples.py -k async_code_agent_at

chaos-short: bytecode
	$(BIN)/crashproof verify examples.code_agent:SCENARIO --mode chaos --trials 20 --seed $(CHAOS_SEED)

# The sdist and the pure wheel, the wheel installed into clean venvs on Python 3.11-3.13
# without a C compiler, the sdist with and without one (.ci/package.py).
package: $(STAMP)
	$(BIN)/python .ci/package.py

bench: bytecode
	$(BIN)/python bench/steps.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build dist site
