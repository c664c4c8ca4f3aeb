# Headrace developer targets. Everything runs from a project-local virtualenv (.venv),
# created and filled on first use, so a fresh clone needs only python3 (3.11+) and make.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= dev

.PHONY: setup run test lint fmt bench proto proto-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

setup: $(STAMP)  ## create .venv and install the project with its dev tools

# Until subscriptions land (nothing can consume yet), the main job is the WAL benchmark in
# quick mode; `headrace serve` already runs the broker.
run: setup  ## run the main job on the embedded default (a local ./data directory)
	@echo "headrace: consuming is not built yet, so this runs the write-ahead log benchmark (quick)."
	@echo "          The broker itself runs with: .venv/bin/headrace serve"
	$(BIN)/python -m bench wal --quick --dir ./data/bench

lint: setup  ## ruff, formatting, mypy --strict, generated-code staleness
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/python -m proto.generate --check
	$(BIN)/python -m client._codegen --check

fmt: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: lint  ## lint, then the whole test suite
	$(BIN)/python -m pytest

bench: setup  ## full WAL benchmark; JSON lines with BENCH_ARGS=--json
	$(BIN)/python -m bench wal $(BENCH_ARGS)

proto: setup  ## regenerate protobuf/gRPC code, and the client's copy of the batch codec
	$(BIN)/python -m proto.generate
	$(BIN)/python -m client._codegen

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache ./data/bench
