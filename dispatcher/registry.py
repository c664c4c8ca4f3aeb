"""Every subscription of the broker, and where their cursors are kept on disk.

Owns :class:`SubscriptionRegistry`: creating, finding, listing and dropping subscriptions,
and persisting their acknowledged state. Each subscription is one file,
``<data dir>/subscriptions/<topic>/<subscription>.json``, replaced atomically (temp file,
fsync, rename, fsync of the directory: DESIGN section 2, invariant 3)::

    {"version": 1, "topic": "orders", "subscription": "billing", "type": "exclusive",
     "partitions": [{"cursor": 1200, "acked": [[1205, 1210]]}, ...]}

``cursor`` is the first unacknowledged offset; ``acked`` lists the acknowledged ranges above
it (the ack holes between them are still owed), so a restart does not resend what was acked
out of order.

When saved: a new subscription before its consumer gets an answer; a seek or a commit
(``AckUpTo``) before the reply; acks from consumers in the background every
``flush_interval_s`` (acks not yet saved may be redelivered after a crash; nothing is
skipped); everything at shutdown.

A damaged file is kept as ``.corrupt`` and the subscription restarts at the earliest retained
offset: duplicates, never a skip.

The registry also runs the heartbeat: one task for every subscription, which ticks each at
its own interval (:class:`~dispatcher.lag.HeartbeatConfig`, per topic and per
subscription) and, after each round, refreshes :attr:`SubscriptionRegistry.samples`, the
snapshot the metrics exporter reads from its own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from dispatcher.acks import AckRanges
from dispatcher.errors import (
    DispatcherClosedError,
    InvalidSubscriptionError,
    SubscriptionNotFoundError,
)
from dispatcher.lag import HeartbeatConfig
from dispatcher.subscription import InitialPosition, Subscription, SubscriptionType
from wal import FileSystem, LogWriter

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_SUFFIX = ".json"
_VERSION = 1


def check_subscription_name(name: str) -> None:
    """Raise ``InvalidSubscriptionError`` unless ``name`` is a valid subscription name."""
    if not _NAME.fullmatch(name or ""):
        raise InvalidSubscriptionError(
            "subscription",
            f"{name!r} is not a valid subscription name: use 1-200 characters from "
            "A-Z a-z 0-9 . _ -, starting with a letter or digit",
        )


class _PartitionDoc(msgspec.Struct, forbid_unknown_fields=True):
    cursor: int
    acked: list[tuple[int, int]] = []


class _Doc(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    topic: str
    subscription: str
    type: str
    partitions: list[_PartitionDoc]


#: Ticks due this close to a round are done in it, so subscriptions on one interval share
#: one wake-up (and a manual clock's float steps do not skip a tick).
_TICK_SLACK_S = 0.001

_decoder = msgspec.json.Decoder(_Doc)
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class PartitionSample:
    """One partition of a subscription at the last heartbeat round."""

    partition: int
    lag: int  # records at or above the cursor not yet acknowledged
    in_flight: int


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


class SubscriptionRegistry:
    """The broker's subscriptions. Use from one event loop.

    Args:
        data_dir: The broker's data directory.
        fs: File operations (tests pass a faulty one).
        max_unacked: Records in flight per subscription, at most.
        flush_interval_s: How often acknowledged state is saved in the background.
        heartbeat: Heartbeat intervals and the stall timeout.
        monotonic: Monotonic seconds (tests pass a manual clock).
    """

    def __init__(
        self,
        data_dir: str,
        *,
        fs: FileSystem | None = None,
        max_unacked: int = 1_000,
        flush_interval_s: float = 0.1,
        heartbeat: HeartbeatConfig | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root = os.path.join(data_dir, "subscriptions")
        self._fs = fs or FileSystem()
        self._max_unacked = max_unacked
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
            acks = _restore(doc, topics[topic], topic, name)
            self._add(topic, name, topics[topic], acks, type_)
            self._saved[(topic, name)] = tuple(a.cursor for a in acks)
        self._flusher = asyncio.create_task(self._flush_loop(), name="subscription flusher")
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        logger.info("opened %d subscriptions under %s", len(self._subs), self._root)

    async def aclose(self) -> None:
        """Stop every subscription and save its state. Idempotent."""
        self._closed = True
        for task in (self._flusher, self._heartbeat_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._flusher = self._heartbeat_task = None
        subs, self._subs = list(self._subs.values()), {}
        for sub in subs:
            await sub.aclose()
        for sub in subs:
            await self._save(sub)
        self._dirty.clear()

    # -- finding and creating -----------------------------------------------------------

    async def subscribe(
        self,
        topic: str,
        name: str,
        writers: Sequence[LogWriter],
        *,
        initial: InitialPosition = InitialPosition.EARLIEST,
        type_: SubscriptionType = SubscriptionType.EXCLUSIVE,
    ) -> Subscription:
        """The subscription ``name`` of ``topic``, created at ``initial`` (and saved) if new.

        Raises:
            InvalidSubscriptionError: a bad name, or it exists with another type.
            DispatcherClosedError: the registry is closed (the broker is shutting down).
        """
        if self._closed:
            raise DispatcherClosedError()
        check_subscription_name(name)
        sub = self._subs.get((topic, name))
        if sub is not None:
            if sub.type is not type_:
                raise InvalidSubscriptionError(
                    "type",
                    f"subscription {name!r} on topic {topic!r} is {sub.type.value}, not "
                    f"{type_.value}; use its type or another subscription name",
                )
            return sub
        if initial is InitialPosition.LATEST:
            acks = [AckRanges(w.high_water_mark) for w in writers]
        else:
            acks = [AckRanges(w.first_offset) for w in writers]
        sub = self._add(topic, name, writers, acks, type_)
        await self._save(sub)
        logger.info("created subscription %s/%s at %s", topic, name, initial.value)
        return sub

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
        """Stop and forget every subscription of ``topic`` (the topic is being deleted)."""
        for key in [k for k in self._subs if k[0] == topic]:
            await self._subs.pop(key).aclose()
            self._saved.pop(key, None)
            self._dirty.discard(key)
            self._next_tick.pop(key, None)
            self._samples.pop(key, None)
        async with self._save_lock:
            await asyncio.to_thread(self._remove_topic_dir, topic)

    async def save(self, sub: Subscription) -> None:
        """Save ``sub``'s acknowledged state now (before answering a seek or a commit)."""
        self._dirty.discard((sub.topic, sub.name))
        await self._save(sub)

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
        self.samples = tuple(self._sample(key, sub) for key, sub in self._subs.items())
        return max(soonest, 0.001)

    def _sample(self, key: tuple[str, str], sub: Subscription) -> SubscriptionSample:
        """The subscription's sample, rebuilt only when something in it may have changed."""
        version = sub.sample_key()
        cached = self._samples.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        sample = _sample(sub)
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

    def _add(
        self,
        topic: str,
        name: str,
        writers: Sequence[LogWriter],
        acks: Sequence[AckRanges],
        type_: SubscriptionType = SubscriptionType.EXCLUSIVE,
    ) -> Subscription:
        sub = Subscription(
            topic,
            name,
            writers,
            acks,
            type_=type_,
            max_unacked=self._max_unacked,
            on_change=self._mark_dirty,
            heartbeat_interval_s=self._heartbeat.interval_for(topic, name),
            stall_timeout_s=self._heartbeat.stall_timeout_s,
        )
        self._subs[(topic, name)] = sub
        sub.start()
        return sub

    def _mark_dirty(self, sub: Subscription) -> None:
        self._dirty.add((sub.topic, sub.name))

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval_s)
            dirty, self._dirty = self._dirty, set()
            for key in sorted(dirty):
                sub = self._subs.get(key)
                if sub is None:
                    continue
                try:
                    await self._save(sub)
                except OSError:
                    logger.exception("saving the cursor of %s/%s failed; will retry", *key)
                    self._dirty.add(key)

    async def _save(self, sub: Subscription) -> None:
        async with self._save_lock:  # one writer per file; the newest state wins
            doc = _Doc(
                version=_VERSION,
                topic=sub.topic,
                subscription=sub.name,
                type=sub.type.value,
                partitions=[
                    _PartitionDoc(cursor=cursor, acked=ranges)
                    for cursor, ranges in sub.acked_state()
                ],
            )
            await asyncio.to_thread(self._write, sub.topic, sub.name, _encoder.encode(doc))
            if (sub.topic, sub.name) in self._subs:
                self._saved[(sub.topic, sub.name)] = tuple(p.cursor for p in doc.partitions)

    def _write(self, topic: str, name: str, data: bytes) -> None:
        directory = os.path.join(self._root, topic)
        if not self._fs.exists(directory):
            self._fs.makedirs(directory)
            self._fs.fsync_dir(self._root)
        self._fs.atomic_write(os.path.join(directory, name + _SUFFIX), data)

    def _remove_topic_dir(self, topic: str) -> None:
        directory = os.path.join(self._root, topic)
        if self._fs.exists(directory):
            shutil.rmtree(directory)
            self._fs.fsync_dir(self._root)

    def _load_all(self, topics: set[str]) -> list[tuple[str, str, _Doc | None]]:
        """``(topic, name, doc)`` of every saved subscription; ``doc`` is None if damaged."""
        self._fs.makedirs(self._root)
        found: list[tuple[str, str, _Doc | None]] = []
        for topic in sorted(self._fs.listdir(self._root)):
            if topic not in topics:
                logger.warning("dropping the subscriptions of deleted topic %r", topic)
                self._remove_topic_dir(topic)
                continue
            directory = os.path.join(self._root, topic)
            for entry in sorted(self._fs.listdir(directory)):
                if entry.endswith(_SUFFIX):
                    name = entry[: -len(_SUFFIX)]
                    found.append((topic, name, self._load(os.path.join(directory, entry))))
        return found

    def _load(self, path: str) -> _Doc | None:
        try:
            doc = _decoder.decode(self._fs.read_file(path))
            if doc.version != _VERSION:
                raise ValueError(f"version {doc.version} is not {_VERSION}")
            SubscriptionType(doc.type)
        except (msgspec.DecodeError, ValueError) as exc:
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


def _restore(
    doc: _Doc | None, writers: Sequence[LogWriter], topic: str, name: str
) -> list[AckRanges]:
    """Acknowledged state per partition from ``doc``, fitted to what the logs hold."""
    acks = []
    for i, writer in enumerate(writers):
        saved = doc.partitions[i] if doc is not None and i < len(doc.partitions) else None
        if saved is None:
            acks.append(AckRanges(writer.first_offset))
            continue
        cursor = max(saved.cursor, writer.first_offset)
        if cursor > writer.high_water_mark:
            logger.warning(
                "%s/%s partition %d: saved cursor %d is past the head %d; using the head",
                topic,
                name,
                i,
                cursor,
                writer.high_water_mark,
            )
            cursor = writer.high_water_mark
        ranges = [(b, min(e, writer.high_water_mark)) for b, e in saved.acked if b < e]
        acks.append(AckRanges(cursor, ranges))
    return acks


def _sample(sub: Subscription) -> SubscriptionSample:
    return SubscriptionSample(
        sub.topic,
        sub.name,
        sub.notifier_polls,
        sub.heartbeat_polls,
        sub.task_restarts,
        sub.verdict.stalled,
        tuple(PartitionSample(i, lag, in_flight) for i, lag, in_flight in sub.lag()),
    )
