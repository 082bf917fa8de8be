# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench chaos chaos-short clean

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
	$(BIN)/crashproof demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy --strict src

unit: $(STAMP)
	$(BIN)/pytest -q

# The crash tests run once, under -O: runtime invariants are `if ... raise`, never
# `assert`, and this is where a missing one would show (pytest's own asserts still check).
test: lint typecheck
	$(BIN)/pytest -q --ignore=tests/crash
	$(BIN)/python -O -m pytest -q tests/crash

chaos: $(STAMP)
	$(BIN)/crashproof verify examples.code_agent:SCENARIO --mode chaos --trials $(CHAOS_TRIALS) --seed $(CHAOS_SEED)
	$(BIN)/crashproof verify examples.patch_task:SCENARIO --mode chaos --trials $(CHAOS_TRIALS) --seed $(CHAOS_SEED)
	# PostgreSQL killed (pg_ctl stop -m immediate) and restarted under 50 in-flight runs, the
	# real witness in its cluster and on a server of its own crashed with it (#38)
	CRASHPROOF_PG_CRASHES=$(PG_CRASHES) CRASHPROOF_PG_CRASH_RUNS=$(PG_CRASH_RUNS) $(BIN)/pytest -q tests/integration/test_postgres_crash.py
	POWERCUT_TRIALS=24 $(BIN)/python -O -m pytest -q tests/crash/test_powercut_image.py
	$(BIN)/crashproof verify examples.patch_task:SCENARIO --mode chaos --trials 200 --seed $(CHAOS_SEED) --faults worker,outage,powercut
	# PostgreSQL restarted while a worker drives the run (verify --faults restart, #38)
	CRASHPROOF_CHAOS_RESTARTS=16 $(BIN)/pytest -q tests/verify/test_verify_chaos.py -k store_restarts
	# a kill at every event of each framework's stream (make test: a seeded sample) (#41)
	STREAM_KILLS=1000 $(BIN)/python -O -m pytest -q tests/crash/test_sigkill_streams.py tests/crash/test_sigkill_langgraph_prebuilt.py
	FLEET_SEED=$(CHAOS_SEED) FLEET_RUNS=$(FLEET_RUNS) FLEET_KILLS=$(FLEET_KILLS) FLEET_BUDGET=1800 \
		$(BIN)/pytest -q -s tests/integration/test_fleet.py
	# The SDK agents (OpenAI sync and async, Anthropic) and the framework agents (pydantic-ai,
	# the Agents SDK, LangGraph) SIGKILLed at every crash point (#41)
	CRASHPROOF_FULL_MATRIX=1 $(BIN)/pytest -q tests/verify/test_openai_agent.py -k sigkill
	LANGGRAPH_AGENT_KILLS=all $(BIN)/pytest -q tests/crash/test_sigkill_langgraph_agent.py

chaos-short: $(STAMP)
	$(BIN)/crashproof verify examples.code_agent:SCENARIO --mode chaos --trials 20 --seed $(CHAOS_SEED)

bench: $(STAMP)
	$(BIN)/python bench/steps.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
