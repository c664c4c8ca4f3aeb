"""Request rules a client written from docs/protocol.md alone found loose, over real gRPC
on loopback: invalid names answered as missing, the wrong field named, a negative
timestamp or end offset taken as a default, a false ``earliest`` taken as true, a release
reported as an ack, and a topic deleted under a reader reported as a broker shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest

from broker.app import Broker
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests._helpers import eventually
from tests.broker.conftest import Client
from wal import encode_columns

pytestmark = pytest.mark.asyncio(loop_scope="function")

TOPIC = "t"
SUB = "s"


async def status_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    """The status ``call`` fails with, and its message."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


async def with_subscription(client: Client) -> None:
    """Topic ``TOPIC`` (2 partitions, 3 records on partition 0) and subscription ``SUB``."""
    await client.admin.CreateTopic(admin.CreateTopicRequest(name=TOPIC, partitions=2))
    for value in (b"a", b"b", b"c"):
        batch = encode_columns([value], timestamps_ms=1_000)
        await client.broker.Publish(pb.PublishRequest(topic=TOPIC, partition=0, batch=batch))
    await client.broker.AckUpTo(
        pb.AckUpToRequest(topic=TOPIC, subscription=SUB, partition=0, offset=0)
    )


@pytest.mark.parametrize("name", ["a/b", "", "-x", "y" * 201])
async def test_describe_and_seek_refuse_an_invalid_subscription_name(
    client: Client, name: str
) -> None:
    """Scenario: DescribeSubscription and Seek name a subscription no valid name matches.
    Expected: INVALID_ARGUMENT naming ``subscription`` and the rule; before, NOT_FOUND with
    advice to create it by a command that would itself be refused."""
    await with_subscription(client)
    calls = [
        client.admin.DescribeSubscription(
            admin.DescribeSubscriptionRequest(topic=TOPIC, subscription=name)
        ),
        client.admin.Seek(admin.SeekRequest(topic=TOPIC, subscription=name, earliest=True)),
    ]
    for call in calls:
        code, message = await status_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message.startswith("subscription: ")
        assert "is not a valid subscription name" in message


async def test_topic_calls_name_the_field_name(client: Client) -> None:
    """Scenario: CreateTopic, DescribeTopic and DeleteTopic with the name ``a/b``.
    Expected: INVALID_ARGUMENT whose message starts with ``name:``, the request's field
    (it said ``topic:``)."""
    calls = [
        client.admin.CreateTopic(admin.CreateTopicRequest(name="a/b", partitions=1)),
        client.admin.DescribeTopic(admin.DescribeTopicRequest(name="a/b")),
        client.admin.DeleteTopic(admin.DeleteTopicRequest(name="a/b")),
    ]
    for call in calls:
        code, message = await status_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message.startswith("name: 'a/b' is not a valid topic name")


async def test_seek_refuses_a_negative_time_and_a_false_target(client: Client) -> None:
    """Scenario: Seek to timestamp -1, to ``earliest: false`` and to ``latest: false``
    after the cursor was set to 1. Expected: INVALID_ARGUMENT naming the field each time
    (a negative time moved to the earliest, a false flag acted as true); the cursor stays
    at 1."""
    await with_subscription(client)
    await client.admin.Seek(
        admin.SeekRequest(
            topic=TOPIC,
            subscription=SUB,
            partition_offsets=admin.PartitionOffsets(
                offsets=[pb.PartitionOffset(partition=0, offset=1)]
            ),
        )
    )
    bad = [
        (admin.SeekRequest(topic=TOPIC, subscription=SUB, timestamp_ms=-1), "timestamp_ms"),
        (admin.SeekRequest(topic=TOPIC, subscription=SUB, earliest=False), "earliest"),
        (admin.SeekRequest(topic=TOPIC, subscription=SUB, latest=False), "latest"),
    ]
    for request, field in bad:
        assert request.WhichOneof("target") == field
        code, message = await status_of(client.admin.Seek(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message.startswith(f"{field}: ")
    info = await client.admin.DescribeSubscription(
        admin.DescribeSubscriptionRequest(topic=TOPIC, subscription=SUB)
    )
    assert info.partitions[0].cursor == 1


async def test_fetch_refuses_a_negative_end_offset(client: Client) -> None:
    """Scenario: Fetch with end_offset -1. Expected: INVALID_ARGUMENT naming end_offset
    (it read as "no limit", which only 0 means)."""
    await with_subscription(client)
    request = pb.FetchRequest(topic=TOPIC, partition=0, offset=0, end_offset=-1)
    code, message = await status_of(client.broker.Fetch(request))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("end_offset: must be >= 0")


def open_stream(
    client: Client, outbox: asyncio.Queue[pb.SubscribeRequest | None]
) -> grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse]:
    """A Subscribe stream of ``SUB`` on ``TOPIC`` that sends what ``outbox`` holds."""

    async def requests() -> AsyncIterator[pb.SubscribeRequest]:
        yield pb.SubscribeRequest(
            open=pb.OpenSubscription(topic=TOPIC, subscription=SUB, initial_credit=10)
        )
        while (request := await outbox.get()) is not None:
            yield request

    call: grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse]
    call = client.broker.Subscribe(requests())
    return call


async def test_a_release_of_unsent_offsets_says_release(client: Client) -> None:
    """Scenario: a consumer gets offsets 0-2 and releases [5, 9). Expected: the stream ends
    INVALID_ARGUMENT, and the message says release (it said ack)."""
    await with_subscription(client)
    outbox: asyncio.Queue[pb.SubscribeRequest | None] = asyncio.Queue()
    call = open_stream(client, outbox)

    async def read() -> None:
        delivered = 0
        async for response in call:
            if response.WhichOneof("kind") == "delivery":
                delivered += response.delivery.to_offset - response.delivery.from_offset
                if delivered == 3:
                    ranges = [pb.OffsetRange(partition=0, begin=5, end=9)]
                    outbox.put_nowait(pb.SubscribeRequest(ack=pb.Acks(releases=ranges)))

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(read(), 10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("release of offset 8 on partition 0")


async def test_deleting_a_topic_ends_its_readers_with_not_found(
    broker: Broker, client: Client
) -> None:
    """Scenario: a Subscribe stream on a topic and a Fetch waiting past its head; the topic
    is deleted. Expected: the stream ends NOT_FOUND ("subscription deleted", "topic
    deleted") and the Fetch NOT_FOUND ("was deleted while this request was served"). Before,
    UNAVAILABLE said the broker was shutting down, and the Fetch's message named the log's
    path on the server."""
    await with_subscription(client)
    outbox: asyncio.Queue[pb.SubscribeRequest | None] = asyncio.Queue()
    call = open_stream(client, outbox)

    subscribed = asyncio.Event()

    async def read_stream() -> None:
        async for _ in call:
            subscribed.set()  # the first answer: the session is attached

    stream = asyncio.create_task(read_stream())
    await asyncio.wait_for(subscribed.wait(), 10)
    writer = broker.topics.get(TOPIC).partition(0).writer
    listening = len(writer._listeners)  # the subscription's notifier among them
    fetch = client.broker.Fetch(
        pb.FetchRequest(topic=TOPIC, partition=0, offset=3, max_wait_ms=5_000)
    )
    await eventually(lambda: len(writer._listeners) > listening)  # the Fetch waits for data
    await client.admin.DeleteTopic(admin.DeleteTopicRequest(name=TOPIC))
    code, message = await status_of(stream)
    assert code == grpc.StatusCode.NOT_FOUND
    assert message.startswith("subscription deleted")
    assert "topic deleted" in message
    code, message = await status_of(fetch)
    assert code == grpc.StatusCode.NOT_FOUND
    assert message.startswith(f"topic {TOPIC!r} was deleted while this request was served")
