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
few periods (weight :data:`WEIGHT` per period), or :data:`PEAK_AT` in a single period (a
load's onset: every period pipelined at saturation leaves a backlog that drains slowly);
it is calm again once the average falls to :data:`CALM_AT` (hysteresis, so a process near
one threshold does not flip the hint on every period). The threshold is a share of *one*
core: the interpreter's lock lets one thread run Python at a time, so a process near one
core is saturated whatever the machine's core count (on a large machine this may call a
process busy early, which only keeps producers at one batch in flight, the behaviour
without the hint).

Where the thresholds sit (the development machine, 2 cores, fsync ``always``, one
subscription, ``python -m bench hint``: 4 s runs, the producer and consumer in one other
process):

- 1 partition at 2,000 msg/s: 0.57-0.60 of a core with one batch in flight, 0.72-0.76
  with the hint's two: under :data:`BUSY_AT` (single 50 ms periods peaked at 0.79; with
  25 ms readings and :data:`PEAK_AT` the last ``bench hint`` run still pipelined there,
  0.73 of a core, p50 0.52x one batch in flight's), so the hint stands. :data:`CALM_AT`
  (0.65) lies above the 0.60 of one batch in flight, so a broker that a burst made busy
  comes back to pipelining.
- 8 partitions at 4,000 msg/s in all: 0.95-1.02 of a core with one batch in flight:
  saturated. Each partition's commits are cheap, so each hints 2; without this rule the
  backlog grew without bound (p50 250-470 ms against 7-9). What the first pipelined
  periods of the load's onset leave behind drains slowly at saturation, so detection
  speed is what matters: with the average alone over 50 ms periods (calm at 0.6), p50
  7.6-19.8 ms and p99 108-188 against 7-9 and 14-51 with one batch in flight; adding the
  single-period :data:`PEAK_AT`, p50 6.8-12.7 and p99 57-118; with 25 ms periods
  (:data:`broker.load_monitor.PERIOD_S`), p50 6.2-13.5 and p99 67-85 in two runs, and in
  the last ``bench hint`` run p50 9.4-10.4 (1.35x one batch in flight's median) and p99
  47-68 (2.9x): the cost the hint still has at a saturating load's onset.
- Thresholds of 0.9 and 0.7 were too permissive: 8 partitions at 2,000 msg/s (0.86-0.89
  of a core) pipelined, p50 1.21-1.75 ms against 0.86-1.00 with one batch in flight.

Pure: no I/O, no clock (the monitor measures and passes seconds in). Not task-safe: the
monitor calls it on the event loop only.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Weight of each new period in the average (1/2: about the last two periods count).
WEIGHT = 1 / 2
#: The process is busy once its average CPU reaches this share of one core.
BUSY_AT = 0.8
#: A calm process is busy at once when one period reaches this share of one core.
PEAK_AT = 0.95
#: A busy process is calm again once its average CPU falls to this share of one core.
CALM_AT = 0.65


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
        period = cpu_s / wall_s
        self.cores += (period - self.cores) * WEIGHT
        if self.busy:
            self.busy = self.cores > CALM_AT
        else:  # one period at the peak is enough: a load's onset costs the least backlog
            self.busy = self.cores >= BUSY_AT or period >= PEAK_AT

    def in_flight_hint(self, partition_hint: int) -> int:
        """The hint to send: ``partition_hint`` (:mod:`wal.commit_cost`), or 1 while busy."""
        return 1 if self.busy else partition_hint
