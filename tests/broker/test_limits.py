"""Every ``[limits]`` key over real gRPC on loopback: at the limit a request passes, one
over it fails with INVALID_ARGUMENT or RESOURCE_EXHAUSTED and a message naming the limit
and its key, and the broker keeps serving. Also :class:`broker.limits.StreamSlots` and
:class:`broker.limits.LimitsConfig` on their own (pure)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from broker.config import BrokerConfig
from broker.errors import LimitExceededError
from broker.limits import LimitsConfig, StreamSlots
from broker.metrics import BrokerMetrics
from broker.service import BrokerService
from client.errors import ResourceExhausted, from_rpc_error
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests.broker.conftest import Client, broker_config, serving
from tests.broker.test_service import create
from wal import encode_columns

LIMITS = LimitsConfig(
    max_headers_per_record=4,
    max_header_bytes=64,
    max_header_name_bytes=8,
    max_partitions_per_topic=4,
    max_subscriptions_per_topic=2,
    max_consumers_per_subscription=2,
    max_streams_per_connection=3,
    max_credit_per_consumer=10,
)
RESOURCE = grpc.StatusCode.RESOURCE_EXHAUSTED
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def test_stream_slots_count_per_peer() -> None:
    """Scenario: two slots; peer A opens two streams, a third, then releases one; peer B
    opens one meanwhile. Expected: A's third fails naming the key; B is not affected; after
    A releases one, A gets a stream again."""
    slots = StreamSlots(2)
    slots.acquire("a")
    slots.acquire("a")
    slots.acquire("b")
    with pytest.raises(LimitExceededError, match=r"\(\[limits\] max_streams_per_connection\)"):
        slots.acquire("a")
    slots.release("a")
    slots.acquire("a")
    assert (slots.open_streams("a"), slots.open_streams("b")) == (2, 1)


@pytest.mark.parametrize(
    ("key", "value"), [("max_credit_per_consumer", 0), ("max_streams_per_connection", True)]
)
def test_limits_out_of_range_are_refused(key: str, value: object) -> None:
    """Scenario: a limit set out of its range (or to a bool). Expected: ValueError naming
    the key and the range."""
    with pytest.raises(ValueError, match=rf"\[limits\] {key} = .*must be an integer from"):
        LimitsConfig(**{key: value})  # type: ignore[arg-type]


def _config(tmp_path: Path, **changes: object) -> BrokerConfig:
    return broker_config(tmp_path / "data", limits=LIMITS, **changes)


async def _still_serving(client: Client) -> None:
    listed = await client.admin.ListTopics(admin.ListTopicsRequest())
    assert "t" in [t.name for t in listed.topics]


def _publish(headers: dict[str, bytes]) -> pb.PublishRequest:
    data = encode_columns([b"ok", b"v"], timestamps_ms=1, headers=[{}, headers])
    return pb.PublishRequest(topic="t", batch=data)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("at_limit", "over", "key", "found"),
    [
        (
            {f"h{i}": b"" for i in range(4)},
            {f"h{i}": b"" for i in range(5)},
            "max_headers_per_record",
            "record 1 has 5 headers; the limit is 4",
        ),
        (
            {"a": b"x" * 63},
            {"a": b"x" * 64},
            "max_header_bytes",
            "record 1 has 65 bytes of header names and values; the limit is 64",
        ),
        (
            {"abcdefgh": b""},
            {"abcdefghi": b""},
            "max_header_name_bytes",
            "record 1 has a header name of 9 bytes; the limit is 8",
        ),
    ],
)
async def test_header_limits_over_grpc(
    tmp_path: Path, at_limit: dict[str, bytes], over: dict[str, bytes], key: str, found: str
) -> None:
    """Scenario: Publish a batch whose second record's headers are at a limit, then one
    over it. Expected: the first is appended; the second fails INVALID_ARGUMENT, names the
    record, the limit and its key, appends nothing; the broker keeps serving."""
    async with serving(_config(tmp_path)) as (_broker, client):
        await create(client, "t")
        ok = await client.broker.Publish(_publish(at_limit))
        assert (ok.base_offset, ok.last_offset) == (0, 1)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.broker.Publish(_publish(over))
        assert info.value.code() == INVALID
        assert found in (info.value.details() or "")
        assert f"([limits] {key})" in (info.value.details() or "")
        again = await client.broker.Publish(_publish(at_limit))
        assert again.base_offset == 2  # nothing of the refused batch was appended
        await _still_serving(client)


@pytest.mark.asyncio
async def test_partitions_per_topic(tmp_path: Path) -> None:
    """Scenario: create topics with 4 partitions (the limit) and 5. Expected: the first
    exists; the second fails INVALID_ARGUMENT naming the key and is not created."""
    async with serving(_config(tmp_path)) as (_broker, client):
        await create(client, "t", 4)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await create(client, "u", 5)
        assert info.value.code() == INVALID
        assert "must be from 1 to 4 ([limits] max_partitions_per_topic), got 5" in (
            info.value.details() or ""
        )
        listed = await client.admin.ListTopics(admin.ListTopicsRequest())
        assert [t.name for t in listed.topics] == ["t"]


class Stream:
    """A Subscribe stream held open until :meth:`close` (the read/write API only)."""

    def __init__(self, client: Client, first: pb.SubscribeRequest) -> None:
        self._more: asyncio.Queue[pb.SubscribeRequest | None] = asyncio.Queue()
        self._more.put_nowait(first)
        self.call = client.broker.Subscribe(self._requests())

    async def _requests(self) -> AsyncIterator[pb.SubscribeRequest]:
        while (request := await self._more.get()) is not None:
            yield request

    def send(self, request: pb.SubscribeRequest) -> None:
        self._more.put_nowait(request)

    async def opened(self) -> pb.SubscribeResponse:
        """The ``subscribed`` answer (raises the call's error if it failed)."""
        async with asyncio.timeout(5):
            return await self.call.read()  # type: ignore[no-any-return]

    async def error(self) -> grpc.aio.AioRpcError:
        """The status the stream ends with."""
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await self.drain()
        return info.value

    async def drain(self) -> None:
        """Read until the stream ends (raises its error, if any)."""
        async with asyncio.timeout(5):
            while await self.call.read() is not grpc.aio.EOF:
                pass

    def close(self) -> None:
        """Half-close: the broker ends the stream and lets the consumer go."""
        self._more.put_nowait(None)


def _open(subscription: str = "s", credit: int = 1) -> pb.SubscribeRequest:
    """Open shared subscription ``subscription`` of topic t with ``credit``."""
    return pb.SubscribeRequest(
        open=pb.OpenSubscription(
            topic="t", subscription=subscription, type=pb.SHARED, initial_credit=credit
        )
    )


def _assert_limit(error: grpc.aio.AioRpcError, key: str, words: str) -> None:
    assert error.code() == RESOURCE, error
    assert words in (error.details() or "")
    assert f"([limits] {key})" in (error.details() or "")


@pytest.mark.asyncio
async def test_subscriptions_per_topic(tmp_path: Path) -> None:
    """Scenario: consumers open subscriptions a and b of topic t (the limit is 2), then c;
    then a again. Expected: c fails RESOURCE_EXHAUSTED naming the key and is not created;
    an existing subscription still opens."""
    async with serving(_config(tmp_path)) as (_broker, client):
        await create(client, "t")
        streams = [Stream(client, _open(name)) for name in ("a", "b")]
        for s in streams:
            await s.opened()
        third = Stream(client, _open("c"))
        _assert_limit(
            await third.error(), "max_subscriptions_per_topic", "topic 't' has 2 subscriptions"
        )
        for s in streams:
            s.close()
        listed = await client.admin.ListSubscriptions(admin.ListSubscriptionsRequest(topic="t"))
        assert sorted(s.subscription for s in listed.subscriptions) == ["a", "b"]
        again = Stream(client, _open("a"))
        assert (await again.opened()).subscribed.subscription == "a"
        again.close()


@pytest.mark.asyncio
async def test_consumers_per_subscription(tmp_path: Path) -> None:
    """Scenario: two consumers join shared subscription s (the limit), then a third; then
    one leaves and a fourth joins. Expected: the third fails RESOURCE_EXHAUSTED naming the
    key; the fourth, after one left, is attached."""
    async with serving(_config(tmp_path)) as (_broker, client):
        await create(client, "t")
        first, second = Stream(client, _open()), Stream(client, _open())
        await first.opened()
        await second.opened()
        _assert_limit(
            await Stream(client, _open()).error(),
            "max_consumers_per_subscription",
            "subscription 's' on topic 't' has 2 consumers",
        )
        first.close()
        await first.drain()
        fourth = Stream(client, _open())
        assert (await fourth.opened()).subscribed.subscription == "s"
        second.close()
        fourth.close()


@pytest.mark.asyncio
async def test_credit_per_consumer(tmp_path: Path) -> None:
    """Scenario: a consumer opens with 11 records of credit (the limit is 10); another opens
    with 10, then asks for 1 more. Expected: both over-limit requests fail RESOURCE_EXHAUSTED
    naming the key; opening at the limit works."""
    async with serving(_config(tmp_path)) as (_broker, client):
        await create(client, "t")
        _assert_limit(
            await Stream(client, _open(credit=11)).error(),
            "max_credit_per_consumer",
            "holding 0 records of credit asked for 11 more",
        )
        stream = Stream(client, _open(credit=10))
        await stream.opened()
        stream.send(pb.SubscribeRequest(credit=1))
        _assert_limit(
            await stream.error(),
            "max_credit_per_consumer",
            "holding 10 records of credit asked for 1 more",
        )
        await _still_serving(client)


@pytest.mark.asyncio
async def test_streams_per_connection(tmp_path: Path) -> None:
    """Scenario: on one connection, three Subscribe streams are open (the limit); a fourth
    Subscribe and a PublishStream are opened; then one stream ends and a Subscribe opens;
    and another connection opens a stream. Expected: the fourth stream and the
    PublishStream fail RESOURCE_EXHAUSTED naming the key and the peer; after one ended a
    new one opens; the other connection is not affected."""
    limits = dataclasses.replace(LIMITS, max_consumers_per_subscription=10)
    config = broker_config(tmp_path / "data", limits=limits)
    async with serving(config) as (broker, client):
        await create(client, "t")
        streams = [Stream(client, _open(credit=1)) for _ in range(3)]
        for s in streams:
            await s.opened()
        _assert_limit(
            await Stream(client, _open()).error(),
            "max_streams_per_connection",
            "has 3 open streams",
        )
        publishes = client.broker.PublishStream(_one_publish())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(publishes.read(), 5)
        _assert_limit(info.value, "max_streams_per_connection", "connection ipv4:127.0.0.1:")
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{broker.port}", options=[("grpc.use_local_subchannel_pool", 1)]
        ) as other:
            elsewhere = Stream(Client(other), _open())
            assert (await elsewhere.opened()).subscribed.subscription == "s"
            elsewhere.close()
        streams[0].close()
        await streams[0].drain()
        replacement = Stream(client, _open())
        await replacement.opened()
        for s in (*streams[1:], replacement):
            s.close()


async def _one_publish() -> AsyncIterator[pb.PublishRequest]:
    yield pb.PublishRequest(topic="t", batch=encode_columns([b"x"], timestamps_ms=1))


REQUEST_LIMIT = 64 << 10


def _publish_of_size(size: int) -> pb.PublishRequest:
    """A one-record Publish to ``t`` whose serialized size is exactly ``size`` bytes."""
    request = pb.PublishRequest(topic="t", records=[pb.Record(value=b"")])
    request.records[0].value = bytes(size - request.ByteSize())
    while request.ByteSize() > size:  # the value's length prefix grew by a byte or two
        request.records[0].value = request.records[0].value[:-1]
    assert request.ByteSize() == size
    return request


@pytest.mark.asyncio
async def test_max_request_bytes_is_the_transports_limit(tmp_path: Path) -> None:
    """Scenario: max_request_bytes is 64 KiB; Publishes of exactly limit - 1, limit,
    limit + 1 and 2 x limit serialized bytes, over real gRPC, then a small one.
    Expected: limit - 1 and limit are appended (offsets 0 and 1); limit + 1 and
    2 x limit are RESOURCE_EXHAUSTED from gRPC itself ("... (<size> vs. 65536)": the
    setting, not twice it), which the client's translation restates naming the size, the
    limit and ``[broker] max_request_bytes``; the broker keeps serving (offset 2)."""
    async with serving(_config(tmp_path, max_request_bytes=REQUEST_LIMIT)) as (_, client):
        await create(client, "t")
        for offset, size in enumerate((REQUEST_LIMIT - 1, REQUEST_LIMIT)):
            got = await client.broker.Publish(_publish_of_size(size))
            assert (got.base_offset, got.last_offset) == (offset, offset)
        for size in (REQUEST_LIMIT + 1, 2 * REQUEST_LIMIT):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await client.broker.Publish(_publish_of_size(size))
            assert info.value.code() == RESOURCE
            assert f"({size} vs. {REQUEST_LIMIT})" in (info.value.details() or "")
            error = from_rpc_error(info.value)
            assert isinstance(error, ResourceExhausted)
            assert str(error).startswith(
                f"request is {size} bytes, over the broker's limit of {REQUEST_LIMIT} "
                "bytes ([broker] max_request_bytes); "
            )
        small = await client.broker.Publish(
            pb.PublishRequest(topic="t", batch=encode_columns([b"x"], timestamps_ms=1))
        )
        assert small.base_offset == 2


@pytest.mark.asyncio
async def test_publish_stream_stops_reading_at_in_flight_limit() -> None:
    """Scenario: a PublishStream of 10 requests with max_publish_stream_in_flight 3, while
    every publish is held (a unit-test aid replaces the append). Expected: the broker reads
    exactly 3 requests and then stops reading (backpressure, no error); once publishes
    complete, all 10 are answered in order, and at no time were more than 3 read and not
    yet answered."""
    service = BrokerService(
        cast(Any, None),
        cast(Any, None),
        BrokerMetrics(),
        limits=LimitsConfig(max_publish_stream_in_flight=3),
    )
    gate = asyncio.Event()
    pulled = 0

    async def held_publish(request: pb.PublishRequest, **_: object) -> pb.PublishResponse:
        await gate.wait()
        return pb.PublishResponse(request_id=request.request_id)

    async def requests() -> AsyncIterator[pb.PublishRequest]:
        nonlocal pulled
        for i in range(10):
            pulled += 1
            yield pb.PublishRequest(request_id=i)

    service._publish = held_publish  # type: ignore[method-assign]
    stream = service._publish_stream(requests(), cast(Any, None))  # no request fails to parse
    first = asyncio.ensure_future(anext(stream))
    for _ in range(100):  # let the reader run as far as it can
        await asyncio.sleep(0)
    assert pulled == 3
    assert not first.done()
    gate.set()
    answered = [(await first).request_id]
    async for response in stream:
        assert pulled - len(answered) <= 3
        answered.append(response.request_id)
    assert answered == list(range(10))


@pytest.mark.asyncio
async def test_producers_per_partition(tmp_path: Path) -> None:
    """Scenario: cap 16; 100 publishes, each from a new idempotent producer id (as a fuzzer
    or a crowd of short-lived producers sends), then one retention pass. Expected: every
    publish is appended (the cap is not an error); the newest producer's retry is still a
    duplicate; the partition remembers 16 producers; the pass counts the 84 forgotten in
    headrace_expired_producer_ids_total."""
    limits = dataclasses.replace(LIMITS, max_producers_per_partition=16)
    config = broker_config(tmp_path / "data", limits=limits)
    async with serving(config) as (broker, client):
        await create(client, "t", 1)
        for pid in range(1_000, 1_100):
            batch = encode_columns([b"v"], producer_id=pid, base_sequence=0)
            answer = await client.broker.Publish(pb.PublishRequest(topic="t", batch=batch))
            assert (answer.error_code, answer.duplicate) == (0, False)
        retry = encode_columns([b"v"], producer_id=1_099, base_sequence=0)
        answer = await client.broker.Publish(pb.PublishRequest(topic="t", batch=retry))
        assert (answer.duplicate, answer.base_offset) == (True, 99)
        partition = broker.topics.get("t").partition(0)
        assert partition.producer_count == 16
        await broker.retention.run_once()
        labels = {"topic": "t", "partition": "0"}
        sample = broker.metrics.registry.get_sample_value(
            "headrace_expired_producer_ids_total", labels
        )
        assert sample == 84
