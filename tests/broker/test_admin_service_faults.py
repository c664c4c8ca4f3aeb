"""CreateTopic and DeleteTopic over real gRPC when the call is cut short, and at scale.

A call whose deadline expires while the change runs gets DEADLINE_EXCEEDED, but the change
runs to its end: a second call of the same name (serialized behind it) then finds the topic
made (ALREADY_EXISTS) or gone (NOT_FOUND), ListTopics and the disk agree, and a restart
changes nothing. A topic of the documented maximum, 10,000 partitions, is created and
served within the process's descriptor limit.
"""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest

from broker.app import Broker
from broker.topics import MAX_PARTITIONS
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer
from proto import admin_pb2 as _admin
from tests.broker.conftest import Client, broker_config, serving

pytestmark = pytest.mark.asyncio(loop_scope="function")

PARTITIONS = 120
DEADLINES_S = [0.0005, 0.005, 0.03, 0.1]


def topics_on_disk(data: Path) -> dict[str, int]:
    """Each topic directory under ``topics/`` and its partition directories; dot entries
    (leftovers) are included so that a test sees them."""
    root = data / "topics"
    return {p.name: sum(1 for d in p.iterdir() if d.is_dir()) for p in root.iterdir() if p.is_dir()}


async def listed(client: Client) -> dict[str, int]:
    """ListTopics as name -> partitions."""
    got = await client.admin.ListTopics(_admin.ListTopicsRequest(), timeout=30)
    return {t.name: len(t.partitions) for t in got.topics}


async def status_of(call: Awaitable[object]) -> grpc.StatusCode:
    """Await ``call``; OK, or the status it failed with."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def create_cut_short(client: Client, name: str, deadline_s: float) -> tuple[bool, bool]:
    """CreateTopic with a deadline of ``deadline_s``; then, serialized behind it, a second
    one. Returns whether the first call was cut short, and whether its change happened."""
    request = _admin.CreateTopicRequest(name=name, partitions=PARTITIONS)
    first = await status_of(client.admin.CreateTopic(request, timeout=deadline_s))
    assert first in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED)
    second = await status_of(client.admin.CreateTopic(request, timeout=60))
    assert second in (grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS)
    return first != grpc.StatusCode.OK, second == grpc.StatusCode.ALREADY_EXISTS


async def delete_cut_short(client: Client, name: str, deadline_s: float) -> tuple[bool, bool]:
    """DeleteTopic with a deadline of ``deadline_s``; then a second one behind it.
    Returns whether the first call was cut short, and whether its change happened."""
    request = _admin.DeleteTopicRequest(name=name)
    first = await status_of(client.admin.DeleteTopic(request, timeout=deadline_s))
    assert first in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED)
    second = await status_of(client.admin.DeleteTopic(request, timeout=60))
    assert second in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND)
    return first != grpc.StatusCode.OK, second == grpc.StatusCode.NOT_FOUND


async def test_admin_calls_past_their_deadline_complete_or_leave_nothing(
    tmp_path: Path,
) -> None:
    """Scenario: for each of four deadlines from 0.5 ms to 100 ms, a CreateTopic of 120
    partitions, then a DeleteTopic of it, each with that deadline, and a CreateTopic of
    another name that stays; then a restart. Expected: each change either happened whole
    or not at all (the second call says which), ListTopics always equals the topic
    directories on disk (no leftovers), and the restart shows the same topics with the same
    partitions. At least one create and one delete were cut short after they began
    (DEADLINE_EXCEEDED, yet done)."""
    data = tmp_path / "data"
    expected: dict[str, int] = {}
    outcomes: list[tuple[str, bool, bool]] = []
    async with serving(broker_config(data)) as (_broker, client):
        for i, deadline in enumerate(DEADLINES_S):
            outcomes.append(("create", *await create_cut_short(client, f"t{i}", deadline)))
            expected[f"t{i}"] = PARTITIONS
            assert await listed(client) == expected == topics_on_disk(data)
            outcomes.append(("delete", *await delete_cut_short(client, f"t{i}", deadline)))
            del expected[f"t{i}"]
            assert await listed(client) == expected == topics_on_disk(data)
            await create_cut_short(client, f"kept{i}", deadline)
            expected[f"kept{i}"] = PARTITIONS
    async with serving(broker_config(data)) as (_broker, client):
        assert await listed(client) == expected == topics_on_disk(data)
    assert ("create", True, True) in outcomes, outcomes
    assert ("delete", True, True) in outcomes, outcomes


async def test_deleting_a_topic_drops_its_subscriptions_for_good(tmp_path: Path) -> None:
    """Scenario: a topic with a subscription holding acked records is deleted with a
    deadline too short to finish, then created again under the same name, and the broker
    restarts. Expected: the old subscription is gone (NOT_FOUND) before and after the
    restart, and a new subscription of that name starts from the new, empty topic."""
    data = tmp_path / "data"
    async with serving(broker_config(data)) as (broker, client):
        address = f"127.0.0.1:{broker.port}"
        async with AsyncAdminClient(address) as admin:
            await admin.create_topic("t", 2)
        async with AsyncProducer(address) as producer:
            await producer.publish("t", b"old", partition=0)
        async with AsyncConsumer("t", "s", broker=address) as consumer:
            message = await asyncio.wait_for(consumer.receive(), 10)
            assert message.value == b"old"
            consumer.ack(message)
        await delete_cut_short(client, "t", 0.0005)
        assert broker.subscriptions.subscriptions("t") == []
        async with AsyncAdminClient(address) as admin:
            await admin.create_topic("t", 2)
    async with serving(broker_config(data)) as (broker, _client):
        assert broker.subscriptions.subscriptions("t") == []
        address = f"127.0.0.1:{broker.port}"
        async with AsyncProducer(address) as producer:
            await producer.publish("t", b"new", partition=0)
        async with AsyncConsumer("t", "s", broker=address) as consumer:
            message = await asyncio.wait_for(consumer.receive(), 10)
        assert (message.value, message.offset) == (b"new", 0)


def open_fds() -> int:
    """Descriptors open in this process."""
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_topic_of_the_maximum_partitions_is_created_and_served(tmp_path: Path) -> None:
    """Scenario: under this machine's descriptor limit (20,000 here), CreateTopic with
    10,000 partitions, the documented maximum (it used to fail with EMFILE after 19 s and
    leave 39,600 files); then records are produced to partitions 0, 5,000 and 9,999 and
    consumed. Expected: the create succeeds; descriptors stay under the soft limit; every
    record comes back from its partition."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    async with Broker(broker_config(tmp_path / "data")) as broker:
        address = f"127.0.0.1:{broker.port}"
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # raised by the broker
        if soft < MAX_PARTITIONS + broker.topics.files.capacity + 1000:
            pytest.skip(f"the descriptor limit here ({soft}) is below what 10,000 need")
        async with AsyncAdminClient(address, timeout_s=180) as admin:
            info = await admin.create_topic("big", MAX_PARTITIONS)
        assert len(info.partitions) == MAX_PARTITIONS
        assert open_fds() < soft
        assert broker.topics.files.busy_count == MAX_PARTITIONS
        wanted = {0: b"first", 5_000: b"middle", 9_999: b"last"}
        async with AsyncProducer(address) as producer:
            for partition, value in wanted.items():
                meta = await producer.publish("big", value, partition=partition)
                assert (meta.partition, meta.offset) == (partition, 0)
        got: dict[int, bytes] = {}
        async with AsyncConsumer("big", "s", broker=address) as consumer:
            async with asyncio.timeout(60):
                while len(got) < len(wanted):
                    message = await consumer.receive()
                    got[message.partition] = message.value
                    consumer.ack(message)
        assert got == wanted
        assert open_fds() < soft
