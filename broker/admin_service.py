"""The admin-plane servicer: topics and subscriptions.

Role: thin, like :mod:`broker.service`: pb -> registry -> pb, errors through
:mod:`broker.status`.
"""

from __future__ import annotations

import asyncio

from broker.convert import partition_info, subscription_info
from broker.errors import InvalidRequestError
from broker.status import Context, rpc
from broker.topics import Topic, TopicRegistry
from dispatcher import SubscriptionRegistry
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _grpc
from wal import LogWriter

_SCAN_BYTES = 8 << 20


def _topic_info(topic: Topic) -> _admin.TopicInfo:
    return _admin.TopicInfo(
        name=topic.name,
        partitions=[partition_info(p.index, p.log) for p in topic.partitions],
    )


class AdminService(_grpc.AdminServicer):
    """Topic and subscription administration. Task-safe."""

    def __init__(self, topics: TopicRegistry, subscriptions: SubscriptionRegistry) -> None:
        self._topics = topics
        self._subscriptions = subscriptions

    @rpc
    async def CreateTopic(  # noqa: N802 - gRPC method name
        self,
        request: _admin.CreateTopicRequest,
        context: Context,
    ) -> _admin.TopicInfo:
        """Create a topic; ALREADY_EXISTS if the name is taken."""
        return _topic_info(await self._topics.create(request.name, request.partitions))

    @rpc
    async def ListTopics(  # noqa: N802 - gRPC method name
        self,
        request: _admin.ListTopicsRequest,
        context: Context,
    ) -> _admin.ListTopicsResponse:
        """Every topic with its partitions."""
        topics = [_topic_info(self._topics.get(n)) for n in self._topics.names()]
        return _admin.ListTopicsResponse(topics=topics)

    @rpc
    async def DescribeTopic(  # noqa: N802 - gRPC method name
        self,
        request: _admin.DescribeTopicRequest,
        context: Context,
    ) -> _admin.TopicInfo:
        """One topic's partitions: heads, sizes, segments."""
        return _topic_info(self._topics.get(request.name))

    @rpc
    async def DeleteTopic(  # noqa: N802 - gRPC method name
        self,
        request: _admin.DeleteTopicRequest,
        context: Context,
    ) -> _admin.DeleteTopicResponse:
        """Delete a topic, its data and its subscriptions."""
        self._topics.get(request.name)  # NOT_FOUND before anything is dropped
        await self._subscriptions.drop_topic(request.name)
        await self._topics.delete(request.name)
        return _admin.DeleteTopicResponse()

    @rpc
    async def ListSubscriptions(  # noqa: N802 - gRPC method name
        self,
        request: _admin.ListSubscriptionsRequest,
        context: Context,
    ) -> _admin.ListSubscriptionsResponse:
        """Every subscription (of one topic, when given) with its cursors and lag."""
        if request.topic:
            self._topics.get(request.topic)
        subs = self._subscriptions.subscriptions(request.topic or None)
        return _admin.ListSubscriptionsResponse(
            subscriptions=[subscription_info(s.status()) for s in subs]
        )

    @rpc
    async def DescribeSubscription(  # noqa: N802 - gRPC method name
        self,
        request: _admin.DescribeSubscriptionRequest,
        context: Context,
    ) -> _admin.SubscriptionInfo:
        """One subscription's cursors, heads, lag and consumers."""
        self._topics.get(request.topic)
        return subscription_info(
            self._subscriptions.get(request.topic, request.subscription).status()
        )

    @rpc
    async def Seek(  # noqa: N802 - gRPC method name
        self,
        request: _admin.SeekRequest,
        context: Context,
    ) -> _admin.SubscriptionInfo:
        """Move a subscription's cursors; saved before the answer."""
        topic = self._topics.get(request.topic)
        sub = self._subscriptions.get(request.topic, request.subscription)
        writers = [p.writer for p in topic.partitions]
        target = request.WhichOneof("target")
        if target == "earliest":
            offsets = [w.first_offset for w in writers]
        elif target == "latest":
            offsets = [w.high_water_mark for w in writers]
        elif target == "offset":
            if request.offset < 0:
                raise InvalidRequestError("offset", f"must be >= 0, got {request.offset}")
            offsets = [request.offset] * len(writers)
        elif target == "timestamp_ms":
            offsets = [
                await asyncio.to_thread(offset_for_time, w, request.timestamp_ms) for w in writers
            ]
        else:
            raise InvalidRequestError("target", "say where to: earliest, latest, offset or time")
        sub.seek(offsets)
        await self._subscriptions.save(sub)
        return subscription_info(sub.status())


def offset_for_time(writer: LogWriter, timestamp_ms: int) -> int:
    """The first offset whose record time is at or after ``timestamp_ms`` (the head if none).

    Reads batch headers and skips every batch whose newest record is older; only the batch
    that holds the answer has its timestamps read.
    """
    offset, hwm = writer.first_offset, writer.high_water_mark
    while offset < hwm:
        batches = writer.read(offset, _SCAN_BYTES)
        if not batches:
            break
        for batch in batches:
            if batch.max_timestamp_ms >= timestamp_ms:
                for i, ts in enumerate(batch.timestamps()):
                    if ts >= timestamp_ms:
                        return batch.base_offset + i
            offset = batch.next_offset
    return hwm
