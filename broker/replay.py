"""Dead-letter replay: put a subscription's dead letters back on their original topic.

Role: the asyncio shell behind the ``ReplayDeadLetters`` admin call. It reads entries from a
:class:`~dispatcher.dead_letter_queue.DeadLetterQueue` oldest first, publishes each one's
:func:`~dispatcher.dead_letter_records.replay_record` (``x-replay-count`` incremented) to
the entry's original topic and partition, paced to a rate, and acks each batch in the queue
once its publish is durable. The planning steps (:func:`batch_size_for`, :func:`replayable_prefix`,
:func:`encode_chunks`) are pure.

Invariants:

- Removal from a queue is a prefix operation (``ack_up_to``), so replay never skips over
  an entry: it stops at the first one it must skip (loop guard or truncated payload),
  which stays in the queue with everything after it. Example: entries 0..4, entry 2 at
  ``max_replays``: entries 0 and 1 are published and acked, entry 2 is reported, entries
  2..4 stay.
- A batch is acked only after every one of its records is durable in its partition. The
  publish and the ack run to their end (``wal.run_to_end``) even when the caller gives up
  mid-batch (a deadline, a cancel): the batch is acked, and the call ends, releasing the
  queue to the next replay, only after that. A crash (or a failed publish) between the
  two republishes the batch next time: replay is at least once.
- Pacing: before a batch, ``sent / rate_per_s`` seconds must have passed since the start,
  so over the call no more than ``rate_per_s`` records leave per second (plus one batch,
  a tenth of a second's worth). Example: 30 records at 100/s go out as batches of 10 at
  0 s, 0.1 s and 0.2 s.
- One replay per queue at a time; a second one is refused, not queued.
- Records are appended as a producer's are (:mod:`broker.ingest`): the backlog quota
  applies, and they count as published. A partition over its quota stops the replay
  with the batch in hand still queued (``reject_producer``), or holds it
  (``block_producer``).

Imports ``broker.topics``, ``broker.ingest``, ``dispatcher`` and ``wal``; no protobuf
types.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker.errors import DeadLetterReplayError, TopicNotFoundError
from broker.ingest import Append
from broker.topics import TopicRegistry
from dispatcher.dead_letter_queue import DeadLetterQueue
from dispatcher.dead_letter_records import DlqEntry, replay_record, replay_refusal
from proto.shown import shown
from wal import encode_columns, run_to_end

logger = logging.getLogger(__name__)

#: Records per second when the request names no rate.
DEFAULT_RATE_PER_S = 1_000
#: The highest rate a request may ask for, records per second.
MAX_RATE_PER_S = 100_000
#: Most records in one paced batch.
MAX_BATCH_RECORDS = 1_000
#: Batch bytes set aside for the batch header and per-record columns, beyond the payloads.
_BATCH_OVERHEAD = 4096
_RECORD_OVERHEAD = 64  # timestamp, key and value offsets, header offsets, bitmap, padding
_HEADER_OVERHEAD = 16  # the two header offsets plus padding


@dataclass(frozen=True, slots=True)
class ReplayOrder:
    """What to replay.

    Attributes:
        limit: Most entries replayed; ``None``: every entry.
        up_to_sequence: Replay only entries at or below this sequence; ``None``: no bound.
        rate_per_s: Most records published per second, from 1 to :data:`MAX_RATE_PER_S`.
    """

    limit: int | None = None
    up_to_sequence: int | None = None
    rate_per_s: int = DEFAULT_RATE_PER_S


@dataclass(frozen=True, slots=True)
class SkippedEntry:
    """An entry replay would not publish: its ``sequence`` and why (``reason``)."""

    sequence: int
    reason: str


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """What a replay did: ``replayed`` entries published and acked, the ``skipped`` entry
    where it stopped (if any), and the entries ``remaining`` in the queue."""

    replayed: int
    skipped: tuple[SkippedEntry, ...]
    remaining: int


# ---------------------------------------------------------------------------------------
# Planning (pure)


def batch_size_for(rate_per_s: int) -> int:
    """Records per paced batch: a tenth of a second's worth, from 1 to 1000."""
    return max(1, min(MAX_BATCH_RECORDS, -(-rate_per_s // 10)))


def replayable_prefix(
    entries: Sequence[DlqEntry], max_replays: int, up_to_sequence: int | None
) -> tuple[list[DlqEntry], SkippedEntry | None, bool]:
    """The leading entries replay may publish, and why it stops.

    Returns:
        ``(take, skipped, done)``: the entries to publish; the first entry that must be
        skipped (``None`` if none); and whether replay ends after ``take`` (an entry was
        skipped or one lies past ``up_to_sequence``).
    """
    take: list[DlqEntry] = []
    for entry in entries:
        if up_to_sequence is not None and entry.sequence > up_to_sequence:
            return take, None, True
        refusal = replay_refusal(entry, max_replays)
        if refusal is not None:
            return take, SkippedEntry(entry.sequence, refusal), True
        take.append(entry)
    return take, None, False


def encode_chunks(entries: Sequence[DlqEntry], max_batch_bytes: int, now_ms: int) -> list[bytes]:
    """Record batches of the replay records of ``entries``, in order, each under
    ``max_batch_bytes`` (a record too big for any batch goes alone; the log rejects it)."""
    budget = max(1, max_batch_bytes - _BATCH_OVERHEAD)
    chunks: list[list[DlqEntry]] = [[]]
    used = 0
    for entry in entries:
        size = _record_bytes(entry)
        if chunks[-1] and used + size > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(entry)
        used += size
    return [_encode(chunk, now_ms) for chunk in chunks]


def _encode(entries: Sequence[DlqEntry], now_ms: int) -> bytes:
    keys: list[bytes | None] = []
    values: list[bytes] = []
    headers: list[list[tuple[str, bytes]]] = []
    for entry in entries:
        key, value, names = replay_record(entry)
        keys.append(key)
        values.append(value)
        headers.append(names)
    return encode_columns(values, keys=keys, timestamps_ms=now_ms, headers=headers)


def _record_bytes(entry: DlqEntry) -> int:
    n = len(entry.value) + len(entry.key or b"") + _RECORD_OVERHEAD + _HEADER_OVERHEAD
    for name, value in entry.headers:
        n += len(name.encode()) + len(value) + _HEADER_OVERHEAD
    return n + 32  # x-replay-count, which replay_record adds or replaces


def _by_target(entries: Sequence[DlqEntry]) -> dict[tuple[str, int], list[DlqEntry]]:
    """Entries grouped by (original topic, partition), each group in queue order."""
    groups: dict[tuple[str, int], list[DlqEntry]] = {}
    for entry in entries:
        groups.setdefault((entry.topic, entry.partition), []).append(entry)
    return groups


# ---------------------------------------------------------------------------------------
# The shell


class DeadLetterReplayer:
    """Replays dead-letter queues into the broker's topics. Use from one event loop.

    Args:
        topics: Where the original topics live.
        append: Appends a batch as a producer's publish is appended (backlog quota, then
            the log, then the ``published`` metric): :func:`broker.ingest.append_batch`,
            bound to the broker's quota and metrics.
        clock: Wall-clock seconds since the epoch (the replayed records' timestamp).
    """

    def __init__(
        self,
        topics: TopicRegistry,
        append: Append,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._topics = topics
        self._append = append
        self._clock = clock
        self._running: set[tuple[str, str]] = set()

    async def replay(
        self, dlq: DeadLetterQueue, topic: str, subscription: str, order: ReplayOrder
    ) -> ReplayOutcome:
        """Replay ``dlq`` (the queue of ``topic``/``subscription``) as ``order`` says.

        Raises:
            DeadLetterReplayError: another replay of this queue is running, or an entry's
                original topic or partition no longer exists (entries before it stay
                replayed and acked).
            InvalidBatchError: a record does not fit the target partition's limits.
            BacklogQuotaExceededError: a target partition is over its backlog quota
                (``reject_producer``, or ``block_producer`` after its wait); the entries
                of the batch in hand stay in the queue.
        """
        key = (topic, subscription)
        if key in self._running:
            raise DeadLetterReplayError(
                topic, subscription, "another replay of this queue is running; wait for it"
            )
        self._running.add(key)
        try:
            replayed, skipped = await self._run(dlq, key, order)
        finally:
            self._running.discard(key)
        if replayed or skipped:
            logger.info(
                "dlq %s/%s: replayed %d entries%s",
                topic,
                subscription,
                replayed,
                f"; stopped at entry {skipped.sequence}" if skipped else "",
            )
        return ReplayOutcome(replayed, (skipped,) if skipped else (), dlq.count())

    async def _run(
        self, dlq: DeadLetterQueue, key: tuple[str, str], order: ReplayOrder
    ) -> tuple[int, SkippedEntry | None]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        size = batch_size_for(order.rate_per_s)
        replayed, after = 0, None
        while order.limit is None or replayed < order.limit:
            delay = start + replayed / order.rate_per_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            want = size if order.limit is None else min(size, order.limit - replayed)
            entries = await dlq.peek(from_sequence=after, limit=want)
            take, skipped, done = replayable_prefix(
                entries, dlq.config.max_replays, order.up_to_sequence
            )
            take, gone = self._reachable(take)
            if take:
                await run_to_end(self._publish_and_ack(dlq, take))
                replayed += len(take)
                after = take[-1].sequence + 1
            if gone is not None:
                raise DeadLetterReplayError(*key, _gone_message(gone, key, replayed))
            if skipped is not None or done or len(entries) < want:
                return replayed, skipped
        return replayed, None

    def _reachable(self, entries: list[DlqEntry]) -> tuple[list[DlqEntry], _Gone | None]:
        """The leading entries whose original topic and partition still exist, and what is
        gone for the first entry after them (``None`` when every entry is reachable)."""
        for i, entry in enumerate(entries):
            try:
                partitions = len(self._topics.get(entry.topic).partitions)
            except TopicNotFoundError:
                partitions = 0
            if not 0 <= entry.partition < partitions:
                return entries[:i], _Gone(entry, partitions)
        return entries, None

    async def _publish_and_ack(self, dlq: DeadLetterQueue, entries: Sequence[DlqEntry]) -> None:
        """Publish every entry (partitions in parallel, each in queue order), then ack them
        all. Every target was checked by :meth:`_reachable` just before."""
        now_ms = int(self._clock() * 1000)

        async def publish(topic: str, index: int, group: list[DlqEntry]) -> None:
            partition = self._topics.get(topic).partition(index)
            limit = partition.log.config.max_batch_bytes
            for data in encode_chunks(group, limit, now_ms):
                await self._append(topic, partition, data)

        await asyncio.gather(*(publish(t, i, g) for (t, i), g in _by_target(entries).items()))
        await dlq.ack_up_to(entries[-1].sequence)


@dataclass(frozen=True, slots=True)
class _Gone:
    """An entry whose original partition is gone; its topic now has ``partitions``."""

    entry: DlqEntry
    partitions: int


def _gone_message(gone: _Gone, key: tuple[str, str], replayed: int) -> str:
    entry = gone.entry
    if gone.partitions == 0:
        what = f"original topic {shown(entry.topic)} no longer exists"
    else:
        what = (
            f"original partition {entry.partition} of topic {shown(entry.topic)} no longer exists "
            f"(it has {gone.partitions}; entries are not moved to another partition)"
        )
    before = f"the {replayed} entries before it were replayed and acked; " if replayed else ""
    return (
        f"entry {entry.sequence}'s {what}; {before}handle it by hand, then ack it with "
        f"`headrace dlq ack {key[0]} --subscription {key[1]} --up-to {entry.sequence}`"
    )
