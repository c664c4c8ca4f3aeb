"""Tests of what the bench charts show (``bench._chartdata``): the CDF points, the bars,
their labels and titles, and how latency charts are split. Pure: no matplotlib, no disk."""

from __future__ import annotations

import itertools
import random

import pytest

from bench import _chartdata
from bench._chartdata import cdf_charts, cdf_from_quantiles, cdf_from_samples, throughput_chart
from bench._output import Goal, Params, Result
from bench._samples import Distribution, curves_from_series

MACHINE = Result(
    "pubsub", "machine", "cpu_cores", 2, "cores", {"cpu": "Xeon", "date": "2026-11-24T10:00:00Z"}
)


def _assert_cdf(xs: list[float], ys: list[float]) -> None:
    """A CDF for a logit axis: latencies and fractions both non-decreasing / increasing,
    fractions strictly inside (0, 1)."""
    assert len(xs) == len(ys) > 0
    assert all(a <= b for a, b in itertools.pairwise(xs))
    assert all(a < b for a, b in itertools.pairwise(ys))
    assert all(0 < y < 1 for y in ys)


@pytest.mark.parametrize("n", [1, 2, 10, 2000, 2001, 100_000])
def test_cdf_from_samples_is_monotone_and_keeps_the_ends(n: int) -> None:
    """Scenario: n random latencies, sorted. Expected: a monotone CDF whose first and last
    points are the minimum and the maximum at (0.5 / n) and (1 - 0.5 / n); every sample when
    n <= 2,000, else at most 2,000 points."""
    rng = random.Random(n)
    ordered = sorted(rng.lognormvariate(0, 1) for _ in range(n))
    xs, ys = cdf_from_samples(ordered)
    _assert_cdf(xs, ys)
    assert (xs[0], xs[-1]) == (ordered[0], ordered[-1])
    assert ys[0] == pytest.approx(0.5 / n)
    assert ys[-1] == pytest.approx(1 - 0.5 / n)
    assert len(xs) == n if n <= _chartdata.MAX_CURVE_POINTS else len(xs) <= 2000


def test_cdf_from_samples_thins_evenly_on_the_logit_axis() -> None:
    """Beyond the limit, both tails keep points: the 99.9th and the 0.1th percentile
    regions each hold several of them (an even spread in fraction would keep ~2)."""
    n = 1_000_000
    _, ys = cdf_from_samples([float(i) for i in range(n)], max_points=400)
    assert len([y for y in ys if y > 0.999]) >= 20
    assert len([y for y in ys if y < 0.001]) >= 20


def test_cdf_of_nothing_is_an_error() -> None:
    """No samples: a ValueError."""
    with pytest.raises(ValueError, match="no samples"):
        cdf_from_samples([])


@pytest.mark.parametrize("n", [1, 3, 1000, 50_000])
def test_cdf_from_quantiles_is_monotone_with_the_same_ends(n: int) -> None:
    """Scenario: the saved quantile series of n samples. Expected: a monotone CDF with the
    same first and last points as the CDF drawn from the samples themselves, and the
    median at fraction 0.5 when n is large enough to resolve it."""
    rng = random.Random(n)
    ordered = sorted(rng.expovariate(1.0) for _ in range(n))
    d = Distribution("pubsub", "headrace", "e2e_latency_quantile_ms", {}, ordered)
    (curve,) = curves_from_series(d.series())
    xs, ys = cdf_from_quantiles(curve)
    _assert_cdf(xs, ys)
    sxs, sys_ = cdf_from_samples(ordered)
    assert (xs[0], xs[-1]) == (sxs[0], sxs[-1])
    assert [ys[0], ys[-1]] == pytest.approx([sys_[0], sys_[-1]])
    if n >= 1000:
        assert dict(zip(ys, xs, strict=True))[0.5] == ordered[n // 2 - 1]


def _rate(system: str, metric: str, value: float, **params: object) -> Result:
    base: Params = {"payload_bytes": 100, "loop": "uvloop"}
    return Result("pubsub", system, metric, value, "msgs/s", {**base, **params})  # type: ignore[dict-item]


def test_throughput_chart_groups_bars_by_unit_and_metric() -> None:
    """The module docstring's worked example: publish of headrace and of two Redis fsync
    modes, consume of headrace, plus Headrace's goal results (copies of the measured ones)
    and results that are not rates. Expected: one msgs/s panel, two metric groups, bars
    labelled by system and fsync, the shared params and the machine in the title, the goals
    kept as dashed lines and not as extra bars."""
    measured = [
        _rate("headrace", "publish_msgs_s", 1.3e6, fsync="always"),
        _rate("redis-streams", "publish_msgs_s", 9e4, fsync="always"),
        _rate("redis-streams", "publish_msgs_s", 8.7e4, fsync="everysec"),
        _rate("headrace", "consume_msgs_s", 1.1e6, fsync="always"),
    ]
    goals = [
        Result(
            r.bench,
            r.system,
            r.metric,
            r.value,
            r.unit,
            {**r.params, **Goal(">=", 1e6).params(r.value)},
        )
        for r in measured
        if r.system == "headrace"
    ]
    other = Result("pubsub", "headrace", "rss_mib", 61.0, "MiB", {"fsync": "always"})
    chart = throughput_chart("pubsub", [MACHINE, *measured, other, *goals])
    assert chart is not None
    (panel,) = chart.panels
    assert panel.unit == "msgs/s"
    publish, consume = panel.groups
    assert publish.metric == "publish_msgs_s"
    assert [b.label for b in publish.bars] == [
        "headrace fsync=always",
        "redis-streams fsync=always",
        "redis-streams fsync=everysec",
    ]
    assert [b.label for b in consume.bars] == ["headrace"]
    assert publish.goal == Goal(">=", 1e6)
    assert consume.goal == Goal(">=", 1e6)
    assert chart.common == {"payload_bytes": 100, "loop": "uvloop"}
    assert "2 cores (Xeon), 2026-11-24T10:00:00Z" in chart.title
    assert "payload_bytes=100 loop=uvloop" in chart.title
    assert chart.filename == "pubsub_throughput.png"
    assert panel.rows == 2 + 3 + 1


def test_spread_params_become_error_bars_and_units_split_panels() -> None:
    """A median with ``min``/``max`` params gets an error bar; MiB/s and rows/s figures go
    to separate panels (one unit per axis)."""
    results = [
        Result("spark", "headrace", "read_rows_s", 2e6, "rows/s", {"min": 1.4e6, "max": 2.2e6}),
        Result("spark", "headrace", "write_mb_s", 50.0, "MiB/s", {}),
    ]
    chart = throughput_chart("spark", results)
    assert chart is not None
    assert [p.unit for p in chart.panels] == ["rows/s", "MiB/s"]
    bar = chart.panels[0].groups[0].bars[0]
    assert (bar.low, bar.value, bar.high) == (1.4e6, 2e6, 2.2e6)
    assert chart.title.splitlines()[1] == "machine not recorded"


def test_no_rates_no_throughput_chart() -> None:
    """A scenario that measured no rate (or another scenario's results) has no bar chart."""
    results = [Result("dispatch", "headrace", "heartbeat_cpu_pct", 0.8, "%", {}), MACHINE]
    assert throughput_chart("dispatch", results) is None
    assert throughput_chart("wal", [_rate("headrace", "publish_msgs_s", 1.0)]) is None


@pytest.mark.parametrize(
    ("text", "goal"),
    [(">= 1000000", Goal(">=", 1e6)), ("< 0.5", Goal("<", 0.5)), ("~ 3", None), (None, None)],
)
def test_parse_goal(text: str | None, goal: Goal | None) -> None:
    """The goal param as results write it reads back; anything else is no goal."""
    assert _chartdata.parse_goal(text) == goal


def _append(record_bytes: int, fsync: str, batch: int) -> Distribution:
    params: Params = {
        "record_bytes": record_bytes,
        "batch": batch,
        "fsync": fsync,
        "loop": "uvloop",
    }
    return Distribution("wal", "headrace", "append_latency_quantile_ms", params, [0.1 * batch, 0.2])


def test_wal_latency_charts_split_with_the_disk_as_reference() -> None:
    """Scenario: append distributions for 2 record sizes x 2 fsync policies x 2 batches, and
    the disk's fdatasync distribution. Expected: four charts (one per record size and fsync,
    named after them), each with its two batches and the disk's curve; the split and the
    shared params in the title, the batch in the curve labels, the disk's curve labelled
    with its own metric and params."""
    sources = [
        _append(rb, f, b) for rb in (100, 1024) for f in ("always", "interval") for b in (1, 1000)
    ]
    disk = Distribution(
        "wal", "disk", "fdatasync_latency_quantile_ms", {"block_bytes": 4096}, [0.2]
    )
    charts = cdf_charts("wal", [*sources, disk], [])
    assert [c.filename for c in charts] == [
        "wal_append_latency_cdf_100_always.png",
        "wal_append_latency_cdf_100_interval.png",
        "wal_append_latency_cdf_1024_always.png",
        "wal_append_latency_cdf_1024_interval.png",
    ]
    first = charts[0]
    assert first.split == {"record_bytes": 100, "fsync": "always"}
    assert first.common == {"loop": "uvloop"}
    assert [c.label for c in first.curves] == [
        "headrace append latency batch=1",
        "headrace append latency batch=1000",
        "disk fdatasync latency block_bytes=4096",
    ]
    assert "record_bytes=100 fsync=always" in first.title.splitlines()[0]
    assert all(len(c.curves) == 3 for c in charts)


def test_latency_chart_of_peers_labels_them_by_what_differs() -> None:
    """One chart per metric when nothing splits it; curves named by system and the params
    that differ; p50 and p99 read from the samples or, when redrawn, from the series."""
    a = Distribution(
        "pubsub",
        "headrace",
        "e2e_latency_quantile_ms",
        {"fsync": "always", "loop": "uvloop"},
        [1.0, 2.0, 3.0],
    )
    b = Distribution(
        "pubsub",
        "redis-streams",
        "e2e_latency_quantile_ms",
        {"fsync": "everysec", "loop": "uvloop"},
        [0.5],
    )
    (chart,) = cdf_charts("pubsub", [a, b], [MACHINE])
    assert chart.filename == "pubsub_e2e_latency_cdf.png"
    assert [c.label for c in chart.curves] == [
        "headrace fsync=always",
        "redis-streams fsync=everysec",
    ]
    assert (chart.curves[0].p50, chart.curves[0].p99) == (2.0, 3.0)
    (redrawn,) = cdf_charts("pubsub", curves_from_series([*a.series(), *b.series()]), [MACHINE])
    assert [c.label for c in redrawn.curves] == [c.label for c in chart.curves]
    assert [(c.p50, c.p99, c.samples) for c in redrawn.curves] == [(2.0, 3.0, 3), (0.5, 0.5, 1)]
    assert redrawn.title == chart.title


@pytest.mark.parametrize(
    ("n", "ticks"),
    [
        (1, [50.0]),
        (1000, [0.1, 1.0, 10.0, 50.0, 90.0, 99.0, 99.9]),
        (400_000, [0.001, 0.01, 0.1, 1.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99, 99.999]),
    ],
)
def test_percentile_ticks_reach_as_far_as_the_samples(n: int, ticks: list[float]) -> None:
    """The logit axis marks the median and the nines the curves reach: a tail of 400,000
    samples shows 99.999%, one of a thousand stops at 99.9%."""
    xs, ys = cdf_from_samples([float(i) for i in range(n)])
    curve = _chartdata.Curve("c", "headrace", tuple(xs), tuple(ys), 0.0, 0.0, n)
    assert _chartdata.percentile_ticks([curve]) == ticks


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.2843, "0.284"), (42.93, "42.9"), (1950.4, "1,950"), (2e6, "2 M"), (89_846, "89.8 k")],
)
def test_numbers_for_people(value: float, text: str) -> None:
    """Legends say latencies without exponents; bars say rates with k / M."""
    formatted = _chartdata.format_ms(value) if value < 10_000 else _chartdata.format_rate(value)
    assert formatted == text
