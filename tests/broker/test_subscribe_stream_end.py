"""How a Subscribe stream ends when the client goes, over real gRPC on loopback.

Subscribe is an async generator (``BrokerService.Subscribe`` around ``_subscribe``) inside
the handler's guard (:mod:`broker.rpc_handlers`). A client that cancels its call while
the broker waits to send it more must still end the session: the consumer is detached
(what it did not acknowledge goes to the next consumer, as a redelivery) and its stream
slot on the connection is given back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from proto import broker_pb2 as pb
from tests.broker.conftest import Client
from tests.broker.test_service import batch, create

pytestmark = pytest.mark.asyncio(loop_scope="function")

OPEN = pb.SubscribeRequest(open=pb.OpenSubscription(topic="t", subscription="s", initial_credit=10))


async def _open_then_hold() -> AsyncIterator[pb.SubscribeRequest]:
    yield OPEN
    await asyncio.sleep(30)  # the stream stays open until the test cancels it


async def _next_delivery(
    call: grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse],
) -> pb.SubscribeResponse:
    while True:
        response = await call.read()
        assert isinstance(response, pb.SubscribeResponse)
        if response.WhichOneof("kind") == "delivery":
            return response


async def test_a_cancelled_stream_hands_its_records_to_the_next_consumer(
    client: Client,
) -> None:
    """Scenario: a consumer of an exclusive subscription receives one record and cancels
    its call without acknowledging it (the broker waits in the stream for more to send);
    a second consumer then opens the same subscription, retrying while the first still
    holds it.
    Expected: the second stream is accepted within 5 s and gets the record again as a
    redelivery (count 1): the first session ended and failed its record."""
    await create(client, "t")
    first = client.broker.Subscribe(_open_then_hold())
    await client.broker.Publish(pb.PublishRequest(topic="t", batch=batch(b"a")))
    got = await asyncio.wait_for(_next_delivery(first), 5)
    assert (got.delivery.from_offset, got.delivery.to_offset) == (0, 1)
    first.cancel()
    async with asyncio.timeout(5):
        while True:
            second = client.broker.Subscribe(_open_then_hold())
            try:
                again = await _next_delivery(second)
            except grpc.aio.AioRpcError as exc:  # the first session is not gone yet
                if exc.code() is not grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                await asyncio.sleep(0.01)
                continue
            break
    assert (again.delivery.from_offset, again.delivery.to_offset) == (0, 1)
    assert dict(again.delivery.redeliveries) == {0: 1}
    second.cancel()
