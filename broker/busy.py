"""When the broker process is too busy for producers to pipeline: the rule.

Owns :class:`BusyRule`, fed by :class:`broker.load_monitor.LoadMonitor` with the CPU the
whole process used over each sampling period (all its threads: the event loop, the log
writers' threads, gRPC's). A partition's own commit cost (:mod:`wal.commit_cost`) says
whether a second batch in flight is cheap *for that partition*; it cannot see the rest of
the process. Many partitions, each cheap, can together saturate it, and then every extra
batch a pipelining producer sends is one more request, commit and answer that the
saturated process queues behind the others. So while the process is busy, every
partition's in-flight hint is 1, whatever its commit cost says.

Busy means the process used at least :data:`BUSY_AT` of a core, averaged over the last
few periods (weight :data:`WEIGHT` per period); it is calm again once the average falls to
:data:`CALM_AT` (hysteresis, so a process near one threshold does not flip the hint on
every period). The threshold is a share of *one* core: the interpreter's lock lets one
thread run Python at a time, so a process near one core is saturated whatever the
machine's core count (on a large machine this may call a process busy early, which only
keeps producers at one batch in flight, the behaviour without the hint).

Worked example (measured on the development machine, 2 cores, fsync ``always``, one
subscription, 4 s runs, the producer and consumer in one other process):

- 1 partition at 2,000 msg/s: the process uses 0.58-0.59 of a core with one batch in
  flight and 0.72-0.75 with two; under :data:`BUSY_AT`, so the partition's hint of 2
  stands (e2e p50 0.79-0.97 ms against 1.23-1.33).
- 8 partitions at 4,000 msg/s in all: 0.89-1.0 of a core with one batch in flight (p50
  6-24 ms: saturated). Each partition's commits are cheap, so each hinted 2, and without
  this rule the backlog grew without bound (p50 250-470 ms); with it, p50 6.6-12.9 ms.
- 4 partitions at 8,000 msg/s: 0.84-0.94 of a core: mostly busy, p50 level with one
  batch in flight (2.6-3.0 ms against 2.5-3.1), the p99 higher in two runs of three
  (7.6-15.1 ms against 5.9-8.9): periods run pipelined until the average is back over
  :data:`BUSY_AT`.
- Thresholds of 0.9 and 0.7 were too permissive: 8 partitions at 2,000 msg/s (0.86-0.89
  of a core) pipelined, p50 1.21-1.75 ms against 0.86-1.00 with one batch in flight.
  With these, the same load takes 0.76-0.80 and pipelines to p50 0.82-0.87 against
  1.07-1.19.

Pure: no I/O, no clock (the monitor measures and passes seconds in). Not task-safe: the
monitor calls it on the event loop only.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Weight of each new period in the average (1/2: about the last two periods count).
WEIGHT = 1 / 2
#: The process is busy once its average CPU reaches this share of one core.
BUSY_AT = 0.8
#: A busy process is calm again once its average CPU falls to this share of one core.
CALM_AT = 0.6


@dataclass(slots=True)
class BusyRule:
    """The process's averaged CPU use, in cores, and whether it is too busy to pipeline."""

    #: Average CPU seconds per wall second over the recent periods.
    cores: float = 0.0
    #: Whether producers should keep one batch in flight, whatever a partition's hint.
    busy: bool = False

    def observe(self, cpu_s: float, wall_s: float) -> None:
        """Take one period: the process used ``cpu_s`` CPU seconds in ``wall_s`` seconds
        of wall time (a period of no length is ignored)."""
        if wall_s <= 0:
            return
        self.cores += (cpu_s / wall_s - self.cores) * WEIGHT
        self.busy = self.cores > CALM_AT if self.busy else self.cores >= BUSY_AT

    def in_flight_hint(self, partition_hint: int) -> int:
        """The hint to send: ``partition_hint`` (:mod:`wal.commit_cost`), or 1 while busy."""
        return 1 if self.busy else partition_hint
