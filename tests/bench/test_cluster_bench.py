"""The ``cluster`` bench scenario: its pure parts (broker counts, the CPU ceiling, the
median round), and a quick run through its command line against a real etcd and real
``headrace serve`` processes in cluster mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.cluster import (
    CLUSTER,
    SINGLE,
    TOPICS,
    Cell,
    Phase,
    ceiling_x,
    default_brokers,
    median_cells,
    parse_brokers,
)


@pytest.mark.parametrize(
    ("cores", "expected"), [(1, (1, 2)), (2, (1, 2)), (3, (1, 2, 3)), (64, (1, 2, 3, 4))]
)
def test_default_brokers_go_up_to_the_cores_and_four(cores: int, expected: tuple[int]) -> None:
    """Scenario: the default broker counts on machines of 1, 2, 3 and 64 cores. Expected:
    1..min(cores, 4), never fewer than (1, 2) (the goal's two cells)."""
    assert default_brokers(cores) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("1,2", (1, 2)), ("2, 1,2", (1, 2)), ("3", (3,)), ("4,1", (1, 4))]
)
def test_parse_brokers_sorts_and_dedups(text: str, expected: tuple[int, ...]) -> None:
    """Scenario: ``--brokers`` lists. Expected: distinct counts, ascending."""
    assert parse_brokers(text) == expected


@pytest.mark.parametrize("text", ["0,1", f"1,{TOPICS + 1}", "", "one"])
def test_parse_brokers_refuses_counts_out_of_range(text: str) -> None:
    """Scenario: a count below 1, above the topic count (a broker would own none), none,
    or not a number. Expected: ValueError."""
    with pytest.raises(ValueError, match=r"."):
        parse_brokers(text)


@pytest.mark.parametrize(
    ("broker_us", "client_us", "cores", "brokers", "expected"),
    [
        (1.0, 0.1, 2, 2, 2.0 / 1.1 / 1.0),  # cheap clients: one broker is the bottleneck
        (1.0, 1.0, 2, 2, 1.0),  # clients cost as much: the 2 cores are, already at 1 broker
        (0.5, 0.45, 2, 2, (2 / 0.95) / (1 / 0.5)),  # this machine's kind of run
        (1.0, 0.0001, 4, 4, 4 / 1.0001),  # nearly free clients on 4 cores: nearly 4x
    ],
)
def test_ceiling_is_the_cpu_bound_gain_over_one_broker(
    broker_us: float, client_us: float, cores: int, brokers: int, expected: float
) -> None:
    """Scenario: per-record CPU costs of brokers and clients, cores and brokers. Expected:
    min(N/b, k/(b+c)) over min(1/b, k/(b+c))."""
    got = ceiling_x(broker_us * 1e-6, client_us * 1e-6, cores, brokers)
    assert got == pytest.approx(expected, rel=1e-6)


def _cell(system: str, brokers: int, records_s: float) -> Cell:
    phase = Phase(records=int(records_s), seconds=1.0, broker_cpu_s=0.5, client_cpu_s=0.5)
    return Cell(system, brokers, phase, phase, {}, {})


def test_median_cells_picks_the_median_publish_round_of_each_cell() -> None:
    """Scenario: three rounds of two cells, alternated, and one cell run twice. Expected:
    one cell each, in first-seen order, the median round (the lower middle of two)."""
    cells = [
        _cell(CLUSTER, 1, 300),
        _cell(CLUSTER, 2, 500),
        _cell(SINGLE, 1, 900),
        _cell(CLUSTER, 1, 100),
        _cell(CLUSTER, 2, 700),
        _cell(SINGLE, 1, 800),
        _cell(CLUSTER, 1, 200),
        _cell(CLUSTER, 2, 600),
    ]
    picked = median_cells(cells)
    assert [(c.system, c.brokers, c.publish.records) for c in picked] == [
        (CLUSTER, 1, 200),
        (CLUSTER, 2, 600),
        (SINGLE, 1, 800),
    ]


#: The quick run, as ``make`` or a user would type it (its ``--dir`` added).
COMMAND = [sys.executable, "-m", "bench", "cluster", "--quick", "--json", "--brokers", "1,2"]


def _rows(rows: list[dict[str, Any]], system: str, metric: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["system"] == system and r["metric"] == metric]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed (etcd-server)")
def test_quick_run_measures_every_cell_on_placed_topics(tmp_path: Path) -> None:
    """Scenario: ``python -m bench cluster --quick --json --brokers 1,2``: one broker
    alone, then etcd plus 1 and 2 brokers in cluster mode. Expected: exit 0; every line is
    one JSON object of the bench shape; each cell reports publish and consume rates and CPU
    figures, all positive; in each cluster cell every broker owned at least one topic and
    together all of them; first-request latencies through the owner and a non-owner
    (p50 <= p99); the derived rows, and the goal row judged (met or not)."""
    done = subprocess.run(
        [*COMMAND, "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    keys = {"bench", "system", "metric", "value", "unit", "params"}
    assert all(set(r) == keys and r["bench"] == "cluster" for r in rows), rows
    assert rows[0]["system"] == "machine"
    for metric in ("publish_records_s", "consume_records_s", "broker_cpu_us_per_record"):
        for system, counts in ((SINGLE, [1]), (CLUSTER, [1, 2])):
            found = _rows(rows, system, metric)
            assert sorted({r["params"]["brokers"] for r in found}) == counts, metric
            assert all(r["value"] > 0 for r in found), found
    assert all(r["value"] > 0 for r in _rows(rows, CLUSTER, "client_cpu_us_per_record"))
    for brokers in (1, 2):
        owned = [
            r for r in _rows(rows, CLUSTER, "topics_owned") if r["params"]["brokers"] == brokers
        ]
        assert sorted(r["params"]["node"] for r in owned) == [
            f"b{i}" for i in range(1, brokers + 1)
        ]
        assert all(r["value"] >= 1 for r in owned), owned
        assert sum(r["value"] for r in owned) == TOPICS
    for seed in ("owner", "non-owner"):
        p50, p99 = (
            next(r for r in _rows(rows, CLUSTER, m) if r["params"]["seed"] == seed)["value"]
            for m in ("first_request_latency_p50_ms", "first_request_latency_p99_ms")
        )
        assert 0 < p50 <= p99
    for metric in ("publish_ceiling_x", "consume_scaling_x", "cluster_mode_cost_x"):
        assert [r["value"] > 0 for r in _rows(rows, CLUSTER, metric)] == [True], metric
    (goal,) = _rows(rows, CLUSTER, "publish_scaling_x")
    assert goal["value"] > 0
    assert goal["params"]["goal"] == ">= 1.5"
    assert goal["params"]["met"] == (goal["value"] >= 1.5)


@pytest.mark.parametrize(
    "argv",
    [
        ["wal", "--brokers", "1,2"],  # another scenario's flag
        ["cluster", "--brokers", "0,1"],
        ["cluster", "--brokers", "x"],
        ["cluster", "--records", "10"],  # spark's flag
    ],
)
def test_bad_brokers_flags_are_usage_errors(argv: list[str]) -> None:
    """Scenario: ``--brokers`` given to another scenario, or out of range, or spark's
    flags given to ``cluster``. Expected: a usage error (exit 2) before anything runs."""
    from bench.__main__ import main

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2


def test_without_etcd_the_run_stops_at_once_saying_how_to_install_it(tmp_path: Path) -> None:
    """Scenario: ``python -m bench cluster --quick`` with a PATH that holds no ``etcd``.
    Expected: exit 1 with one ``bench: error:`` line saying how to install it, and no cell
    measured (nothing but the machine record printed)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(
        [*COMMAND, "--dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": str(empty)},
    )
    assert done.returncode == 1
    assert done.stderr.startswith("bench: error: etcd is not on the PATH: install it")
    assert [json.loads(line)["system"] for line in done.stdout.splitlines()] == ["machine"]
