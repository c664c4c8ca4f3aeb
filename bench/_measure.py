"""Measurement helpers shared by scenarios: the event loop to use, percentiles and rates.

Owns the choice of event loop: uvloop when it can be imported, else asyncio's default, and
the name of that choice that results record as ``params["loop"]``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory() -> tuple[str, LoopFactory]:
    """The event loop to benchmark on: ``("uvloop", ...)`` when importable, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return "asyncio", asyncio.new_event_loop
    return "uvloop", uvloop.new_event_loop


def new_runner() -> tuple[str, asyncio.Runner]:
    """An ``asyncio.Runner`` on the chosen loop, and the loop's name."""
    name, factory = loop_factory()
    return name, asyncio.Runner(loop_factory=factory)


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ascending samples."""
    if not sorted_samples:
        raise ValueError("percentile of no samples")
    rank = max(1, math.ceil(q / 100 * len(sorted_samples)))
    return sorted_samples[rank - 1]


def per_second(count: float, seconds: float) -> float:
    """``count / seconds``, guarding against a zero-length interval."""
    return count / max(seconds, 1e-9)


def median(samples: Sequence[float]) -> float:
    """The median of samples (the lower middle one when their number is even)."""
    ordered = sorted(samples)
    return ordered[(len(ordered) - 1) // 2]
