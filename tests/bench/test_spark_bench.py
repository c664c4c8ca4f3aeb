"""Smoke test of the ``spark`` bench scenario: ``python -m bench spark`` run small, as a
subprocess (its SparkSession and broker come and go with it), checked for shape.

It checks that every expected metric line is there, parses, carries the bench output keys,
its system, unit and params, and a positive value; it never judges timings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 20_000
KEYS = {"bench", "system", "metric", "value", "unit", "params"}
BASE = {"records", "record_bytes", "partitions", "master"}
REPEATED = BASE | {"rounds", "stat", "min", "max"}
GOAL = {"goal", "met"}

#: metric -> (system, unit, params its line must have)
EXPECTED: dict[str, tuple[str, str, set[str]]] = {
    "connector_read_rows_s": ("headrace", "rows/s", REPEATED | {"min_partitions"}),
    "parquet_read_rows_s": ("spark-parquet", "rows/s", REPEATED),
    "connector_vs_parquet": ("headrace", "x", BASE | GOAL),
    "stream_ingest_rows_s": ("headrace", "rows/s", REPEATED | GOAL),
    "stream_batches": ("headrace", "batches", BASE),
    "sink_write_rows_s": ("headrace", "rows/s", REPEATED | GOAL),
}


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    scratch = tmp_path_factory.mktemp("bench-spark")
    argv = [sys.executable, "-m", "bench", "spark", "--records", str(RECORDS)]
    argv += ["--rounds", "1", "--json", "--dir", str(scratch), "--plot", str(scratch / "charts")]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    machine, *rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert (machine["system"], machine["metric"]) == ("machine", "cpu_cores")
    charts = [p.name for p in (scratch / "charts").iterdir()]
    assert charts == ["spark_throughput.png"]  # --plot: the four figures' bar chart
    return rows


def test_every_expected_metric_is_reported_once(lines: list[dict[str, Any]]) -> None:
    """A run prints exactly one line for each of the scenario's metrics."""
    assert sorted(line["metric"] for line in lines) == sorted(EXPECTED)


def test_every_line_has_the_bench_output_schema(lines: list[dict[str, Any]]) -> None:
    """Each line has the bench output keys, the right system and unit, its params, the
    run's size, and a positive number as its value."""
    for line in lines:
        system, unit, params = EXPECTED[line["metric"]]
        assert set(line) == KEYS
        assert line["bench"] == "spark"
        assert (line["system"], line["unit"]) == (system, unit)
        assert isinstance(line["params"], dict)
        assert params <= set(line["params"]), line
        assert line["params"]["records"] == RECORDS
        assert isinstance(line["value"], int | float)
        assert not isinstance(line["value"], bool)
        assert line["value"] > 0, line


def test_repeated_figures_carry_their_spread(lines: list[dict[str, Any]]) -> None:
    """With one round, the median, min and max of a timed figure are the same number."""
    for line in lines:
        if "stat" in line["params"] and "min" in line["params"]:
            params = line["params"]
            assert params["rounds"] == 1
            assert params["min"] == params["max"] == line["value"]


def test_goals_are_judged(lines: list[dict[str, Any]]) -> None:
    """Judged metrics say their goal and whether this run met it."""
    for line in lines:
        if "goal" in line["params"]:
            assert line["params"]["goal"].startswith(">= ")
            assert isinstance(line["params"]["met"], bool)
