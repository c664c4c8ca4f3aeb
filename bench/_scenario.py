"""What a scenario is: the options it is given and the shape of its run.

Owns :class:`RunOptions` (what every scenario is given) and :data:`Scenario` (a scenario's
run: options in, results out). Every scenario module imports this one; the registry of
scenarios (:mod:`bench._runner`) imports the scenarios, so the arrows run one way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench._output import Result
from bench._samples import SampleLog


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What a scenario is given.

    Attributes:
        quick: Shrink sizes so the whole scenario takes seconds (smoke runs, ``make run``).
        data_dir: An empty directory owned by this run; it is removed afterwards.
        samples: Where latency distributions go for the CDF charts; ``None`` (the
            default, no ``--plot``) keeps no samples beyond each measurement.
    """

    quick: bool
    data_dir: Path
    samples: SampleLog | None = None


Scenario = Callable[[RunOptions], Iterator[Result]]
