# Headrace developer targets. Everything runs from a project-local virtualenv (.venv),
# created and filled on first use, so a fresh clone needs only python3 (3.11+) and make.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The spark extra is part of the default set: the connector's tests need a real
# SparkSession (pyspark, pyarrow; Java 17 comes from the system).
EXTRAS ?= dev,spark

.PHONY: setup run demo test lint fmt bench proto proto-check clean

# editable_mode=compat puts the checkout on sys.path (a .pth entry) instead of an import
# hook, so Spark's data source lookup, which lists modules with pkgutil, finds
# pyspark_headrace and with it format("headrace").
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]' --config-settings editable_mode=compat
	touch $(STAMP)

# Bytecode is compiled here, as pip does for an installed package: an editable install
# leaves it to the first import, and where PYTHONDONTWRITEBYTECODE is set (as on our
# development machines) every process would compile every module again, about 130 ms
# for each `headrace` start (restart to serving, every CLI command). Only changed files
# recompile.
setup: $(STAMP)  ## create .venv and install the project with its dev tools
	$(BIN)/python -m compileall -q -j 0 broker wal dispatcher proto client spark_connector pyspark_headrace bench

# The main job: the broker in the foreground until Ctrl-C, on its defaults (./data,
# 127.0.0.1:50051, metrics on :9464) or what HEADRACE_DATA_DIR, HEADRACE_LISTEN,
# HEADRACE_METRICS_LISTEN or SERVE_ARGS (e.g. SERVE_ARGS='--config broker.toml') say. The
# broker itself prints, once it listens, its real addresses and what to try next.
run: setup  ## start the broker (./data, 127.0.0.1:50051) and print how to produce and consume
	$(BIN)/headrace serve $(SERVE_ARGS)

# The Spark demo: a broker in a temporary directory, a stream of orders, a streaming
# query that aggregates them into another topic, a broker SIGKILL midway, and a check that
# nothing was lost or counted twice. About a minute; needs Java 17 (from the system).
demo: setup  ## end-to-end Spark pipeline through the connector, with a broker crash
	$(BIN)/python -m spark_connector.demo

lint: setup  ## ruff, formatting, mypy --strict, generated-code staleness
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/python -m proto.generate --check

fmt: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: lint  ## lint, then the whole test suite
	$(BIN)/python -m pytest

bench: setup  ## full WAL benchmark; JSON lines with BENCH_ARGS=--json
	$(BIN)/python -m bench wal $(BENCH_ARGS)

proto: setup  ## regenerate protobuf/gRPC code
	$(BIN)/python -m proto.generate

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache ./data/bench
