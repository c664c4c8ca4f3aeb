"""The machine record every bench run starts with: where and when it was measured.

Owns :func:`machine_result`, a bench result like any other (DESIGN.md section 4): system
``machine``, metric ``cpu_cores`` (the cores this process may run on), unit ``cores``,
params ``cpu`` (the model name), ``date`` (UTC, ISO 8601, to the second), ``kernel`` and
``python``. Charts drawn from saved ``--json`` output read their titles from it.
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Callable

from bench._output import Result

SYSTEM = "machine"
METRIC = "cpu_cores"


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name from ``cpuinfo``, else :func:`platform.processor`, else ``unknown``."""
    try:
        with open(cpuinfo, encoding="utf-8") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cores() -> int:
    """The cores this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_result(
    bench: str,
    *,
    now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
) -> Result:
    """The machine record of a run of ``bench``, dated ``now()``."""
    params = {
        "cpu": cpu_model(),
        "date": now().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    return Result(bench, SYSTEM, METRIC, usable_cores(), "cores", params)
