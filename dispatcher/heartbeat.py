"""The heartbeat of every subscription, and the samples the metrics exporter reads.

Owns :class:`Heartbeat`: one task for all subscriptions, which ticks each at its own
interval (:class:`~dispatcher.lag.HeartbeatConfig`, per topic and per subscription; what a
tick does is :meth:`~dispatcher.subscription.Subscription.tick`'s: restart a dead dispatch
task, re-poll a backlog with room, judge STALLED) and, after each round, refreshes
:attr:`Heartbeat.samples`: a tuple of :class:`SubscriptionSample`, replaced and never
changed, so the metrics exporter reads it from its own thread while the loop runs.

A sample is rebuilt only when something in it may have changed
(:meth:`~dispatcher.subscription.Subscription.sample_key`), and the age of a partition's
oldest unacknowledged record, which costs a log read, is read again at most every
:data:`_AGE_REFRESH_S` while its cursor moves. Times are monotonic seconds; the publish
times in samples are the records' own (wall-clock milliseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.dlq import DeadLetterQueue
from dispatcher.lag import HeartbeatConfig
from dispatcher.subscription import Subscription

logger = logging.getLogger(__name__)

Key = tuple[str, str]

#: A moving cursor's publish time (for the oldest-unacked age) is read at most this often.
_AGE_REFRESH_S = 5.0


@dataclass(frozen=True, slots=True)
class PartitionSample:
    """One partition of a subscription at the last heartbeat round."""

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
    """A subscription's counters and lag at the last heartbeat round (for metrics)."""

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
    """Ticks every subscription at its interval and keeps their samples. Use from one
    event loop.

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
        #: Counters and lag of every subscription at the last round. Replaced, never
        #: changed, so the metrics thread can read it while the loop runs.
        self.samples: tuple[SubscriptionSample, ...] = ()

    def start(self) -> None:
        """Start the heartbeat task."""
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
        self.samples = tuple(s for s in self.samples if (s.topic, s.subscription) != key)

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
        self.samples = tuple(self._sample(key, sub, now) for key, sub in subs.items())
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
            else:
                oldest, at, read_at = sub.cursor_timestamp_ms(i), cursor, now
        samples.append(PartitionSample(i, lag, in_flight, oldest, blocked, at, read_at))
    return tuple(samples)


def _age_due(sample: PartitionSample, cursor: int, now: float) -> bool:
    """Whether the partition's oldest-unacked time must be read again: it belongs to an
    earlier cursor and was read at least :data:`_AGE_REFRESH_S` ago."""
    return (
        sample.oldest_unacked_ms is not None
        and sample.timestamp_cursor != cursor
        and now - sample.read_at >= _AGE_REFRESH_S
    )
