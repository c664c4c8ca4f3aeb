# Headrace developer targets. Everything runs from a project-local virtualenv (.venv),
# created and filled on first use, so a fresh clone needs only python3 (3.11+) and make.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed
# The lock: every runtime dependency, extra and tool at the exact version the suite last
# passed with, resolved together by `make lock`. Everything make installs is held to it,
# so each machine tests what the last commit was tested with. pyproject.toml keeps ranges
# for people who install the package into their own environment.
LOCK   := constraints.txt
# The spark extra is part of the default set: the connector's tests need a real
# SparkSession (pyspark, pyarrow; Java 17 comes from the system). docs builds the site,
# which `make test` checks with --strict.
EXTRAS ?= dev,spark,docs

.PHONY: setup run cluster demo test lint docs docs-check lock fmt bench proto proto-check clean

# editable_mode=compat puts the checkout on sys.path (a .pth entry) instead of an import
# hook, so Spark's data source lookup, which lists modules with pkgutil, finds
# pyspark_headrace and with it format("headrace").
#
# pip, setuptools and wheel come from the lock first, and the project is then built with
# them (--no-build-isolation): an isolated build would fetch whatever setuptools is newest
# that day. The installer's output goes to a log, shown only if it fails: a first
# `make run` prints one line, not pages of pip.
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "headrace: installing the locked dependencies into $(VENV) (a minute or two the first time; log: $(VENV)/install.log)"
	@( set -e; \
	  $(PIP) install --quiet -c $(LOCK) pip setuptools wheel; \
	  $(PIP) install --quiet -c $(LOCK) --no-build-isolation -e '.[$(EXTRAS)]' \
	    --config-settings editable_mode=compat; \
	) > $(VENV)/install.log 2>&1 || { \
	  tail -n 40 $(VENV)/install.log >&2; \
	  echo "headrace: installing dependencies failed; the whole log is $(VENV)/install.log" >&2; \
	  exit 1; }
	@touch $(STAMP)

# Bytecode is compiled here, as pip does for an installed package: an editable install
# leaves it to the first import, and where PYTHONDONTWRITEBYTECODE is set (as on our
# development machines) every process would compile every module again, about 130 ms
# for each `headrace` start (restart to serving, every CLI command). Only changed files
# recompile.
setup: $(STAMP)  ## create .venv and install the project with its dev tools, as locked
	@$(BIN)/python -m compileall -q -j 0 broker cluster wal dispatcher proto client spark_connector pyspark_headrace bench

# The main job: the broker in the foreground until Ctrl-C, on its defaults (./data,
# 127.0.0.1:50051, metrics on :9464) or what HEADRACE_DATA_DIR, HEADRACE_LISTEN,
# HEADRACE_METRICS_LISTEN or SERVE_ARGS (e.g. SERVE_ARGS='--config broker.toml') say. The
# broker itself prints, once it listens, its real addresses and what to try next.
run: setup  ## start the broker (./data, 127.0.0.1:50051) and print how to produce and consume
	$(BIN)/headrace serve $(SERVE_ARGS)

# A cluster on this machine: an etcd (from the PATH: Debian's etcd-server) and three
# brokers on loopback in the foreground, data under ./cluster-data (kept: a restart finds
# the topics). It prints the seed list and what to try; Ctrl-C stops them all.
cluster: setup  ## start etcd and 3 brokers on loopback (./cluster-data) and print the seeds
	$(BIN)/headrace cluster local --brokers 3 --data-dir ./cluster-data

# The Spark demo: a broker in a temporary directory, a stream of orders, a streaming
# query that aggregates them into another topic, a broker SIGKILL midway, and a check that
# nothing was lost or counted twice. About a minute; needs Java 17 (from the system).
demo: setup  ## end-to-end Spark pipeline through the connector, with a broker crash
	$(BIN)/python -m spark_connector.demo

lint: setup  ## ruff, formatting, mypy --strict, import arrows, generated-code staleness (proto, sync twins)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m proto.generate --check
	$(BIN)/python -m client._sync._generate --check

fmt: setup  ## fix lint, format, and rewrite the generated blocking client twins
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .
	$(BIN)/python -m client._sync._generate

test: lint docs-check  ## lint, build the docs strictly, then the whole test suite
	$(BIN)/python -m pytest

# The documentation site (mkdocs.yml, sources in docs/), served with live reload on
# http://127.0.0.1:8000.
docs: setup  ## serve the documentation site locally
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# A broken link, anchor or snippet fails the build. (NO_MKDOCS_2_WARNING quiets
# mkdocs-material's banner about MkDocs 2.0, which is not a problem of these pages.)
docs-check: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Refresh the lock: every dependency and tool re-resolved to its newest release (the
# ranges in pyproject.toml allow), installed, and the generated protobuf code remade
# with the new grpcio-tools. Run it to take new releases on purpose (a security fix, a
# new pyspark), or after changing a dependency in pyproject.toml; then `make test`, and
# commit constraints.txt (and proto/) only if it passes. The file carries no index URL,
# host or find-links, so it works against any mirror.
lock: $(STAMP)  ## re-resolve constraints.txt to the newest releases, reinstall, regenerate proto
	CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile --quiet --upgrade --all-extras \
	  --strip-extras --allow-unsafe --no-emit-index-url --no-emit-trusted-host \
	  --no-emit-find-links --output-file $(LOCK) pyproject.toml
	$(MAKE) --no-print-directory setup
	$(BIN)/python -m proto.generate
	@echo "headrace: $(LOCK) refreshed; run make test, and commit it only if that passes"

bench: setup  ## full WAL benchmark; JSON lines with BENCH_ARGS=--json
	$(BIN)/python -m bench wal $(BENCH_ARGS)

proto: setup  ## regenerate protobuf/gRPC code
	$(BIN)/python -m proto.generate

clean:
	rm -rf $(VENV) build site *.egg-info .mypy_cache .ruff_cache .pytest_cache ./data/bench
