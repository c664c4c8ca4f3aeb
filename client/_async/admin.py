"""AsyncAdminClient: topics, over the Admin gRPC service.

Role: thin calls with typed results; gRPC errors become :mod:`client.errors` once, here.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

import grpc

from client._types import DEFAULT_BROKER, PartitionInfo, TopicInfo
from client.errors import from_rpc_error
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _grpc


def _topic(info: _admin.TopicInfo) -> TopicInfo:
    return TopicInfo(
        info.name,
        tuple(
            PartitionInfo(p.partition, p.first_offset, p.head, p.size_bytes, p.segments)
            for p in info.partitions
        ),
    )


class AsyncAdminClient:
    """Topic administration. Task-safe; an async context manager.

    Args:
        broker: ``host:port`` of the broker.
        channel: An existing channel to use instead (not closed by this client).
        timeout_s: Deadline of each call, seconds. Default 10.
    """

    def __init__(
        self,
        broker: str = DEFAULT_BROKER,
        *,
        channel: grpc.aio.Channel | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._owns_channel = channel is None
        self._channel = channel or grpc.aio.insecure_channel(broker)
        self._stub = _grpc.AdminStub(self._channel)
        self._timeout = timeout_s

    async def create_topic(self, name: str, partitions: int = 1) -> TopicInfo:
        """Create a topic. Raises ``AlreadyExists`` or ``InvalidArgument``."""
        request = _admin.CreateTopicRequest(name=name, partitions=partitions)
        try:
            return _topic(await self._stub.CreateTopic(request, timeout=self._timeout))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic, by name."""
        try:
            got = await self._stub.ListTopics(_admin.ListTopicsRequest(), timeout=self._timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc
        return [_topic(t) for t in got.topics]

    async def describe_topic(self, name: str) -> TopicInfo:
        """One topic. Raises ``NotFound``."""
        request = _admin.DescribeTopicRequest(name=name)
        try:
            return _topic(await self._stub.DescribeTopic(request, timeout=self._timeout))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and its data. Raises ``NotFound``."""
        request = _admin.DeleteTopicRequest(name=name)
        try:
            await self._stub.DeleteTopic(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    async def aclose(self) -> None:
        """Close the channel (if this client opened it)."""
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
