"""Plain values the client returns: topics, partitions, acknowledged records, lag and
dead letters.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

DEFAULT_BROKER = "127.0.0.1:50051"


class Queued:
    """What :class:`~client.AsyncConsumer`'s ``ack``, ``ack_many``, ``ack_cumulative`` and
    ``nack`` return: the acknowledgement is queued, and goes to the broker with the next
    ack request (within ``ack_interval_ms``, sooner when many are pending, and at the
    latest when the consumer closes).

    Awaiting it returns at once, without yielding to the loop, so ``consumer.ack(m)`` and
    ``await consumer.ack(m)`` do the same: an application written either way works.
    """

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        return
        yield  # a generator that ends at once: ``await`` returns None without suspending

    def __repr__(self) -> str:
        return "<ack queued>"


#: The one :class:`Queued` value (it carries nothing).
QUEUED = Queued()


@dataclass(frozen=True, slots=True)
class FollowerInfo:
    """One follower of a replicated topic in one partition, as its leader knows it
    (issue 37): ``fetch_offset``, where its last fetch in the leader's epoch read from
    (0 before its first); ``lag_records`` it lacks of the leader's durable end;
    ``lag_s``, seconds since it was last caught up (0 while it is); ``in_sync``: in the
    in-sync set."""

    node: str
    fetch_offset: int
    lag_records: int
    lag_s: float
    in_sync: bool


@dataclass(frozen=True, slots=True)
class LogFollowerInfo:
    """One follower of a replicated topic in one kind of its other logs, as its leader
    knows it (issue 37): ``log`` ``state`` (the subscription-state log) or ``dlq`` (the
    largest over the dead-letter queues); ``lag_records`` and ``lag_s`` as
    :class:`FollowerInfo`'s; ``in_sync``: in the in-sync set."""

    log: str
    node: str
    lag_records: int
    lag_s: float
    in_sync: bool


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition: retained offsets ``[first_offset, head)``, bytes and segments; on
    a replicated topic described through its leader, each follower's lag (``followers``,
    in replica order; empty from any other broker)."""

    partition: int
    first_offset: int
    head: int
    size_bytes: int
    segments: int
    followers: tuple[FollowerInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic and its partitions, and its fsync policy (``always``, ``interval`` or
    ``never``; empty from a broker that does not say). ``topic_id``: random, chosen when
    the topic was created, so a topic deleted and created again has another one; empty
    for a topic created before issue 17 or from a broker that predates it.

    In a cluster, ``owner`` is the node id of the broker that owns the topic (``""`` from
    a single broker), and ``offline`` says why its figures are not its owner's: a refusal
    reason (``offline``, ``creating``, ``no-session``, ``data-missing``) or
    ``unreachable`` (the owner did not answer). Such a topic is listed with its
    partitions, zero figures and no ``fsync``; ``offline`` is ``""`` when the owner
    answered.

    Replication (issue 37): ``leader`` (the owner; ``local`` on a single broker) at
    ``epoch``, the ordered ``replicas`` (first: the preferred leader), the in-sync set
    ``isr`` and ``min_insync_replicas``, the in-sync replicas a publish needs. A topic of
    one replica lists its owner alone. Empty and 0 from a broker before issue 37 and for a
    topic listed ``offline``. Described through its leader, ``log_followers``: each
    follower's lag in the topic's state log and dead-letter queues."""

    name: str
    partitions: tuple[PartitionInfo, ...]
    fsync: str = ""
    topic_id: str = ""
    owner: str = ""
    offline: str = ""
    leader: str = ""
    epoch: int = 0
    replicas: tuple[str, ...] = ()
    isr: tuple[str, ...] = ()
    min_insync_replicas: int = 0
    log_followers: tuple[LogFollowerInfo, ...] = ()


class PublishOutcome(enum.Enum):
    """What a failed send left in the log, as far as the client can know
    (:attr:`ClientError.outcome <client.errors.ClientError.outcome>`).

    ``REFUSED``: the records were not written, so sending them again is safe. The broker
    refused the batch before appending it (a bad or oversized batch, a missing topic, the
    backlog quota, a sequence gap, auth), or it was never sent.

    ``UNKNOWN``: the records may or may not have been written; sending them again may
    store them twice. No answer came (the delivery timeout ran out while the broker was
    unreachable or slow), or the broker answered with an error that can follow an append
    (``UNKNOWN``, ``INTERNAL``, ``CANCELLED``...). Read the partition to find out.
    """

    REFUSED = "refused"
    UNKNOWN = "unknown"

    def is_refused(self) -> bool:
        """Whether the records were certainly not written."""
        return self is PublishOutcome.REFUSED

    @property
    def advice(self) -> str:
        """What the outcome means for the caller, as the error message ends with it."""
        if self.is_refused():
            return "not written; safe to resend"
        return "may or may not have been written; resending may duplicate"


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record was stored. ``duplicate``: the broker had it already.

    ``offset`` is -1 for a duplicate appended too long ago for the broker to remember where
    (a retry older than its last few batches of the producer, e.g. a replayed Spark task
    re-sending every batch): the record is in the log once, at an offset not reported.
    """

    topic: str
    partition: int
    offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class PublishedRange:
    """One batch that :meth:`~client.AsyncProducer.send_many` published: ``count`` records
    at offsets ``[base_offset, base_offset + count)`` of ``partition``.

    ``indices`` says which of the values passed to ``send_many`` they are, in offset order.
    ``duplicate``: the broker had the batch already (a retry that had been appended).
    ``base_offset`` is -1 when ``duplicate`` and the broker no longer remembers where the
    batch was appended (it answers offsets -1 for a retry older than its last few batches
    of the producer); the records are in the log once, and their offsets are reported as -1.
    """

    partition: int
    base_offset: int
    count: int
    duplicate: bool
    indices: Sequence[int]


class SentRecords(Sequence[RecordMetadata]):
    """What :meth:`~client.AsyncProducer.send_many` stored: a sequence with one
    :class:`RecordMetadata` per value passed, in the order passed.

    Built from the published batches (:attr:`ranges`) without per-record work; the first
    lookup of a single record builds the index from record to batch once.
    """

    __slots__ = ("_where", "ranges", "topic")

    def __init__(self, topic: str, ranges: Sequence[PublishedRange]) -> None:
        self.topic = topic
        #: The published batches, in the order they were cut from the values.
        self.ranges: tuple[PublishedRange, ...] = tuple(ranges)
        self._where: list[tuple[PublishedRange, int]] | None = None

    def __len__(self) -> int:
        return sum(r.count for r in self.ranges)

    @overload
    def __getitem__(self, i: int) -> RecordMetadata: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[RecordMetadata]: ...
    def __getitem__(self, i: int | slice) -> RecordMetadata | Sequence[RecordMetadata]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        where = self._index()
        r, pos = where[i]  # IndexError, and negative indices, come from the list
        offset = r.base_offset + pos if r.base_offset >= 0 else -1  # -1: a duplicate, offset gone
        return RecordMetadata(self.topic, r.partition, offset, r.duplicate)

    def __iter__(self) -> Iterator[RecordMetadata]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"SentRecords(topic={self.topic!r}, records={len(self)}, batches={len(self.ranges)})"

    def _index(self) -> list[tuple[PublishedRange, int]]:
        where = self._where
        if where is None:
            slots: list[tuple[PublishedRange, int] | None] = [None] * len(self)
            for r in self.ranges:
                for pos, i in enumerate(r.indices):
                    slots[i] = (r, pos)
            where = self._where = [slot for slot in slots if slot is not None]
        return where


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a subscription.

    ``cursor`` is the first offset not yet acknowledged, ``head`` the next offset to be
    written, ``lag`` the records at or above the cursor not yet acknowledged, and
    ``in_flight`` those sent to a consumer and not yet acknowledged. ``state`` is one of
    ``CAUGHT_UP``, ``LAGGING``, ``STALLED``, ``NO_CONSUMER`` or ``BLOCKED``; ``reason`` says
    why: a fixed phrase (``no consumer``, ``window full``, ``consumer slow``, ``retry
    backoff``, ``blocked on poison``, ``dlq full``, ``dlq error``, ``read error``, ``no
    progress``), then ``": "`` and details; ``""`` when caught up.

    The broker measures the rates over a sliding window of the last 10 s of heartbeats:
    ``ingress_rate`` is records appended to the partition per second, ``ack_rate`` records
    the subscription acknowledged per second. ``drain_s`` is the seconds until the lag is
    drained at those rates (``lag / (ack_rate - ingress_rate)``), 0 when caught up, ``None``
    when acks do not outpace ingress. ``trend`` is ``growing``, ``shrinking`` or
    ``steady``: the lag's change over the window.
    """

    partition: int
    cursor: int
    head: int
    lag: int
    in_flight: int
    oldest_unacked_age_s: float
    state: str
    reason: str
    ingress_rate: float = 0.0
    ack_rate: float = 0.0
    drain_s: float | None = 0.0
    trend: str = "steady"


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    """A subscription: its type, attached consumers and per-partition lag."""

    topic: str
    subscription: str
    type: str
    consumers: tuple[str, ...]
    partitions: tuple[PartitionLag, ...]
    #: ``"at_least_once"`` (a record is consumed when acked) or ``"at_most_once"`` (when sent).
    mode: str = "at_least_once"
    #: Who commits to it by offset (e.g. ``"spark"``: a Spark query reads through it),
    #: ``""`` if nobody did. While set, a consumer attaches only with ``force=True``.
    committer: str = ""
    #: The node id of the topic's owner in a cluster; ``""`` from a single broker.
    owner: str = ""

    @property
    def lag(self) -> int:
        """Records not yet acknowledged, over every partition."""
        return sum(p.lag for p in self.partitions)


@dataclass(frozen=True, slots=True)
class OfflineTopic:
    """A topic of a cluster whose owner could not be asked for its subscriptions (or
    figures), and why.

    Attributes:
        topic: Its name.
        owner: Its owner's node id, ``""`` when it has none yet.
        reason: ``offline`` (the owner has no live session), ``creating``,
            ``no-session``, ``data-missing`` (refusal reasons, docs/protocol.md 11.2) or
            ``unreachable`` (the owner is registered but did not answer).
        message: What happened, for a person.
    """

    topic: str
    owner: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class SubscriptionListing:
    """Every subscription a listing could reach, and the topics whose owners it could
    not ask (their subscriptions are unknown, not absent)."""

    subscriptions: tuple[SubscriptionInfo, ...]
    offline: tuple[OfflineTopic, ...] = ()


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One entry of a subscription's dead-letter queue.

    Attributes:
        sequence: Its number in the queue (``ack_dead_letters`` and ``from_sequence`` take
            it).
        topic, partition, offset, subscription: Where the record came from.
        key: The original key, or ``None``.
        value: The original value, cut to the queue's ``max_event_bytes`` when
            ``truncated``.
        headers: The original headers (``x-replay-count`` included, when present); of a
            name that repeats, the last value.
        timestamp_ms: The original publish time, ms since the epoch.
        attempts: How often delivery was attempted.
        reason: Why the last delivery failed.
        attempt_times_ms: When each delivery was attempted, ms since the epoch, oldest
            first.
        dead_lettered_ms: When it entered the queue, ms since the epoch.
        truncated: Whether the value was cut (such an entry cannot be replayed).
        original_size: Length of the original value, bytes.
        replay_count: How often it was replayed from a dead-letter queue already.
        header_list: The original headers as ``(name, value)`` pairs in their order, a
            repeated name once per value (as :meth:`Message.header_list` gives them).
    """

    sequence: int
    topic: str
    partition: int
    offset: int
    subscription: str
    key: bytes | None
    value: bytes
    headers: Mapping[str, bytes]
    timestamp_ms: int
    attempts: int
    reason: str
    attempt_times_ms: tuple[int, ...]
    dead_lettered_ms: int
    truncated: bool
    original_size: int
    replay_count: int
    header_list: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SkippedDeadLetter:
    """An entry a replay did not publish (it stays in the queue), and why."""

    sequence: int
    reason: str


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What :meth:`~client.AsyncAdminClient.replay_dead_letters` did.

    ``replayed`` entries were published to their original topic and removed from the
    queue; ``skipped`` holds the entry where replay stopped, if any (it stops at the first
    entry it must skip); ``remaining`` entries are left in the queue.
    """

    replayed: int
    skipped: tuple[SkippedDeadLetter, ...]
    remaining: int
