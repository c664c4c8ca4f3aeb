"""The follower against the real leader: :class:`~broker.replica.fetcher.FollowerTopic`
fetching over gRPC on loopback from a :class:`~broker.replica.leader.LeaderTopic`
(served by a thin servicer here, standing in for the broker's Replication service).

Checks that the two sides agree on the protocol: the follower's fetch offsets are what
moves the leader's high watermark (a publish is acknowledged only once the follower has
it), and a divergent tail is cut where the leader says.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.replica.fetcher import FollowerTopic
from broker.replica.leader import LeaderTopic
from broker.replica.service import fetch_stream
from broker.topics import Topic
from cluster.records import TopicRecord
from proto import replication_pb2 as pb
from proto import replication_pb2_grpc as pb_grpc
from tests._helpers import eventually
from tests.broker.replica.fake_leader import Publisher, batch, close_topic, open_topic, record
from tests.broker.replica.test_fetcher import assert_identical, caught_up

Context = grpc.aio.ServicerContext[Any, Any]


class Servicer:
    """The Replication service over one LeaderTopic."""

    def __init__(self, leader: LeaderTopic) -> None:
        self.leader = leader

    async def ReplicaFetch(  # noqa: N802 - the RPC's name
        self, request: pb.ReplicaFetchRequest, context: Context
    ) -> pb.ReplicaFetchResponse:
        return await self.leader.fetch(request)

    async def ReplicaStream(  # noqa: N802 - the RPC's name
        self, requests: AsyncIterator[pb.ReplicaFetchRequest], context: Context
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        stream = fetch_stream(requests, context, self.leader.fetch, self.leader.note_progress)
        async for answer in stream:
            yield answer

    async def OffsetForLeaderEpoch(  # noqa: N802 - the RPC's name
        self, request: pb.OffsetForLeaderEpochRequest, context: Context
    ) -> pb.OffsetForLeaderEpochResponse:
        epoch, end = self.leader.offset_for_epoch(request.log, request.epoch)
        return pb.OffsetForLeaderEpochResponse(epoch=epoch, end_offset=end)


async def _no_change(_isr: tuple[str, ...]) -> bool:
    return False


@asynccontextmanager
async def leading(topic: Topic, rec: TopicRecord) -> AsyncIterator[tuple[LeaderTopic, int]]:
    """``topic`` led by b1 at ``rec.epoch``, served on a loopback port."""
    leader = LeaderTopic(topic, rec, "b1", lag_time_max_ms=60_000, change_isr=_no_change)
    await leader.start()
    server = grpc.aio.server()
    pb_grpc.add_ReplicationServicer_to_server(Servicer(leader), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield leader, port
    finally:
        await leader.aclose()
        await server.stop(0)


@asynccontextmanager
async def following(topic: Topic, port: int, epoch: int) -> AsyncIterator[FollowerTopic]:
    follower = FollowerTopic(
        topic,
        record(epoch),
        "b2",
        f"127.0.0.1:{port}",
        channel=grpc.aio.insecure_channel,
        credential=None,
        max_bytes=4096,
        max_wait_ms=200,
    )
    await follower.start()
    try:
        yield follower
    finally:
        await follower.aclose()


@pytest.mark.asyncio
async def test_publishes_are_acknowledged_once_the_follower_has_them(tmp_path: Path) -> None:
    """Scenario: b1 leads (isr b1, b2; min_insync 2) and 60 publishes per partition wait
    for the watermark; b2 follows over gRPC. Expected: no ack before b2 fetches; all of
    them once it does; b2 ends byte-identical with the leader's epochs [(1, 0)]; b2's
    mark reaches the leader's."""
    leader_topic = await open_topic(tmp_path / "b1")
    follower_topic = await open_topic(tmp_path / "b2")
    async with leading(leader_topic, record(1).replace(min_insync=2)) as (_leader, port):
        acks = [
            asyncio.create_task(p.append(batch(7, 3 * i)))
            for p in leader_topic.partitions
            for i in range(60)
        ]
        await asyncio.sleep(0.2)
        assert not any(a.done() for a in acks)  # nobody has them but the leader
        async with following(follower_topic, port, 1) as follower:
            async with asyncio.timeout(15):
                results = await asyncio.gather(*acks)
            assert not any(duplicate for _offsets, duplicate in results)
            await caught_up(follower, leader_topic)
            pairs = list(zip(follower_topic.partitions, leader_topic.partitions, strict=True))
            await eventually(
                lambda: all(m.writer.high_water_mark == t.writer.high_water_mark for m, t in pairs)
            )
    assert_identical(leader_topic, follower_topic)
    for p in follower_topic.partitions:
        assert [tuple(e) for e in p.log.leader_epochs.entries()] == [(1, 0)]
    await close_topic(leader_topic)
    await close_topic(follower_topic)


@pytest.mark.asyncio
async def test_a_divergent_tail_is_cut_where_the_real_leader_says(tmp_path: Path) -> None:
    """Scenario: b1 and b2 share 40 batches of epoch 1 (b2 copied them from b1 leading
    at epoch 1); b2 then appended 25 batches of its own at epoch 2; b1 leads again at
    epoch 3 and appends 15 batches. b2 follows at epoch 3. Expected: b2's logs are cut
    to the shared end (one cut per partition) and end byte-identical, epochs
    [(1, 0), (3, shared end)]."""
    leader_topic = await open_topic(tmp_path / "b1")
    follower_topic = await open_topic(tmp_path / "b2")
    await Publisher().publish(leader_topic, 1, 40)
    async with (
        leading(leader_topic, record(1)) as (_leader, port),
        following(follower_topic, port, 1) as follower,
    ):
        await caught_up(follower, leader_topic)
    shared = [p.writer.head for p in leader_topic.partitions]
    for p in follower_topic.partitions:
        p.writer.release_commits()
    await Publisher(9).publish(follower_topic, 2, 25)
    async with leading(leader_topic, record(3)) as (_leader, port):
        for p in leader_topic.partitions:
            for i in range(15):
                p.writer.release_commits()  # nobody acks in this test: append unheld
                await p.append(batch(11, 3 * i))
        async with following(follower_topic, port, 3) as follower:
            await caught_up(follower, leader_topic)
            assert follower.truncations == 2
    assert_identical(leader_topic, follower_topic)
    for p, end in zip(follower_topic.partitions, shared, strict=True):
        assert [tuple(e) for e in p.log.leader_epochs.entries()] == [(1, 0), (3, end)]
    await close_topic(leader_topic)
    await close_topic(follower_topic)
