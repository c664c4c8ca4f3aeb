"""Latency distributions a run keeps for its CDF charts, and their JSON-lines form.

Owns :class:`Distribution` (every latency sample of one measurement, ascending, in ms),
:class:`SampleLog` (where scenarios put them; it exists only when ``--plot`` is given, so
a run without charts keeps no samples beyond each measurement) and the quantile series
that carries a distribution through ``--json`` output so ``python -m bench plot`` can redraw
its CDF without the samples.

A quantile series is ordinary bench output (DESIGN.md section 4): one result per quantile,
``metric`` the distribution's (e.g. ``e2e_latency_quantile_ms``), ``value`` the latency at
that quantile, ``params`` the distribution's own plus ``quantile`` (0 to 1, nearest rank)
and ``samples`` (how many there were). For example the 99th percentile of 20,000 pubsub
latencies is::

    {"bench": "pubsub", "system": "headrace", "metric": "e2e_latency_quantile_ms",
     "value": 4.1, "unit": "ms", "params": {"fsync": "always", ..., "quantile": 0.99,
     "samples": 20000}}

Pure module: no I/O.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from bench._output import Params, Result

#: The quantiles a series carries: dense at both ends, so a logit axis shows the median
#: and the tail alike. 0 and 1 are the minimum and the maximum.
QUANTILES: tuple[float, ...] = (
    *(0.0, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05),
    *(0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8),
    *(0.85, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9998, 0.9999, 1.0),
)
#: The params a series point adds to its distribution's.
SERIES_PARAMS = ("quantile", "samples")


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank quantile ``q`` (0 <= q <= 1) of ascending samples; 0 is the minimum."""
    if not ordered:
        raise ValueError("quantile of no samples")
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class Distribution:
    """Every latency one measurement saw.

    Attributes:
        bench: The scenario, e.g. ``"pubsub"``.
        system: ``"headrace"`` or a peer.
        metric: The series' metric, ending in ``_quantile_ms``.
        params: The conditions, as the measurement's own results carry them.
        samples: The latencies in ms, ascending; at least one.
    """

    bench: str
    system: str
    metric: str
    params: Params
    samples: Sequence[float]

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError(f"{self.bench} {self.system} {self.metric}: no samples")

    @property
    def key(self) -> str:
        """What identifies the distribution: system, metric and params, as one string."""
        return json.dumps([self.system, self.metric, dict(self.params)], sort_keys=True)

    def series(self) -> list[Result]:
        """The distribution as a quantile series (see the module docstring)."""
        n = len(self.samples)
        return [
            Result(
                self.bench,
                self.system,
                self.metric,
                nearest_rank(self.samples, q),
                "ms",
                {**self.params, "quantile": q, "samples": n},
            )
            for q in QUANTILES
        ]


class SampleLog:
    """The distributions of one run, in the order they were measured.

    Not task-safe: scenarios add to it from the thread that runs them.
    """

    def __init__(self) -> None:
        self._items: list[Distribution] = []

    def add(
        self, bench: str, system: str, metric: str, params: Params, samples: Iterable[float]
    ) -> None:
        """Keep the latencies (ms) of one measurement; they are stored sorted, as doubles."""
        ordered = array("d", sorted(samples))
        self._items.append(Distribution(bench, system, metric, dict(params), ordered))

    def __iter__(self) -> Iterator[Distribution]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def series(self) -> list[Result]:
        """Every distribution's quantile series, in order."""
        return [r for d in self._items for r in d.series()]


def is_series_point(result: Result) -> bool:
    """Whether ``result`` is one point of a quantile series, not a measured figure."""
    return result.is_series_point


@dataclass(frozen=True, slots=True)
class QuantileCurve:
    """A distribution known only by its quantile series (read back from ``--json`` output).

    Attributes:
        bench, system, metric, params: As the distribution's.
        points: (quantile, latency ms) pairs, by quantile.
        samples: How many samples the quantiles were taken from.
    """

    bench: str
    system: str
    metric: str
    params: Params
    points: tuple[tuple[float, float], ...]
    samples: int


def curves_from_series(results: Iterable[Result]) -> list[QuantileCurve]:
    """Group series points back into one curve per distribution, in first-seen order."""
    groups: dict[str, tuple[Result, list[tuple[float, float]]]] = {}
    for r in results:
        if not is_series_point(r):
            continue
        params = {k: v for k, v in r.params.items() if k not in SERIES_PARAMS}
        key = json.dumps([r.bench, r.system, r.metric, params], sort_keys=True)
        quantile = r.params["quantile"]
        if not isinstance(quantile, int | float) or isinstance(quantile, bool):
            raise ValueError(f"{r.metric}: quantile must be a number, got {quantile!r}")
        groups.setdefault(key, (r, []))[1].append((float(quantile), r.value))
    curves = []
    for first, points in groups.values():
        samples = first.params["samples"]
        params = {k: v for k, v in first.params.items() if k not in SERIES_PARAMS}
        curves.append(
            QuantileCurve(
                first.bench,
                first.system,
                first.metric,
                params,
                tuple(sorted(points)),
                int(samples) if isinstance(samples, int | float) else 0,
            )
        )
    return curves
