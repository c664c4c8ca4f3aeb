"""The sampler that feeds :class:`broker.busy.BusyRule`: the process's CPU, periodically.

Owns :class:`LoadMonitor`: a timer on the event loop that, every :data:`PERIOD_S`, reads
the CPU time of the whole process (``time.process_time``: every thread, user and system)
and the monotonic clock, and hands the difference since the last reading to the rule. No
task and no thread: one timer callback a period, a few microseconds each.

Must not depend on the gRPC layer: the publish handlers only read :attr:`LoadMonitor.rule`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from broker.busy import BusyRule

#: Seconds between two readings.
PERIOD_S = 0.05


class LoadMonitor:
    """Samples the process's CPU every ``period_s`` into :attr:`rule`.

    Task-safe on one event loop: started, read and stopped there only.

    Args:
        period_s: Seconds between readings. Default :data:`PERIOD_S`.
        cpu: The process's CPU seconds so far (tests pass their own).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        *,
        period_s: float = PERIOD_S,
        cpu: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rule = BusyRule()
        self._period_s = period_s
        self._cpu = cpu
        self._clock = clock
        self._last = (0.0, 0.0)
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Take the first reading and sample from now on."""
        self._last = (self._cpu(), self._clock())
        self._timer = asyncio.get_running_loop().call_later(self._period_s, self._sample)

    def stop(self) -> None:
        """Stop sampling (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sample(self) -> None:
        cpu, now = self._cpu(), self._clock()
        last_cpu, last_now = self._last
        self._last = (cpu, now)
        self.rule.observe(cpu - last_cpu, now - last_now)
        self._timer = asyncio.get_running_loop().call_later(self._period_s, self._sample)
