"""AsyncAdminClient: topics and subscriptions, over the Admin gRPC service.

Role: thin calls with typed results; gRPC errors become :mod:`client.errors` once, here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc

from client._types import DEFAULT_BROKER, PartitionInfo, PartitionLag, SubscriptionInfo, TopicInfo
from client.errors import from_rpc_error
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _grpc
from proto import broker_pb2 as _pb

R = TypeVar("R")


def _topic(info: _admin.TopicInfo) -> TopicInfo:
    return TopicInfo(
        info.name,
        tuple(
            PartitionInfo(p.partition, p.first_offset, p.head, p.size_bytes, p.segments)
            for p in info.partitions
        ),
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
            )
            for p in info.partitions
        ),
    )


class AsyncAdminClient:
    """Topic and subscription administration. Task-safe; an async context manager.

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

    async def _call(self, method: Callable[..., Awaitable[Any]], request: Any) -> Any:
        try:
            return await method(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    async def create_topic(self, name: str, partitions: int = 1) -> TopicInfo:
        """Create a topic. Raises ``AlreadyExists`` or ``InvalidArgument``."""
        request = _admin.CreateTopicRequest(name=name, partitions=partitions)
        return _topic(await self._call(self._stub.CreateTopic, request))

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic, by name."""
        got = await self._call(self._stub.ListTopics, _admin.ListTopicsRequest())
        return [_topic(t) for t in got.topics]

    async def describe_topic(self, name: str) -> TopicInfo:
        """One topic. Raises ``NotFound``."""
        request = _admin.DescribeTopicRequest(name=name)
        return _topic(await self._call(self._stub.DescribeTopic, request))

    async def delete_topic(self, name: str) -> None:
        """Delete a topic, its data and its subscriptions. Raises ``NotFound``."""
        await self._call(self._stub.DeleteTopic, _admin.DeleteTopicRequest(name=name))

    async def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionInfo]:
        """Every subscription (of ``topic``, when given) with its lag."""
        request = _admin.ListSubscriptionsRequest(topic=topic or "")
        got = await self._call(self._stub.ListSubscriptions, request)
        return [_subscription(s) for s in got.subscriptions]

    async def describe_subscription(self, topic: str, subscription: str) -> SubscriptionInfo:
        """One subscription's cursors, heads, lag and consumers. Raises ``NotFound``."""
        request = _admin.DescribeSubscriptionRequest(topic=topic, subscription=subscription)
        return _subscription(await self._call(self._stub.DescribeSubscription, request))

    async def seek(
        self,
        topic: str,
        subscription: str,
        *,
        earliest: bool = False,
        latest: bool = False,
        offset: int | None = None,
        timestamp_ms: int | None = None,
    ) -> SubscriptionInfo:
        """Move a subscription's cursors to the earliest or latest retained offsets, to one
        offset on every partition, or to the first record at or after a time (ms since
        the epoch). Give exactly one target."""
        given = [earliest, latest, offset is not None, timestamp_ms is not None]
        if sum(given) != 1:
            raise ValueError("give exactly one of earliest, latest, offset or timestamp_ms")
        request = _admin.SeekRequest(topic=topic, subscription=subscription)
        if earliest:
            request.earliest = True
        elif latest:
            request.latest = True
        elif offset is not None:
            request.offset = offset
        else:
            request.timestamp_ms = timestamp_ms or 0
        return _subscription(await self._call(self._stub.Seek, request))

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
