"""A PublishStream's batches reach the log in the order the broker read them, even when
the first of them waits under the backlog quota (``block_producer``) and the quota opens
while later ones arrive (:meth:`broker.service.BrokerService.PublishStream`).

Real gRPC on 127.0.0.1 to a :class:`BrokerService` over real logs, subscriptions and a
:class:`RetentionService` built here, so that the quota's clock is a manual one and its
poll interval an hour: a blocked publish wakes only when the test runs a retention pass,
never by a timer. :class:`ReadCounting` counts the requests the broker has read, so the
test knows the later ones reached the broker before the quota opens.

Every record is sent on the simple path (plain records, producer id -1: not idempotent),
so nothing on the broker could repair an order that came out wrong.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from broker.backlog import BacklogConfig, BacklogPolicy
from broker.error_status import Context
from broker.metrics import BrokerMetrics
from broker.retention import RetentionService
from broker.service import BrokerService, add_to_server
from broker.topics import TopicRegistry
from dispatcher import SubscriptionRegistry
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from tests._helpers import ManualClock, eventually
from wal import LogConfig

pytestmark = pytest.mark.asyncio(loop_scope="function")

QUOTA = 10
POLL_S = 3600.0  # a blocked publish re-checks the quota only when woken


class ReadCounting(BrokerService):
    """The broker's data plane, counting the PublishStream requests it read, and noting
    when a PublishStream call ended."""

    read = 0
    ended = False

    async def PublishStream(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[pb.PublishRequest], context: Context
    ) -> AsyncIterator[pb.PublishResponse]:
        async def counted() -> AsyncIterator[pb.PublishRequest]:
            async for request in request_iterator:
                self.read += 1
                yield request

        try:
            async for response in super().PublishStream(counted(), context):
                yield response
        finally:
            self.ended = True


@dataclass
class Env:
    """Topic ``t`` (one partition) with subscription ``s``, served on loopback."""

    service: ReadCounting
    topics: TopicRegistry
    retention: RetentionService
    metrics: BrokerMetrics
    clock: ManualClock
    stub: broker_pb2_grpc.BrokerStub

    def blocked(self) -> float:
        """Publishes that found the partition over its quota."""
        labels = {"topic": "t", "partition": "0", "policy": "block_producer"}
        name = "headrace_backlog_quota_exceeded_requests_total"
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    async def fill_over_quota(self) -> None:
        """Subscription ``s`` saved at 0, then QUOTA + 1 records: the next publish blocks."""
        await self.ack(0)
        filler = [pb.Record(value=b"fill-%d" % i) for i in range(QUOTA + 1)]
        answer = await self.stub.Publish(pb.PublishRequest(topic="t", records=filler))
        assert answer.error_code == 0, answer.error_message

    async def ack(self, offset: int) -> None:
        """Save subscription ``s``'s cursor at ``offset``."""
        request = pb.AckUpToRequest(topic="t", subscription="s", partition=0, offset=offset)
        await self.stub.AckUpTo(request)

    async def open_quota(self) -> None:
        """Ack everything, let the cached floor go stale, and run a retention pass (it
        refreshes the floor and wakes the blocked publish)."""
        await self.ack(QUOTA + 1)
        self.clock.advance(POLL_S + 1)
        await self.retention.run_once()

    async def values(self) -> list[bytes]:
        """Every value in the partition after the filler, in offset order."""
        request = pb.FetchRequest(topic="t", partition=0, offset=QUOTA + 1, decoded=True)
        fetched = await self.stub.Fetch(request)
        return [r.value for r in fetched.records]


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[Env]:
    data = str(tmp_path / "data")
    topics = TopicRegistry(data, LogConfig())
    await topics.open()
    await topics.create("t", 1)
    subs = SubscriptionRegistry(data, flush_interval_s=3600)
    await subs.open({"t": [p.writer for p in topics.get("t").partitions]})
    metrics = BrokerMetrics()
    clock = ManualClock()
    backlog = BacklogConfig(
        quota_messages=QUOTA, policy=BacklogPolicy.BLOCK_PRODUCER, block_timeout_ms=10_000
    )
    retention = RetentionService(
        topics, subs.saved_floor, metrics, backlog=backlog, poll_s=POLL_S, clock=clock
    )
    service = ReadCounting(topics, subs, metrics, retention=retention)
    server = grpc.aio.server()
    add_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            yield Env(service, topics, retention, metrics, clock, stub)
    finally:
        await server.stop(None)
        await retention.aclose()
        await subs.aclose()
        await topics.aclose()


def publish(value: bytes, request_id: int) -> pb.PublishRequest:
    return pb.PublishRequest(topic="t", records=[pb.Record(value=value)], request_id=request_id)


Stream = grpc.aio.StreamStreamCall[pb.PublishRequest, pb.PublishResponse]


async def answers(call: Stream, count: int) -> list[pb.PublishResponse]:
    return [await call.read() for _ in range(count)]  # type: ignore[misc]


async def send_while_blocked(env: Env, values: Sequence[bytes]) -> Stream:
    """Open a stream; send ``values[0]`` and wait until it is blocked by the quota; then
    save the ack that makes room and let the cached floor go stale (so that a publish
    arriving now would find room by itself), send the rest, and wait until the broker
    has read them all."""
    await env.fill_over_quota()
    call: Stream = env.stub.PublishStream()
    await call.write(publish(values[0], 0))
    await eventually(lambda: env.blocked() == 1)
    await env.ack(QUOTA + 1)
    env.clock.advance(POLL_S + 1)
    for i, value in enumerate(values[1:], start=1):
        await call.write(publish(value, i))
    await eventually(lambda: env.service.read == len(values))
    return call


async def test_batches_land_in_send_order_when_the_quota_opens(tmp_path: Path) -> None:
    """Scenario: block_producer, quota 10; the partition is over it; on one PublishStream
    batch "a" blocks; the subscription then acks everything and the cached floor goes
    stale; batches "b" to "f" arrive (the first of them could pass the quota check at
    once); then a retention pass wakes "a". Expected: six OK answers in order with
    increasing offsets, and the log holds a, b, c, d, e, f after the filler, each once."""
    sent = [b"a", b"b", b"c", b"d", b"e", b"f"]
    async with serving(tmp_path) as env:
        call = await send_while_blocked(env, sent)
        await env.retention.run_once()
        got = await answers(call, len(sent))
        await call.done_writing()
        assert [(r.request_id, r.error_code) for r in got] == [(i, 0) for i in range(6)]
        assert [r.base_offset for r in got] == list(range(QUOTA + 1, QUOTA + 7))
        assert await env.values() == sent


async def test_a_refused_request_does_not_hold_back_the_next(tmp_path: Path) -> None:
    """Scenario: as above, but the second request is invalid (neither batch nor records)
    and the third names a topic that does not exist. Expected: "a" is answered OK, the
    second INVALID_ARGUMENT, the third NOT_FOUND, and "d" OK after "a"; the log holds a,
    d."""
    async with serving(tmp_path) as env:
        await env.fill_over_quota()
        call = env.stub.PublishStream()
        await call.write(publish(b"a", 0))
        await eventually(lambda: env.blocked() == 1)
        await call.write(pb.PublishRequest(topic="t", request_id=1))
        await call.write(pb.PublishRequest(topic="nope", records=[pb.Record()], request_id=2))
        await call.write(publish(b"d", 3))
        await eventually(lambda: env.service.read == 4)
        await env.open_quota()
        got = await answers(call, 4)
        await call.done_writing()
        codes = [grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND]
        expected = [code.value[0] for code in (*codes, grpc.StatusCode.OK)]
        assert [r.error_code for r in got] == expected
        assert await env.values() == [b"a", b"d"]


async def test_a_stream_cut_short_while_blocked_leaves_the_rest_in_order(tmp_path: Path) -> None:
    """Scenario: "a" blocks on a stream, "b" and "c" are read behind it, then the client
    cancels the stream; once the broker has ended the call, the quota opens. Expected:
    "a", the publish the stream's answer loop was awaiting, is cancelled with the call
    before it was queued, so nothing of it is written; "b" and "c", read and not
    cancelled, still run to their end and land in order, each once; nothing hangs."""
    async with serving(tmp_path) as env:
        call = await send_while_blocked(env, [b"a", b"b", b"c"])
        call.cancel()
        await eventually(lambda: env.service.ended)
        await env.retention.run_once()
        writer = env.topics.get("t").partition(0).writer
        await eventually(lambda: writer.high_water_mark >= QUOTA + 3)
        assert await env.values() == [b"b", b"c"]
