"""The retention task, and the backlog quota on the publish path: the asyncio shell.

Role: every ``interval_s`` (``retention_check_interval_ms``) one pass over every topic
partition: ``writer.apply_retention(floor_offset=floor)``, where the floor is the lowest
cursor the topic's subscriptions saved (``SubscriptionRegistry.saved_floor``; ``None``
without a subscription, so retention applies freely), then a refresh of the partition's
:class:`~broker.backlog.BacklogGate`. The same pass forgets the idempotent producers idle
longer than ``producer_expiry_ms`` (:meth:`Partition.expire_producers`, on the partition's
own wall clock). On the publish path, :meth:`RetentionService.admit`
applies the quota. The rules are pure, in :mod:`broker.backlog`; this module carries them
out, logs and counts.

Invariants:
- Retention never deletes a segment holding the saved floor or a later offset, so after a
  restart no saved cursor lies below the log's first offset. (The floor is read just before
  the deletion is queued; a subscription created in between starts at the first offset that
  remains, which is what "earliest" means.)
- Only ``evict_oldest_backlog`` deletes past the floor; it logs what it deleted, and
  subscriptions behind the new first offset skip forward with a warning of their own.
- The publish path costs one dict lookup and one integer compare per batch while the
  partition is within its quota (or no quota is set: then nothing at all). Over quota it
  refreshes the cached floor at most every ``poll_s`` per partition.
- A blocked publish never blocks the loop: it waits on an event that refreshes set when
  the partition falls back under its quota, re-checking every ``poll_s``.
- Crossing the quota is logged once per change of state, not once per publish; each
  publish over quota is counted (``headrace_backlog_quota_exceeded_requests_total``).
- A pass that forgets producers logs one line per partition and counts them
  (``headrace_expired_producer_ids_total``); a producer with a batch in flight is kept.

Task-safe on one event loop. Must not depend on gRPC or protobuf.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from broker.backlog import BacklogConfig, BacklogGate, eviction_offset
from broker.errors import BacklogQuotaExceededError, ShuttingDownError, TopicNotFoundError
from broker.metrics import BrokerMetrics
from broker.partition import Partition
from broker.topics import TopicRegistry
from wal import WalClosedError, WalError

logger = logging.getLogger(__name__)

#: Per partition of a topic, the lowest saved cursor; ``None`` when it has no subscription.
FloorFunction = Callable[[str], Sequence[int] | None]


@dataclass(slots=True)
class _Slot:
    """One partition's quota state: the pure gate, plus the event blocked publishes wait on
    (set while the partition is under its quota)."""

    topic: str
    gate: BacklogGate
    under: asyncio.Event


class RetentionService:
    """Runs retention on every partition and applies the backlog quota to publishes.

    Task-safe on one event loop: the retention task and publishes share the gates, and no
    gate method awaits.

    Args:
        topics: The broker's topics.
        floors: ``SubscriptionRegistry.saved_floor``, or a fake in tests.
        metrics: Where deletions and quota hits are counted.
        backlog: The backlog quota and its policy. Default: no quota.
        interval_s: Seconds between retention passes. Default 5.
        poll_s: Seconds between re-checks of a blocked publish, and the least time between
            floor refreshes on the publish path. Default 0.1.
        clock: Monotonic seconds (tests pass a manual clock).
        producer_expiry_ms: Idempotent producers idle longer than this, milliseconds, are
            forgotten at each pass. Default 604,800,000 (7 days).
    """

    def __init__(
        self,
        topics: TopicRegistry,
        floors: FloorFunction,
        metrics: BrokerMetrics,
        *,
        backlog: BacklogConfig | None = None,
        interval_s: float = 5.0,
        poll_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        producer_expiry_ms: int = 604_800_000,
    ) -> None:
        self._topics = topics
        self._floors = floors
        self._metrics = metrics
        self._config = backlog or BacklogConfig()
        self._quota = self._config.has_quota()
        self._interval_s = interval_s
        self._poll_s = poll_s
        self._clock = clock
        self._producer_expiry_ms = producer_expiry_ms
        self._slots: dict[Partition, _Slot] = {}
        self._evictions: dict[Partition, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the retention task: one pass now, then one every ``interval_s``."""
        self._task = asyncio.create_task(self._run(), name="retention")

    async def aclose(self) -> None:
        """Stop the task and any eviction; blocked publishes fail with
        ``ShuttingDownError``. Idempotent."""
        self._closed = True
        tasks = [t for t in (self._task, *self._evictions.values()) if t is not None]
        self._task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for slot in self._slots.values():
            slot.under.set()  # wake blocked publishes: they see the service closed

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:  # the task must outlive one bad pass
                logger.exception("retention pass failed; trying again in %.1fs", self._interval_s)
            await asyncio.sleep(self._interval_s)

    # -- the retention pass -----------------------------------------------------------

    async def run_once(self) -> None:
        """One pass: producer expiry and retention on every partition, then its quota
        (tests call this)."""
        live: set[Partition] = set()
        for name in self._topics.names():
            try:
                partitions = self._topics.get(name).partitions
            except TopicNotFoundError:
                continue  # deleted since names() was read
            floors = self._floors(name)
            for partition in partitions:
                live.add(partition)
                self._expire_producers(name, partition)
                await self._retain(name, partition, _floor_at(floors, partition.index))
        for gone in self._slots.keys() - live:
            del self._slots[gone]

    def _expire_producers(self, topic: str, partition: Partition) -> None:
        expired = partition.expire_producers(self._producer_expiry_ms)
        if expired:
            logger.info(
                "%s/%d: forgot %d idempotent producer id(s) idle for over %d ms; a retry "
                "from one of them would be appended again",
                topic,
                partition.index,
                expired,
                self._producer_expiry_ms,
            )
            self._metrics.producers_expired(topic, partition.index, expired)
        evicted = partition.take_evicted_producers()
        if evicted:
            logger.warning(
                "%s/%d: forgot %d idempotent producer id(s) to stay within [limits] "
                "max_producers_per_partition; a retry from one of them would be appended again",
                topic,
                partition.index,
                evicted,
            )
            self._metrics.producers_expired(topic, partition.index, evicted)

    async def _retain(self, topic: str, partition: Partition, floor: int | None) -> None:
        writer = partition.writer
        try:
            deleted = await writer.apply_retention(floor_offset=floor)
        except WalClosedError:
            return  # the topic is being deleted, or the broker is closing
        except WalError as exc:
            logger.error("%s/%d: retention failed: %s", topic, partition.index, exc)
            return
        if deleted:
            logger.info(
                "%s/%d: retention deleted %d segment(s) (base offsets %s); first offset now "
                "%d, saved floor %s",
                topic,
                partition.index,
                len(deleted),
                ", ".join(map(str, deleted)),
                writer.first_offset,
                "none (no subscription)" if floor is None else floor,
            )
            self._metrics.retention_deleted(topic, partition.index, len(deleted))
        if self._quota:
            slot = self._slot(topic, partition)
            self._apply_floor(slot, partition, floor)
            if slot.gate.state.is_over() and self._config.policy.is_evict():
                self._schedule_eviction(slot, partition)

    # -- the publish path -------------------------------------------------------------

    def admit(self, topic: str, partition: Partition) -> Awaitable[None] | None:
        """Apply the backlog quota to a publish to ``partition``, before it is appended.

        Returns:
            ``None`` to go ahead now, or (``block_producer``) something to await first.

        Raises:
            BacklogQuotaExceededError: over quota under ``reject_producer``.
        """
        if not self._quota:
            return None
        slot = self._slots.get(partition)
        if slot is None:
            slot = self._slot(topic, partition)
        if partition.writer.head <= slot.gate.limit:
            return None  # the fast path: within the quota by the cached floor
        return self._over_quota(slot, partition)

    def _over_quota(self, slot: _Slot, partition: Partition) -> Awaitable[None] | None:
        self._check(slot, partition)
        if slot.gate.admits(partition.writer.head):
            return None  # acks saved since the last refresh made room
        policy = self._config.policy
        self._metrics.quota_exceeded(slot.topic, partition.index, policy.value)
        if policy.is_reject():
            raise self._exceeded(slot, partition)
        if policy.is_evict():
            self._schedule_eviction(slot, partition)
            return None
        if self._closed:
            raise ShuttingDownError()
        return self._wait_under(slot, partition)

    async def _wait_under(self, slot: _Slot, partition: Partition) -> None:
        """``block_producer``: wait until the partition is under its quota again."""
        timeout_ms = self._config.block_timeout_ms
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                while True:
                    if self._closed:
                        raise ShuttingDownError()
                    self._check(slot, partition)  # clears ``under`` while still over
                    if slot.gate.admits(partition.writer.head):
                        return
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(slot.under.wait(), self._poll_s)
        except TimeoutError as exc:
            raise self._exceeded(slot, partition, waited_ms=timeout_ms) from exc

    def _exceeded(
        self, slot: _Slot, partition: Partition, waited_ms: int | None = None
    ) -> BacklogQuotaExceededError:
        return BacklogQuotaExceededError(
            slot.topic,
            partition.index,
            slot.gate.backlog(partition.writer.head),
            self._config.quota_messages,
            self._config.policy.value,
            waited_ms=waited_ms,
        )

    # -- eviction ---------------------------------------------------------------------

    def _schedule_eviction(self, slot: _Slot, partition: Partition) -> None:
        """Start an eviction unless one runs for the partition or the last was too recent
        (a partition whose active segment alone is over quota would otherwise get one
        attempt per publish)."""
        now = self._clock()
        if self._closed or partition in self._evictions or not slot.gate.eviction_due(now):
            return
        slot.gate.evicting(now)
        task = asyncio.create_task(
            self._evict(slot, partition), name=f"evict {slot.topic}/{partition.index}"
        )
        self._evictions[partition] = task
        task.add_done_callback(lambda _t: self._evictions.pop(partition, None))

    async def _evict(self, slot: _Slot, partition: Partition) -> None:
        writer = partition.writer
        quota = self._config.quota_messages
        try:
            # Segment facts come from the loop, as the writer's own retention reads them.
            target = eviction_offset(writer.log.segment_infos(), writer.head, quota)
            if target is None:
                return
            floor, first = slot.gate.floor, writer.first_offset
            deleted = await writer.delete_before(target)
        except WalClosedError:
            return
        except Exception:  # an eviction task must never die unreported
            logger.exception(
                "%s/%d: evicting the oldest backlog failed", slot.topic, partition.index
            )
            return
        if not deleted:
            return
        unconsumed = max(0, writer.first_offset - max(first, floor if floor is not None else 0))
        logger.warning(
            "%s/%d: backlog over the quota of %d records: evicted %d segment(s) (base offsets "
            "%s), offsets %d..%d, %d of them past the saved floor %s; subscriptions behind "
            "offset %d skip forward",
            slot.topic,
            partition.index,
            quota,
            len(deleted),
            ", ".join(map(str, deleted)),
            first,
            writer.first_offset - 1,
            unconsumed,
            floor,
            writer.first_offset,
        )
        self._metrics.evicted(slot.topic, partition.index, unconsumed)
        self._refresh(slot, partition)

    # -- gates ------------------------------------------------------------------------

    def _slot(self, topic: str, partition: Partition) -> _Slot:
        slot = self._slots.get(partition)
        if slot is None:
            under = asyncio.Event()
            under.set()
            slot = _Slot(topic, BacklogGate(self._config, refresh_s=self._poll_s), under)
            self._slots[partition] = slot
            self._refresh(slot, partition)
        return slot

    def _check(self, slot: _Slot, partition: Partition) -> None:
        """Refresh the floor if it is stale, else just judge the partition again."""
        if slot.gate.is_stale(self._clock()):
            self._refresh(slot, partition)
        else:
            self._observe(slot, partition)

    def _refresh(self, slot: _Slot, partition: Partition) -> None:
        """Take a fresh floor (walks the topic's subscriptions), then judge."""
        self._apply_floor(slot, partition, _floor_at(self._floors(slot.topic), partition.index))

    def _apply_floor(self, slot: _Slot, partition: Partition, floor: int | None) -> None:
        slot.gate.refresh(floor, partition.writer.first_offset, self._clock())
        self._observe(slot, partition)

    def _observe(self, slot: _Slot, partition: Partition) -> None:
        """Judge the partition; log a change of state, and wake blocked publishes."""
        head = partition.writer.head
        crossed = slot.gate.observe(head)
        if crossed is None:
            return
        if crossed.state.is_over():
            slot.under.clear()
            logger.warning(
                "%s/%d: backlog of %d records (saved floor %s, head %d) is over the quota of "
                "%d; policy %s applies until consumers acknowledge",
                slot.topic,
                partition.index,
                crossed.backlog,
                slot.gate.floor,
                head,
                crossed.quota,
                self._config.policy.value,
            )
        else:
            slot.under.set()
            logger.info(
                "%s/%d: backlog of %d records is back within the quota of %d",
                slot.topic,
                partition.index,
                crossed.backlog,
                crossed.quota,
            )


def _floor_at(floors: Sequence[int] | None, index: int) -> int | None:
    """The floor of partition ``index``: ``None`` without subscriptions; 0 (keep all) if a
    subscription somehow has no cursor for it."""
    if floors is None:
        return None
    return floors[index] if index < len(floors) else 0
