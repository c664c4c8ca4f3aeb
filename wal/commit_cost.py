"""What a group commit costs on each side, and how many batches a producer should keep in
flight because of it.

Owns :class:`CommitCost`, a pure rule fed by :class:`~wal.writer.LogWriter` with two
measurements per synced group commit:

- ``disk_s``: the writer thread's write and ``fdatasync`` (the time a second batch in
  flight would overlap with), and
- ``notify_s``: the event loop's work telling the high-water mark's listeners, that is a
  dispatcher's pass over every subscription of the partition, which writes each
  consumer's stream (the work every extra commit costs again).

The rule (the broker sends it to producers as ``PublishResponse.in_flight_hint``):

- While the loop's work per commit is small beside the disk's, a second batch in flight
  costs the broker little and saves its records the wait for the previous answer: hint 2.
- While it is large, each batch in flight becomes a commit of its own that pays that work
  again, and the broker falls behind; one batch in flight lets the records that arrive
  meanwhile share the next commit: hint 1.

Worked example (measured on the development machine, 2 cores, fsync ``always``): one
subscription consuming 2,000 msg/s, ``disk_s`` about 170 us and ``notify_s`` about 40 us
per commit: the ratio is 0.24, under :data:`ON_RATIO`, so the hint becomes 2 (the e2e p50
fell from 1.19-1.33 to 0.79-0.97 ms). 100 subscriptions at 200 msg/s: ``disk_s`` about 240 us,
``notify_s`` about 1,500 us: 6.2, over :data:`OFF_RATIO`, so it stays 1 (with 2 the
fan-out's p50 rose from about 11 to 17-22 ms). Between the two thresholds the hint keeps
its value (hysteresis), so a ratio near one threshold does not flip it on every commit.

The rule sees one partition only. Many partitions, each cheap, can together saturate the
broker; the broker then sends 1 whatever this says (:mod:`broker.busy`).

Both are exponentially weighted averages (weight :data:`WEIGHT` for each new commit),
and the hint stays 1 until :data:`WARMUP_COMMITS` commits were seen: a producer starts
with one batch in flight, as before this rule existed.

Pure: no I/O, no clock (the writer measures and passes seconds in). Not task-safe: the
writer calls it on the event loop only.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Weight of each new commit in the averages (1/8: about the last 8 commits count).
WEIGHT = 1 / 8
#: Commits observed before the hint may leave 1.
WARMUP_COMMITS = 8
#: The hint becomes 2 once ``notify_s`` falls under this share of ``disk_s``.
ON_RATIO = 0.5
#: The hint falls back to 1 once ``notify_s`` rises over this share of ``disk_s``.
OFF_RATIO = 1.0
#: The hint while pipelining pays.
PIPELINED = 2


@dataclass(slots=True)
class CommitCost:
    """The averaged cost of a log's synced group commits, and the in-flight hint."""

    #: Average seconds the writer thread spent writing and syncing one group.
    disk_s: float = 0.0
    #: Average seconds the event loop spent telling the listeners about one group.
    notify_s: float = 0.0
    #: Commits observed so far.
    commits: int = 0
    #: Whether a producer should keep :data:`PIPELINED` batches in flight (else one).
    pipelined: bool = False

    def observe(self, disk_s: float, notify_s: float) -> None:
        """Take one synced group commit's measurements (seconds, both >= 0)."""
        if self.commits == 0:
            self.disk_s, self.notify_s = disk_s, notify_s
        else:
            self.disk_s += (disk_s - self.disk_s) * WEIGHT
            self.notify_s += (notify_s - self.notify_s) * WEIGHT
        self.commits += 1
        if self.commits < WARMUP_COMMITS:
            return
        if self.pipelined:
            self.pipelined = self.notify_s <= self.disk_s * OFF_RATIO
        else:
            self.pipelined = self.notify_s < self.disk_s * ON_RATIO

    @property
    def in_flight_hint(self) -> int:
        """Batches a producer should keep in flight on this log: 1 or :data:`PIPELINED`."""
        return PIPELINED if self.pipelined else 1
