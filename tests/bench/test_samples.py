"""Tests of the latency sample log and its quantile series (``bench._samples``), and of the
machine record (``bench._machine``): pure, no loop, no disk but a fake cpuinfo file."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from bench import _machine
from bench._output import Result, render_table
from bench._samples import (
    QUANTILES,
    Distribution,
    SampleLog,
    curves_from_series,
    is_series_point,
    nearest_rank,
)


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 0.0, 1.0),  # the minimum
        ([1.0, 2.0, 3.0, 4.0], 0.25, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 0.26, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 1.0, 4.0),  # the maximum
        ([7.0], 0.999, 7.0),
    ],
)
def test_nearest_rank(samples: list[float], q: float, expected: float) -> None:
    """The quantile is the sample at rank ceil(q * n) (the first one for q = 0)."""
    assert nearest_rank(samples, q) == expected


def test_nearest_rank_of_nothing_is_an_error() -> None:
    """No samples, no quantile: a ValueError, not an IndexError."""
    with pytest.raises(ValueError, match="no samples"):
        nearest_rank([], 0.5)


def test_sample_log_keeps_sorted_copies_in_order() -> None:
    """Scenario: two measurements are added, unsorted. Expected: both kept in order, each
    sorted, with their params copied (a later change to the caller's dict does not leak)."""
    log = SampleLog()
    params = {"fsync": "always"}
    log.add("pubsub", "headrace", "e2e_latency_quantile_ms", params, [3.0, 1.0, 2.0])
    params["fsync"] = "changed"
    log.add("pubsub", "redis-streams", "e2e_latency_quantile_ms", {}, iter([5.0, 4.0]))
    kept = list(log)
    assert len(log) == 2
    assert [d.system for d in kept] == ["headrace", "redis-streams"]
    assert list(kept[0].samples) == [1.0, 2.0, 3.0]
    assert kept[0].params == {"fsync": "always"}
    assert list(kept[1].samples) == [4.0, 5.0]


def test_a_distribution_needs_samples() -> None:
    """An empty measurement is refused with the system and metric in the message."""
    with pytest.raises(ValueError, match="headrace e2e_latency_quantile_ms: no samples"):
        SampleLog().add("pubsub", "headrace", "e2e_latency_quantile_ms", {}, [])


def test_series_is_one_valid_result_per_quantile() -> None:
    """Scenario: 1,000 latencies 0.001 .. 1.0 ms. Expected: one bench result per quantile,
    valid JSON, params = the distribution's + quantile + samples, values ascending, the
    ends the minimum and the maximum."""
    samples = [i / 1000 for i in range(1, 1001)]
    d = Distribution("wal", "headrace", "append_latency_quantile_ms", {"batch": 1}, samples)
    series = d.series()
    assert [r.params["quantile"] for r in series] == list(QUANTILES)
    assert all(r.params["samples"] == 1000 and r.params["batch"] == 1 for r in series)
    assert all(r.unit == "ms" and r.metric == d.metric for r in series)
    values = [r.value for r in series]
    assert values == sorted(values)
    assert (values[0], values[-1]) == (0.001, 1.0)
    assert series[QUANTILES.index(0.5)].value == 0.5
    for r in series:
        assert json.loads(r.to_json())["params"]["quantile"] == r.params["quantile"]
        assert is_series_point(r)
        assert not r.is_goal


def test_curves_from_series_regroup_each_distribution() -> None:
    """Scenario: the series of two distributions, interleaved, plus an ordinary result.
    Expected: two curves in first-seen order with their own params (without quantile and
    samples), every point, sorted by quantile; the ordinary result is ignored."""
    a = Distribution("pubsub", "headrace", "e2e_latency_quantile_ms", {"fsync": "always"}, [1.0])
    b = Distribution("pubsub", "nats", "e2e_latency_quantile_ms", {"fsync": "default"}, [2.0, 3.0])
    mixed = [x for pair in zip(reversed(a.series()), b.series(), strict=True) for x in pair]
    mixed.append(Result("pubsub", "headrace", "publish_msgs_s", 5.0, "msgs/s", {}))
    curves = curves_from_series(mixed)
    assert [(c.system, c.params, c.samples) for c in curves] == [
        ("headrace", {"fsync": "always"}, 1),
        ("nats", {"fsync": "default"}, 2),
    ]
    assert [q for q, _ in curves[0].points] == sorted(QUANTILES)
    assert curves[1].points[0] == (0.0, 2.0)
    assert curves[1].points[-1] == (1.0, 3.0)


def test_series_points_stay_out_of_the_human_tables() -> None:
    """The quantile series is chart data: the tables show the measured figures only."""
    d = Distribution("pubsub", "headrace", "e2e_latency_quantile_ms", {}, [1.0, 2.0])
    figure = Result("pubsub", "headrace", "e2e_latency_p50_ms", 1.0, "ms", {})
    table = render_table([figure, *d.series()])
    assert "e2e_latency_p50_ms" in table
    assert "quantile" not in table


def test_machine_result_names_cores_cpu_and_date(tmp_path: Path) -> None:
    """The machine record: cores this process may use, the CPU model from cpuinfo, the
    date in UTC to the second; valid bench JSON."""
    when = datetime.datetime(2026, 11, 24, 10, 30, 5, tzinfo=datetime.UTC)
    result = _machine.machine_result("wal", now=lambda: when)
    assert (result.bench, result.system, result.metric, result.unit) == (
        "wal",
        "machine",
        "cpu_cores",
        "cores",
    )
    assert result.value >= 1
    assert result.params["date"] == "2026-11-24T10:30:05Z"
    assert json.loads(result.to_json())["params"]["cpu"] == result.params["cpu"]
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example  CPU @ 2.0GHz\n")
    assert _machine.cpu_model(str(cpuinfo)) == "Example CPU @ 2.0GHz"
    assert _machine.cpu_model(str(tmp_path / "missing")) != ""
