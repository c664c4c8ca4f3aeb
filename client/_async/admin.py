"""AsyncAdminClient: topics, subscriptions and dead-letter queues, over the Admin gRPC
service.

Role: thin calls with typed results; gRPC errors become :mod:`client.errors` once, here.
Every call that names a topic goes to that topic's owner (:mod:`client._async._routing`:
a refusal is followed, to the owner at once or after a backoff and a Lookup, and the
call resent: a refused call did nothing, so this holds for every call, creating and
deleting ones too); ``create_topic`` goes to the seed in use. A call whose outcome is
unknown (UNAVAILABLE) is not resent.

``list_topics`` and ``list_subscriptions`` of no topic show the whole cluster, whichever
seed they reach (:mod:`client._survey`): the seed's answer says whether it is a cluster
member; a single broker's answer is the whole answer (one call, no Lookup); in a cluster
one Lookup finds every topic's owner, each other owner is asked at once for its own
topics, and a topic whose owner cannot be asked is reported as such, not left out
silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import grpc

from client._async._routing import Link, Router
from client._connection import ConnectionOptions, ConnectionSettings
from client._survey import UNREACHABLE, Owner, Plan, is_cluster, offline_topic, plan, unread_topic
from client._types import (
    DEFAULT_BROKER,
    DeadLetterEntry,
    FollowerInfo,
    LogFollowerInfo,
    PartitionInfo,
    PartitionLag,
    ReplayResult,
    SkippedDeadLetter,
    SubscriptionInfo,
    SubscriptionListing,
    TopicInfo,
)
from client.errors import AlreadyExists, ClientError, from_rpc_error
from proto import admin_pb2 as _admin
from proto import broker_pb2 as _pb

R = TypeVar("R")

#: The broker's replay rate when a request names none, records per second (the client
#: sizes a replay's deadline with it).
DEFAULT_REPLAY_RATE_PER_S = 1_000


def _topic(info: _admin.TopicInfo, owner: str = "") -> TopicInfo:
    return TopicInfo(
        info.name,
        tuple(
            PartitionInfo(
                p.partition,
                p.first_offset,
                p.head,
                p.size_bytes,
                p.segments,
                tuple(
                    FollowerInfo(f.node, f.fetch_offset, f.lag_records, f.lag_s, f.in_sync)
                    for f in p.followers
                ),
            )
            for p in info.partitions
        ),
        info.fsync,
        info.topic_id,
        owner=owner,
        leader=info.leader,
        epoch=info.epoch,
        replicas=tuple(info.replicas),
        isr=tuple(info.isr),
        min_insync_replicas=info.min_insync_replicas,
        log_followers=tuple(
            LogFollowerInfo(f.log, f.node, f.lag_records, f.lag_s, f.in_sync)
            for f in info.log_followers
        ),
    )


def _subscription(info: _admin.SubscriptionInfo, owner: str = "") -> SubscriptionInfo:
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
        owner=owner,
    )


def _list_topics(link: Link) -> Any:
    return link.admin.ListTopics


def _list_subscriptions(link: Link) -> Any:
    return link.admin.ListSubscriptions


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
        self,
        name: str,
        partitions: int | None = None,
        *,
        exist_ok: bool = False,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
    ) -> TopicInfo:
        """Create a topic.

        Args:
            name: The topic's name.
            partitions: How many partitions it has. Default (``None``, sent as 0): the
                broker's ``default_partitions``, the cluster's in cluster mode.
            exist_ok: When the topic exists already with ``partitions`` partitions (any
                count when ``partitions`` is ``None``), return it instead of raising, so
                that a program that creates what it needs can run twice. Its replication
                is not compared.
            replication_factor: Copies of the topic, each on another broker of a cluster.
                Default (``None``, sent as 0): the cluster's ``replication_factor``
                default (3 unless ``headrace cluster config`` sets it), clamped to the
                live brokers; a single broker takes 1 only.
            min_insync_replicas: In-sync replicas a publish needs. Default (``None``,
                sent as 0): the cluster's default (2 unless ``headrace cluster config``
                sets it), clamped to the factor.

        Raises:
            AlreadyExists: The topic exists (with ``exist_ok``: with another partition
                count; the message names both counts).
            InvalidArgument: A bad name or partition count; a factor above 1 on a single
                broker; ``min_insync_replicas`` above the factor.
            FailedPrecondition: A factor above the cluster's live brokers (the message
                names both numbers).
        """
        request = _admin.CreateTopicRequest(
            name=name,
            partitions=partitions or 0,
            replication_factor=replication_factor or 0,
            min_insync_replicas=min_insync_replicas or 0,
        )
        try:
            return _topic(await self._call(lambda link: link.admin.CreateTopic, request, None))
        except AlreadyExists as exc:
            if not exist_ok:
                raise
            found = await self.describe_topic(name)
            if partitions is not None and len(found.partitions) != partitions:
                raise AlreadyExists(
                    f"topic {name!r} exists with {len(found.partitions)} partitions, not the "
                    f"{partitions} asked for; use it as it is, or delete it first",
                    exc.code,
                ) from exc
            return found

    async def _survey(
        self, rpc: Callable[[Link], Callable[..., Awaitable[Any]]], request: Any
    ) -> tuple[Any, Plan | None, list[tuple[Owner, Any]]]:
        """A listing of the whole cluster (:mod:`client._survey`): the seed's answer; in a
        cluster also the plan and, per other owner, its answer or its error."""
        home = await self._call(rpc, request, None)
        if not is_cluster(home.node_id):
            return home, None, []  # a single broker: one call, as ever
        _asked, found = await self.router.lookup_response([], timeout_s=self._timeout)
        layout = plan(home.node_id, found)

        async def ask(owner: Owner) -> Any:
            try:
                return await rpc(self.router.link(owner.address))(request, timeout=self._timeout)
            except grpc.RpcError as exc:
                return from_rpc_error(exc)

        answers = await asyncio.gather(*(ask(o) for o in layout.owners))
        return home, layout, list(zip(layout.owners, answers, strict=True))

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic, by name. In a cluster, every broker's topics, each with its
        owner's figures (``owner`` set); a topic whose owner cannot be asked now is
        listed with its partitions, zero figures and ``offline`` saying why.

        Raises:
            ClientError: No seed broker answered.
        """
        home, layout, answers = await self._survey(_list_topics, _admin.ListTopicsRequest())
        if layout is None:
            return [_topic(t) for t in home.topics]
        ids = {t.name: t.topic_id for t in home.topics}
        found = {t.name: _topic(t, layout.node) for t in home.topics if t.name in layout.mine}
        gone = list(layout.offline)
        for owner, answer in answers:
            if isinstance(answer, ClientError):
                gone += [
                    offline_topic(t, owner.node, UNREACHABLE, str(answer)) for t in owner.topics
                ]
                continue
            # the owner's answer is authoritative: a topic it does not list is gone
            found |= {
                t.name: _topic(t, owner.node) for t in answer.topics if t.name in owner.topics
            }
        for g in gone:
            found[g.topic] = unread_topic(
                g.topic, layout.partitions.get(g.topic, 0), ids.get(g.topic, ""), g
            )
        return [found[name] for name in sorted(found)]

    async def describe_topic(self, name: str) -> TopicInfo:
        """One topic. Raises ``NotFound``."""
        request = _admin.DescribeTopicRequest(name=name)
        return _topic(await self._call(lambda link: link.admin.DescribeTopic, request, name))

    async def delete_topic(self, name: str) -> None:
        """Delete a topic, its data and its subscriptions. Raises ``NotFound``."""
        request = _admin.DeleteTopicRequest(name=name)
        await self._call(lambda link: link.admin.DeleteTopic, request, name)

    async def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionInfo]:
        """Every subscription (of ``topic``, when given) with its lag: in a cluster, of
        every broker's topics. Topics whose owner cannot be asked now are left out:
        :meth:`subscription_listing` names them.

        Raises:
            ClientError: No seed broker answered (or, with ``topic``, its owner).
        """
        return list((await self.subscription_listing(topic)).subscriptions)

    async def subscription_listing(self, topic: str | None = None) -> SubscriptionListing:
        """Every subscription (of ``topic``, when given) with its lag, by topic and name,
        and, in a cluster, the topics whose owner could not be asked (their
        subscriptions are unknown). With ``topic`` the call goes to its owner.

        Raises:
            ClientError: No seed broker answered (or, with ``topic``, its owner).
        """
        request = _admin.ListSubscriptionsRequest(topic=topic or "")
        if topic:
            got = await self._call(lambda link: link.admin.ListSubscriptions, request, topic)
            owner = got.node_id if is_cluster(got.node_id) else ""
            return SubscriptionListing(tuple(_subscription(s, owner) for s in got.subscriptions))
        home, layout, answers = await self._survey(_list_subscriptions, request)
        if layout is None:
            return SubscriptionListing(tuple(_subscription(s) for s in home.subscriptions))
        found = [
            _subscription(s, layout.node) for s in home.subscriptions if s.topic in layout.mine
        ]
        gone = list(layout.offline)
        for owner, answer in answers:
            if isinstance(answer, ClientError):
                gone += [
                    offline_topic(t, owner.node, UNREACHABLE, str(answer)) for t in owner.topics
                ]
                continue
            found += [
                _subscription(s, owner.node)
                for s in answer.subscriptions
                if s.topic in owner.topics
            ]
        found.sort(key=lambda s: (s.topic, s.subscription))
        return SubscriptionListing(tuple(found), tuple(sorted(gone, key=lambda g: g.topic)))

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
