"""The heartbeat of every subscription, and the samples the metrics exporter reads.

Owns :class:`Heartbeat`: one task for all subscriptions, which ticks each at its own
interval (:class:`~dispatcher.lag.HeartbeatConfig`, per topic and per subscription; what a
tick does is :meth:`~dispatcher.subscription.Subscription.tick`'s: restart a dead dispatch
task, re-poll a backlog with room, judge STALLED), and :meth:`Heartbeat.samples`: a tuple of
:class:`SubscriptionSample`, built when asked (at a scrape), never changed after.

Samples are built on the event loop, which owns the subscriptions' state: the metrics
exporter's thread asks the loop and waits up to :data:`SAMPLES_WAIT_S`, then takes the last
tuple built (a loop too busy to answer still gets a scrape). Building them at the scrape,
not at every round, keeps 1,000 idle subscriptions from costing a rebuild check each per
round while nobody reads them. A sample is rebuilt only when something in it may have
changed (:meth:`~dispatcher.subscription.Subscription.sample_key`), and the age of a
partition's oldest unacknowledged record, which costs a log read, is read again at most
every :data:`_AGE_REFRESH_S` while its cursor moves. Times are monotonic seconds; the
publish times in samples are the records' own (wall-clock milliseconds).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.cursor_ages import running_loop
from dispatcher.dead_letter_queue import DeadLetterQueue
from dispatcher.lag import HeartbeatConfig
from dispatcher.subscription import Subscription

logger = logging.getLogger(__name__)

Key = tuple[str, str]

#: How long a caller off the loop (the metrics exporter) waits for fresh samples before it
#: takes the last ones built, seconds.
SAMPLES_WAIT_S = 1.0

#: A moving cursor's publish time (for the oldest-unacked age) is read at most this often.
_AGE_REFRESH_S = 5.0


@dataclass(frozen=True, slots=True)
class PartitionSample:
    """One partition of a subscription when its sample was built."""

    partition: int
    lag: int  # records at or above the cursor not yet acknowledged
    in_flight: int
    #: Publish time (ms) of the oldest unacknowledged record; ``None`` when caught up.
    oldest_unacked_ms: float | None = None
    blocked: bool = False  # BLOCKED: sends nothing until an operator acts
    #: The cursor whose record ``oldest_unacked_ms`` is, and when it was read (monotonic
    #: seconds): a moving cursor's time is read again at most every _AGE_REFRESH_S.
    timestamp_cursor: int = -1
    read_at: float = 0.0


@dataclass(frozen=True, slots=True)
class SubscriptionSample:
    """A subscription's counters and lag when the sample was built (for metrics)."""

    topic: str
    subscription: str
    notifier_polls: int
    heartbeat_polls: int
    task_restarts: int
    stalled: bool
    partitions: tuple[PartitionSample, ...]
    dispatched: int = 0
    redelivered: int = 0
    acked: int = 0
    nacked: int = 0
    released: int = 0
    ack_timeouts: int = 0
    dead_lettered: int = 0
    dropped: int = 0
    dlq_events: int = 0
    dlq_entries: int = 0
    dlq_evicted: int = 0
    dlq_rejected: int = 0
    dlq_max_entries: int = 0  # the queue's capacity; 0 while it has no queue

    @property
    def blocked(self) -> bool:
        """Whether any partition is BLOCKED."""
        return any(p.blocked for p in self.partitions)


#: Ticks due this close to a round are done in it, so subscriptions on one interval share
#: one wake-up (and a manual clock's float steps do not skip a tick).
_TICK_SLACK_S = 0.001


class Heartbeat:
    """Ticks every subscription at its interval, and builds their samples when asked. Use
    from one event loop; :meth:`samples` may be called from any thread.

    Args:
        config: Heartbeat intervals and the stall timeout.
        monotonic: Monotonic seconds (tests pass a manual clock).
        subscriptions: Every live subscription, by key (read each round).
        dead_letter_queue: A subscription's open dead-letter queue, if any.
    """

    def __init__(
        self,
        config: HeartbeatConfig,
        monotonic: Callable[[], float],
        subscriptions: Callable[[], dict[Key, Subscription]],
        dead_letter_queue: Callable[[Key], DeadLetterQueue | None],
    ) -> None:
        self.config = config
        self._monotonic = monotonic
        self._subs = subscriptions
        self._dlq = dead_letter_queue
        self._next_tick: dict[Key, float] = {}
        self._samples: dict[Key, tuple[tuple[int, ...], SubscriptionSample]] = {}
        self._task: asyncio.Task[None] | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        #: The samples last built: what a caller off the loop gets when the loop is busy.
        self._built: tuple[SubscriptionSample, ...] = ()

    def start(self) -> None:
        """Start the heartbeat task."""
        self._event_loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._loop(), name="heartbeat")

    async def aclose(self) -> None:
        """Stop the heartbeat task. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def forget(self, key: Key) -> None:
        """Drop everything kept for ``key`` (deleted, or its topic dropped), at once."""
        self._next_tick.pop(key, None)
        self._samples.pop(key, None)
        self._built = tuple(s for s in self._built if (s.topic, s.subscription) != key)

    def samples(self, wait_s: float = SAMPLES_WAIT_S) -> tuple[SubscriptionSample, ...]:
        """Counters and lag of every subscription, built now. Callable from any thread.

        On the loop (or before the heartbeat started, or after its loop stopped) they are
        built in place. From another thread the loop builds them, and the caller waits up
        to ``wait_s`` seconds; if the loop is closed or busy that long, it gets the samples
        last built."""
        loop = self._event_loop
        if loop is None or not loop.is_running() or running_loop() is loop:
            return self._build()
        asked: concurrent.futures.Future[tuple[SubscriptionSample, ...]] = (
            concurrent.futures.Future()
        )

        def build() -> None:
            if asked.set_running_or_notify_cancel():
                asked.set_result(self._build())

        try:
            loop.call_soon_threadsafe(build)
            return asked.result(wait_s)
        except (RuntimeError, TimeoutError):  # closed, or busy for wait_s
            asked.cancel()
            return self._built

    def _build(self) -> tuple[SubscriptionSample, ...]:
        """Every subscription's sample, reusing those that cannot have changed."""
        now = self._monotonic()
        try:
            built = tuple(self._sample(key, sub, now) for key, sub in self._subs().items())
        except Exception:  # one bad subscription must not take every series away
            logger.exception("building the subscriptions' metric samples failed")
            return self._built
        self._built = built
        return built

    def round(self) -> float:
        """Tick every subscription that is due; return the seconds until the next is.

        The heartbeat task calls this in a loop; tests call it directly with a manual clock.
        """
        subs = self._subs()
        now = self._monotonic()
        soonest = self.config.interval_s
        for key, sub in list(subs.items()):
            due = self._next_tick.get(key, now)
            if due <= now + _TICK_SLACK_S:
                sub.tick(now)
                due = now + sub.heartbeat_interval_s
                self._next_tick[key] = due
            soonest = min(soonest, due - now)
        return max(soonest, 0.001)

    def _sample(self, key: Key, sub: Subscription, now: float) -> SubscriptionSample:
        """The subscription's sample, rebuilt only when something in it may have changed."""
        dlq = self._dlq(key)
        version = sub.sample_key()
        if dlq is not None:
            version += (dlq.events_total, dlq.first_sequence, dlq.next_sequence)
        cached = self._samples.get(key)
        if (
            cached is not None
            and cached[0] == version
            and not any(
                _age_due(p, sub.state.cursor(p.partition), now) for p in cached[1].partitions
            )
        ):
            return cached[1]
        sample = _sample(sub, dlq, cached[1] if cached is not None else None, now)
        self._samples[key] = (version, sample)
        return sample

    async def _loop(self) -> None:
        while True:
            try:
                pause = self.round()
            except Exception:  # the safety net must outlive any one bad subscription
                logger.exception("heartbeat round failed; trying again")
                pause = self.config.interval_s
            await asyncio.sleep(pause)


def _sample(
    sub: Subscription,
    dlq: DeadLetterQueue | None,
    previous: SubscriptionSample | None,
    now: float,
) -> SubscriptionSample:
    state = sub.state
    return SubscriptionSample(
        sub.topic,
        sub.name,
        sub.notifier_polls,
        sub.heartbeat_polls,
        sub.task_restarts,
        sub.verdict.stalled,
        _partition_samples(sub, previous, now),
        dispatched=state.sent_total - state.redelivered_total,
        redelivered=state.redelivered_total,
        acked=state.acked_total,
        nacked=state.nacked_total,
        released=state.released_total,
        ack_timeouts=state.ack_timeouts_total,
        dead_lettered=state.dead_lettered_total,
        dropped=state.dropped_total,
        dlq_events=dlq.events_total if dlq else 0,
        dlq_entries=dlq.count() if dlq else 0,
        dlq_evicted=dlq.evicted_total if dlq else 0,
        dlq_rejected=dlq.rejected_total if dlq else 0,
        dlq_max_entries=dlq.config.max_entries if dlq else 0,
    )


def _partition_samples(
    sub: Subscription, previous: SubscriptionSample | None, now: float
) -> tuple[PartitionSample, ...]:
    """Lag, in-flight records, BLOCKED and the oldest unacknowledged record's publish time
    per partition (``now``: monotonic seconds).

    That time costs a log read (~25 us), so it is reused while the cursor stays put, and a
    moving cursor's is read again at most every :data:`_AGE_REFRESH_S`: with 1,000 busy
    subscriptions of 4 partitions that bounds the reads to 800 a second, not 8,000 (one per
    partition per 0.5 s round). Meanwhile the age reads at most that much too old."""
    before = {p.partition: p for p in previous.partitions} if previous is not None else {}
    samples = []
    for (i, lag, in_flight), blocked in zip(sub.lag(), sub.blocked(), strict=True):
        cursor = sub.state.cursor(i)
        old = before.get(i)
        oldest, at, read_at = None, -1, 0.0
        if lag > 0:
            if (
                old is not None
                and old.oldest_unacked_ms is not None
                and not _age_due(old, cursor, now)
            ):
                oldest, at, read_at = old.oldest_unacked_ms, old.timestamp_cursor, old.read_at
            elif (read := sub.cursor_timestamp_ms(i)) is not None:
                oldest, at, read_at = read, cursor, now
            elif old is not None and old.oldest_unacked_ms is not None:
                # Not in the page cache yet (a thread reads it in): the last time known.
                oldest, at, read_at = old.oldest_unacked_ms, old.timestamp_cursor, old.read_at
        samples.append(PartitionSample(i, lag, in_flight, oldest, blocked, at, read_at))
    return tuple(samples)


def _age_due(sample: PartitionSample, cursor: int, now: float) -> bool:
    """Whether the partition's oldest-unacked time must be read again: it belongs to an
    earlier cursor and was read at least :data:`_AGE_REFRESH_S` ago; or a lagging
    partition has none yet (its record was not in the page cache: a thread reads it in)."""
    if sample.oldest_unacked_ms is None:
        return sample.lag > 0
    return sample.timestamp_cursor != cursor and now - sample.read_at >= _AGE_REFRESH_S
