"""What AsyncConsumer writes on its Subscribe stream, seen on the wire (a recording
interceptor on a real channel to a real broker on loopback): in-order acks go out as one
range per request, credit goes out while the application is still taking a delivery,
acks pending at close are sent, and an ack after close raises instead of vanishing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable
from itertools import pairwise
from typing import Any

import grpc
import pytest

from broker.app import Broker
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, ClientClosed, Consumer
from proto import broker_pb2 as pb
from tests.client.conftest import address

pytestmark = pytest.mark.asyncio(loop_scope="function")


class _Recorder(grpc.aio.StreamStreamClientInterceptor):
    """Keeps every request a stream writes, with what ``probe`` said when it went out."""

    def __init__(self, probe: Callable[[], int] = lambda: 0) -> None:
        self.requests: list[tuple[pb.SubscribeRequest, int]] = []
        self._probe = probe

    async def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        async def tap() -> AsyncIterator[pb.SubscribeRequest]:
            assert isinstance(request_iterator, AsyncIterable)  # the consumer's writer
            async for request in request_iterator:
                copy = pb.SubscribeRequest()
                copy.CopyFrom(request)
                self.requests.append((copy, self._probe()))
                yield request

        return await continuation(details, tap())

    def of(self, kind: str) -> list[tuple[pb.SubscribeRequest, int]]:
        return [(r, at) for r, at in self.requests if r.WhichOneof("kind") == kind]


async def _topic_with(broker: Broker, topic: str, count: int, batches: int = 1) -> None:
    """A topic of one partition with ``count`` records in ``batches`` equal batches."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic(topic, 1)
    size = count // batches
    async with AsyncProducer(address(broker)) as producer:
        for first in range(0, count, size):
            values = [b"r%d" % i for i in range(first, first + size)]
            assert len(await (await producer.send_many(topic, values))) == size


async def _nothing_left(broker: Broker, topic: str) -> None:
    """A new consumer of the subscription gets nothing: every record was acked."""
    async with AsyncConsumer(topic, "s", broker=address(broker)) as again:
        with pytest.raises(TimeoutError):
            await again.receive(timeout=0.5)


async def test_in_order_acks_go_out_as_one_range_per_request(broker: Broker) -> None:
    await _topic_with(broker, "t", 2_000, batches=4)
    recorder = _Recorder()
    async with (
        grpc.aio.insecure_channel(address(broker), interceptors=[recorder]) as channel,
        AsyncConsumer(
            "t", "s", channel=channel, receive_queue=5_000, ack_interval_ms=60_000
        ) as consumer,
        asyncio.timeout(10),
    ):
        taken = 0
        async for message in consumer:
            consumer.ack(message)
            taken += 1
            if taken == 2_000:
                break
    acks = [r.ack for r, _ in recorder.of("ack")]
    ranges = [(r.partition, r.begin, r.end) for a in acks for r in a.ranges]
    assert all(len(a.ranges) == 1 for a in acks if a.ranges), ranges
    assert ranges[0][1] == 0
    assert ranges[-1][2] == 2_000
    assert all(prev[2] == nxt[1] for prev, nxt in pairwise(ranges))
    # The broker's cap is 1,000 unacked, so acks are due every 250; the writer may merge.
    assert 2 <= len(acks) <= 2_000 // 250 + 2
    await _nothing_left(broker, "t")


async def _take_all(consumer: AsyncConsumer, count: int, taken: list[int]) -> None:
    """``async for`` and ``ack`` each, ``taken[0]`` counting; the loop awaits nothing but
    the consumer, as a fast application's does."""
    async with asyncio.timeout(10):
        async for message in consumer:
            consumer.ack(message)
            taken[0] += 1
            if taken[0] == count:
                break


async def test_credit_goes_out_while_the_application_takes_its_buffer(broker: Broker) -> None:
    """Four batches of 100 fill a queue of 400; credit for the first 200 taken must reach
    the broker while the other 200 are still buffered (else it idles until they are
    taken)."""
    await _topic_with(broker, "t", 1_000, batches=10)
    taken = [0]
    recorder = _Recorder(lambda: taken[0])
    async with (
        grpc.aio.insecure_channel(address(broker), interceptors=[recorder]) as channel,
        AsyncConsumer("t", "s", channel=channel, receive_queue=400) as consumer,
    ):
        async with asyncio.timeout(10):
            while len(consumer._buffer) < 400:  # noqa: ASYNC110 - all four deliveries in
                await asyncio.sleep(0.01)
        await _take_all(consumer, 1_000, taken)
    credits = recorder.of("credit")
    assert credits, recorder.requests
    assert 200 <= credits[0][1] < 400, credits[0][1]  # sent at 200, before the 400 were used
    assert 600 <= sum(r.credit for r, _ in credits) <= 1_000
    await _nothing_left(broker, "t")


async def test_grants_the_broker_could_not_act_on_are_merged(broker: Broker) -> None:
    """One 1,000-record batch against a queue of 100 leaves the broker at -900 credit:
    grants of the first 900 records taken change nothing there, so they go out as one
    request once the total lifts the broker above 0, not as 19 of 50."""
    await _topic_with(broker, "t", 1_000)
    taken = [0]
    recorder = _Recorder(lambda: taken[0])
    async with (
        grpc.aio.insecure_channel(address(broker), interceptors=[recorder]) as channel,
        AsyncConsumer("t", "s", channel=channel, receive_queue=100) as consumer,
    ):
        await _take_all(consumer, 1_000, taken)
    credits = [(r.credit, at) for r, at in recorder.of("credit")]
    assert 1 <= len(credits) <= 2, credits  # the last 50 taken may make a second grant
    granted, at = credits[0]
    assert granted > 900  # the broker's -900 and then some
    assert 900 < at <= 1_000
    await _nothing_left(broker, "t")


async def test_shared_consumers_ack_every_half_queue_exclusive_ones_every_quarter_cap(
    broker: Broker,
) -> None:
    """The broker's cap here is 1,000 unacked records: an exclusive consumer sends its
    acks every 250; one of a shared subscription, whose consumers share the cap, every
    50 (half its queue of 100)."""
    await _topic_with(broker, "t", 1_000, batches=10)
    counts = {}
    for kind in ("exclusive", "shared"):
        taken = [0]
        recorder = _Recorder()
        async with (
            grpc.aio.insecure_channel(address(broker), interceptors=[recorder]) as channel,
            AsyncConsumer(
                "t", kind, channel=channel, type=kind, receive_queue=100, ack_interval_ms=60_000
            ) as consumer,
        ):
            await _take_all(consumer, 1_000, taken)
        counts[kind] = len(recorder.of("ack"))
    assert counts["exclusive"] <= 1_000 // 250 + 1, counts  # and the last ones at close
    assert counts["shared"] >= 8, counts  # 20 due; the writer merges what queues meanwhile


async def test_acks_pending_at_close_are_sent_before_the_half_close(broker: Broker) -> None:
    await _topic_with(broker, "t", 10)
    recorder = _Recorder()
    async with (
        grpc.aio.insecure_channel(address(broker), interceptors=[recorder]) as channel,
        AsyncConsumer("t", "s", channel=channel, ack_interval_ms=60_000) as consumer,
        asyncio.timeout(10),
    ):
        for _ in range(10):
            consumer.ack(await consumer.receive())
    # Below the threshold and long before the interval: only the close sends them.
    kinds = [r.WhichOneof("kind") for r, _ in recorder.requests]
    assert kinds[0] == "open"
    assert kinds[-1] == "ack"
    assert "drain" in kinds
    last = recorder.requests[-1][0].ack
    assert [(r.begin, r.end) for r in last.ranges] == [(0, 10)]
    await _nothing_left(broker, "t")


async def test_an_ack_after_close_raises_instead_of_vanishing(broker: Broker) -> None:
    await _topic_with(broker, "t", 3)
    consumer = AsyncConsumer("t", "s", broker=address(broker))
    async with asyncio.timeout(10):
        first, second, third = [await consumer.receive() for _ in range(3)]
    consumer.ack(first)  # pending: sent by the close
    await consumer.aclose()
    with pytest.raises(ClientClosed, match="sent its last acks"):
        consumer.ack(second)
    with pytest.raises(ClientClosed):
        consumer.ack_many([second, third])
    with pytest.raises(ClientClosed):
        consumer.ack_cumulative(third)
    with pytest.raises(ClientClosed):
        consumer.nack(third)
    # The first was acked; the others come again.
    async with AsyncConsumer("t", "s", broker=address(broker)) as again:
        async with asyncio.timeout(10):
            redelivered = [await again.receive() for _ in range(2)]
    assert [m.offset for m in redelivered] == [1, 2]


async def test_a_blocking_consumer_raises_on_an_ack_after_close(broker: Broker) -> None:
    await _topic_with(broker, "t", 1)

    def run() -> None:
        consumer = Consumer("t", "s", broker=address(broker))
        message = consumer.receive(timeout=10)
        consumer.close()
        with pytest.raises(ClientClosed):
            consumer.ack(message)

    await asyncio.to_thread(run)
