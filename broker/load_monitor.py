"""The sampler that feeds :class:`broker.busy.BusyRule`: the process's CPU, read as
publishes are answered.

Owns :class:`LoadMonitor`. Each publish answer asks it for the in-flight hint; when
:data:`PERIOD_S` or more passed since its last reading, it reads the CPU time of the whole
process (``time.process_time``: every thread, user and system) and the monotonic clock,
and hands the difference to the rule first. So it samples exactly while hints are given
out, and an idle broker pays nothing: a timer of its own, 40 wake-ups a second, cost an
idle broker about 0.57 % of a core here (0.008 % without it), each wake-up of a halted
vCPU being dear on this VM. A reading costs about 0.5 us, the rule 0.6 us; between
readings an answer costs one clock read.

The period after a pause in publishing spans the whole pause, so its share of a core is
low and the average falls; the next period, :data:`PERIOD_S` later, shows the new load
(and a single period at :data:`broker.busy.PEAK_AT` makes the process busy at once).

Must not depend on the gRPC layer: the publish handlers call :meth:`LoadMonitor.hint`;
the metrics exporter reads :attr:`LoadMonitor.rule` (as of the last answer).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from broker.busy import BusyRule

#: Seconds between two readings, at least: short, because at a saturating load's onset
#: every period still pipelined leaves a backlog that drains slowly (:mod:`broker.busy`).
PERIOD_S = 0.025


class LoadMonitor:
    """Reads the process's CPU at most every ``period_s`` into :attr:`rule`.

    Not task-safe: called on the event loop only (the publish handlers).

    Args:
        period_s: Least seconds between readings. Default :data:`PERIOD_S`.
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
        self._last_cpu = cpu()
        self._last_at = clock()

    def hint(self, partition_hint: int) -> int:
        """The in-flight hint to answer with: ``partition_hint`` (:mod:`wal.commit_cost`),
        or 1 while the process is busy; takes a reading first when one is due."""
        now = self._clock()
        if now - self._last_at >= self._period_s:
            cpu = self._cpu()
            self.rule.observe(cpu - self._last_cpu, now - self._last_at)
            self._last_cpu, self._last_at = cpu, now
        return self.rule.in_flight_hint(partition_hint)
