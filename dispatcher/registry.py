"""Every subscription of the broker, and where their cursors are kept on disk.

Owns :class:`SubscriptionRegistry`: creating, finding, listing and dropping subscriptions,
persisting their state, and their dead-letter queues. Each subscription is one file,
``<data dir>/subscriptions/<topic>/<subscription>.json``, replaced atomically (temp file,
fsync, rename, fsync of the directory: DESIGN section 2, invariants 3 and 4). Its format is
:mod:`dispatcher.state_file`'s: the cursor (the first unacknowledged offset), the
acknowledged ranges above it (so a restart does not resend what was acked out of order),
the highest offset ever sent, and the failure history of offsets whose delivery failed
(so max-deliveries holds across restarts).

Dead-letter queues live in ``<data dir>/dlq/<topic>/<subscription>/``
(:mod:`dispatcher.dlq`), opened when a subscription first dead-letters a record or an
admin asks for one.

When saved: a new subscription before its consumer gets an answer; a seek or a commit
(``AckUpTo``) before the reply; acks from consumers in the background every
``flush_interval_s`` (acks not yet saved may be redelivered after a crash; nothing is
skipped); everything at shutdown. A background flush saves every subscription that
changed in one thread hop (``FileSystem.atomic_write_many``): each file is still replaced
atomically, but a topic's directory is fsynced once per flush rather than once per
subscription, which with 100 busy subscriptions is 1,000 directory fsyncs a second fewer
competing with the log's own.

A damaged file is kept as ``.corrupt`` and the subscription restarts at the earliest retained
offset: duplicates, never a skip.

Deleting a subscription (:meth:`SubscriptionRegistry.delete`, the ``DeleteSubscription`` RPC
and inactivity expiry): refused while consumers are attached unless forced. Once begun it
runs to its end whatever happens to its caller (:func:`wal.run_to_end`): the subscription
leaves the registry (a Subscribe of the same name waits for the delete, then creates a new
one), its state file is removed (the commit point; if that fails, the subscription carries
on unchanged), its consumers are let go with :class:`SubscriptionDeletedError`, and its
dead-letter queue is removed. The on-disk steps and why a crash leaves all or nothing are
:mod:`dispatcher.removal`'s. Its cursors stop holding retention back at once (they leave
:meth:`SubscriptionRegistry.saved_floor`), and its metric series leave :attr:`samples`.

Inactivity expiry (``inactive_expiry_s``, off by default): the registry runs an expiry task
that deletes a subscription with no consumer and no ack, commit or seek for that long, by
the monotonic clock (the rule, and why a restart restarts every idle clock, are
:mod:`dispatcher.expiry`'s).

The registry also runs the heartbeat: one task for every subscription, which ticks each at
its own interval (:class:`~dispatcher.lag.HeartbeatConfig`, per topic and per
subscription) and, after each round, refreshes :attr:`SubscriptionRegistry.samples`, the
snapshot the metrics exporter reads from its own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dispatcher import state_file
from dispatcher.dead_letter import DeadLetter
from dispatcher.dlq import DeadLetterQueue, DlqConfig, PutOutcome
from dispatcher.errors import (
    DispatcherClosedError,
    InvalidSubscriptionError,
    SubscriptionDeletedError,
    SubscriptionInUseError,
    SubscriptionLimitError,
    SubscriptionNotFoundError,
)
from dispatcher.expiry import IdleTracker
from dispatcher.lag import HeartbeatConfig
from dispatcher.names import NAME_RULE, is_valid_name
from dispatcher.protocol import (
    DeliveryMode,
    DispatchLimits,
    DispatchPolicy,
    PartitionSnapshot,
    SubscriptionType,
    ToDeadLetter,
)
from dispatcher.removal import commit_delete, prune_queues, remove_queue
from dispatcher.subscription import InitialPosition, Subscription
from wal import FileSystem, LogWriter, run_to_end

logger = logging.getLogger(__name__)


def check_subscription_name(name: str) -> None:
    """Raise ``InvalidSubscriptionError`` unless ``name`` is a valid subscription name."""
    if not is_valid_name(name):
        raise InvalidSubscriptionError(
            "subscription", f"{name!r} is not a valid subscription name: {NAME_RULE}"
        )


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """How subscriptions deliver, by default and per subscription.

    Attributes:
        defaults: The policy of every subscription without an override (its ``type`` and
            ``mode`` come from the subscription itself).
        subscriptions: Per ``"topic/subscription"``, a policy whose fields replace the
            defaults (again except ``type`` and ``mode``).
        dlq: The dead-letter queue settings of every subscription.
    """

    defaults: DispatchPolicy = field(default_factory=DispatchPolicy)
    subscriptions: Mapping[str, DispatchPolicy] = field(default_factory=dict)
    dlq: DlqConfig = field(default_factory=DlqConfig)

    def policy_for(
        self, topic: str, name: str, type_: SubscriptionType, mode: DeliveryMode
    ) -> DispatchPolicy:
        """The policy of subscription ``name`` of ``topic`` with that type and mode."""
        base = self.subscriptions.get(f"{topic}/{name}", self.defaults)
        return dataclasses.replace(base, type=type_, mode=mode)


#: How often dead-letter queues drop entries older than their max_age, seconds.
_DLQ_EXPIRY_INTERVAL_S = 10.0

#: A moving cursor's publish time (for the oldest-unacked age) is read at most this often.
_AGE_REFRESH_S = 5.0

#: Ticks due this close to a round are done in it, so subscriptions on one interval share
#: one wake-up (and a manual clock's float steps do not skip a tick).
_TICK_SLACK_S = 0.001


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


class SubscriptionRegistry:
    """The broker's subscriptions. Use from one event loop.

    Args:
        data_dir: The broker's data directory.
        fs: File operations (tests pass a faulty one).
        max_unacked: Records in flight per subscription, at most (replaces the one in
            ``dispatch``'s policies).
        dispatch: Redelivery, poison and dead-letter settings.
        flush_interval_s: How often acknowledged state is saved in the background.
        heartbeat: Heartbeat intervals and the stall timeout.
        monotonic: Monotonic seconds (tests pass a manual clock).
        clock: Wall-clock seconds (ack timeouts, nack delays, dead-letter times).
        on_dispatch: Called with a topic once per subscription of it; returns what the
            subscription calls with the seconds from publish to each first delivery.
        limits: Subscriptions per topic, consumers and credit, at most. Default: none.
        inactive_expiry_s: Delete a subscription with no consumer and no ack, commit or
            seek for this long, seconds (monotonic). Default ``None``: never.
        on_expired: Called with the topic of each subscription that expiry deleted (for
            the metric).
        crash_point: Called with each name of :data:`dispatcher.removal.CRASH_POINTS` as
            a delete passes it. Default: nothing; tests raise there.
    """

    def __init__(
        self,
        data_dir: str,
        *,
        fs: FileSystem | None = None,
        max_unacked: int | None = None,
        dispatch: DispatchConfig | None = None,
        flush_interval_s: float = 0.1,
        heartbeat: HeartbeatConfig | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        on_dispatch: Callable[[str], Callable[[float], None]] | None = None,
        limits: DispatchLimits | None = None,
        inactive_expiry_s: float | None = None,
        on_expired: Callable[[str], None] = lambda _topic: None,
        crash_point: Callable[[str], None] = lambda _point: None,
    ) -> None:
        self._limits = limits or DispatchLimits()
        self._idle: IdleTracker[tuple[str, str]] | None = (
            IdleTracker(inactive_expiry_s) if inactive_expiry_s is not None else None
        )
        self._on_expired = on_expired
        self._crash_point = crash_point
        #: Deletes under way, by subscription: a Subscribe of that name waits for it.
        self._deletions: dict[tuple[str, str], asyncio.Task[None]] = {}
        #: Deleted subscriptions whose state must never be saved again.
        self._doomed: weakref.WeakSet[Subscription] = weakref.WeakSet()
        #: Deleted subscriptions whose queue directory could not be removed: removed
        #: before a subscription of the same name is created.
        self._orphan_queues: set[tuple[str, str]] = set()
        self._expiry_task: asyncio.Task[None] | None = None
        self._root = os.path.join(data_dir, "subscriptions")
        self._dlq_root = os.path.join(data_dir, "dlq")
        self._fs = fs or FileSystem()
        self._max_unacked = max_unacked
        self._dispatch = dispatch or DispatchConfig()
        self._clock = clock
        self._dlqs: dict[tuple[str, str], DeadLetterQueue] = {}
        self._dlq_lock = asyncio.Lock()
        self._on_dispatch = on_dispatch
        self._flush_interval_s = flush_interval_s
        self._subs: dict[tuple[str, str], Subscription] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._save_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._heartbeat = heartbeat or HeartbeatConfig()
        self._monotonic = monotonic
        self._next_tick: dict[tuple[str, str], float] = {}
        self._samples: dict[tuple[str, str], tuple[tuple[int, ...], SubscriptionSample]] = {}
        self._heartbeat_task: asyncio.Task[None] | None = None
        #: The cursors last written to disk, per subscription: the retention floor.
        self._saved: dict[tuple[str, str], tuple[int, ...]] = {}
        self._closed = False
        #: Counters and lag of every subscription at the last heartbeat round. Replaced,
        #: never changed, so the metrics thread can read it while the loop runs.
        self.samples: tuple[SubscriptionSample, ...] = ()

    # -- lifecycle --------------------------------------------------------------------

    async def open(self, topics: Mapping[str, Sequence[LogWriter]]) -> None:
        """Load every saved subscription of ``topics``; drop those of topics now gone."""
        docs = await asyncio.to_thread(self._load_all, set(topics))
        for topic, name, doc in docs:
            type_ = SubscriptionType(doc.type) if doc is not None else SubscriptionType.EXCLUSIVE
            mode = DeliveryMode(doc.mode) if doc is not None else DeliveryMode.AT_LEAST_ONCE
            snaps = state_file.restore(doc, topics[topic], topic, name)
            self._add(topic, name, topics[topic], snaps, type_, mode)
            self._saved[(topic, name)] = tuple(s.cursor for s in snaps)
        for topic, name, _doc in docs:
            if await asyncio.to_thread(self._fs.exists, self._dlq_dir(topic, name)):
                await self.dead_letter_queue(topic, name)
        self._flusher = asyncio.create_task(self._flush_loop(), name="subscription flusher")
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        if self._idle is not None:
            self._expiry_task = asyncio.create_task(self._expiry_loop(), name="expiry")
        logger.info("opened %d subscriptions under %s", len(self._subs), self._root)

    async def aclose(self) -> None:
        """Stop every subscription and save its state. Idempotent."""
        self._closed = True
        for task in (self._flusher, self._heartbeat_task, self._expiry_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._flusher = self._heartbeat_task = self._expiry_task = None
        if self._deletions:  # they run to their end; the state they leave is then saved
            await asyncio.wait(list(self._deletions.values()))
        subs, self._subs = list(self._subs.values()), {}
        for sub in subs:
            await sub.aclose()
        await self._save_all(subs)
        self._dirty.clear()
        dlqs, self._dlqs = list(self._dlqs.values()), {}
        for dlq in dlqs:
            await dlq.aclose()

    # -- finding and creating -----------------------------------------------------------

    async def subscribe(
        self,
        topic: str,
        name: str,
        writers: Sequence[LogWriter],
        *,
        initial: InitialPosition = InitialPosition.EARLIEST,
        type_: SubscriptionType = SubscriptionType.EXCLUSIVE,
        mode: DeliveryMode = DeliveryMode.AT_LEAST_ONCE,
        any_type: bool = False,
    ) -> Subscription:
        """The subscription ``name`` of ``topic``, created at ``initial`` (and saved) if new.

        ``any_type`` accepts an existing subscription whatever its type and mode (a reader
        that only commits offsets, like Spark).

        Raises:
            InvalidSubscriptionError: a bad name, or it exists with another type or mode.
            SubscriptionLimitError: it is new and the topic has
                ``max_subscriptions_per_topic`` subscriptions already.
            DispatcherClosedError: the registry is closed (the broker is shutting down).
        """
        if self._closed:
            raise DispatcherClosedError()
        check_subscription_name(name)
        pending = self._deletions.get((topic, name))
        if pending is not None:
            await asyncio.wait([pending])  # then new, or back if the delete failed
        sub = self._subs.get((topic, name))
        if sub is not None:
            if any_type:
                return sub
            for what, have, want in (("type", sub.type, type_), ("mode", sub.policy.mode, mode)):
                if have is not want:
                    raise InvalidSubscriptionError(
                        what,
                        f"subscription {name!r} on topic {topic!r} is {have.value}, not "
                        f"{want.value}; use its {what} or another subscription name",
                    )
            return sub
        self._check_room(topic)
        if (topic, name) in self._orphan_queues:  # an old queue must not be inherited
            await asyncio.to_thread(self._remove_queue, topic, name)
            self._orphan_queues.discard((topic, name))
        if initial is InitialPosition.LATEST:
            snaps = [PartitionSnapshot(w.high_water_mark) for w in writers]
        else:
            snaps = [PartitionSnapshot(w.first_offset) for w in writers]
        sub = self._add(topic, name, writers, snaps, type_, mode)
        await self._save(sub)
        logger.info("created subscription %s/%s at %s", topic, name, initial.value)
        return sub

    def _check_room(self, topic: str) -> None:
        """Raise unless ``topic`` may have one more subscription."""
        most = self._limits.max_subscriptions_per_topic
        if most is None:
            return
        count = sum(1 for t, _name in self._subs if t == topic)
        if count >= most:
            raise SubscriptionLimitError(
                "max_subscriptions_per_topic",
                most,
                f"topic {topic!r} has {count} subscriptions",
                "reuse an existing subscription of the topic, or raise the limit",
            )

    def get(self, topic: str, name: str) -> Subscription:
        """The subscription, or ``SubscriptionNotFoundError``."""
        sub = self._subs.get((topic, name))
        if sub is None:
            raise SubscriptionNotFoundError(topic, name)
        return sub

    def subscriptions(self, topic: str | None = None) -> list[Subscription]:
        """Every subscription (of ``topic`` when given), sorted by topic and name."""
        return [s for key, s in sorted(self._subs.items()) if topic in (None, key[0])]

    async def drop_topic(self, topic: str) -> None:
        """Stop and forget every subscription of ``topic`` (the topic is being deleted).

        The dead-letter queues go first, on disk too: a crash halfway leaves subscription
        files without queues (pruned at the next open with the topic gone), never queues
        that a later subscription of the same name would inherit."""
        pending = [task for key, task in self._deletions.items() if key[0] == topic]
        if pending:
            await asyncio.wait(pending)
        self._orphan_queues = {key for key in self._orphan_queues if key[0] != topic}
        for key in [k for k in self._subs if k[0] == topic]:
            await self._subs.pop(key).aclose()
            self._saved.pop(key, None)
            self._dirty.discard(key)
            self._next_tick.pop(key, None)
            self._samples.pop(key, None)
        async with self._dlq_lock:  # not while dead_letter_queue() opens one of them
            dlqs = [self._dlqs.pop(key) for key in list(self._dlqs) if key[0] == topic]
        for dlq in dlqs:
            await dlq.aclose()
        async with self._save_lock:
            await asyncio.to_thread(self._remove_dir, os.path.join(self._dlq_root, topic))
            await asyncio.to_thread(self._remove_topic_dir, topic)

    # -- deleting -------------------------------------------------------------------------

    async def delete(
        self, topic: str, name: str, *, force: bool = False, why: str = "deleted by an admin"
    ) -> tuple[str, ...]:
        """Delete subscription ``name`` of ``topic``: its state and its dead-letter queue.

        Once begun it runs to its end even if the caller is cancelled (see the module
        docstring for the steps). Returns the names of the consumers it detached.

        Args:
            topic: The subscription's topic.
            name: The subscription.
            force: Detach attached consumers; without it they make the delete fail.
            why: Why, in words: for the log and the detached consumers' streams.

        Raises:
            InvalidSubscriptionError: a bad name.
            SubscriptionNotFoundError: there is no such subscription (or it was deleted
                while this call waited for another delete of it).
            SubscriptionInUseError: consumers are attached and ``force`` is off; nothing
                was changed.
            OSError, WalIOError: the state file could not be removed; nothing was changed.
        """
        check_subscription_name(name)
        key = (topic, name)
        pending = self._deletions.get(key)
        if pending is not None:
            await asyncio.wait([pending])
        sub = self.get(topic, name)
        consumers = sub.consumers()
        if consumers and not force:
            raise SubscriptionInUseError(topic, name, consumers)
        # No await from the lookup to here: nothing attaches or saves in between.
        del self._subs[key]
        self._dirty.discard(key)
        self._doomed.add(sub)
        task = asyncio.ensure_future(self._delete(key, sub, why))
        self._deletions[key] = task
        task.add_done_callback(functools.partial(self._deleted, key))
        await run_to_end(task)
        logger.info(
            "deleted subscription %s/%s (%s)%s",
            topic,
            name,
            why,
            f"; detached consumers {', '.join(consumers)}" if consumers else "",
        )
        return consumers

    def _deleted(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._deletions.get(key) is task:
            del self._deletions[key]

    async def _delete(self, key: tuple[str, str], sub: Subscription, why: str) -> None:
        """The delete's steps, from the commit point on (see :mod:`dispatcher.removal`)."""
        topic, name = key
        path = self._state_path(topic, name)
        try:
            async with self._save_lock:  # no save of it is under way, none starts
                await asyncio.to_thread(commit_delete, self._fs, path, self._crash_point)
        except BaseException:
            if await asyncio.to_thread(self._fs.exists, path):  # nothing changed
                self._subs[key] = sub
                self._doomed.discard(sub)
                self._dirty.add(key)
                raise
            self._orphan_queues.add(key)  # gone, but whether durably is unknown
            await self._forget(key, sub, why)
            raise
        await self._forget(key, sub, why)
        try:
            await asyncio.to_thread(self._remove_queue, topic, name)
        except OSError:
            self._orphan_queues.add(key)
            logger.exception(
                "%s/%s: the subscription is deleted, but its dead-letter queue %s could not "
                "be removed; it goes at the next start, or before the name is used again",
                topic,
                name,
                self._dlq_dir(topic, name),
            )
        except BaseException:
            self._orphan_queues.add(key)
            raise

    async def _forget(self, key: tuple[str, str], sub: Subscription, why: str) -> None:
        """Drop everything the registry held for a deleted subscription; let its consumers
        go, their streams ending with ``SubscriptionDeletedError``; close its queue."""
        self._saved.pop(key, None)
        self._next_tick.pop(key, None)
        self._samples.pop(key, None)
        if self._idle is not None:
            self._idle.forget(key)
        self.samples = tuple(s for s in self.samples if (s.topic, s.subscription) != key)
        await sub.aclose(SubscriptionDeletedError(*key, why))
        async with self._dlq_lock:
            dlq = self._dlqs.pop(key, None)
        if dlq is not None:
            await dlq.aclose()

    def _state_path(self, topic: str, name: str) -> str:
        return os.path.join(self._root, topic, name + state_file.SUFFIX)

    def _remove_queue(self, topic: str, name: str) -> None:
        remove_queue(self._fs, self._dlq_dir(topic, name), self._crash_point)

    async def expire_idle(self) -> list[tuple[str, str]]:
        """Delete every subscription inactive for ``inactive_expiry_s`` (see
        :mod:`dispatcher.expiry`); return which. The expiry task calls this in a loop; tests
        call it directly with a manual clock."""
        idle = self._idle
        if idle is None or self._closed:
            return []
        now = self._monotonic()
        for key, sub in self._subs.items():
            idle.observe(key, attached=bool(sub.consumers()), activity=sub.activity, now=now)
        idle.retain(set(self._subs))
        deleted = []
        for expired in idle.expired(now):
            found = self._subs.get(expired.key)
            if found is None:
                continue
            # Look again: a consumer may have come, or a commit, while a delete ran.
            idle_s = idle.observe(
                expired.key,
                attached=bool(found.consumers()),
                activity=found.activity,
                now=self._monotonic(),
            )
            if idle_s < idle.expiry_s:
                continue
            if await self._expire(expired.key, idle_s):
                deleted.append(expired.key)
        return deleted

    async def _expire(self, key: tuple[str, str], idle_s: float) -> bool:
        """Delete one expired subscription (never forced); log and count it."""
        topic, name = key
        assert self._idle is not None
        why = f"no consumer and no ack, commit or seek for {idle_s:.1f} s"
        try:
            await self.delete(topic, name, why=f"expired: {why}")
        except (SubscriptionInUseError, SubscriptionNotFoundError):
            return False  # a consumer came in time, or someone else deleted it
        except Exception:
            logger.exception("%s/%s: deleting the expired subscription failed", topic, name)
            return False
        logger.info(
            "%s/%s: subscription expired and deleted: %s (inactive_expiry_ms = %d)",
            topic,
            name,
            why,
            round(self._idle.expiry_s * 1000),
        )
        self._on_expired(topic)
        return True

    async def _expiry_loop(self) -> None:
        assert self._idle is not None
        pause = min(self._heartbeat.interval_s, self._idle.expiry_s)
        while True:
            await asyncio.sleep(pause)
            try:
                await self.expire_idle()
            except Exception:  # keep expiring the others
                logger.exception("inactivity expiry failed; trying again")

    async def save(self, sub: Subscription) -> None:
        """Save ``sub``'s acknowledged state now (before answering a seek or a commit),
        once every command queued to it so far (that seek or commit) is applied."""
        await sub.applied()
        await self._persist(sub)

    async def _persist(self, sub: Subscription) -> None:
        """Save ``sub``'s state now: a pass awaits this before a redelivery goes out."""
        self._dirty.discard((sub.topic, sub.name))
        await self._save(sub)

    # -- dead-letter queues -------------------------------------------------------------

    def _dlq_dir(self, topic: str, name: str) -> str:
        return os.path.join(self._dlq_root, topic, name)

    async def dead_letter_queue(
        self, topic: str, name: str, *, create: bool = True
    ) -> DeadLetterQueue | None:
        """The dead-letter queue of subscription ``name`` of ``topic``, opened (and made,
        with ``create``) on first use; ``None`` when it does not exist and ``create`` is
        off."""
        key = (topic, name)
        async with self._dlq_lock:
            dlq = self._dlqs.get(key)
            if dlq is not None:
                return dlq
            if key not in self._subs:  # deleted while this call waited
                raise SubscriptionNotFoundError(topic, name)
            directory = self._dlq_dir(topic, name)
            if not create and not await asyncio.to_thread(self._fs.exists, directory):
                return None
            dlq = await DeadLetterQueue.open(
                directory,
                self._dispatch.dlq,
                fs=self._fs,
                clock=self._clock,
                name=f"{topic}/{name}",
            )
            self._dlqs[key] = dlq
            return dlq

    async def _dead_letter(self, sub: Subscription, action: ToDeadLetter) -> None:
        """Write poison records to ``sub``'s dead-letter queue (the subscription's sink)."""
        dlq = await self.dead_letter_queue(sub.topic, sub.name)
        assert dlq is not None
        batch = action.batch
        keys, values, headers = batch.keys(), batch.values(), batch.headers()
        stamps = batch.timestamps()
        letters = []
        for failure in action.failures:
            i = failure.offset - batch.base_offset
            letters.append(
                DeadLetter(
                    topic=sub.topic,
                    partition=action.partition,
                    offset=failure.offset,
                    subscription=sub.name,
                    key=keys[i],
                    value=values[i],
                    headers=tuple(headers[i].items()),
                    timestamp_ms=int(stamps[i]),
                    attempts=failure.deliveries,
                    reason=failure.reason or "delivery failed",
                    attempt_times_ms=failure.times_ms,
                )
            )
        outcome = await dlq.put(letters)
        if outcome is PutOutcome.REJECTED:
            logger.warning(
                "%s/%s: the dead-letter queue is full and rejects new entries (overflow "
                "policy reject); dropped offsets %d..%d of partition %d",
                sub.topic,
                sub.name,
                action.begin,
                action.end - 1,
                action.partition,
            )

    def saved_floor(self, topic: str) -> list[int] | None:
        """Per partition of ``topic``, the lowest cursor any of its subscriptions has on
        disk; ``None`` when it has no subscription. Retention never deletes at or past it,
        so a restart never finds a saved cursor below the log's first offset."""
        floors: list[int] | None = None
        for (t, _name), cursors in self._saved.items():
            if t != topic:
                continue
            floors = (
                list(cursors)
                if floors is None
                else [min(a, b) for a, b in zip(floors, cursors, strict=False)]
            )
        return floors

    def heartbeat_round(self) -> float:
        """Tick every subscription that is due; return the seconds until the next is.

        The heartbeat task calls this in a loop; tests call it directly with a manual clock.
        """
        now = self._monotonic()
        soonest = self._heartbeat.interval_s
        for key, sub in list(self._subs.items()):
            due = self._next_tick.get(key, now)
            if due <= now + _TICK_SLACK_S:
                sub.tick(now)
                due = now + sub.heartbeat_interval_s
                self._next_tick[key] = due
            soonest = min(soonest, due - now)
        self.samples = tuple(self._sample(key, sub, now) for key, sub in self._subs.items())
        return max(soonest, 0.001)

    def _sample(self, key: tuple[str, str], sub: Subscription, now: float) -> SubscriptionSample:
        """The subscription's sample, rebuilt only when something in it may have changed."""
        dlq = self._dlqs.get(key)
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

    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                pause = self.heartbeat_round()
            except Exception:  # the safety net must outlive any one bad subscription
                logger.exception("heartbeat round failed; trying again")
                pause = self._heartbeat.interval_s
            await asyncio.sleep(pause)

    # -- internals --------------------------------------------------------------------

    def _add(  # noqa: PLR0917 - two private callers
        self,
        topic: str,
        name: str,
        writers: Sequence[LogWriter],
        snaps: Sequence[PartitionSnapshot],
        type_: SubscriptionType,
        mode: DeliveryMode,
    ) -> Subscription:
        policy = self._dispatch.policy_for(topic, name, type_, mode)
        if self._max_unacked is not None:
            policy = dataclasses.replace(policy, max_unacked=self._max_unacked)
        sub = Subscription(
            topic,
            name,
            writers,
            snaps,
            policy=policy,
            on_change=self._mark_dirty,
            persist=self._persist,
            dead_letters=self._dead_letter,
            clock=self._monotonic,
            wall_clock=self._clock,
            heartbeat_interval_s=self._heartbeat.interval_for(topic, name),
            stall_timeout_s=self._heartbeat.stall_timeout_s,
            limits=self._limits,
        )
        if self._on_dispatch is not None:
            sub.on_dispatch = self._on_dispatch(topic)
        self._subs[(topic, name)] = sub
        sub.start()
        return sub

    def _mark_dirty(self, sub: Subscription) -> None:
        self._dirty.add((sub.topic, sub.name))

    async def _flush_loop(self) -> None:
        next_expiry = self._monotonic()
        while True:
            await asyncio.sleep(self._flush_interval_s)
            if self._monotonic() >= next_expiry:
                next_expiry = self._monotonic() + _DLQ_EXPIRY_INTERVAL_S
                await self._expire_dead_letters()
            dirty, self._dirty = self._dirty, set()
            subs = [self._subs[key] for key in sorted(dirty) if key in self._subs]
            try:
                await self._save_all(subs)
            except OSError:
                logger.exception(
                    "saving the cursors of %d subscriptions failed; will retry", len(subs)
                )
                self._dirty |= dirty

    async def _expire_dead_letters(self) -> None:
        for key, dlq in list(self._dlqs.items()):
            try:
                removed = await dlq.expire()
            except Exception:
                logger.exception("expiring the dead-letter queue of %s/%s failed", *key)
                continue
            if removed:
                logger.info("%s/%s: %d dead letters expired (max_age)", *key, removed)

    async def _save(self, sub: Subscription) -> None:
        await self._save_all([sub])

    async def _save_all(self, subs: Sequence[Subscription]) -> None:
        """Save every one of ``subs`` in one thread hop: each file is replaced atomically,
        and each topic's directory is fsynced once for all of them."""
        if not subs:
            return
        async with self._save_lock:  # one writer per file; the newest state wins
            subs = [sub for sub in subs if sub not in self._doomed]
            if not subs:
                return
            docs = [
                state_file.StateDoc(
                    version=state_file.VERSION,
                    topic=sub.topic,
                    subscription=sub.name,
                    type=sub.type.value,
                    mode=sub.policy.mode.value,
                    partitions=[state_file.partition_doc(snap) for snap in sub.snapshot()],
                )
                for sub in subs
            ]
            # Cancelled, it still holds the lock until the thread is done, so that the next
            # save never races it on the same temp files.
            files = [(d.topic, d.subscription, state_file.encode(d)) for d in docs]
            await run_to_end(asyncio.to_thread(self._write, files))
            for doc in docs:
                key = (doc.topic, doc.subscription)
                if key in self._subs:
                    self._saved[key] = tuple(p.cursor for p in doc.partitions)

    def _write(self, files: Sequence[tuple[str, str, bytes]]) -> None:
        for directory in dict.fromkeys(os.path.join(self._root, topic) for topic, _, _ in files):
            if not self._fs.exists(directory):
                self._fs.makedirs(directory)  # fsyncs the root too
        self._fs.atomic_write_many(
            [
                (os.path.join(self._root, topic, name + state_file.SUFFIX), data)
                for topic, name, data in files
            ]
        )

    def _remove_topic_dir(self, topic: str) -> None:
        self._remove_dir(os.path.join(self._root, topic))

    def _remove_dir(self, directory: str) -> None:
        if self._fs.exists(directory):
            shutil.rmtree(directory)
            self._fs.fsync_dir(os.path.dirname(directory))

    def _load_all(self, topics: set[str]) -> list[tuple[str, str, state_file.StateDoc | None]]:
        """``(topic, name, doc)`` of every saved subscription; ``doc`` is None if damaged."""
        self._fs.makedirs(self._root)
        if self._fs.exists(self._dlq_root):
            for topic in sorted(set(self._fs.listdir(self._dlq_root)) - topics):
                logger.warning("dropping the dead-letter queues of deleted topic %r", topic)
                self._remove_dir(os.path.join(self._dlq_root, topic))
        found: list[tuple[str, str, state_file.StateDoc | None]] = []
        for topic in sorted(self._fs.listdir(self._root)):
            if topic not in topics:
                logger.warning("dropping the subscriptions of deleted topic %r", topic)
                self._remove_topic_dir(topic)
                continue
            directory = os.path.join(self._root, topic)
            for entry in sorted(self._fs.listdir(directory)):
                if entry.endswith(state_file.SUFFIX):
                    name = entry[: -len(state_file.SUFFIX)]
                    found.append((topic, name, self._load(os.path.join(directory, entry))))
        prune_queues(self._fs, self._dlq_root, {(topic, name) for topic, name, _ in found})
        return found

    def _load(self, path: str) -> state_file.StateDoc | None:
        try:
            doc = state_file.decode(self._fs.read_file(path))
        except ValueError as exc:
            logger.error(
                "%s is damaged (%s); kept as %s.corrupt, the subscription restarts at the "
                "earliest offset",
                path,
                exc,
                path,
            )
            self._fs.rename(path, path + ".corrupt")
            return None
        return doc


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
