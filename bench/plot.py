"""The bench charts: PNG files drawn with matplotlib's Agg backend, never a display.

Owns the drawing and the files: :func:`write_charts` turns one run's results (and, when
the run kept them, its latency samples) into a throughput bar chart per scenario and its
latency CDF charts, in a directory (``docs/bench`` by default); :func:`load_results` reads
saved ``--json`` output back for ``python -m bench plot``. What goes on each chart is
decided by :mod:`bench._chartdata`, so the charts of a run and those redrawn from its JSON
lines are the same (a CDF redrawn from JSON follows the saved quantiles, not every sample).

matplotlib is imported only when a chart is drawn: it is in the ``bench`` extra (and the
``dev`` one, for the tests), not a dependency of the broker. :func:`require_matplotlib`
says in one line how to get it.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import _chartdata
from bench._chartdata import CdfChart, MetricGroup, Panel, ThroughputChart
from bench._output import Result
from bench._samples import Distribution, curves_from_series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Where charts go unless told otherwise (relative to the working directory).
DEFAULT_DIR = Path("docs") / "bench"
INSTALL_HINT = "pip install 'headrace[bench]'"
#: Colour of Headrace's bars and curves; peers take the next colours of the cycle.
HEADRACE_COLOR = "#1f77b4"
PEER_COLORS = ("#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
GOAL_COLOR = "#d62728"
#: The smallest latency a log axis shows (ms); a zero is drawn there.
MIN_MS = 1e-3


class PlotUnavailableError(RuntimeError):
    """Raised when a chart is asked for and matplotlib is not installed."""

    def __init__(self) -> None:
        super().__init__(f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}")


class ResultsFileError(ValueError):
    """Raised when saved bench output cannot be read; says the file, the line and why."""


def require_matplotlib() -> None:
    """Return if matplotlib can be imported, else raise :class:`PlotUnavailableError`."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends import backend_agg  # noqa: F401
    except ImportError as exc:
        raise PlotUnavailableError() from exc


def has_matplotlib() -> bool:
    """Whether matplotlib is installed, without importing it."""
    return importlib.util.find_spec("matplotlib") is not None


# ---------------------------------------------------------------------------------------
# Files


def write_charts(
    results: Sequence[Result], distributions: Iterable[Distribution], out_dir: Path
) -> list[Path]:
    """Draw every chart of ``results`` into ``out_dir`` (created if missing).

    Latency CDFs come from ``distributions`` (a run's samples) when there are any, else
    from the quantile series in ``results`` (saved ``--json --plot`` output).

    Returns:
        The files written, throughput charts first.

    Raises:
        PlotUnavailableError: matplotlib is not installed.
        OSError: A file could not be written.
    """
    require_matplotlib()
    sources: list[_chartdata.Source] = list(distributions) or list(curves_from_series(results))
    written = []
    for bench in dict.fromkeys(r.bench for r in results):
        chart = _chartdata.throughput_chart(bench, results)
        if chart is not None:
            written.append(_save(draw_throughput(chart), out_dir / chart.filename))
        for cdf in _chartdata.cdf_charts(bench, sources, results):
            written.append(_save(draw_cdf(cdf), out_dir / cdf.filename))
    return written


def _save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=_chartdata.DPI)
    return path


def load_results(path: Path) -> list[Result]:
    """The results in a file of saved ``--json`` output; blank lines are skipped.

    Raises:
        ResultsFileError: The file cannot be read, a line is not a bench result, or there
            are none.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFileError(f"cannot read {path}: {exc}") from exc
    results = [
        _parse_line(path, number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not results:
        raise ResultsFileError(
            f"{path} holds no bench results; save some with: python -m bench <scenario> --json"
        )
    return results


def _parse_line(path: Path, number: int, line: str) -> Result:
    where = f"{path} line {number}"
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ResultsFileError(
            f"{where} is not JSON ({exc.msg}); expected bench --json output"
        ) from exc
    if not isinstance(doc, dict):
        raise ResultsFileError(f"{where} is not a JSON object; expected bench --json output")
    missing = [k for k in ("bench", "system", "metric", "value", "unit", "params") if k not in doc]
    if missing:
        raise ResultsFileError(f"{where} lacks {', '.join(missing)}; not bench --json output")
    value, params = doc["value"], doc["params"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ResultsFileError(f"{where}: value must be a finite number, got {value!r}")
    if not isinstance(params, dict) or not all(
        v is None or isinstance(v, str | int | float | bool) for v in params.values()
    ):
        raise ResultsFileError(f"{where}: params must be an object of numbers and strings")
    bench, system, metric, unit = (doc[k] for k in ("bench", "system", "metric", "unit"))
    if not all(isinstance(t, str) for t in (bench, system, metric, unit)):
        raise ResultsFileError(f"{where}: bench, system, metric and unit must be strings")
    return Result(bench, system, metric, float(value), unit, params)


# ---------------------------------------------------------------------------------------
# Drawing


def _figure(size_in: tuple[float, float]) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size_in, dpi=_chartdata.DPI, layout="constrained")
    FigureCanvasAgg(figure)  # Agg, explicitly: no display is ever opened
    return figure


def _colors(systems: Iterable[str]) -> dict[str, str]:
    """Headrace in blue, each other system in the next colour, in first-seen order."""
    peers = [s for s in dict.fromkeys(systems) if s != "headrace"]
    colors = {s: PEER_COLORS[i % len(PEER_COLORS)] for i, s in enumerate(peers)}
    return {"headrace": HEADRACE_COLOR, **colors}


def draw_throughput(chart: ThroughputChart) -> Figure:
    """The bar chart: one axis per unit, each metric a block of horizontal bars under its
    name, the value written at each bar's end."""
    figure = _figure(chart.size_in)
    systems = [b.system for p in chart.panels for g in p.groups for b in g.bars]
    colors = _colors(systems)
    ratios = [p.rows + 1.5 for p in chart.panels]
    axes = figure.subplots(len(chart.panels), 1, squeeze=False, height_ratios=ratios)
    for panel, ax in zip(chart.panels, axes[:, 0], strict=True):
        _draw_panel(ax, panel, colors)
    figure.suptitle(chart.title, fontsize=10)
    return figure


def _draw_panel(ax: Axes, panel: Panel, colors: dict[str, str]) -> None:
    from matplotlib.ticker import FuncFormatter

    labels: list[str] = []
    headings: list[int] = []
    values = [b.high or b.value for g in panel.groups for b in g.bars]
    positives = [v for v in values if v > 0]
    log = bool(positives) and max(positives) / min(positives) > 100
    for group in panel.groups:
        headings.append(len(labels))
        labels.append(group.metric)
        first = len(labels)
        labels.extend(b.label for b in group.bars)
        _draw_group(ax, group, first, colors)
    ax.set_yticks(range(len(labels)), labels=labels, fontsize=8)
    for index in headings:
        ax.get_yticklabels()[index].set_fontweight("bold")
    ax.set_ylim(len(labels) - 0.4, -0.6)
    ax.tick_params(axis="y", length=0)
    if log:
        ax.set_xscale("log")
    goals = [g.goal.target for g in panel.groups if g.goal is not None]
    top = max([*values, *goals], default=1.0)
    ax.set_xlim(right=top * (8 if log else 1.25))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: _chartdata.format_rate(value)))
    ax.set_xlabel(f"{panel.unit}{' (log scale)' if log else ''}", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)


def _draw_group(ax: Axes, group: MetricGroup, first: int, colors: dict[str, str]) -> None:
    for offset, bar in enumerate(group.bars):
        y = first + offset
        err: Any = None
        if bar.low is not None and bar.high is not None:
            err = [[bar.value - bar.low], [bar.high - bar.value]]
        ax.barh(y, bar.value, color=colors[bar.system], xerr=err, capsize=3, height=0.7)
        ax.text(bar.high or bar.value, y, f"  {_chartdata.format_rate(bar.value)}", va="center")
    if group.goal is not None:
        last = first + len(group.bars) - 1
        target = group.goal.target
        ax.vlines(target, first - 0.45, last + 0.45, colors=GOAL_COLOR, linestyles="dashed")
        ax.text(target, first - 0.5, f" goal {group.goal.op} {_chartdata.format_rate(target)}",
                color=GOAL_COLOR, fontsize=8, va="bottom")  # fmt: skip


def _curve_looks(chart: CdfChart) -> tuple[list[str], list[str]]:
    """Colours and line styles of the curves: by system when each system has one curve
    (Headrace blue), else a colour per curve and a line style per system (Headrace solid)."""
    systems = list(dict.fromkeys(c.system for c in chart.curves))
    if len(systems) == len(chart.curves):
        by_system = _colors(systems)
        return [by_system[c.system] for c in chart.curves], ["-"] * len(chart.curves)
    palette = (HEADRACE_COLOR, *PEER_COLORS)
    colors = [palette[i % len(palette)] for i in range(len(chart.curves))]
    peers = [s for s in systems if s != "headrace"]
    style_of = {"headrace": "-"} | {s: ("--", ":", "-.")[i % 3] for i, s in enumerate(peers)}
    return colors, [style_of[c.system] for c in chart.curves]


def draw_cdf(chart: CdfChart) -> Figure:
    """The latency CDF: log-scaled ms against a logit percentile axis, so the median and
    the tail are both readable; each curve's p50 and p99 in the legend."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    figure = _figure(chart.size_in)
    ax = figure.add_subplot()
    for curve, color, style in zip(chart.curves, *_curve_looks(chart), strict=True):
        xs = [max(x, MIN_MS) for x in curve.xs]
        p50, p99 = _chartdata.format_ms(curve.p50), _chartdata.format_ms(curve.p99)
        label = f"{curve.label}: p50 {p50} ms, p99 {p99} ms"
        ax.plot(xs, curve.ys, style, color=color, label=label)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yscale("logit")
    ticks = _chartdata.percentile_ticks(chart.curves)
    ax.set_yticks([p / 100 for p in ticks], labels=[f"{p:g}%" for p in ticks])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("samples at or below (percentile)")
    ax.grid(True, which="both", alpha=0.3)
    figure.legend(loc="outside lower center", fontsize=8, frameon=False)
    figure.suptitle(chart.title, fontsize=10)
    return figure
