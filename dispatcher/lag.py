"""The heartbeat lag monitor's rules: when to re-poll, when a subscription is STALLED, and
how fast each partition fills and drains.

Owns :class:`HeartbeatConfig` (the interval, per topic and per subscription, and the stall
timeout), :class:`LagMonitor` (one per subscription) and :class:`RateWindow` (one per
partition of a subscription: ingress and ack rates and the lag's trend). The notifier is
the fast path: the log wakes the dispatch task after each fsync. The heartbeat is the
safety net for whatever the fast path misses (a lost wake-up, a read that came back
empty, a dispatch task that died). On each tick the monitor compares the subscription's
read position with the log's head, even when no consumer is attached, and decides:

- **Re-poll** when records are ready to send (below the head, not yet sent) and the
  consumer has room for them (attached, with credit, under ``max_unacked``).
- **STALLED** when that has been so for ``stall_timeout_s`` with no progress: no record
  sent and none acknowledged. The reason says what is ready and, if reads fail, why.

Example: records 0..99 are durable, the consumer has credit, the read position is 40 and
stays 40. Tick at t=0: re-poll; the wait is first seen now. Ticks at t=0.5 .. 9.5: re-poll,
not stalled. Tick at t=10 (timeout 10 s): re-poll, STALLED "60 records are ready ...". A
record sent or acknowledged restarts the count; a consumer out of credit stops it.

Rates: every tick also samples each partition's head (records appended, ever) and its
acknowledged total (``head - lag``: records below the head this subscription no longer
owes) into a :class:`RateWindow`, which keeps the last :data:`RATE_WINDOW_S` seconds of
them. The ingress rate is the head's growth over the window, the ack rate the acknowledged
total's, and the trend the lag's change. Example: at t=0 head 1000, lag 100; at t=10 head
1500, lag 300. Ingress 50/s, acks (1200 - 900) / 10 = 30/s, lag +200 (more than
max(10, 5 % of 300)): growing; drain ``None`` (acks do not outpace ingress). Sampling
on the heartbeat, not on ``lag`` calls, makes one ``headrace lag`` call meaningful. A
tick where neither total moved only marks the window's last values as still held then
(:meth:`RateWindow.hold`), which is what keeps 1,000 idle subscriptions cheap. A seek
starts the subscription's windows afresh; records deleted by retention before they were
acknowledged count as acknowledged (the subscription no longer owes them).

Pure module: no asyncio, os or time; ``now`` comes in on every call.
"""

from __future__ import annotations

import enum
import math
from collections import deque
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
    """What a tick decided.

    Attributes:
        repoll: Wake the dispatch task: records are ready and a consumer has room.
        stalled: That has lasted ``stall_timeout_s`` without progress.
        reason: Why it is stalled, in words (``""`` when not).
        ready: Records ready to send at the tick.
        stuck_s: How long they have waited without progress, seconds.
    """

    repoll: bool
    stalled: bool
    reason: str
    ready: int = 0
    stuck_s: float = 0.0


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
            return Verdict(repoll=True, stalled=False, reason="", ready=seen.ready)
        reason = (
            f"{seen.ready} records are ready and the consumer has room, but nothing was "
            f"sent or acknowledged for {stuck_for:.1f} s"
        )
        if seen.last_error:
            reason += f"; the last read failed: {seen.last_error}"
        return Verdict(True, True, reason, ready=seen.ready, stuck_s=stuck_for)


#: The span over which ingress and ack rates and the lag's trend are measured, seconds.
RATE_WINDOW_S = 10.0
#: Samples closer together than this replace each other, so a window holds about
#: ``2 * RATE_WINDOW_S / RATE_SPACING_S`` samples whatever the heartbeat interval; seconds.
RATE_SPACING_S = 1.0
#: A lag change over the window within this many records is steady ...
TREND_NOISE_RECORDS = 10
#: ... or within this fraction of the larger lag, whichever is larger.
TREND_NOISE_FRACTION = 0.05


class Trend(enum.Enum):
    """Which way a partition's lag went over the rate window."""

    GROWING = "growing"
    SHRINKING = "shrinking"
    STEADY = "steady"


def trend_of(lag_before: int, lag_now: int) -> Trend:
    """The trend of a lag that went from ``lag_before`` to ``lag_now``: changes within
    max(:data:`TREND_NOISE_RECORDS`, :data:`TREND_NOISE_FRACTION` of the larger) are
    steady, so the batches in flight of a consumer that keeps up read as steady."""
    noise = max(TREND_NOISE_RECORDS, TREND_NOISE_FRACTION * max(lag_before, lag_now))
    change = lag_now - lag_before
    if change > noise:
        return Trend.GROWING
    if change < -noise:
        return Trend.SHRINKING
    return Trend.STEADY


@dataclass(frozen=True, slots=True)
class Rates:
    """One partition's rates over the window.

    Attributes:
        ingress: Records appended to the partition per second.
        acked: Records acknowledged by the subscription per second.
        trend: Which way the lag went.
        span_s: The seconds the rates were measured over (0: not measured yet).
    """

    ingress: float
    acked: float
    trend: Trend
    span_s: float

    def drain_s(self, lag: int) -> float | None:
        """Seconds until ``lag`` records are drained at these rates: 0 when there is no
        lag, ``None`` when acks do not outpace ingress (it never drains at these rates)."""
        if lag <= 0:
            return 0.0
        net = self.acked - self.ingress
        return lag / net if net > 0 else None


#: The rates of a partition with fewer than two samples (the broker just started).
NO_RATES = Rates(0.0, 0.0, Trend.STEADY, 0.0)


class RateWindow:
    """The last :data:`RATE_WINDOW_S` seconds of one partition's head and acknowledged
    total, sampled by the heartbeat. Not task-safe; owned by its subscription.

    A tick where nothing moved calls :meth:`hold` instead of :meth:`observe`: it records
    only that the last values still held at that time, so 1,000 idle subscriptions cost a
    float store each per tick. :meth:`rates` reads a held stretch as the samples
    :meth:`observe` would have taken.

    Args:
        window_s: How far back the rates look, seconds.
        spacing_s: Samples closer than this replace each other, seconds.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S, spacing_s: float = RATE_SPACING_S) -> None:
        self._window = window_s
        self._spacing = spacing_s
        #: (monotonic seconds, head, acknowledged total), oldest first. The oldest is the
        #: newest sample at least ``window_s`` old, so the rates span the whole window.
        self._samples: deque[tuple[float, int, int]] = deque()
        #: The last time the newest sample's values were seen (by observe or hold).
        self._seen = -math.inf

    def wants(self, now: float) -> bool:
        """Whether a sample at ``now`` is worth taking: a quarter of the spacing has passed
        since the last one (so a 10 ms heartbeat does not compute lags 100 times a
        second for rates measured over seconds)."""
        return now - self._seen >= self._spacing / 4

    def hold(self, now: float) -> None:
        """The values last observed still hold at ``now`` (monotonic s): the caller knows
        that neither the head nor the acknowledged total moved since."""
        if self._samples and now > self._seen:
            self._seen = now

    def observe(self, now: float, head: int, acked: int) -> None:
        """Record the partition's ``head`` and ``acked`` total at ``now`` (monotonic s)."""
        samples = self._samples
        if samples:
            last, last_head, last_acked = samples[-1]
            if now < last:
                return  # a clock that went back: keep what was measured
            if last < self._seen <= now:  # the last values held until then: a sample
                self._add(self._seen, last_head, last_acked)
        self._add(now, head, acked)
        self._seen = now

    def _add(self, now: float, head: int, acked: int) -> None:
        samples = self._samples
        if len(samples) >= 2 and now - samples[-2][0] < self._spacing:
            samples[-1] = (now, head, acked)
        else:
            samples.append((now, head, acked))
        while len(samples) > 2 and samples[1][0] <= now - self._window:
            samples.popleft()

    def rates(self) -> Rates:
        """The rates between the oldest sample of the window and the newest (or the last
        time its values were held)."""
        samples = self._samples
        if not samples:
            return NO_RATES
        t1, head1, acked1 = samples[-1]
        t1 = max(t1, self._seen)
        start = t1 - self._window
        k = 0  # the newest sample at least a window old, if any
        while k + 1 < len(samples) and samples[k + 1][0] <= start:
            k += 1
        t0, head0, acked0 = samples[k]
        after = samples[k + 1] if k + 1 < len(samples) else (t1, head1, acked1)
        # Both totals only grow, so equal values at two points held in between: a flat
        # stretch through the window's start measures from the start, however sparse.
        if t0 < start and after[1:] == (head0, acked0):
            t0 = start
        span = t1 - t0
        if span <= 0:
            return NO_RATES
        return Rates(
            ingress=max(0, head1 - head0) / span,
            acked=max(0, acked1 - acked0) / span,
            trend=trend_of(head0 - acked0, head1 - acked1),
            span_s=span,
        )
