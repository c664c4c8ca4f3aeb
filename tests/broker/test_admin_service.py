"""Topic administration, health and reflection over real gRPC on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from broker.admin_service import offset_for_time
from broker.app import Broker
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests.broker.conftest import Client, broker_config, serving
from wal import LogWriter, encode_columns


@pytest.mark.asyncio
async def test_create_list_describe_delete(client: Client, tmp_path: Path) -> None:
    """Scenario: create two topics, publish to one, describe, delete the other. Expected:
    both listed in name order; describe shows the head after the publish; after delete only
    one is listed, its directory is gone, and describing the deleted one is NOT_FOUND."""
    await client.admin.CreateTopic(admin.CreateTopicRequest(name="b-topic", partitions=2))
    await client.admin.CreateTopic(admin.CreateTopicRequest(name="a-topic", partitions=1))
    await client.broker.Publish(
        pb.PublishRequest(topic="b-topic", partition=1, batch=encode_columns([b"1", b"2"]))
    )
    listed = await client.admin.ListTopics(admin.ListTopicsRequest())
    assert [t.name for t in listed.topics] == ["a-topic", "b-topic"]
    info = await client.admin.DescribeTopic(admin.DescribeTopicRequest(name="b-topic"))
    assert [(p.partition, p.first_offset, p.head) for p in info.partitions] == [
        (0, 0, 0),
        (1, 0, 2),
    ]
    assert info.partitions[1].size_bytes > 0
    assert info.partitions[1].segments == 1
    await client.admin.DeleteTopic(admin.DeleteTopicRequest(name="a-topic"))
    listed = await client.admin.ListTopics(admin.ListTopicsRequest())
    assert [t.name for t in listed.topics] == ["b-topic"]
    assert not (tmp_path / "data" / "topics" / "a-topic").exists()
    with pytest.raises(grpc.aio.AioRpcError) as info_err:
        await client.admin.DescribeTopic(admin.DescribeTopicRequest(name="a-topic"))
    assert info_err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "partitions", "code", "words"),
    [
        ("dup", 1, grpc.StatusCode.ALREADY_EXISTS, "already exists"),
        ("", 1, grpc.StatusCode.INVALID_ARGUMENT, "not a valid topic name"),
        ("../escape", 1, grpc.StatusCode.INVALID_ARGUMENT, "not a valid topic name"),
        (".hidden", 1, grpc.StatusCode.INVALID_ARGUMENT, "not a valid topic name"),
        ("x" * 201, 1, grpc.StatusCode.INVALID_ARGUMENT, "1-200 characters"),
        ("negative", -1, grpc.StatusCode.INVALID_ARGUMENT, "partitions"),  # 0: the default
        ("huge", 10_001, grpc.StatusCode.INVALID_ARGUMENT, "partitions"),
    ],
    ids=["duplicate", "empty", "path", "dot", "long", "negative-partitions", "many-partitions"],
)
async def test_bad_create_gets_a_clear_status(
    client: Client, name: str, partitions: int, code: grpc.StatusCode, words: str
) -> None:
    """Scenario: each kind of bad CreateTopic. Expected: its status code and a message that
    names the problem; the topic list is unchanged."""
    await client.admin.CreateTopic(admin.CreateTopicRequest(name="dup", partitions=1))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.admin.CreateTopic(admin.CreateTopicRequest(name=name, partitions=partitions))
    assert info.value.code() == code
    assert words in (info.value.details() or "")
    listed = await client.admin.ListTopics(admin.ListTopicsRequest())
    assert [t.name for t in listed.topics] == ["dup"]


@pytest.mark.asyncio
async def test_delete_missing_topic_is_not_found(client: Client) -> None:
    """Scenario: delete a topic that never existed. Expected: NOT_FOUND naming it."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.admin.DeleteTopic(admin.DeleteTopicRequest(name="ghost"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "ghost" in (info.value.details() or "")


@pytest.mark.asyncio
async def test_auto_create_on_publish_when_enabled(tmp_path: Path) -> None:
    """Scenario: a broker with auto_create_topics and default_partitions 3 gets a publish to
    an unknown topic. Expected: the topic is created with 3 partitions and the publish
    succeeds."""
    config = broker_config(tmp_path / "d", auto_create_topics=True, default_partitions=3)
    async with serving(config) as (_, c):
        ok = await c.broker.Publish(
            pb.PublishRequest(topic="fresh", partition=2, batch=encode_columns([b"v"]))
        )
        assert (ok.partition, ok.base_offset) == (2, 0)
        info = await c.admin.DescribeTopic(admin.DescribeTopicRequest(name="fresh"))
        assert len(info.partitions) == 3


@pytest.mark.asyncio
async def test_interrupted_create_is_cleaned_up_on_start(tmp_path: Path) -> None:
    """Scenario: a topic directory without topic.json (a crash mid-create) and a leftover
    `.x.deleting` directory. Expected: the broker starts, removes both, lists no topics."""
    topics = tmp_path / "d" / "topics"
    (topics / "half" / "0").mkdir(parents=True)
    (topics / ".gone.deleting" / "0").mkdir(parents=True)
    async with serving(broker_config(tmp_path / "d")) as (_, c):
        listed = await c.admin.ListTopics(admin.ListTopicsRequest())
    assert list(listed.topics) == []
    assert sorted(p.name for p in topics.iterdir()) == []


@pytest.mark.asyncio
async def test_health_serving_then_not_serving_on_shutdown(tmp_path: Path) -> None:
    """Scenario: check health of a running broker, then watch it while the broker shuts
    down. Expected: SERVING for the server and both services; NOT_SERVING is reported
    before the server goes away."""
    running = Broker(broker_config(tmp_path / "d"))
    await running.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "headrace.v1.Broker", "headrace.v1.Admin"):
            got = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert got.status == health_pb2.HealthCheckResponse.SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        await running.aclose()
        second = await watch.read()
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.asyncio
async def test_server_reflection_lists_the_services(client: Client) -> None:
    """Scenario: ask server reflection for its services. Expected: both headrace.v1
    services, health and reflection itself."""
    stub = reflection_pb2_grpc.ServerReflectionStub(client.channel)
    call = stub.ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    response = await call.read()
    await call.done_writing()
    names = {s.name for s in response.list_services_response.service}
    assert {"headrace.v1.Broker", "headrace.v1.Admin", "grpc.health.v1.Health"} <= names


@pytest.mark.asyncio(loop_scope="function")
async def test_seek_by_time_scans_many_reads_on_the_loop_and_yields(tmp_path: Path) -> None:
    """Scenario: 3,000 one-record batches of 1 KiB (about three scan reads), record i
    stamped 1000 + i; the first offset at or after stamp 3500 is asked for, while another
    task counts loop turns.
    Expected: offset 2500; the scan gave the loop turns between its reads; a time past
    every record gives the head."""
    async with await LogWriter.open(str(tmp_path / "p0")) as writer:
        for i in range(3_000):
            await writer.append(encode_columns([b"x" * 1024], timestamps_ms=1000 + i))
        turns = 0
        stop = asyncio.Event()

        async def count_turns() -> None:
            nonlocal turns
            while not stop.is_set():
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.create_task(count_turns())
        await asyncio.sleep(0)
        before = turns
        assert await offset_for_time(writer, 3_500) == 2_500
        stop.set()
        await counter
        assert turns - before >= 2
        assert await offset_for_time(writer, 10_000) == 3_000
