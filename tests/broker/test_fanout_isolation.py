"""Fan-out over real gRPC on loopback: a consumer that stops reading its stream holds up
no other subscription's deliveries, and a stream that ends lets exactly its own session
go (its unacknowledged records go to the next consumer)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from broker.app import Broker
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from tests.broker.conftest import Client
from tests.broker.test_service import batch, create

pytestmark = pytest.mark.asyncio(loop_scope="function")

RECORDS = 40
VALUE = b"x" * (256 << 10)  # 40 of them are 10 MiB: far past HTTP/2's flow-control windows


def _open(subscription: str) -> pb.SubscribeRequest:
    return pb.SubscribeRequest(
        open=pb.OpenSubscription(topic="t", subscription=subscription, initial_credit=1_000)
    )


async def _hold(first: pb.SubscribeRequest) -> AsyncIterator[pb.SubscribeRequest]:
    yield first
    await asyncio.Event().wait()  # keep the stream open: the test cancels the call


async def _offsets(
    call: grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse], records: int
) -> list[int]:
    """The offsets of the next ``records`` records delivered on ``call``."""
    got: list[int] = []
    while len(got) < records:
        response = await call.read()
        assert isinstance(response, pb.SubscribeResponse)
        d = response.delivery
        got += range(d.from_offset, d.to_offset)
    return got


async def test_a_consumer_that_stops_reading_delays_no_other_subscription(
    broker: Broker, client: Client
) -> None:
    """Scenario: two subscriptions of one topic, each with a consumer on its own
    connection; ``slow`` reads its ``subscribed`` answer and then nothing, ``fast`` reads
    everything; 10 MiB of records are published.
    Expected: ``fast`` gets every record, in order, while ``slow`` reads nothing (its
    stream is stalled by flow control, with its deliveries queued in the broker). Then
    ``slow``'s stream is cancelled: its session goes (a new consumer of the exclusive
    subscription is accepted) and the new consumer gets every record from 0, none of
    them having been acked."""
    await create(client, "t")
    address = f"127.0.0.1:{broker.port}"
    async with (
        grpc.aio.insecure_channel(address) as slow_channel,
        grpc.aio.insecure_channel(address) as fast_channel,
    ):
        slow = broker_pb2_grpc.BrokerStub(slow_channel).Subscribe(_hold(_open("slow")))
        fast = broker_pb2_grpc.BrokerStub(fast_channel).Subscribe(_hold(_open("fast")))
        assert (await slow.read()).HasField("subscribed")
        assert (await fast.read()).HasField("subscribed")
        async with asyncio.timeout(8):
            reading = asyncio.create_task(_offsets(fast, RECORDS))
            for _ in range(RECORDS):
                await client.broker.Publish(pb.PublishRequest(topic="t", batch=batch(VALUE)))
            assert await reading == list(range(RECORDS))
        slow.cancel()
        fast.cancel()
        async with asyncio.timeout(8):
            while True:  # the broker sees the cancellation soon, not at once
                again = client.broker.Subscribe(_hold(_open("slow")))
                try:
                    first = await again.read()
                except grpc.aio.AioRpcError as exc:  # the old session is still attached
                    refused = exc.code()
                else:
                    break
                assert refused == grpc.StatusCode.FAILED_PRECONDITION
                await asyncio.sleep(0.05)
            assert first is not grpc.aio.EOF
            assert first.HasField("subscribed")
            assert await _offsets(again, RECORDS) == list(range(RECORDS))
        again.cancel()
