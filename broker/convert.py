"""Pure converters between protobuf messages and broker domain values.

Role: keep servicers thin (pb -> domain -> pb). No I/O, no asyncio.
"""

from __future__ import annotations

from broker.errors import InvalidRequestError
from dispatcher import (
    Delivery,
    DeliveryMode,
    InitialPosition,
    SubscriptionStatus,
    SubscriptionType,
)
from proto import admin_pb2 as _admin
from proto import broker_pb2 as _pb
from wal import AppendResult, Log

_TYPES: dict[int, SubscriptionType] = {
    _pb.SUBSCRIPTION_TYPE_UNSPECIFIED: SubscriptionType.EXCLUSIVE,
    _pb.EXCLUSIVE: SubscriptionType.EXCLUSIVE,
    _pb.FAILOVER: SubscriptionType.FAILOVER,
    _pb.SHARED: SubscriptionType.SHARED,
    _pb.KEY_SHARED: SubscriptionType.KEY_SHARED,
}
_MODES: dict[int, DeliveryMode] = {
    _pb.DELIVERY_MODE_UNSPECIFIED: DeliveryMode.AT_LEAST_ONCE,
    _pb.AT_LEAST_ONCE: DeliveryMode.AT_LEAST_ONCE,
    _pb.AT_MOST_ONCE: DeliveryMode.AT_MOST_ONCE,
}


def publish_response(
    request_id: int, partition: int, result: AppendResult, *, duplicate: bool = False
) -> _pb.PublishResponse:
    """The response to one appended batch."""
    return _pb.PublishResponse(
        request_id=request_id,
        partition=partition,
        base_offset=result.first_offset,
        last_offset=result.last_offset,
        duplicate=duplicate,
    )


def partition_info(partition: int, log: Log) -> _admin.PartitionInfo:
    """One partition's heads, size and segment count."""
    return _admin.PartitionInfo(
        partition=partition,
        first_offset=log.first_offset,
        head=log.head,
        size_bytes=log.size_bytes,
        segments=log.segment_count,
    )


def subscription_type(value: int) -> SubscriptionType:
    """The subscription type a request asks for.

    Raises:
        InvalidRequestError: a type this broker does not offer.
    """
    try:
        return _TYPES[value]
    except KeyError:
        raise InvalidRequestError(
            "type",
            f"{value} is not a subscription type; use EXCLUSIVE, FAILOVER, SHARED or KEY_SHARED",
        ) from None


def delivery_mode(value: int) -> DeliveryMode:
    """The delivery mode a request asks for (at least once unless ``AT_MOST_ONCE``).

    Raises:
        InvalidRequestError: a value that is not a mode.
    """
    try:
        return _MODES[value]
    except KeyError:
        raise InvalidRequestError(
            "mode", f"{value} is not a delivery mode; use AT_LEAST_ONCE or AT_MOST_ONCE"
        ) from None


def initial_position(value: int) -> InitialPosition:
    """Where a new subscription starts (``earliest`` unless ``LATEST``)."""
    if value not in _pb.InitialPosition.values():
        raise InvalidRequestError("initial_position", f"{value} is not EARLIEST or LATEST")
    return InitialPosition.LATEST if value == _pb.LATEST else InitialPosition.EARLIEST


def delivery(topic: str, d: Delivery) -> _pb.SubscribeResponse:
    """One delivery on a Subscribe stream."""
    return _pb.SubscribeResponse(
        delivery=_pb.Delivery(
            topic=topic,
            partition=d.partition,
            batch=d.batch,
            from_offset=d.from_offset,
            to_offset=d.to_offset,
            redeliveries=d.redeliveries,
        )
    )


def subscription_info(status: SubscriptionStatus) -> _admin.SubscriptionInfo:
    """A subscription's cursors, heads and lag."""
    return _admin.SubscriptionInfo(
        topic=status.topic,
        subscription=status.name,
        type=status.type.name,
        consumers=status.consumers,
        partitions=[
            _admin.PartitionLag(
                partition=p.partition,
                cursor=p.cursor,
                head=p.head,
                lag=p.lag,
                in_flight=p.in_flight,
                oldest_unacked_age_s=p.oldest_unacked_age_s,
                state=p.state,
                reason=p.reason,
            )
            for p in status.partitions
        ],
    )
