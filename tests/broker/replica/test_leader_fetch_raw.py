"""Tests of the leader's serialized fetch answer (:meth:`LeaderTopic.fetch_raw`): the
batches spliced into the encoded answer, one read shared by the followers that ask the
same, and what the followers get from it.

Real partitions on tmp dirs (the ``orders`` topic of :mod:`tests.broker.replica.test_leader`,
led by b1, followers b2 and b3) and fetches made by calling the leader directly.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from broker.partition import Partition
from broker.replica.answers import encode as _encode
from broker.replica.fetch_rules import LogPosition, RestartAt, plan, reply_from_pb
from broker.replica.leader import LeaderTopic
from broker.topics import Topic
from proto import replication_pb2 as pb
from tests.broker.replica.test_leader import (
    TOPIC_ID,
    Isr,
    fetch_request,
    leading,
    publish,
    record,
)
from tests.wal.test_read_raw import GatedFs
from wal import LogConfig, LogWriter, iter_batches


def test_the_spliced_encoding_parses_as_the_message_built_with_its_batches() -> None:
    """Scenario: 200 random answers (0-3 logs, each with or without an error, epochs, a
    divergence, and batches of 0 to 70,000 bytes, so their lengths take one to three
    varint bytes) encoded by ``_encode``. Expected: each parses to exactly the message
    built the ordinary way with the batches assigned to each log."""
    rng = random.Random(37)
    for _ in range(200):
        head = pb.ReplicaFetchResponse(
            leader_epoch=rng.randint(0, 1 << 40),
            log_ids=[f"p/{i}" for i in range(rng.randint(0, 4))],
        )
        logs, chunks = [], []
        for i in range(rng.randint(0, 3)):
            data = pb.LogData(
                log=f"p/{i}",
                high_watermark=rng.randint(0, 1 << 33),
                log_start=rng.randint(0, 100),
                log_end=rng.randint(0, 1 << 33),
                error=rng.choice([pb.REPLICA_ERROR_NONE, pb.OFFSET_OUT_OF_RANGE]),
            )
            data.epochs.extend(pb.EpochStart(epoch=e, start_offset=e * 10) for e in range(3))
            if rng.random() < 0.2:
                data.diverging.CopyFrom(pb.Divergence(epoch=1, end_offset=5))
            logs.append(data)
            chunks.append(rng.randbytes(rng.choice([0, 1, 127, 128, 16_383, 16_384, 70_000])))
        expected = pb.ReplicaFetchResponse()
        expected.CopyFrom(head)
        for data, chunk in zip(logs, chunks, strict=True):
            entry = expected.logs.add()
            entry.CopyFrom(data)
            entry.batches = chunk
        assert pb.ReplicaFetchResponse.FromString(_encode(head, logs, chunks)) == expected


@pytest.mark.asyncio
async def test_followers_at_the_same_offset_share_one_read_of_byte_identical_batches(
    tmp_path: Path,
) -> None:
    """Scenario: 30 publishes durable on the leader; b2 and b3 fetch partition 0 from 0
    with the same max_bytes; then 5 more publishes and b2 fetches from 0 again.
    Expected: both answers carry the same batches, the log's bytes from 0 to its durable
    end, and the second follower's came from the first one's read (kept for one other
    follower, then dropped once taken); a read kept is dropped as soon as the durable end
    moves; the next read is made anew and carries the new batches too. A follower log
    fed the answer ends byte-identical."""
    async with leading(tmp_path, record()) as (leader, topic, _clock, _isr):
        await publish(topic, 30)
        writer = topic.partitions[0].writer
        led = leader._logs["p/0"]
        first = await leader.fetch(fetch_request("b2", {"p/0": 0, "p/1": 0}))
        shared = led.last_read
        assert shared is not None
        assert led.shares_left == 1  # kept for b3
        second = await leader.fetch(fetch_request("b3", {"p/0": 0, "p/1": 0}))
        assert led.last_read is None  # b3 took it (a read of its own would be kept anew)
        raw = await writer.read_raw(0, 1 << 30, durable=True)
        assert first.logs[0].batches == second.logs[0].batches == raw == shared[1]
        assert [b.next_offset for b in iter_batches(raw)][-1] == writer.durable_end == 30
        await leader.fetch(fetch_request("b2", {"p/0": 0, "p/1": 0}))
        assert led.last_read is not None
        await publish(topic, 5)
        assert led.last_read is None  # the durable end moved: nobody could share it
        third = await leader.fetch(fetch_request("b2", {"p/0": 0, "p/1": 0}))
        assert led.last_read is not None
        assert led.last_read is not shared
        assert len(list(iter_batches(third.logs[0].batches))) == 35
        follower = await LogWriter.open(str(tmp_path / "follower"), LogConfig())
        try:
            assert await follower.append_replicated(third.logs[0].batches) == 35
            assert await follower.read_raw(0, 1 << 30) == third.logs[0].batches
        finally:
            await follower.aclose()


@pytest.mark.asyncio
async def test_max_bytes_still_gives_one_whole_batch_and_bounds_the_rest(tmp_path: Path) -> None:
    """Scenario: 10 durable one-record batches; b2 fetches with max_bytes 1, b3 with a
    budget of three batches. Expected: b2 gets exactly one whole batch (bigger than its
    max_bytes, as Kafka), b3 three; each answer's batches start at offset 0."""
    async with leading(tmp_path, record()) as (leader, topic, _clock, _isr):
        await publish(topic, 10)
        size = len(await topic.partitions[0].writer.read_raw(0, 1, durable=True))
        one = await leader.fetch(fetch_request("b2", {"p/0": 0, "p/1": 0}, max_bytes=1))
        three = await leader.fetch(fetch_request("b3", {"p/0": 0, "p/1": 0}, max_bytes=3 * size))
        assert [b.base_offset for b in iter_batches(one.logs[0].batches)] == [0]
        assert [b.base_offset for b in iter_batches(three.logs[0].batches)] == [0, 1, 2]
        assert one.leader_epoch == three.leader_epoch == 1
        assert list(one.log_ids) == ["p/0", "p/1"]


@pytest.mark.asyncio
async def test_retention_under_a_cold_read_answers_out_of_range_from_the_new_start(
    tmp_path: Path,
) -> None:
    """Scenario: partition 0 in 4 KiB segments; b2 fetches it from 0 and the read goes to
    a cold-read thread (the oldest segment out of the page cache), held in its first
    pread while retention deletes the two oldest segments. Expected: the answer for p/0
    is OFFSET_OUT_OF_RANGE with no batches and log_start the new first offset (not the 0
    it was when the fetch began), so the follower's rule restarts its log there at once
    rather than backing off."""
    fs = GatedFs()
    config = LogConfig(segment_bytes=4096, index_interval_bytes=256, tail_cache_bytes=0)
    parts = [await Partition.open(i, str(tmp_path / "orders"), config, fs) for i in range(2)]
    topic = Topic("orders", parts, TOPIC_ID)
    leader = LeaderTopic(
        topic, record(), "b1", lag_time_max_ms=10_000, change_isr=Isr(), isr_check_s=3600
    )
    try:
        await leader.start()
        await publish(topic, 200)
        writer = parts[0].writer
        segments = sorted(
            p.name for p in (tmp_path / "orders" / "0").iterdir() if p.suffix == ".log"
        )
        assert len(segments) > 3
        fs.cold.add(segments[0])
        fs.gate = segments[0]
        answer = asyncio.create_task(leader.fetch(fetch_request("b2", {"p/0": 0, "p/1": 0})))
        for _ in range(500):
            if fs.entered.is_set():
                break
            await asyncio.sleep(0.01)
        assert fs.entered.is_set(), "the read never went to a cold-read thread"
        floor = int(segments[2].split(".")[0])
        await writer.delete_before(floor)
        fs.release.set()
        data = (await answer).logs[0]
        assert (data.error, data.batches, data.log_start) == (pb.OFFSET_OUT_OF_RANGE, b"", floor)
        action = plan(LogPosition(0, 0, ()), reply_from_pb(data))
        assert isinstance(action, RestartAt)
        assert action.offset == floor
    finally:
        await leader.aclose()
        for p in parts:
            await p.aclose()
