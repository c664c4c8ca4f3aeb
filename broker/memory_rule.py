"""When the broker gives memory back: the rule behind :mod:`broker.memory`.

Why (issue 38): a burst of large requests (the fuzzer's 16 MiB ones, or a producer's 16
MiB batches) left a broker at 350-400 MiB of RSS long after it went quiet, from 54 MiB.
Two things held it. The requests of calls that ended in an exception stay reachable from
reference cycles (the exception's traceback holds the frames that hold the request, and
grpc keeps the abort exception on the call's state, which the frames reach again), and
only a full collection frees them, which an idle broker never runs. And glibc keeps what
is freed in its heaps: after the first large buffer is freed its mmap threshold rises
(up to 32 MiB), so the next ones come from heaps that shrink only from the top.
:mod:`broker.memory` pins the mmap threshold at 1 MiB at start and, when this rule says
so, runs a full collection and ``malloc_trim``.

The rule: relieve when the resident set is at least ``grow_bytes`` above the lowest it
has been (the broker's floor), and at least the current interval after the last relief.
The interval starts at ``min_interval_s``; a relief that gives back less than half of
``grow_bytes`` doubles it (up to ``max_interval_s``), one that gives back more resets it.
So a burst that leaves RSS high is relieved within seconds, again until RSS is back near
the floor (memory still held by calls in flight at the first relief goes at a later one),
while a plateau that is real (buffers in use under a steady load) costs a relief of a few
milliseconds every 5 s, then 10 s, 20 s... and at most one every ``max_interval_s``.

Worked example (64 MiB, 5 s, 300 s): RSS 55 MiB at t=0 is the floor; 100 MiB at t=1 is
not due (45 MiB above); 350 MiB at t=2 is due, and the relief brings it to 160 MiB
(productive: the interval stays 5 s); 160 MiB at t=4 waits; at t=7 it is due again and
brings it to 60 MiB. Had it stayed at 150 MiB (unproductive) the next would be at t=17.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``; the caller passes ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass
class ReliefRule:
    """Decides when to give memory back. Not task-safe: one task owns it.

    Attributes:
        grow_bytes: How far above the floor RSS must be for a relief to be due.
        min_interval_s: Least time between two reliefs, seconds.
        max_interval_s: The longest the interval grows to after unproductive reliefs.
    """

    grow_bytes: int = 64 * MIB
    min_interval_s: float = 5.0
    max_interval_s: float = 300.0
    floor: int | None = None
    interval_s: float = 0.0
    last_at: float | None = None

    def due(self, rss: int, now: float) -> bool:
        """Whether to relieve now, with RSS at ``rss`` bytes at ``now`` (seconds)."""
        if self.floor is None or rss < self.floor:
            self.floor = rss
        if self.last_at is not None and now - self.last_at < self.interval_s:
            return False
        return rss - self.floor >= self.grow_bytes

    def relieved(self, before: int, after: int, now: float) -> None:
        """A relief took RSS from ``before`` to ``after`` bytes, ending at ``now``."""
        self.last_at = now
        if before - after >= self.grow_bytes // 2:
            self.interval_s = self.min_interval_s
        else:
            self.interval_s = min(
                max(self.interval_s, self.min_interval_s) * 2, self.max_interval_s
            )
        self.floor = min(self.floor if self.floor is not None else after, after)
