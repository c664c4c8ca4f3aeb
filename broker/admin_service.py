"""The admin-plane servicer: topics, subscriptions and dead-letter queues.

Role: thin, like :mod:`broker.service`: pb -> registry -> pb, errors through
:mod:`broker.error_status`. Dead-letter calls name a subscription, which must exist (else
NOT_FOUND); a subscription whose queue was never created answers as an empty queue, and
these calls never create one. Replay itself lives in :mod:`broker.replay`. Every call
that names a topic asks :class:`~broker.topic_guard.TopicGuard` first (cluster mode: a
call this broker may not serve ends ``ABORTED`` naming the owner, nothing done);
CreateTopic and ListTopics name none.

Cluster mode (a :class:`~broker.cluster_node.ClusterNode` given): CreateTopic validates as
a single broker does, then takes the name cluster-wide and waits until the owner made the
topic (placed on any broker); DeleteTopic runs on the owner only (the guard refuses the
others) and deletes cluster-wide; ListTopics shows every topic of the cluster. Every
``TopicInfo`` carries the topic's replication (leader, epoch, replicas, isr, min_insync)
from the cluster's record; a single broker's are ``local`` at epoch 0. For a topic
owned by another broker it gives what etcd holds, ``name``, ``topic_id`` and one
``PartitionInfo`` per partition with only ``partition`` set: the heads, sizes, segment
counts and ``fsync`` are the owner's only (DescribeTopic there, which a client reaches
through the refusal). ListTopics and ListSubscriptions carry this broker's node id
(``local`` alone): a client that sees another asks each owner for its own topics
(docs/protocol.md 11.5).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

import grpc

from broker.cluster_service import LOCAL_NODE
from broker.convert import (
    ack_sequence,
    partition_info,
    partition_seek_offsets,
    peek_arguments,
    peek_response,
    replay_order,
    replay_response,
    subscription_info,
)
from broker.error_status import Context, rpc
from broker.errors import InvalidRequestError, TopicNotFoundError
from broker.ingest import Append
from broker.replay import DeadLetterReplayer, ReplayOutcome
from broker.rpc_handlers import add_service
from broker.topic_guard import TopicGuard
from broker.topics import Topic, TopicRegistry, check_topic_name
from dispatcher import SubscriptionRegistry, check_subscription_name
from dispatcher.dead_letter_queue import DeadLetterQueue
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _grpc
from proto import broker_pb2 as _pb
from wal import LogWriter

if TYPE_CHECKING:  # imported by cluster mode only: a single broker never loads etcd
    from broker.cluster_node import ClusterNode
    from cluster.records import TopicRecord

_SCAN_BYTES = 1 << 20  # read size of a seek by time, between yields to the loop


def _record_info(record: TopicRecord) -> _admin.TopicInfo:
    """What etcd holds of a topic another broker owns (see the module docstring)."""
    info = _admin.TopicInfo(
        name=record.name,
        partitions=[_admin.PartitionInfo(partition=i) for i in range(record.partitions)],
        topic_id=record.id,
    )
    return _with_replication(info, record)


def _topic_info(topic: Topic, record: TopicRecord | None = None) -> _admin.TopicInfo:
    """A topic held here; its replication from ``record`` (cluster mode), else this
    single broker's: leader and only replica ``local`` at epoch 0."""
    info = _admin.TopicInfo(
        name=topic.name,
        partitions=[partition_info(p.index, p.log) for p in topic.partitions],
        fsync=topic.partitions[0].log.config.fsync.value if topic.partitions else "",
        topic_id=topic.topic_id,
    )
    if record is not None:
        return _with_replication(info, record)
    info.leader, info.min_insync_replicas = LOCAL_NODE, 1
    info.replicas.append(LOCAL_NODE)
    info.isr.append(LOCAL_NODE)
    return info


def _with_replication(info: _admin.TopicInfo, record: TopicRecord) -> _admin.TopicInfo:
    """``info`` with the record's leader, epoch, replica set, in-sync set and min_insync."""
    info.leader, info.epoch, info.min_insync_replicas = (
        record.owner,
        record.epoch,
        record.min_insync,
    )
    info.replicas.extend(record.effective_replicas())
    info.isr.extend(record.effective_isr())
    return info


def _check_single_broker_replication(request: _admin.CreateTopicRequest) -> None:
    """A single broker keeps one copy: factor 0 or 1, min_insync 0 or 1.

    Raises:
        InvalidRequestError: anything else, naming the field.
    """
    factor, min_insync = request.replication_factor, request.min_insync_replicas
    if factor < 0 or factor > 1:
        raise InvalidRequestError(
            "replication_factor",
            f"{factor} needs a cluster: a single broker keeps one copy of each topic (0 or "
            "1); start brokers with --cluster-etcd for replicated topics",
        )
    if min_insync < 0 or min_insync > 1:
        raise InvalidRequestError(
            "min_insync_replicas",
            f"{min_insync} exceeds the replication factor 1 of a single broker (0 or 1)",
        )


class AdminService(_grpc.AdminServicer):
    """Topic and subscription administration. Task-safe."""

    def __init__(
        self,
        topics: TopicRegistry,
        subscriptions: SubscriptionRegistry,
        append: Append,
        guard: TopicGuard | None = None,
        *,
        cluster: ClusterNode | None = None,
        node_id: str = LOCAL_NODE,
        default_partitions: int = 1,
    ) -> None:
        #: Cluster mode: topic creation, deletion and listing are cluster-wide.
        self._cluster = cluster
        #: Answered by ListTopics and ListSubscriptions: a client that sees another id
        #: than ``local`` asks each topic's owner (docs/protocol.md, section 11.5).
        self.node_id = cluster.member.node_id if cluster is not None else node_id
        #: Asked first by every call that names a topic (cluster mode; see topic_guard).
        self._guard = guard or TopicGuard()
        self._topics = topics
        self._subscriptions = subscriptions
        self._replayer = DeadLetterReplayer(topics, append)
        #: CreateTopic with 0 partitions: this many (a single broker's ``default_partitions``;
        #: in cluster mode the cluster's, see ``ClusterNode.create_topic``).
        self._default_partitions = default_partitions

    @rpc
    async def CreateTopic(  # noqa: N802 - gRPC method name
        self,
        request: _admin.CreateTopicRequest,
        context: Context,
    ) -> _admin.TopicInfo:
        """Create a topic; ALREADY_EXISTS if the name is taken. ``partitions`` 0: the
        default (the cluster's ``default_partitions`` in cluster mode, else this broker's);
        below 0: INVALID_ARGUMENT. ``replication_factor`` and ``min_insync_replicas`` 0:
        the defaults; a single broker takes 1 only (above: INVALID_ARGUMENT, a cluster is
        needed); a cluster's errors are :meth:`ClusterNode.create_topic`'s."""
        check_topic_name(request.name, field="name")
        if self._cluster is None:
            _check_single_broker_replication(request)
            partitions = request.partitions or self._default_partitions
            return _topic_info(await self._topics.create(request.name, partitions))
        timeout_s = self._cluster.wait_s(context.time_remaining())
        record = await self._cluster.create_topic(
            request.name,
            request.partitions,
            timeout_s,
            replication_factor=request.replication_factor,
            min_insync_replicas=request.min_insync_replicas,
        )
        return self._info(record)

    def _info(self, record: TopicRecord) -> _admin.TopicInfo:
        """The full facts of a topic this broker owns (leads), else what etcd holds of it:
        a follower's copy has figures of its own, which are not the topic's."""
        try:
            topic = self._topics.get(record.name)
        except TopicNotFoundError:
            return _record_info(record)
        if topic.topic_id != record.id or record.owner != self.node_id:
            return _record_info(record)
        return _topic_info(topic, record)

    @rpc
    async def ListTopics(  # noqa: N802 - gRPC method name
        self,
        request: _admin.ListTopicsRequest,
        context: Context,
    ) -> _admin.ListTopicsResponse:
        """Every topic with its partitions (of the whole cluster in cluster mode)."""
        if self._cluster is not None:
            return _admin.ListTopicsResponse(
                topics=[self._info(r) for r in self._cluster.records()], node_id=self.node_id
            )
        topics = [_topic_info(self._topics.get(n)) for n in self._topics.names()]
        return _admin.ListTopicsResponse(topics=topics, node_id=self.node_id)

    @rpc
    async def DescribeTopic(  # noqa: N802 - gRPC method name
        self,
        request: _admin.DescribeTopicRequest,
        context: Context,
    ) -> _admin.TopicInfo:
        """One topic's partitions (heads, sizes, segments) and its replication (in
        cluster mode as this broker's view of etcd holds it; on a replicated topic's
        leader, each follower's lag per partition and in its state and dead-letter
        logs)."""
        self._guard.check(request.name, write=False)
        check_topic_name(request.name, field="name")
        topic = self._topics.get(request.name)
        if self._cluster is None:
            return _topic_info(topic)
        held = self._cluster.member.view.state.topics.get(request.name)
        info = _topic_info(topic, held.record if held is not None else None)
        leader = self._cluster.replica_leader(request.name)
        if leader is not None:  # the leader alone knows its followers' progress
            for lag in leader.follower_lag():
                info.partitions[lag.partition].followers.append(
                    _admin.FollowerInfo(
                        node=lag.node,
                        fetch_offset=lag.fetch_offset,
                        lag_records=lag.lag_records,
                        lag_s=lag.lag_s,
                        in_sync=lag.in_sync,
                    )
                )
            info.log_followers.extend(
                _admin.LogFollowerInfo(
                    log=lag.kind,
                    node=lag.node,
                    lag_records=lag.lag_records,
                    lag_s=lag.lag_s,
                    in_sync=lag.in_sync,
                )
                for lag in leader.log_lag()
            )
        return info

    @rpc
    async def DeleteTopic(  # noqa: N802 - gRPC method name
        self,
        request: _admin.DeleteTopicRequest,
        context: Context,
    ) -> _admin.DeleteTopicResponse:
        """Delete a topic, its data and its subscriptions. Once begun it runs to its end,
        even past the call's deadline (see :meth:`TopicRegistry.delete`)."""
        self._guard.check(request.name, write=True)
        name = request.name
        check_topic_name(name, field="name")
        if self._cluster is not None and self._cluster.knows(name):
            timeout = self._cluster.wait_s(context.time_remaining())
            await self._cluster.delete_topic(name, timeout)
            return _admin.DeleteTopicResponse()
        await self._topics.delete(
            name, before_close=functools.partial(self._subscriptions.drop_topic, name)
        )
        return _admin.DeleteTopicResponse()

    @rpc
    async def ListSubscriptions(  # noqa: N802 - gRPC method name
        self,
        request: _admin.ListSubscriptionsRequest,
        context: Context,
    ) -> _admin.ListSubscriptionsResponse:
        """Every subscription (of one topic, when given) with its cursors and lag."""
        if request.topic:
            self._guard.check(request.topic, write=False)
            self._topics.get(request.topic)
        subs = self._subscriptions.subscriptions(request.topic or None)
        return _admin.ListSubscriptionsResponse(
            subscriptions=[subscription_info(await s.status()) for s in subs], node_id=self.node_id
        )

    @rpc
    async def DescribeSubscription(  # noqa: N802 - gRPC method name
        self,
        request: _admin.DescribeSubscriptionRequest,
        context: Context,
    ) -> _admin.SubscriptionInfo:
        """One subscription's cursors, heads, lag and consumers."""
        self._guard.check(request.topic, write=False)
        self._topics.get(request.topic)
        return subscription_info(
            await self._subscriptions.get(request.topic, request.subscription).status()
        )

    @rpc
    async def Seek(  # noqa: N802 - gRPC method name
        self,
        request: _admin.SeekRequest,
        context: Context,
    ) -> _admin.SubscriptionInfo:
        """Move a subscription's cursors; saved before the answer."""
        self._guard.check(request.topic, write=True)
        topic = self._topics.get(request.topic)
        sub = self._subscriptions.get(request.topic, request.subscription)
        writers = [p.writer for p in topic.partitions]
        target = request.WhichOneof("target")
        if target in ("earliest", "latest") and not getattr(request, target):
            raise InvalidRequestError(
                target, f"set it to true to seek to the {target} offsets, or set another target"
            )
        if target == "earliest":
            offsets = [w.first_offset for w in writers]
        elif target == "latest":
            offsets = [w.high_water_mark for w in writers]
        elif target == "offset":
            if request.offset < 0:
                raise InvalidRequestError("offset", f"must be >= 0, got {request.offset}")
            offsets = [request.offset] * len(writers)
        elif target == "timestamp_ms":
            _check_timestamp(request.timestamp_ms)
            offsets = [await offset_for_time(w, request.timestamp_ms) for w in writers]
        elif target == "partition_offsets":
            cursors = [p.cursor for p in (await sub.status()).partitions]
            offsets = partition_seek_offsets(request.partition_offsets, cursors)
        else:
            raise InvalidRequestError("target", "say where to: earliest, latest, offset or time")
        await sub.seek(offsets)
        await self._subscriptions.save(sub)
        return subscription_info(await sub.status())

    @rpc
    async def OffsetsForTime(  # noqa: N802 - gRPC method name
        self,
        request: _admin.OffsetsForTimeRequest,
        context: Context,
    ) -> _admin.OffsetsForTimeResponse:
        """The first offset at or after a time on every partition; moves nothing."""
        self._guard.check(request.topic, write=False)
        _check_timestamp(request.timestamp_ms)
        topic = self._topics.get(request.topic)
        offsets = [
            _pb.PartitionOffset(
                partition=p.index, offset=await offset_for_time(p.writer, request.timestamp_ms)
            )
            for p in topic.partitions
        ]
        return _admin.OffsetsForTimeResponse(offsets=offsets)

    # -- dead-letter queues -------------------------------------------------------------

    async def _dead_letters(self, topic: str, subscription: str) -> DeadLetterQueue | None:
        """The subscription's queue; ``None`` if it never had one. Raises
        ``InvalidRequestError`` for an invalid topic name, ``TopicNotFoundError`` and
        ``SubscriptionNotFoundError`` for unknown ones."""
        self._topics.get(topic)
        self._subscriptions.get(topic, subscription)
        return await self._subscriptions.dead_letter_queue(topic, subscription, create=False)

    @rpc
    async def PeekDeadLetters(  # noqa: N802 - gRPC method name
        self,
        request: _admin.PeekDeadLettersRequest,
        context: Context,
    ) -> _admin.PeekDeadLettersResponse:
        """Entries of a subscription's dead-letter queue, oldest first; removes nothing."""
        self._guard.check(request.topic, write=False)
        start, limit, reason = peek_arguments(request)
        dlq = await self._dead_letters(request.topic, request.subscription)
        if dlq is None:
            return _admin.PeekDeadLettersResponse()
        return peek_response(await dlq.peek(from_sequence=start, limit=limit, reason=reason))

    @rpc
    async def CountDeadLetters(  # noqa: N802 - gRPC method name
        self,
        request: _admin.CountDeadLettersRequest,
        context: Context,
    ) -> _admin.CountDeadLettersResponse:
        """How many entries a subscription's dead-letter queue holds."""
        self._guard.check(request.topic, write=False)
        dlq = await self._dead_letters(request.topic, request.subscription)
        return _admin.CountDeadLettersResponse(count=dlq.count() if dlq else 0)

    @rpc
    async def AckDeadLetters(  # noqa: N802 - gRPC method name
        self,
        request: _admin.AckDeadLettersRequest,
        context: Context,
    ) -> _admin.AckDeadLettersResponse:
        """Remove the entries at or below a sequence; saved before the answer."""
        self._guard.check(request.topic, write=True)
        up_to = ack_sequence(request)
        dlq = await self._dead_letters(request.topic, request.subscription)
        return _admin.AckDeadLettersResponse(acked=await dlq.ack_up_to(up_to) if dlq else 0)

    @rpc
    async def PurgeDeadLetters(  # noqa: N802 - gRPC method name
        self,
        request: _admin.PurgeDeadLettersRequest,
        context: Context,
    ) -> _admin.PurgeDeadLettersResponse:
        """Remove every entry; saved before the answer."""
        self._guard.check(request.topic, write=True)
        dlq = await self._dead_letters(request.topic, request.subscription)
        return _admin.PurgeDeadLettersResponse(purged=await dlq.purge() if dlq else 0)

    @rpc
    async def ReplayDeadLetters(  # noqa: N802 - gRPC method name
        self,
        request: _admin.ReplayDeadLettersRequest,
        context: Context,
    ) -> _admin.ReplayDeadLettersResponse:
        """Publish entries back to their original topic, rate limited; see the proto."""
        self._guard.check(request.topic, write=True)
        order = replay_order(request)
        dlq = await self._dead_letters(request.topic, request.subscription)
        if dlq is None:
            return replay_response(ReplayOutcome(0, (), 0))
        outcome = await self._replayer.replay(dlq, request.topic, request.subscription, order)
        return replay_response(outcome)

    @rpc
    async def DeleteSubscription(  # noqa: N802 - gRPC method name
        self,
        request: _admin.DeleteSubscriptionRequest,
        context: Context,
    ) -> _admin.DeleteSubscriptionResponse:
        """Delete a subscription's state and dead-letter queue; FAILED_PRECONDITION while
        consumers are attached unless ``force``. Once begun it runs to its end, even past
        the call's deadline (see :meth:`SubscriptionRegistry.delete`)."""
        self._guard.check(request.topic, write=True)
        check_topic_name(request.topic)
        check_subscription_name(request.subscription)
        self._topics.get(request.topic)
        detached = await self._subscriptions.delete(
            request.topic, request.subscription, force=request.force
        )
        return _admin.DeleteSubscriptionResponse(detached_consumers=detached)


def _check_timestamp(timestamp_ms: int) -> None:
    if timestamp_ms < 0:
        raise InvalidRequestError(
            "timestamp_ms", f"must be >= 0 (ms since the epoch), got {timestamp_ms}"
        )


def add_to_server(
    servicer: AdminService, server: grpc.aio.Server, *, max_request_bytes: int | None = None
) -> None:
    """Register the Admin service: every RPC of its descriptor, requests parsed by
    :mod:`broker.rpc_handlers` (a request that does not parse gets INVALID_ARGUMENT, one
    over ``max_request_bytes`` RESOURCE_EXHAUSTED)."""
    add_service(
        server,
        _admin.DESCRIPTOR.services_by_name["Admin"],
        servicer,
        max_request_bytes=max_request_bytes,
    )


async def offset_for_time(writer: LogWriter, timestamp_ms: int) -> int:
    """The first offset whose record time is at or after ``timestamp_ms`` (the head if none).

    Reads batch headers and skips every batch whose newest record is older; only the batch
    that holds the answer has its timestamps read. What the page cache does not hold is
    read on a worker thread (``LogWriter.aread``), and the scan yields to the loop between
    reads.
    """
    offset, hwm = writer.first_offset, writer.high_water_mark
    while offset < hwm:
        at = max(offset, writer.first_offset)
        batches = await writer.aread(at, _SCAN_BYTES, deleted_ok=True)
        if not batches:
            if at < writer.first_offset:
                continue  # retention deleted the segment while a thread read it: go on above
            break
        for batch in batches:
            if batch.max_timestamp_ms >= timestamp_ms:
                for i, ts in enumerate(batch.timestamps()):
                    if ts >= timestamp_ms:
                        return batch.base_offset + i
            offset = batch.next_offset
        await asyncio.sleep(0)
    return hwm
