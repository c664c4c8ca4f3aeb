"""AsyncAdminClient: topics, subscriptions and dead-letter queues, over the Admin gRPC
service.

Role: thin calls with typed results; gRPC errors become :mod:`client.errors` once, here.
Every call that names a topic goes to that topic's owner (:mod:`client._async._routing`:
a refusal is followed, to the owner at once or after a backoff and a Lookup, and the
call resent: a refused call did nothing, so this holds for every call, creating and
deleting ones too); ``create_topic``, ``list_topics`` and ``list_subscriptions`` of no
topic go to the seed in use. A call whose outcome is unknown (UNAVAILABLE) is not resent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import grpc

from client._async._routing import Link, Router
from client._connection import ConnectionOptions, ConnectionSettings
from client._types import (
    DEFAULT_BROKER,
    DeadLetterEntry,
    PartitionInfo,
    PartitionLag,
    ReplayResult,
    SkippedDeadLetter,
    SubscriptionInfo,
    TopicInfo,
)
from client.errors import AlreadyExists
from proto import admin_pb2 as _admin
from proto import broker_pb2 as _pb

R = TypeVar("R")

#: The broker's replay rate when a request names none, records per second (the client
#: sizes a replay's deadline with it).
DEFAULT_REPLAY_RATE_PER_S = 1_000


def _topic(info: _admin.TopicInfo) -> TopicInfo:
    return TopicInfo(
        info.name,
        tuple(
            PartitionInfo(p.partition, p.first_offset, p.head, p.size_bytes, p.segments)
            for p in info.partitions
        ),
        info.fsync,
        info.topic_id,
    )


def _subscription(info: _admin.SubscriptionInfo) -> SubscriptionInfo:
    name = _pb.SubscriptionType.Name(info.type).lower()
    return SubscriptionInfo(
        info.topic,
        info.subscription,
        "exclusive" if name == "subscription_type_unspecified" else name,
        tuple(info.consumers),
        tuple(
            PartitionLag(
                p.partition,
                p.cursor,
                p.head,
                p.lag,
                p.in_flight,
                p.oldest_unacked_age_s,
                p.state,
                p.reason,
                ingress_rate=p.ingress_rate,
                ack_rate=p.ack_rate,
                drain_s=p.drain_s if p.HasField("drain_s") else None,
                trend=p.trend or "steady",
            )
            for p in info.partitions
        ),
        mode="at_most_once" if info.mode == _pb.AT_MOST_ONCE else "at_least_once",
        committer=info.committer,
    )


def _dead_letter(entry: _admin.DeadLetterEntry) -> DeadLetterEntry:
    return DeadLetterEntry(
        sequence=entry.sequence,
        topic=entry.topic,
        partition=entry.partition,
        offset=entry.offset,
        subscription=entry.subscription,
        key=entry.key if entry.HasField("key") else None,
        value=entry.value,
        headers=dict(entry.headers),
        header_list=tuple((h.name, h.value) for h in entry.header_list)
        or tuple(entry.headers.items()),
        timestamp_ms=entry.timestamp_ms,
        attempts=entry.attempts,
        reason=entry.reason,
        attempt_times_ms=tuple(entry.attempt_times_ms),
        dead_lettered_ms=entry.dead_lettered_ms,
        truncated=entry.truncated,
        original_size=entry.original_size,
        replay_count=entry.replay_count,
    )


def _replay(got: _admin.ReplayDeadLettersResponse) -> ReplayResult:
    return ReplayResult(
        got.replayed,
        tuple(SkippedDeadLetter(s.sequence, s.reason) for s in got.skipped),
        got.remaining,
    )


class AsyncAdminClient:
    """Topic, subscription and dead-letter queue administration. Task-safe; an async
    context manager.

    Args:
        broker: ``host:port`` of the broker, or seed brokers: ``"h1:p1,h2:p2"`` or a
            sequence of addresses (each topic's calls go to its owner).
        channel: An existing channel to use for the first seed (not closed by this
            client).
        timeout_s: Deadline of each call, seconds. Default 10.
        **connection: The connection keywords, the same for every client class
            (:class:`~client.ConnectionOptions`): ``reconnect_backoff_max_s``,
            ``token``, ``tls_ca``, ``tls_cert`` and ``tls_key``. Unused with ``channel``
            (that channel's own settings apply); a bad one raises ``ValueError`` here.
    """

    def __init__(
        self,
        broker: str | Sequence[str] = DEFAULT_BROKER,
        *,
        channel: grpc.aio.Channel | None = None,
        timeout_s: float = 10.0,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        #: Where the brokers are and how to reach them (``channel`` is the first seed's).
        self.connection = ConnectionSettings.of("AsyncAdminClient", broker, connection)
        self.router = Router(self.connection, channel)
        self._timeout = timeout_s

    async def _call(
        self,
        rpc: Callable[[Link], Callable[..., Awaitable[Any]]],
        request: Any,
        topic: str | None,
        timeout_s: float | None = None,
    ) -> Any:
        return await self.router.call(
            topic or None,
            lambda link, timeout: rpc(link)(request, timeout=timeout),
            timeout_s=timeout_s or self._timeout,
            what=type(request).__name__,
            retry=False,
        )

    async def create_topic(
        self, name: str, partitions: int = 1, *, exist_ok: bool = False
    ) -> TopicInfo:
        """Create a topic.

        Args:
            name: The topic's name.
            partitions: How many partitions it has.
            exist_ok: When the topic exists already with ``partitions`` partitions, return
                it instead of raising, so that a program that creates what it needs can
                run twice.

        Raises:
            AlreadyExists: The topic exists (with ``exist_ok``: with another partition
                count; the message names both counts).
            InvalidArgument: A bad name or partition count.
        """
        request = _admin.CreateTopicRequest(name=name, partitions=partitions)
        try:
            return _topic(await self._call(lambda link: link.admin.CreateTopic, request, None))
        except AlreadyExists as exc:
            if not exist_ok:
                raise
            found = await self.describe_topic(name)
            if len(found.partitions) != partitions:
                raise AlreadyExists(
                    f"topic {name!r} exists with {len(found.partitions)} partitions, not the "
                    f"{partitions} asked for; use it as it is, or delete it first",
                    exc.code,
                ) from exc
            return found

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic, by name."""
        got = await self._call(lambda link: link.admin.ListTopics, _admin.ListTopicsRequest(), None)
        return [_topic(t) for t in got.topics]

    async def describe_topic(self, name: str) -> TopicInfo:
        """One topic. Raises ``NotFound``."""
        request = _admin.DescribeTopicRequest(name=name)
        return _topic(await self._call(lambda link: link.admin.DescribeTopic, request, name))

    async def delete_topic(self, name: str) -> None:
        """Delete a topic, its data and its subscriptions. Raises ``NotFound``."""
        request = _admin.DeleteTopicRequest(name=name)
        await self._call(lambda link: link.admin.DeleteTopic, request, name)

    async def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionInfo]:
        """Every subscription (of ``topic``, when given) with its lag."""
        request = _admin.ListSubscriptionsRequest(topic=topic or "")
        got = await self._call(lambda link: link.admin.ListSubscriptions, request, topic)
        return [_subscription(s) for s in got.subscriptions]

    async def describe_subscription(self, topic: str, subscription: str) -> SubscriptionInfo:
        """One subscription's cursors, heads, lag and consumers. Raises ``NotFound``."""
        request = _admin.DescribeSubscriptionRequest(topic=topic, subscription=subscription)
        got = await self._call(lambda link: link.admin.DescribeSubscription, request, topic)
        return _subscription(got)

    async def seek(
        self,
        topic: str,
        subscription: str,
        *,
        earliest: bool = False,
        latest: bool = False,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        offsets: Mapping[int, int] | None = None,
    ) -> SubscriptionInfo:
        """Move a subscription's cursors to the earliest or latest retained offsets, to one
        offset on every partition, to the first record at or after a time (ms since
        the epoch), or to one offset per partition (``offsets``: partition -> offset;
        partitions not named keep their cursors). Offsets are clamped to what the log
        holds. Give exactly one target."""
        given = [
            earliest,
            latest,
            offset is not None,
            timestamp_ms is not None,
            offsets is not None,
        ]
        if sum(given) != 1:
            raise ValueError(
                "give exactly one of earliest, latest, offset, timestamp_ms or offsets"
            )
        request = _admin.SeekRequest(topic=topic, subscription=subscription)
        if earliest:
            request.earliest = True
        elif latest:
            request.latest = True
        elif offset is not None:
            request.offset = offset
        elif offsets is not None:
            request.partition_offsets.offsets.extend(
                _pb.PartitionOffset(partition=p, offset=o) for p, o in sorted(offsets.items())
            )
        else:
            request.timestamp_ms = timestamp_ms or 0
        return _subscription(await self._call(lambda link: link.admin.Seek, request, topic))

    async def offsets_for_time(self, topic: str, timestamp_ms: int) -> list[int]:
        """Per partition, in partition order, the first offset whose record time is at or
        after ``timestamp_ms`` (ms since the epoch), or the head where every record is
        older. Moves nothing. Raises ``NotFound`` or ``InvalidArgument``."""
        request = _admin.OffsetsForTimeRequest(topic=topic, timestamp_ms=timestamp_ms)
        got = await self._call(lambda link: link.admin.OffsetsForTime, request, topic)
        return [p.offset for p in sorted(got.offsets, key=lambda p: p.partition)]

    async def peek_dead_letters(
        self,
        topic: str,
        subscription: str,
        *,
        from_sequence: int | None = None,
        limit: int = 100,
        reason: str | None = None,
    ) -> list[DeadLetterEntry]:
        """Entries of a subscription's dead-letter queue, oldest first; removes nothing.

        Args:
            topic: The subscription's topic.
            subscription: The subscription's name.
            from_sequence: Start at this sequence; default the oldest entry.
            limit: Most entries returned, from 1 to 10 000. A big response may hold fewer
                (the broker caps it at about 8 MiB): page from the last sequence + 1.
            reason: Only entries whose failure reason contains this text.

        Raises:
            NotFound: No such subscription.
            InvalidArgument: A bad ``limit`` or ``from_sequence``.
        """
        request = _admin.PeekDeadLettersRequest(
            topic=topic, subscription=subscription, limit=limit, reason=reason or ""
        )
        if from_sequence is not None:
            request.from_sequence = from_sequence
        got = await self._call(lambda link: link.admin.PeekDeadLetters, request, topic)
        return [_dead_letter(e) for e in got.entries]

    async def count_dead_letters(self, topic: str, subscription: str) -> int:
        """How many entries a subscription's dead-letter queue holds. Raises ``NotFound``."""
        request = _admin.CountDeadLettersRequest(topic=topic, subscription=subscription)
        got = await self._call(lambda link: link.admin.CountDeadLetters, request, topic)
        return int(got.count)

    async def ack_dead_letters(self, topic: str, subscription: str, up_to_sequence: int) -> int:
        """Remove every entry with a sequence at or below ``up_to_sequence`` (inclusive);
        return how many. Raises ``NotFound`` or ``InvalidArgument`` (a negative sequence)."""
        request = _admin.AckDeadLettersRequest(
            topic=topic, subscription=subscription, up_to_sequence=up_to_sequence
        )
        got = await self._call(lambda link: link.admin.AckDeadLetters, request, topic)
        return int(got.acked)

    async def purge_dead_letters(self, topic: str, subscription: str) -> int:
        """Remove every entry; return how many. Raises ``NotFound``."""
        request = _admin.PurgeDeadLettersRequest(topic=topic, subscription=subscription)
        got = await self._call(lambda link: link.admin.PurgeDeadLetters, request, topic)
        return int(got.purged)

    async def replay_dead_letters(
        self,
        topic: str,
        subscription: str,
        *,
        limit: int | None = None,
        up_to_sequence: int | None = None,
        rate_per_s: int | None = None,
        timeout_s: float | None = None,
    ) -> ReplayResult:
        """Publish entries back to their original topic and partition, oldest first, and
        remove them from the queue once that is durable.

        Replay stops at the first entry it must skip (replayed ``max_replays`` times
        already, or truncated); that entry stays in the queue, with every one after it,
        and is reported in :attr:`ReplayResult.skipped`. At least once: a replay cut short
        may publish its last batch again next time.

        Args:
            topic: The subscription's topic.
            subscription: The subscription's name.
            limit: Most entries replayed; default every entry.
            up_to_sequence: Only entries at or below this sequence; default no bound.
            rate_per_s: Most records published per second, 1 to 100 000; default the
                broker's (1000).
            timeout_s: Deadline of the call, seconds; default the client's timeout plus
                the time the rate needs for ``limit`` entries (or for the queue's current
                count, asked for first).

        Raises:
            NotFound: No such subscription.
            InvalidArgument: A bad limit, sequence or rate.
            FailedPrecondition: An entry's original topic or partition is gone, or another
                replay of the queue is running.
        """
        request = _admin.ReplayDeadLettersRequest(
            topic=topic, subscription=subscription, rate_per_s=rate_per_s or 0
        )
        if limit is not None:
            request.limit = limit
        if up_to_sequence is not None:
            request.up_to_sequence = up_to_sequence
        if timeout_s is None:
            expected = (
                limit if limit is not None else await self.count_dead_letters(topic, subscription)
            )
            rate = max(rate_per_s or DEFAULT_REPLAY_RATE_PER_S, 1)
            timeout_s = self._timeout + max(expected, 0) / rate
        got = await self._call(lambda link: link.admin.ReplayDeadLetters, request, topic, timeout_s)
        return _replay(got)

    async def delete_subscription(
        self, topic: str, subscription: str, force: bool = False
    ) -> list[str]:
        """Delete a subscription: its cursors, delivery-attempt counts and dead-letter
        queue. A consumer that subscribes with the name later starts a new subscription at
        its initial position. Returns the names of the consumers ``force`` detached (their
        streams end with ``NotFound``).

        Raises:
            FailedPrecondition: consumers are attached and ``force`` is off (nothing was
                changed; the message names them). NotFound: no such topic or subscription.
            InvalidArgument: a bad name.
        """
        request = _admin.DeleteSubscriptionRequest(
            topic=topic, subscription=subscription, force=force
        )
        got = await self._call(lambda link: link.admin.DeleteSubscription, request, topic)
        return list(got.detached_consumers)

    async def close(self) -> None:
        """The same as :meth:`aclose`: the sync twin's name for it."""
        await self.aclose()

    async def aclose(self) -> None:
        """Close the channels this client opened."""
        await self.router.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
