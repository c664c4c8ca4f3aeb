"""What the bench charts show, computed from results: pure data, no drawing.

Owns the choice of what goes on each chart, so that a chart drawn at the end of a run
(``--plot``) and one redrawn from its saved ``--json`` output (``python -m bench plot``)
are the same chart:

- :func:`throughput_chart`: one per scenario. Every result whose unit is a rate
  (``.../s``) becomes a bar; bars are grouped by metric, and metrics by unit into panels
  (one axis each, so each axis has one unit). A bar is labelled with its system and the
  params that tell it apart from the other bars of its metric; the params every bar shares
  go in the title. ``min``/``max`` params become error bars, a goal on the metric a
  dashed line. A goal result that repeats a measured one (same system, metric and params
  but ``goal``/``met``) is not a second bar.
- :func:`cdf_charts`: one per latency chart name and split. A distribution's chart is
  named after its metric (``e2e_latency_quantile_ms`` -> ``e2e_latency``) unless
  :data:`CHART_OF` says otherwise; :data:`SPLIT_BY` splits a chart by params (the ``wal``
  grid would be 26 curves on one chart), and a distribution without those params is a
  reference curve on every split (the disk's fdatasync beside each append cell).
- :func:`cdf_from_samples` and :func:`cdf_from_quantiles`: the curve's points, ascending
  in both latency and fraction, with fractions strictly inside (0, 1) for a logit axis.

Worked example: pubsub results ``publish_msgs_s`` of headrace (fsync always) and
redis-streams (fsync always, everysec) give one panel ``msgs/s`` whose ``publish_msgs_s``
group has three bars, ``headrace fsync=always``, ``redis-streams fsync=always`` and
``redis-streams fsync=everysec``; ``payload_bytes=100`` is in every bar's params, so it is
in the title instead.

Pure module: no I/O, no matplotlib.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench import _machine
from bench._output import Goal, Params, ParamValue, Result
from bench._samples import Distribution, QuantileCurve, is_series_point, nearest_rank

#: Resolution every chart is saved at (dots per inch).
DPI = 100
#: Width of every chart, inches.
WIDTH_IN = 11.0
#: Height of a CDF chart, inches.
CDF_HEIGHT_IN = 6.0
#: Most points drawn per CDF curve (the samples are thinned evenly on the logit axis).
MAX_CURVE_POINTS = 2000
#: Params that describe a figure's spread or verdict, not its conditions.
_NOT_CONDITIONS = frozenset({"min", "max", "goal", "met"})
#: Distributions whose chart is not named after their metric.
CHART_OF: dict[str, str] = {"fdatasync_latency_quantile_ms": "append_latency"}
#: Charts split into one file per combination of these params.
SPLIT_BY: dict[str, tuple[str, ...]] = {"append_latency": ("record_bytes", "fsync")}


def format_rate(value: float) -> str:
    """A number for a bar's end: ``1.31 M``, ``89.8 k``, ``3.12``."""
    for scale, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def format_params(params: Params) -> str:
    """``k=v`` pairs, space-separated, in order."""
    return " ".join(f"{k}={_param(v)}" for k, v in params.items())


def _param(value: ParamValue) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return f"{value:.0f}"
    return f"{value:,}" if isinstance(value, int) and value >= 10_000 else str(value)


# ---------------------------------------------------------------------------------------
# Titles


def machine_line(results: Iterable[Result]) -> str:
    """``2 cores (AMD EPYC 7B13), 2026-11-24T10:30:00Z`` from the run's machine record;
    ``machine not recorded`` when the results have none (output of an older bench)."""
    for r in results:
        if r.system == _machine.SYSTEM and r.metric == _machine.METRIC:
            return f"{r.value:.0f} cores ({r.params.get('cpu')}), {r.params.get('date')}"
    return "machine not recorded"


def common_params(params: Sequence[Params]) -> dict[str, ParamValue]:
    """The conditions (params but spread and verdict) that every one of ``params`` has, with
    the same value."""
    if not params:
        return {}
    first = params[0]
    return {
        k: v
        for k, v in first.items()
        if k not in _NOT_CONDITIONS and all(k in p and p[k] == v for p in params[1:])
    }


def _varying(params: Params, common: Params) -> dict[str, ParamValue]:
    return {k: v for k, v in params.items() if k not in common and k not in _NOT_CONDITIONS}


# ---------------------------------------------------------------------------------------
# Throughput


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar: a system's figure under its conditions; ``low``/``high`` its spread."""

    label: str
    system: str
    value: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True, slots=True)
class MetricGroup:
    """The bars of one metric, and its goal when the run judged it."""

    metric: str
    bars: tuple[Bar, ...]
    goal: Goal | None = None


@dataclass(frozen=True, slots=True)
class Panel:
    """One axis: every metric measured in ``unit``."""

    unit: str
    groups: tuple[MetricGroup, ...]

    @property
    def rows(self) -> int:
        """Rows the axis needs: a heading per metric, then its bars."""
        return sum(1 + len(g.bars) for g in self.groups)


@dataclass(frozen=True, slots=True)
class ThroughputChart:
    """The throughput chart of one scenario."""

    bench: str
    panels: tuple[Panel, ...]
    common: Params
    machine: str

    @property
    def filename(self) -> str:
        """The chart's file name."""
        return f"{self.bench}_throughput.png"

    @property
    def size_in(self) -> tuple[float, float]:
        """(width, height) in inches: a fixed header, then each panel by its rows."""
        return WIDTH_IN, round(1.4 + sum(0.9 + 0.3 * p.rows for p in self.panels), 1)

    @property
    def title(self) -> str:
        """What was measured, where and when, and under which shared conditions."""
        lines = [f"bench {self.bench}: throughput", self.machine]
        if self.common:
            lines.append(format_params(self.common))
        return "\n".join(lines)


def is_rate(result: Result) -> bool:
    """Whether ``result`` is a throughput figure for the bar chart."""
    return (
        result.unit.endswith("/s")
        and result.system != _machine.SYSTEM
        and not is_series_point(result)
    )


def parse_goal(text: ParamValue) -> Goal | None:
    """The :class:`Goal` of a ``goal`` param such as ``">= 1e+06"``; None if unreadable."""
    if not isinstance(text, str):
        return None
    op, _, target = text.partition(" ")
    try:
        return Goal(op, float(target)) if op in (">=", ">", "<", "<=") else None
    except ValueError:
        return None


def throughput_chart(bench: str, results: Iterable[Result]) -> ThroughputChart | None:
    """The throughput chart of ``bench``'s results; None when it measured no rate."""
    results = [r for r in results if r.bench == bench]
    rates = [r for r in results if is_rate(r)]
    if not rates:
        return None
    goals = {r.metric: g for r in rates if (g := parse_goal(r.params.get("goal")))}
    unique = _dedupe(rates)
    common = common_params([r.params for r in unique])
    panels: dict[str, dict[str, list[Result]]] = {}
    for r in unique:
        panels.setdefault(r.unit, {}).setdefault(r.metric, []).append(r)
    built = tuple(
        Panel(unit, tuple(_group(m, rs, goals.get(m)) for m, rs in by_metric.items()))
        for unit, by_metric in panels.items()
    )
    return ThroughputChart(bench, built, common, machine_line(results))


def _dedupe(rates: Iterable[Result]) -> list[Result]:
    """One result per (system, metric, conditions), the first seen."""
    seen: dict[str, Result] = {}
    for r in rates:
        conditions = {k: v for k, v in r.params.items() if k not in ("goal", "met")}
        seen.setdefault(json.dumps([r.system, r.metric, conditions], sort_keys=True), r)
    return list(seen.values())


def _group(metric: str, results: Sequence[Result], goal: Goal | None) -> MetricGroup:
    common = common_params([r.params for r in results]) if len(results) > 1 else {}
    if len(results) == 1:  # nothing to tell apart: the system alone
        common = dict(results[0].params)
    bars = tuple(_bar(r, common) for r in results)
    return MetricGroup(metric, bars, goal)


def _bar(r: Result, common: Params) -> Bar:
    label = " ".join([r.system, format_params(_varying(r.params, common))]).strip()
    low, high = r.params.get("min"), r.params.get("max")
    if isinstance(low, int | float) and isinstance(high, int | float) and low <= r.value <= high:
        return Bar(label, r.system, r.value, float(low), float(high))
    return Bar(label, r.system, r.value)  # no spread, or one that does not hold the value


# ---------------------------------------------------------------------------------------
# Latency CDFs


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _logistic(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def cdf_from_samples(
    ordered: Sequence[float], max_points: int = MAX_CURVE_POINTS
) -> tuple[list[float], list[float]]:
    """(latencies, fractions) of the empirical CDF of ascending samples: sample ``i`` of
    ``n`` sits at fraction ``(i + 0.5) / n``. Beyond ``max_points`` samples, the points kept
    are spread evenly on the logit scale, always keeping the first and the last."""
    n = len(ordered)
    if n == 0:
        raise ValueError("a CDF of no samples")
    if n <= max_points:
        indices = list(range(n))
    else:
        edge = _logit(0.5 / n)
        steps = max_points - 1
        picked = {min(n - 1, int(_logistic(edge - 2 * edge * k / steps) * n)) for k in range(steps)}
        indices = sorted(picked | {0, n - 1})
    return [ordered[i] for i in indices], [(i + 0.5) / n for i in indices]


def cdf_from_quantiles(curve: QuantileCurve) -> tuple[list[float], list[float]]:
    """(latencies, fractions) from a quantile series: the same ends as
    :func:`cdf_from_samples` (minimum at ``0.5 / n``, maximum at ``1 - 0.5 / n``), and the
    quantiles that fall between them. With ``n`` unknown, the quantiles strictly inside
    (0, 1)."""
    n = curve.samples
    if n <= 0:
        points = [(q, v) for q, v in curve.points if 0 < q < 1]
    else:
        inner = [(q, v) for q, v in curve.points if 1 / n <= q <= 1 - 1 / n]
        ends = {q: v for q, v in curve.points if q in (0.0, 1.0)}
        points = inner
        if 0.0 in ends:
            points = [(0.5 / n, ends[0.0]), *points]
        if 1.0 in ends and (not points or points[-1][0] < 1 - 0.5 / n):  # n = 1: one point
            points = [*points, (1 - 0.5 / n, ends[1.0])]
    if not points:
        raise ValueError(f"{curve.system} {curve.metric}: no quantile inside (0, 1)")
    return [v for _, v in points], [q for q, _ in points]


#: Percentiles a CDF's logit axis may mark; those outside the curves' range are left off.
PERCENTILE_TICKS: tuple[float, ...] = (
    *(0.0001, 0.001, 0.01, 0.1, 1.0, 10.0, 50.0),
    *(90.0, 99.0, 99.9, 99.99, 99.999, 99.9999),
)


def percentile_ticks(curves: Sequence[Curve]) -> list[float]:
    """The percentiles to mark: the median and the nines, as far as the curves reach
    (a run of a million samples reaches 99.9999%, one of a thousand 99.9%)."""
    low = min((c.ys[0] for c in curves), default=0.001)
    high = max((c.ys[-1] for c in curves), default=0.999)
    return [p for p in PERCENTILE_TICKS if low * 100 <= p <= high * 100]


def format_ms(value: float) -> str:
    """A latency for a legend: ``0.284``, ``42.9``, ``1,950``."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


@dataclass(frozen=True, slots=True)
class Curve:
    """One distribution as drawn: its label, percentiles and points."""

    label: str
    system: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    p50: float
    p99: float
    samples: int


@dataclass(frozen=True, slots=True)
class CdfChart:
    """One latency chart: every curve of one chart name and split."""

    bench: str
    name: str
    split: Params
    curves: tuple[Curve, ...]
    common: Params
    machine: str

    @property
    def filename(self) -> str:
        """``<bench>_<name>_cdf[_<split values>].png``."""
        suffix = "".join(f"_{_param(v)}".replace("/", "-") for v in self.split.values())
        return f"{self.bench}_{self.name}_cdf{suffix}.png"

    @property
    def size_in(self) -> tuple[float, float]:
        """(width, height) in inches: the plot, then a legend line per curve below it."""
        return WIDTH_IN, round(CDF_HEIGHT_IN + 0.18 * len(self.curves), 2)

    @property
    def title(self) -> str:
        """What was measured (and the split), where and when, under which conditions."""
        head = f"bench {self.bench}: {self.name.replace('_', ' ')} CDF"
        if self.split:
            head += f", {format_params(self.split)}"
        lines = [head, self.machine]
        if self.common:
            lines.append(format_params(self.common))
        return "\n".join(lines)


#: A distribution as charts take it: from samples, or from a saved quantile series.
Source = Distribution | QuantileCurve


def chart_name(metric: str) -> str:
    """The chart a distribution of ``metric`` is drawn on."""
    return CHART_OF.get(metric, metric.removesuffix("_quantile_ms"))


def cdf_charts(bench: str, sources: Iterable[Source], results: Iterable[Result]) -> list[CdfChart]:
    """The latency charts of ``bench``: its distributions grouped by chart name and split
    (see the module docstring); ``results`` give the machine line."""
    sources = [s for s in sources if s.bench == bench]
    machine = machine_line(results)
    charts: list[CdfChart] = []
    for name in dict.fromkeys(chart_name(s.metric) for s in sources):
        members = [s for s in sources if chart_name(s.metric) == name]
        keys = SPLIT_BY.get(name, ())
        split_members = [s for s in members if all(k in s.params for k in keys)]
        references = [s for s in members if s not in split_members]
        splits = dict.fromkeys(_split_key(s, keys) for s in split_members) or {"{}": None}
        for split in splits:
            chosen = [s for s in split_members if _split_key(s, keys) == split]
            split_params = json.loads(split)
            common, curves = _cdf_chart(split_params, chosen, references)
            charts.append(CdfChart(bench, name, split_params, curves, common, machine))
    return charts


def _split_key(source: Source, keys: Sequence[str]) -> str:
    return json.dumps({k: source.params[k] for k in keys})


def _cdf_chart(
    split: Params, members: Sequence[Source], references: Sequence[Source]
) -> tuple[Params, tuple[Curve, ...]]:
    """The chart's shared conditions and its curves: conditions are taken over the split's
    own distributions; a reference curve shows every condition of its own."""
    sources = [*members, *references]
    if len(members) == 1 and not references:
        common = dict(members[0].params)
    else:
        common = common_params([s.params for s in members]) if len(members) > 1 else {}
    common = {k: v for k, v in common.items() if k not in split}
    metrics = {s.metric for s in sources}
    curves = tuple(_curve(s, {**common, **split}, len(metrics) > 1) for s in sources)
    return common, curves


def _curve(source: Source, common: Params, name_metric: bool) -> Curve:
    if isinstance(source, Distribution):
        xs, ys = cdf_from_samples(source.samples)
        n = len(source.samples)
        p50, p99 = nearest_rank(source.samples, 0.5), nearest_rank(source.samples, 0.99)
    else:
        xs, ys = cdf_from_quantiles(source)
        n = source.samples
        p50, p99 = _quantile_of(source, 0.5), _quantile_of(source, 0.99)
    words = [source.system]
    if name_metric:
        words.append(source.metric.removesuffix("_quantile_ms").replace("_", " "))
    words.append(format_params(_varying(source.params, common)))
    return Curve(" ".join(w for w in words if w), source.system, tuple(xs), tuple(ys), p50, p99, n)


def _quantile_of(curve: QuantileCurve, q: float) -> float:
    """The series' latency at quantile ``q``, else at the nearest quantile it has."""
    return min(curve.points, key=lambda point: abs(point[0] - q))[1]
