# TurnKit developer targets. Everything runs inside .venv; `make venv` builds it
# and reinstalls whenever pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := test,postgres,providers,dev

PYTEST_ARGS ?=
ARGS ?=
SEEDS ?= 300
FAULTS ?=

.PHONY: venv demo test chaos lint worker bench histories clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: venv
	$(BIN)/python -m turnkit.demo

# pytest's own exit code is saved so .ci/run can report it (make itself exits 2).
test: venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS); rc=$$?; echo $$rc > $(VENV)/.pytest-exit; exit $$rc

# The chaos suite alone, with more seeds (make test runs 30): `make chaos SEEDS=300 FAULTS=all`.
chaos: venv
	TURNKIT_CHAOS_SEEDS=$(SEEDS) TURNKIT_CHAOS_FAULTS=$(FAULTS) $(BIN)/python -m pytest -q -m chaos tests/test_chaos.py $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check turnkit workflows activities
	$(BIN)/pyright turnkit workflows activities

worker: venv
	$(BIN)/python worker.py $(ARGS)

bench: venv
	$(BIN)/python -m bench.turn_latency

histories: venv
	$(BIN)/python -m tests.record_histories

clean:
	rm -rf .turnkit
