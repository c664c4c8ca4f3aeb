"""Subscribe, AckUpTo and the subscription admin RPCs over real gRPC on loopback: every bad
request gets its status code and the broker keeps serving; cursors survive a restart;
shutdown ends consumer streams promptly with UNAVAILABLE."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests.broker.conftest import Client, broker_config, serving
from tests.broker.test_service import batch, create

pytestmark = pytest.mark.asyncio(loop_scope="function")

OPEN = pb.SubscribeRequest(
    open=pb.OpenSubscription(topic="t", subscription="s", initial_credit=100)
)


async def _requests(
    *items: pb.SubscribeRequest, hold: float = 5
) -> AsyncIterator[pb.SubscribeRequest]:
    for item in items:
        yield item
    await asyncio.sleep(hold)  # keep the stream open while the broker answers


async def _stream_error(client: Client, *items: pb.SubscribeRequest) -> grpc.aio.AioRpcError:
    call = client.broker.Subscribe(_requests(*items))

    async def drain() -> None:
        async with asyncio.timeout(5):
            async for _ in call:
                pass

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await drain()
    return info.value


async def _serving_still(client: Client) -> None:
    listed = await client.admin.ListTopics(admin.ListTopicsRequest())
    assert "t" in [t.name for t in listed.topics]


@pytest.mark.parametrize(
    ("first", "code", "words"),
    [
        (pb.SubscribeRequest(credit=5), grpc.StatusCode.INVALID_ARGUMENT, "must open it"),
        (
            pb.SubscribeRequest(open=pb.OpenSubscription(topic="nope", subscription="s")),
            grpc.StatusCode.NOT_FOUND,
            "does not exist",
        ),
        (
            pb.SubscribeRequest(open=pb.OpenSubscription(topic="t", subscription="a b")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "not a valid subscription name",
        ),
        (
            pb.SubscribeRequest(
                open=pb.OpenSubscription(
                    topic="t",
                    subscription="s",
                    type=7,  # type: ignore[arg-type]  # unknown on purpose
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "7 is not a subscription type",
        ),
        (
            pb.SubscribeRequest(
                open=pb.OpenSubscription(
                    topic="t",
                    subscription="s",
                    mode=5,  # type: ignore[arg-type]  # unknown on purpose
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "5 is not a delivery mode",
        ),
        (
            pb.SubscribeRequest(
                open=pb.OpenSubscription(
                    topic="t",
                    subscription="s",
                    initial_position=9,  # type: ignore[arg-type]  # unknown on purpose
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "initial_position",
        ),
    ],
    ids=["no-open", "no-topic", "bad-name", "bad-type", "bad-mode", "bad-position"],
)
async def test_bad_open_gets_its_status(
    client: Client, first: pb.SubscribeRequest, code: grpc.StatusCode, words: str
) -> None:
    await create(client, "t")
    error = await _stream_error(client, first)
    assert error.code() == code
    assert words in (error.details() or "")
    await _serving_still(client)


async def test_bad_requests_inside_a_session_end_it_with_their_status(client: Client) -> None:
    await create(client, "t")
    await client.broker.Publish(pb.PublishRequest(topic="t", partition=0, batch=batch(b"a")))
    undelivered = pb.SubscribeRequest(
        ack=pb.Acks(ranges=[pb.OffsetRange(partition=0, begin=0, end=5)])
    )
    error = await _stream_error(client, OPEN, undelivered)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "were delivered" in (error.details() or "")
    error = await _stream_error(client, OPEN, OPEN)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already open" in (error.details() or "")
    error = await _stream_error(client, OPEN, pb.SubscribeRequest())
    assert "empty request" in (error.details() or "")
    bad_partition = pb.SubscribeRequest(
        ack=pb.Acks(up_to=[pb.PartitionOffset(partition=3, offset=0)])
    )
    error = await _stream_error(client, OPEN, bad_partition)
    assert "partition: 3 does not exist" in (error.details() or "")
    await _serving_still(client)


async def test_exclusive_subscription_refuses_a_second_stream(client: Client) -> None:
    await create(client, "t")
    first = client.broker.Subscribe(_requests(OPEN))
    assert (await first.read()).HasField("subscribed")
    error = await _stream_error(client, OPEN)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    first.cancel()


async def test_stream_delivers_whole_batches_or_the_unacked_part(client: Client) -> None:
    await create(client, "t")
    await client.broker.Publish(
        pb.PublishRequest(topic="t", partition=0, batch=batch(b"a", b"b", b"c"))
    )
    await client.broker.AckUpTo(pb.AckUpToRequest(topic="t", subscription="s", offset=1))
    small = pb.SubscribeRequest(
        open=pb.OpenSubscription(topic="t", subscription="s", initial_credit=1)
    )
    call = client.broker.Subscribe(_requests(small))
    subscribed = await call.read()
    assert subscribed.subscribed.partitions == 1
    assert subscribed.subscribed.max_unacked == 1_000
    got = await call.read()
    assert (got.delivery.from_offset, got.delivery.to_offset) == (1, 3)  # not split to 1
    call.cancel()


async def test_ack_up_to_commits_and_survives_a_restart(tmp_path: Path) -> None:
    config = broker_config(tmp_path / "data")
    async with serving(config) as (_, client):
        await create(client, "t", partitions=2)
        await client.broker.Publish(
            pb.PublishRequest(topic="t", partition=1, batch=batch(b"a", b"b", b"c"))
        )
        done = await client.broker.AckUpTo(
            pb.AckUpToRequest(topic="t", subscription="spark", partition=1, offset=2)
        )
        assert done.cursor == 2
        for request, code, words in [
            (pb.AckUpToRequest(topic="nope", subscription="s"), "NOT_FOUND", "does not exist"),
            (
                pb.AckUpToRequest(topic="t", subscription="s", partition=5),
                "INVALID_ARGUMENT",
                "does not exist",
            ),
            (
                pb.AckUpToRequest(topic="t", subscription="s", partition=1, offset=9),
                "INVALID_ARGUMENT",
                "outside [0, 3]",
            ),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await client.broker.AckUpTo(request)
            assert info.value.code().name == code
            assert words in (info.value.details() or "")
    async with serving(config) as (_, client):
        described = await client.admin.DescribeSubscription(
            admin.DescribeSubscriptionRequest(topic="t", subscription="spark")
        )
        assert [(p.cursor, p.head, p.lag) for p in described.partitions] == [(0, 0, 0), (2, 3, 1)]


async def test_subscription_admin_rpcs_and_their_errors(client: Client) -> None:
    await create(client, "t")
    old, new = 1_600_000_000_000, 1_700_000_000_000
    from wal import encode_columns

    await client.broker.Publish(
        pb.PublishRequest(
            topic="t",
            partition=0,
            batch=encode_columns([b"a", b"b", b"c"], timestamps_ms=[old, old, new]),
        )
    )
    await client.broker.AckUpTo(pb.AckUpToRequest(topic="t", subscription="s", offset=3))
    listed = await client.admin.ListSubscriptions(admin.ListSubscriptionsRequest(topic="t"))
    assert [s.subscription for s in listed.subscriptions] == ["s"]

    async def seek(request: admin.SeekRequest) -> list[int]:
        request.topic, request.subscription = "t", "s"
        info = await client.admin.Seek(request)
        return [p.cursor for p in info.partitions]

    assert await seek(admin.SeekRequest(earliest=True)) == [0]
    assert await seek(admin.SeekRequest(latest=True)) == [3]
    assert await seek(admin.SeekRequest(offset=1)) == [1]
    assert await seek(admin.SeekRequest(timestamp_ms=new)) == [2]
    assert await seek(admin.SeekRequest(timestamp_ms=new + 1)) == [3]
    for call, code in [
        (client.admin.Seek(admin.SeekRequest(topic="t", subscription="s")), "INVALID_ARGUMENT"),
        (
            client.admin.Seek(admin.SeekRequest(topic="t", subscription="s", offset=-1)),
            "INVALID_ARGUMENT",
        ),
        (
            client.admin.Seek(admin.SeekRequest(topic="t", subscription="x", earliest=True)),
            "NOT_FOUND",
        ),
        (
            client.admin.DescribeSubscription(
                admin.DescribeSubscriptionRequest(topic="nope", subscription="s")
            ),
            "NOT_FOUND",
        ),
        (client.admin.ListSubscriptions(admin.ListSubscriptionsRequest(topic="n")), "NOT_FOUND"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code().name == code
    await client.admin.DeleteTopic(admin.DeleteTopicRequest(name="t"))
    listed = await client.admin.ListSubscriptions(admin.ListSubscriptionsRequest())
    assert list(listed.subscriptions) == []


async def test_shutdown_ends_consumer_streams_promptly(tmp_path: Path) -> None:
    config = broker_config(tmp_path / "data", grace_seconds=30.0)
    async with serving(config) as (broker, client):
        await create(client, "t")
        call = client.broker.Subscribe(_requests(OPEN, hold=60))
        assert (await call.read()).HasField("subscribed")
        started = time.monotonic()
        await broker.aclose()
        assert time.monotonic() - started < 5  # not the 30 s grace period
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
