"""Bench results and how they are printed.

Owns the :class:`Result` record (one measured or derived number), the :class:`Goal` a
derived number is judged against, the JSON-lines form (DESIGN.md section 4, "Bench
output") and the human form: one aligned table per group of results that share a system,
parameter names and metrics, then a goals section for every result whose params carry a
``goal``, then the scenario's footnotes when it has any.

Pure module: no I/O; callers print what it returns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

ParamValue = str | int | float | bool | None
Params = Mapping[str, ParamValue]


@dataclass(frozen=True, slots=True)
class Result:
    """One number a scenario reports.

    Attributes:
        bench: The scenario, e.g. ``"wal"``.
        system: ``"headrace"`` or the peer measured beside it, e.g. ``"disk"``.
        metric: What was measured, e.g. ``"append_records_s"``.
        value: The number; finite.
        unit: Its unit, e.g. ``"records/s"``.
        params: The conditions it was measured under; a derived metric adds ``goal``, ``met``.
    """

    bench: str
    system: str
    metric: str
    value: float
    unit: str
    params: Params = field(default_factory=dict)

    def to_json(self) -> str:
        """The result as one line of JSON (no trailing newline)."""
        if not math.isfinite(self.value):
            raise ValueError(f"{self.metric} is not a finite number: {self.value}")
        return json.dumps(
            {
                "bench": self.bench,
                "system": self.system,
                "metric": self.metric,
                "value": self.value,
                "unit": self.unit,
                "params": dict(self.params),
            },
            allow_nan=False,
        )

    @property
    def is_goal(self) -> bool:
        """Whether the result is judged against a goal (it then belongs in the goals section)."""
        return "goal" in self.params

    @property
    def is_series_point(self) -> bool:
        """Whether the result is one point of a latency quantile series (``--plot``): chart
        data, left out of the human tables."""
        return "quantile" in self.params and "samples" in self.params


@dataclass(frozen=True, slots=True)
class Goal:
    """A target for one metric: ``value <op> target``."""

    op: str  # ">=", ">", "<" or "<="
    target: float

    def met(self, value: float) -> bool:
        """Whether ``value`` reaches the goal."""
        if self.op == ">=":
            return value >= self.target
        if self.op == ">":
            return value > self.target
        if self.op == "<":
            return value < self.target
        if self.op == "<=":
            return value <= self.target
        raise ValueError(f"unknown goal operator {self.op!r}")

    def params(self, value: float) -> dict[str, ParamValue]:
        """The ``goal`` and ``met`` params of a result with this ``value``."""
        return {"goal": f"{self.op} {self.target:.12g}", "met": self.met(value)}


@dataclass(frozen=True, slots=True)
class PeerGoal:
    """A target set by a peer measured in the same run: Headrace's value of a metric must be
    at most the peer's value of the same metric (and at most ``cap`` when set).

    The peer's result is the one of system ``peer`` whose params hold every pair of
    ``match`` (e.g. ``fsync=always``). Without it the goal is ``value <= cap``, or, with
    no cap, ``value <= fallback``; with neither, the metric is not judged. The judged row
    says what it was held against in its ``vs`` param.
    """

    peer: str
    match: tuple[tuple[str, ParamValue], ...] = ()
    cap: float | None = None
    fallback: float | None = None

    def judge(self, result: Result, results: Iterable[Result]) -> Result | None:
        """``result`` judged (params gain ``goal``, ``met`` and ``vs``), or ``None`` when
        there is nothing to hold it against."""
        peer = next(
            (
                r
                for r in results
                if r.system == self.peer
                and r.metric == result.metric
                and not r.is_goal
                and all(r.params.get(k) == v for k, v in self.match)
            ),
            None,
        )
        where = " ".join([self.peer, *(f"{k}={_format_param(v)}" for k, v in self.match)])
        if peer is not None:
            target = peer.value if self.cap is None else min(self.cap, peer.value)
            vs = f"{where} {format_value(peer.value)} {peer.unit} in this run"
            if self.cap is not None:
                vs = f"{vs}, and {format_value(self.cap)} {result.unit}"
        else:
            alone = self.cap if self.cap is not None else self.fallback
            if alone is None:
                return None
            target = alone
            vs = f"{where} not measured: {format_value(target)} {result.unit} alone"
        # A measured target has noise far above its fourth digit: print it as measured.
        goal = Goal("<=", float(f"{target:.4g}"))
        params = {**result.params, **goal.params(result.value), "vs": vs}
        return Result(result.bench, result.system, result.metric, result.value, result.unit, params)


# ---------------------------------------------------------------------------------------
# Human output


def format_value(value: float) -> str:
    """A number for people: thousands separators when large, 3 significant digits when small."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _format_param(value: ParamValue) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_value(value)
    return value


def align(rows: Sequence[Sequence[str]], numeric: Sequence[bool]) -> list[str]:
    """Lay out rows as columns: numeric columns right-aligned, others left-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(numeric))]
    return [
        "  ".join(
            cell.rjust(w) if num else cell.ljust(w)
            for cell, w, num in zip(row, widths, numeric, strict=True)
        ).rstrip()
        for row in rows
    ]


@dataclass(slots=True)
class _Row:
    system: str
    params: Params
    cells: dict[str, Result] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        return self.system, tuple(self.params), tuple(self.cells)


def _rows(results: Iterable[Result]) -> list[_Row]:
    """One row per (system, params), holding that row's metrics, in first-seen order."""
    rows: dict[tuple[str, str], _Row] = {}
    for r in results:
        key = (r.system, json.dumps(dict(r.params), sort_keys=True))
        rows.setdefault(key, _Row(r.system, r.params)).cells[r.metric] = r
    return list(rows.values())


def _section(rows: list[_Row]) -> list[str]:
    first = rows[0]
    names = list(first.params)
    metrics = list(first.cells)
    header = [*names, *metrics]
    units = [""] * len(names) + [f"[{first.cells[m].unit}]" for m in metrics]
    body = [
        [_format_param(row.params[n]) for n in names]
        + [format_value(row.cells[m].value) for m in metrics]
        for row in rows
    ]
    numeric = [False] * len(names) + [True] * len(metrics)
    return [f"{first.system}:", *("  " + line for line in align([header, units, *body], numeric))]


def render_table(results: Iterable[Result]) -> str:
    """Measured results as tables, one per group of rows with the same shape."""
    sections: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[_Row]] = {}
    for row in _rows(r for r in results if not r.is_goal and not r.is_series_point):
        sections.setdefault(row.shape, []).append(row)
    return "\n\n".join("\n".join(_section(rows)) for rows in sections.values())


def render_goals(results: Iterable[Result]) -> str:
    """The goals section: each judged metric, its value, goal, verdict and conditions."""
    rows = [["metric", "value", "unit", "goal", "met", "params"]]
    for r in results:
        if not r.is_goal:
            continue
        context = " ".join(
            f"{k}={_format_param(v)}" for k, v in r.params.items() if k not in ("goal", "met")
        )
        met = "yes" if r.params["met"] else "NO"
        rows.append([r.metric, format_value(r.value), r.unit, str(r.params["goal"]), met, context])
    lines = align(rows, [False, True, False, False, False, False])
    return "\n".join(["goals:", *("  " + line for line in lines)])


def render_notes(notes: Sequence[str]) -> str:
    """The footnotes under the tables, numbered, one per line."""
    return "\n".join(["notes:", *(f"  {i}. {note}" for i, note in enumerate(notes, 1))])


def render_human(bench: str, results: Sequence[Result], notes: Sequence[str] = ()) -> str:
    """The whole human report of one scenario run, ending with its ``notes`` (if any)."""
    parts = [f"bench {bench}", render_table(results), render_goals(results)]
    return "\n\n".join([*parts, render_notes(notes)] if notes else parts)
