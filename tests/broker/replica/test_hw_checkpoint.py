"""Tests of the high-watermark checkpoint on a replica's promotion and restart (issue 37):
a log opened fresh starts its mark at the checkpoint (:mod:`wal.hw_checkpoint`), not at
its head, as leader (:class:`broker.replica.leader.LeaderTopic`) and as follower
(:class:`broker.replica.fetcher.FollowerTopic`); a new leader's mark moves only as its
in-sync followers' fetches in its epoch confirm.

Real partitions on tmp dirs; the followers of the leader test are fetch requests made
directly (as in ``test_leader.py``); the follower test's leader is unreachable (nothing
listens), so only the checkpoint can say what is committed.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from broker.partition import Partition
from broker.replica.fetcher import FollowerTopic
from broker.replica.leader import LeaderTopic
from broker.topics import Topic
from cluster.records import TopicRecord, TopicState
from proto import replication_pb2 as pb
from wal import FileSystem, LogConfig, encode_columns

TOPIC_ID = "0123456789abcdef"


def record(owner: str, epoch: int, isr: tuple[str, ...]) -> TopicRecord:
    return TopicRecord(
        "orders",
        TOPIC_ID,
        1,
        0,
        owner,
        epoch,
        TopicState.READY,
        replicas=("b1", "b2", "b3"),
        isr=isr,
        min_insync=2,
    )


async def open_topic(path: Path) -> Topic:
    partition = await Partition.open(0, str(path / "orders"), LogConfig(), FileSystem())
    return Topic("orders", [partition], TOPIC_ID)


async def follower_with_tail(path: Path, *, records: int, committed: int) -> None:
    """b2's log as a follower of b1 at epoch 1 left it: ``records`` one-record batches of
    epoch 1, of which its leader had said ``committed`` were committed (its checkpoint,
    saved when the writer closed); then the process stops."""
    topic = await open_topic(path)
    writer = topic.partitions[0].writer
    writer.hold_commits()
    writer.log.leader_epochs.assign(1, 0)
    for i in range(records):
        await writer.append(encode_columns([b"value-%d" % i]))
    writer.commit_to(committed)
    await topic.partitions[0].aclose()


def fetch_of(node: str, offset: int) -> pb.ReplicaFetchRequest:
    return pb.ReplicaFetchRequest(
        topic="orders",
        topic_id=TOPIC_ID,
        replica_node=node,
        leader_epoch=2,
        logs=[pb.LogFetch(log="p/0", fetch_offset=offset, last_fetched_epoch=1)],
        max_bytes=1 << 20,
        max_wait_ms=0,
    )


async def no_isr_change(_isr: tuple[str, ...]) -> bool:
    return False


@pytest.mark.asyncio
async def test_promoted_follower_shows_its_tail_only_once_committed_in_its_epoch(
    tmp_path: Path,
) -> None:
    """Scenario: b2 followed b1 at epoch 1 and holds 10 records, of which b1 had
    committed 6 (b2's checkpoint); b2 restarts and is elected leader at epoch 2 with isr
    (b2, b3). b3 then fetches in epoch 2 from 8, then from 10. Expected: after the start
    readers see 6 records (not 10: without the checkpoint the mark would be the head),
    the durable end is 10; b3's fetch from 8 moves the mark to 8, from 10 to 10; and the
    checkpoint saved at close is 10."""
    await follower_with_tail(tmp_path, records=10, committed=6)
    topic = await open_topic(tmp_path)
    writer = topic.partitions[0].writer
    assert writer.log.hw_checkpoint.offset == 6
    leader = LeaderTopic(
        topic,
        record("b2", 2, ("b2", "b3")),
        "b2",
        lag_time_max_ms=10_000,
        change_isr=no_isr_change,
        isr_check_s=3600,
    )
    try:
        await leader.start()
        assert writer.durable_end == 10
        assert writer.high_water_mark == 6
        assert [b.base_offset for b in writer.read(0)] == [0, 1, 2, 3, 4, 5]
        answer = await leader.fetch(fetch_of("b3", 8))
        assert answer.error == pb.REPLICA_ERROR_NONE
        assert not answer.logs[0].HasField("diverging")
        assert writer.high_water_mark == 8
        assert answer.logs[0].high_watermark in (6, 8)
        await leader.fetch(fetch_of("b3", 10))
        assert writer.high_water_mark == 10
    finally:
        await leader.aclose()
        await topic.partitions[0].aclose()
    assert (await open_topic(tmp_path)).partitions[0].writer.log.hw_checkpoint.offset == 10


@pytest.mark.asyncio
async def test_new_leader_waits_for_every_in_sync_follower(tmp_path: Path) -> None:
    """Scenario: as above, but the isr at epoch 2 is (b2, b3, b1) and only b3 fetches
    (from 10). Expected: the mark stays at the checkpoint 6: b1 has not confirmed
    anything in this epoch, and a new leader counts a follower as 0 until it fetches."""
    await follower_with_tail(tmp_path, records=10, committed=6)
    topic = await open_topic(tmp_path)
    writer = topic.partitions[0].writer
    leader = LeaderTopic(
        topic,
        record("b2", 2, ("b2", "b3", "b1")),
        "b2",
        lag_time_max_ms=10_000,
        change_isr=no_isr_change,
        isr_check_s=3600,
    )
    try:
        await leader.start()
        await leader.fetch(fetch_of("b3", 10))
        assert writer.high_water_mark == 6
    finally:
        await leader.aclose()
        await topic.partitions[0].aclose()


@pytest.mark.asyncio
async def test_restarted_follower_starts_at_its_checkpoint(tmp_path: Path) -> None:
    """Scenario: b2 holds 10 records of which 6 were committed; it restarts and follows a
    leader it cannot reach. Expected: its mark is 6 (readers see 6 records), not its head
    10, while nothing tells it more."""
    await follower_with_tail(tmp_path, records=10, committed=6)
    topic = await open_topic(tmp_path)
    writer = topic.partitions[0].writer
    follower = FollowerTopic(
        topic,
        record("b1", 1, ("b1", "b2")),
        "b2",
        "127.0.0.1:9",  # the discard port: nothing answers
        channel=grpc.aio.insecure_channel,
        credential=None,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
    )
    try:
        await follower.start()
        assert writer.high_water_mark == 6
        assert len(writer.read(0)) == 6
    finally:
        await follower.aclose()
        await topic.partitions[0].aclose()
