"""Smoke test of the ``wal`` bench scenario: a tiny grid, in-process, checked for shape.

It checks that the JSON lines parse and carry the right keys, units and params, and that
every value is positive; it never judges timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import wal
from bench.__main__ import main
from bench._output import Result, render_human
from bench._samples import SampleLog, nearest_rank
from bench._scenario import RunOptions
from bench._scratch import scratch_root
from wal import FsyncPolicy

KEYS = {"bench", "system", "metric", "value", "unit", "params"}
CELL_PARAMS = {"record_bytes", "batch", "fsync", "appenders", "loop"}
GOAL_PARAMS = {"goal", "met"}

#: metric -> (system, unit, params every line of it must have)
EXPECTED: dict[str, tuple[str, str, set[str]]] = {
    "disk_seq_write_mb_s": ("disk", "MiB/s", {"block_bytes"}),
    "disk_fdatasync_s": ("disk", "calls/s", {"block_bytes"}),
    "encode_records_s": ("headrace", "records/s", {"record_bytes", "batch"}),
    "append_records_s": ("headrace", "records/s", CELL_PARAMS),
    "append_mb_s": ("headrace", "MiB/s", CELL_PARAMS),
    "append_latency_p50_ms": ("headrace", "ms", CELL_PARAMS),
    "append_latency_p99_ms": ("headrace", "ms", CELL_PARAMS),
    "reopen_1gib_s": ("headrace", "s", {"log_bytes"} | GOAL_PARAMS),
    "seq_bandwidth_ratio": ("headrace", "x", GOAL_PARAMS),
    "records_s_100b_batch1000_always": ("headrace", "records/s", GOAL_PARAMS),
    "group_commit_speedup": ("headrace", "x", GOAL_PARAMS),
    "group_commit_vs_one_appender": ("headrace", "x", {"appenders", "vs"} | GOAL_PARAMS),
    "paired_disk_seq_write_mb_s": ("disk", "MiB/s", {"rounds", "pair_bytes"}),
    "paired_append_mb_s": ("headrace", "MiB/s", {"rounds", "pair_bytes"}),
    "group_commit_vs_fdatasync": ("headrace", "x", {"appenders", "vs"}),
    "catch_up_mb_s": ("headrace", "MiB/s", {"mode", "cache", "log_bytes"}),
    "catch_up_loop_stall_max_ms": ("headrace", "ms", {"mode", "cache", "log_bytes"}),
    "catch_up_loop_stall_p99_ms": ("headrace", "ms", {"mode", "cache", "log_bytes"}),
}

TINY_GRID = wal.Grid(
    record_bytes=(100, 1024), batch=(1, 1000), fsync=(FsyncPolicy.ALWAYS,), appenders=(1, 16)
)
TINY_SIZES = wal.Sizes(
    cell_seconds=0.05,
    cell_bytes=4 << 20,
    disk_seq_bytes=4 << 20,
    fdatasync_seconds=0.05,
    encode_seconds=0.02,
    reopen_log_bytes=8 << 20,
    pair_rounds=2,
    pair_bytes=2 << 20,
    catch_up_bytes=4 << 20,
    catch_up_rounds=1,
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def samples() -> SampleLog:
    return SampleLog()


@pytest.fixture(scope="module")
def results(run_dir: Path, samples: SampleLog) -> list[Result]:
    options = RunOptions(quick=True, data_dir=run_dir, samples=samples)
    return list(wal.run(options, grid=TINY_GRID, sizes=TINY_SIZES))


@pytest.fixture(scope="module")
def lines(results: list[Result]) -> list[dict[str, Any]]:
    return [json.loads(r.to_json()) for r in results]


def test_every_line_has_the_bench_output_keys(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        assert set(line) == KEYS
        assert line["bench"] == "wal"
        assert isinstance(line["params"], dict)


def test_every_metric_is_reported_with_its_system_unit_and_params(
    lines: list[dict[str, Any]],
) -> None:
    assert {line["metric"] for line in lines} == set(EXPECTED)
    for line in lines:
        system, unit, params = EXPECTED[line["metric"]]
        assert (line["system"], line["unit"]) == (system, unit), line
        assert params <= set(line["params"]), line


def test_values_are_positive_numbers(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        value = line["value"]
        assert isinstance(value, int | float), line
        assert not isinstance(value, bool), line
        assert value > 0, line


def test_the_grid_is_complete(lines: list[dict[str, Any]]) -> None:
    cells = {
        (p["record_bytes"], p["batch"], p["fsync"], p["appenders"])
        for line in lines
        if line["metric"] == "append_records_s" and (p := line["params"])
    }
    expected = {(c.record_bytes, c.batch, c.fsync.value, c.appenders) for c in TINY_GRID.cells()}
    assert cells == expected
    assert {line["params"]["loop"] for line in lines if "loop" in line["params"]} <= {
        "uvloop",
        "asyncio",
    }


def test_goals_say_whether_they_are_met(lines: list[dict[str, Any]]) -> None:
    goals = [line for line in lines if "goal" in line["params"]]
    # reopen, seq ratio, records/s, then group commit (vs grouping off, vs one appender)
    # for each of the 2 record sizes
    assert len(goals) == 7
    for line in goals:
        assert isinstance(line["params"]["met"], bool)
        assert line["params"]["goal"].split()[0] in (">=", "<")


def test_data_files_are_removed(run_dir: Path, results: list[Result]) -> None:
    assert results
    assert list(run_dir.iterdir()) == []


def test_human_report_has_a_table_and_goals(results: list[Result]) -> None:
    report = render_human("wal", results)
    assert "append_records_s" in report
    assert "goals:" in report
    assert "reopen_1gib_s" in report


def test_scratch_root_is_removed_afterwards(tmp_path: Path) -> None:
    with scratch_root(tmp_path) as root:
        (root / "file").write_bytes(b"x")
    assert list(tmp_path.iterdir()) == []


def test_unknown_scenario_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["no-such-scenario"])
    assert exc.value.code == 2


def test_group_commit_is_compared_with_one_fdatasync_per_record(
    lines: list[dict[str, Any]],
) -> None:
    """The grid holds a baseline cell with group commit off at the same concurrency, and
    the disk baselines are measured at both ends of the run."""
    baseline = [
        line
        for line in lines
        if line["metric"] == "append_records_s" and line["params"]["group_commit"] is False
    ]
    assert baseline, "no single-fdatasync-per-record baseline cell"
    assert all(line["params"]["batch"] == 1 for line in baseline)
    assert all(line["params"]["appenders"] > 1 for line in baseline)
    baselines = ("disk_seq_write_mb_s", "disk_fdatasync_s")
    whens = {line["params"]["when"] for line in lines if line["metric"] in baselines}
    assert whens == {"start", "end"}


def test_with_a_sample_log_every_cell_keeps_its_latencies(
    results: list[Result], samples: SampleLog
) -> None:
    """Scenario: the run is given a sample log (``--plot``). Expected: one append latency
    distribution per grid cell, in ms, with the cell's params, whose median is the cell's
    p50; and one of the disk's fdatasync calls (the first baseline only)."""
    appends = [d for d in samples if d.metric == "append_latency_quantile_ms"]
    assert len(appends) == len(list(TINY_GRID.cells()))
    p50 = {
        json.dumps(dict(r.params), sort_keys=True): r.value
        for r in results
        if r.metric == "append_latency_p50_ms"
    }
    for d in appends:
        assert d.system == "headrace"
        assert nearest_rank(d.samples, 0.5) == pytest.approx(
            p50[json.dumps(dict(d.params), sort_keys=True)]
        )
    disk = [d for d in samples if d.metric == "fdatasync_latency_quantile_ms"]
    assert [(d.system, d.params) for d in disk] == [("disk", {"block_bytes": 4096})]
    assert all(x > 0 for x in disk[0].samples)


def test_the_catch_up_runs_both_modes_from_both_cache_states(lines: list[dict[str, Any]]) -> None:
    """Every (mode, cache) pair of the catch-up read reports its rate and loop stalls."""
    for metric in ("catch_up_mb_s", "catch_up_loop_stall_max_ms", "catch_up_loop_stall_p99_ms"):
        pairs = {
            (p["mode"], p["cache"])
            for line in lines
            if line["metric"] == metric and (p := line["params"])
        }
        assert pairs == {("loop", "cold"), ("loop", "warm"), ("thread", "cold"), ("thread", "warm")}
