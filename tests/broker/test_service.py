"""Publish, PublishStream and Fetch over real gRPC on loopback, against a real broker."""

from __future__ import annotations

import asyncio
import gc
import logging
import struct
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import cast

import grpc
import pytest

from broker.app import Broker
from broker.error_status import Context
from broker.service import BrokerService
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from proto.batch import crc32c
from tests.broker.conftest import Client, broker_config, serving
from wal import decode_batch, encode_columns


def batch(*values: bytes) -> bytes:
    """One encoded batch of ``values``."""
    return encode_columns(list(values), timestamps_ms=1_700_000_000_000)


def fetched_values(response: pb.FetchResponse) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in a fetch response."""
    out: list[tuple[int, bytes]] = []
    for raw in response.batches:
        decoded = decode_batch(raw)
        assert decoded is not None
        out += zip(decoded.offsets(), decoded.values(), strict=True)
    return out


async def create(client: Client, name: str, partitions: int = 1) -> None:
    await client.admin.CreateTopic(admin.CreateTopicRequest(name=name, partitions=partitions))


@pytest.mark.asyncio
async def test_publish_then_fetch_round_trip(client: Client) -> None:
    """Scenario: two batches published to a one-partition topic, then fetched from 0.
    Expected: offsets 0-1 then 2-4 acknowledged; the fetch returns all five values in order
    and the high-water mark is 5."""
    await create(client, "orders")
    first = await client.broker.Publish(pb.PublishRequest(topic="orders", batch=batch(b"a", b"b")))
    second = await client.broker.Publish(
        pb.PublishRequest(topic="orders", partition=0, batch=batch(b"c", b"d", b"e"))
    )
    assert (first.base_offset, first.last_offset) == (0, 1)
    assert (second.base_offset, second.last_offset) == (2, 4)
    got = await client.broker.Fetch(pb.FetchRequest(topic="orders", partition=0, offset=0))
    assert fetched_values(got) == list(enumerate([b"a", b"b", b"c", b"d", b"e"]))
    assert got.high_water_mark == 5


@pytest.mark.asyncio
async def test_unpartitioned_batches_spread_round_robin(client: Client) -> None:
    """Scenario: six batches with partition -1 to a three-partition topic. Expected: each
    partition receives two, and the responses name the partition chosen."""
    await create(client, "spread", 3)
    chosen = [
        (
            await client.broker.Publish(
                pb.PublishRequest(topic="spread", partition=-1, batch=batch(b"x"))
            )
        ).partition
        for _ in range(6)
    ]
    assert sorted(chosen) == [0, 0, 1, 1, 2, 2]


@pytest.mark.asyncio
async def test_publish_stream_pipelines_and_reports_each_error(client: Client) -> None:
    """Scenario: a stream of 50 good batches with one bad (garbage) batch in the middle.
    Expected: 51 responses in request order; the bad one carries INVALID_ARGUMENT and the
    stream goes on; the good ones hold consecutive offsets."""
    await create(client, "stream")

    async def requests() -> AsyncIterator[pb.PublishRequest]:
        for i in range(51):
            data = b"\x00" * 64 if i == 25 else batch(str(i).encode())
            yield pb.PublishRequest(topic="stream", partition=0, batch=data, request_id=i)

    responses = [r async for r in client.broker.PublishStream(requests())]
    assert [r.request_id for r in responses if r.error_code == 0] == [
        i for i in range(51) if i != 25
    ]
    bad = responses[25]
    assert bad.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "invalid record batch" in bad.error_message
    good = [r.base_offset for r in responses if r.error_code == 0]
    assert good == list(range(50))


@pytest.mark.asyncio
async def test_fetch_waits_for_data_then_wakes_on_publish(client: Client) -> None:
    """Scenario: a fetch at the head with max_wait_ms=5000, then a publish 0.1 s later.
    Expected: the fetch returns the new record long before its deadline."""
    await create(client, "wait")
    fetch = asyncio.ensure_future(
        client.broker.Fetch(pb.FetchRequest(topic="wait", offset=0, max_wait_ms=5000))
    )
    await asyncio.sleep(0.1)
    assert not fetch.done()
    await client.broker.Publish(pb.PublishRequest(topic="wait", batch=batch(b"late")))
    got = await asyncio.wait_for(fetch, 2.0)
    assert fetched_values(got) == [(0, b"late")]


@pytest.mark.asyncio
async def test_data_survives_a_broker_restart(tmp_path: Path) -> None:
    """Scenario: publish, stop the broker gracefully, start a new one on the same data
    directory. Expected: the topic is still listed and fetch returns the records."""
    config = broker_config(tmp_path / "data")
    async with serving(config) as (_, c):
        await create(c, "durable", 2)
        await c.broker.Publish(
            pb.PublishRequest(topic="durable", partition=1, batch=batch(b"kept"))
        )
    async with serving(config) as (_, c):
        listed = await c.admin.ListTopics(admin.ListTopicsRequest())
        assert [(t.name, len(t.partitions)) for t in listed.topics] == [("durable", 2)]
        got = await c.broker.Fetch(pb.FetchRequest(topic="durable", partition=1))
        assert fetched_values(got) == [(0, b"kept")]


def _bad_crc() -> bytes:
    data = bytearray(batch(b"payload"))
    data[-1] ^= 0xFF
    return bytes(data)


def _non_monotonic() -> bytes:
    data = bytearray(batch(b"a", b"b"))
    decoded = decode_batch(bytes(data))
    assert decoded is not None
    struct.pack_into("<i", data, decoded.layout.value_offsets + 4, 99)
    struct.pack_into("<I", data, 12, crc32c(memoryview(data)[16:]))
    return bytes(data)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (
            pb.PublishRequest(topic="missing", batch=batch(b"x")),
            grpc.StatusCode.NOT_FOUND,
            "does not exist",
        ),
        (
            pb.PublishRequest(topic="t", partition=7, batch=batch(b"x")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "partitions 0-0",
        ),
        (
            pb.PublishRequest(topic="t", partition=-5, batch=batch(b"x")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "partition",
        ),
        (
            pb.PublishRequest(topic="t"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "batch, records: both are empty",
        ),
        (
            pb.PublishRequest(topic="t", batch=b"garbage"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid record batch",
        ),
        (
            pb.PublishRequest(topic="t", batch=_bad_crc()),
            grpc.StatusCode.INVALID_ARGUMENT,
            "checksum",
        ),
        (
            pb.PublishRequest(topic="t", batch=_non_monotonic()),
            grpc.StatusCode.INVALID_ARGUMENT,
            "never decrease",
        ),
        (
            pb.PublishRequest(topic="t", batch=batch(b"x" * (2 << 20))),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "max_record_bytes",
        ),
    ],
    ids=[
        "no-topic",
        "no-partition",
        "negative-partition",
        "empty",
        "garbage",
        "bad-crc",
        "bad-offsets",
        "record-too-large",
    ],
)
async def test_bad_publish_gets_a_clear_status_and_appends_nothing(
    client: Client, request_: pb.PublishRequest, code: grpc.StatusCode, words: str
) -> None:
    """Scenario: each kind of bad publish. Expected: its status code, a message naming the
    problem, nothing appended (the head stays 0), and the broker still serves."""
    await create(client, "t")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.broker.Publish(request_)
    assert info.value.code() == code
    assert words in (info.value.details() or "")
    described = await client.admin.DescribeTopic(admin.DescribeTopicRequest(name="t"))
    assert described.partitions[0].head == 0
    ok = await client.broker.Publish(pb.PublishRequest(topic="t", batch=batch(b"fine")))
    assert ok.base_offset == 0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (pb.FetchRequest(topic="missing"), grpc.StatusCode.NOT_FOUND),
        (pb.FetchRequest(topic="t", partition=3), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.FetchRequest(topic="t", offset=-1), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.FetchRequest(topic="t", offset=99), grpc.StatusCode.OUT_OF_RANGE),
        (pb.FetchRequest(topic="t", max_wait_ms=10**6), grpc.StatusCode.INVALID_ARGUMENT),
    ],
    ids=["no-topic", "no-partition", "negative-offset", "past-head", "wait-too-long"],
)
async def test_bad_fetch_gets_a_clear_status(
    client: Client, request_: pb.FetchRequest, code: grpc.StatusCode
) -> None:
    """Scenario: each kind of bad fetch. Expected: its status code and a message."""
    await create(client, "t")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.broker.Fetch(request_)
    assert info.value.code() == code
    assert info.value.details()


@pytest.mark.asyncio
async def test_oversized_message_is_refused_and_the_broker_keeps_serving(
    tmp_path: Path,
) -> None:
    """Scenario: a 2 MiB request to a broker whose max_request_bytes is 1 MiB. Expected:
    RESOURCE_EXHAUSTED from gRPC itself, then a normal publish still succeeds."""
    async with serving(broker_config(tmp_path / "d", max_request_bytes=1 << 20)) as (_, c):
        await create(c, "big")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await c.broker.Publish(pb.PublishRequest(topic="big", batch=b"x" * (2 << 20)))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        ok = await c.broker.Publish(pb.PublishRequest(topic="big", batch=batch(b"ok")))
        assert ok.base_offset == 0


class _OneConnection:
    """The one part of a call's context the stream uses here: its peer (for the
    streams-per-connection count)."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"


@pytest.mark.asyncio
async def test_publish_stream_ended_early_leaves_no_unobserved_task_error(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a PublishStream gets a good publish and then an empty batch, and the call
    ends (as a deadline ends it) right after the first answer, while the second publish is
    still unanswered. Found by the RPC fuzz test: asyncio then logged "Task exception was
    never retrieved". Expected: the good batch is appended; no error is logged."""
    await broker.topics.create("t", 1)
    service = BrokerService(broker.topics, broker.subscriptions, broker.metrics)
    held = asyncio.Event()

    async def requests() -> AsyncIterator[pb.PublishRequest]:
        yield pb.PublishRequest(topic="t", partition=0, batch=batch(b"v"))
        yield pb.PublishRequest(topic="t", partition=0, batch=b"")
        await held.wait()  # the client keeps its side open

    with caplog.at_level(logging.ERROR):
        stream = cast(
            AsyncGenerator[pb.PublishResponse, None],
            service.PublishStream(requests(), cast(Context, _OneConnection())),
        )
        first = await anext(stream)
        await asyncio.sleep(0.01)  # the second publish fails meanwhile, unanswered
        await stream.aclose()
        await asyncio.sleep(0)
        gc.collect()  # an unobserved task error is logged when the task is collected
    assert (first.error_code, first.base_offset) == (0, 0)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
