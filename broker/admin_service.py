"""The admin-plane servicer: topics.

Role: thin, like :mod:`broker.service`: pb -> registry -> pb, errors through
:mod:`broker.status`.
"""

from __future__ import annotations

from broker.convert import partition_info
from broker.status import Context, rpc
from broker.topics import Topic, TopicRegistry
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _grpc


def _topic_info(topic: Topic) -> _admin.TopicInfo:
    return _admin.TopicInfo(
        name=topic.name,
        partitions=[partition_info(p.index, p.log) for p in topic.partitions],
    )


class AdminService(_grpc.AdminServicer):
    """Topic administration over a :class:`TopicRegistry`. Task-safe."""

    def __init__(self, topics: TopicRegistry) -> None:
        self._topics = topics

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
        """Delete a topic and its data."""
        await self._topics.delete(request.name)
        return _admin.DeleteTopicResponse()
