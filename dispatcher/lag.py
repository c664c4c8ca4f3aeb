"""The heartbeat lag monitor's rules: when to re-poll, and when a subscription is STALLED.

Owns :class:`HeartbeatConfig` (the interval, per topic and per subscription, and the stall
timeout) and :class:`LagMonitor` (one per subscription). The notifier is the fast path: the
log wakes the dispatch task after each fsync. The heartbeat is the safety net for whatever
the fast path misses (a lost wake-up, a read that came back empty, a dispatch task that
died). On each tick the monitor compares the subscription's read position with the log's
head, even when no consumer is attached, and decides:

- **Re-poll** when records are ready to send (below the head, not yet sent) and the
  consumer has room for them (attached, with credit, under ``max_unacked``).
- **STALLED** when that has been so for ``stall_timeout_s`` with no progress: no record
  sent and none acknowledged. The reason says what is ready and, if reads fail, why.

Example: records 0..99 are durable, the consumer has credit, the read position is 40 and
stays 40. Tick at t=0: re-poll; the wait is first seen now. Ticks at t=0.5 .. 9.5: re-poll,
not stalled. Tick at t=10 (timeout 10 s): re-poll, STALLED "60 records are ready ...". A
record sent or acknowledged restarts the count; a consumer out of credit stops it.

Pure module: no asyncio, os or time; ``now`` comes in on every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dispatcher.errors import InvalidSubscriptionError
from dispatcher.protocol import check_number

#: The heartbeat interval when nothing else is configured, seconds (DESIGN section 3).
DEFAULT_INTERVAL_S = 0.5
#: How long a backlog with room and no progress lasts before it is STALLED, seconds.
DEFAULT_STALL_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    """Heartbeat intervals and the stall timeout.

    Attributes:
        interval_s: The interval of every subscription without an override, seconds.
        stall_timeout_s: Backlog, room and no progress for this long is STALLED, seconds.
        topics: Interval overrides per topic name, seconds.
        subscriptions: Interval overrides per ``"topic/subscription"``, seconds; they win
            over the topic's.
    """

    interval_s: float = DEFAULT_INTERVAL_S
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    topics: Mapping[str, float] = field(default_factory=dict)
    subscriptions: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_number("heartbeat interval", self.interval_s, 0.001, 3_600, "seconds")
        check_number("stall_timeout", self.stall_timeout_s, 0.001, 86_400, "seconds")
        for name, value in {**self.topics, **self.subscriptions}.items():
            check_number(f"heartbeat interval of {name!r}", value, 0.001, 3_600, "seconds")
        for name in self.subscriptions:
            if name.count("/") != 1 or name.startswith("/") or name.endswith("/"):
                raise InvalidSubscriptionError(
                    "heartbeat", f"{name!r} must name a subscription as 'topic/subscription'"
                )

    def interval_for(self, topic: str, subscription: str) -> float:
        """The heartbeat interval of one subscription, seconds."""
        specific = self.subscriptions.get(f"{topic}/{subscription}")
        if specific is not None:
            return specific
        return self.topics.get(topic, self.interval_s)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the heartbeat sees of a subscription at one tick.

    Attributes:
        ready: Records below the head that were never sent, over every partition.
        has_room: A consumer is attached with credit, and in-flight records are under the
            cap, so ready records could be sent now.
        progress: Any number that grows whenever records are sent or acknowledged.
        last_error: The last read error of the dispatch task, or "".
    """

    ready: int
    has_room: bool
    progress: int
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a tick decided."""

    repoll: bool
    stalled: bool
    reason: str


#: The verdict on a subscription with nothing waiting.
IDLE = Verdict(repoll=False, stalled=False, reason="")


class LagMonitor:
    """The heartbeat rules of one subscription. Not task-safe; owned by its subscription."""

    def __init__(self, stall_timeout_s: float) -> None:
        self._timeout = stall_timeout_s
        self._progress: int | None = None
        #: The first tick that found records waiting (ready, with room) and no progress
        #: since; None while nothing waits.
        self._since: float | None = None

    @property
    def idle(self) -> bool:
        """Nothing was waiting at the last tick: a tick with nothing ready changes nothing."""
        return self._since is None

    def tick(self, seen: Observation, now: float) -> Verdict:
        """Judge one observation made at ``now``."""
        waiting = seen.ready > 0 and seen.has_room
        if not waiting:
            self._since = None
        elif self._since is None or seen.progress != self._progress:
            self._since = now
        self._progress = seen.progress
        if self._since is None:
            return IDLE
        stuck_for = now - self._since
        if stuck_for < self._timeout:
            return Verdict(repoll=True, stalled=False, reason="")
        reason = (
            f"{seen.ready} records are ready and the consumer has room, but nothing was "
            f"sent or acknowledged for {stuck_for:.1f} s"
        )
        if seen.last_error:
            reason += f"; the last read failed: {seen.last_error}"
        return Verdict(repoll=True, stalled=True, reason=reason)
