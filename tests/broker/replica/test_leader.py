"""Tests of :class:`broker.replica.leader.LeaderTopic` with real partitions on tmp dirs and
fake followers that call :meth:`LeaderTopic.fetch` directly (no gRPC).

The topic ``orders`` (2 partitions) is led by b1 with followers b2 and b3. A follower here
is only what it tells the leader: its node id and, per log, its fetch offset and last
epoch; one test also appends what it fetched to a real log, byte for byte.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from broker.error_status import status_for
from broker.errors import ReplicationOutcomeUnknownError, TopicRefusedError
from broker.partition import Partition
from broker.replica.leader import LeaderTopic, log_id
from broker.topics import Topic
from cluster.records import TopicRecord, TopicState
from proto import replication_pb2 as pb
from wal import AppendResult, FileSystem, LogConfig, LogWriter, encode_columns

TOPIC_ID = "9f0c1d2e3a4b5c6d"
LAG_MS = 10_000


def record(
    isr: tuple[str, ...] = ("b1", "b2", "b3"), min_insync: int = 2, epoch: int = 1
) -> TopicRecord:
    return TopicRecord(
        "orders",
        TOPIC_ID,
        2,
        0,
        "b1",
        epoch,
        TopicState.READY,
        replicas=("b1", "b2", "b3"),
        isr=isr,
        min_insync=min_insync,
    )


def batch(i: int) -> bytes:
    return encode_columns([b"value-%d" % i])


class Clock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Isr:
    """A fake ``change_isr``: records each asked isr and answers ``committed``."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []
        self.committed = True

    async def __call__(self, isr: tuple[str, ...]) -> bool:
        self.asked.append(isr)
        return self.committed


@asynccontextmanager
async def leading(
    tmp_path: Path, rec: TopicRecord, *, start: bool = True
) -> AsyncIterator[tuple[LeaderTopic, Topic, Clock, Isr]]:
    fs = FileSystem()
    parts = [await Partition.open(i, str(tmp_path / "orders"), LogConfig(), fs) for i in range(2)]
    topic = Topic("orders", parts, TOPIC_ID)
    clock, isr = Clock(), Isr()
    # isr_check_s: the background check never runs during a test (they call check_isr).
    leader = LeaderTopic(
        topic, rec, "b1", lag_time_max_ms=LAG_MS, change_isr=isr, clock=clock, isr_check_s=3600
    )
    try:
        if start:
            await leader.start()
        yield leader, topic, clock, isr
    finally:
        await leader.aclose()
        for p in parts:
            await p.aclose()


def fetch_request(
    node: str,
    offsets: dict[str, int],
    *,
    last_epoch: int = 1,
    epoch: int = 1,
    max_wait_ms: int = 0,
    max_bytes: int = 1 << 20,
) -> pb.ReplicaFetchRequest:
    return pb.ReplicaFetchRequest(
        topic="orders",
        topic_id=TOPIC_ID,
        replica_node=node,
        leader_epoch=epoch,
        logs=[
            pb.LogFetch(log=log, fetch_offset=o, last_fetched_epoch=last_epoch if o else -1)
            for log, o in offsets.items()
        ],
        max_bytes=max_bytes,
        max_wait_ms=max_wait_ms,
    )


async def fetch(leader: LeaderTopic, node: str, offset: int, **kw: int) -> pb.ReplicaFetchResponse:
    return await leader.fetch(fetch_request(node, {"p/0": offset, "p/1": 0}, **kw))


async def publish(topic: Topic, count: int) -> list[asyncio.Task[tuple[AppendResult, bool]]]:
    """``count`` publishes to partition 0, each in its own task; returns once all are
    durable on the leader (not acknowledged)."""
    p = topic.partitions[0]
    target = p.writer.durable_end + count
    durable = asyncio.Event()

    def reached(end: int) -> None:
        if end >= target:
            durable.set()

    p.writer.add_durable_listener(reached)
    tasks: list[asyncio.Task[tuple[AppendResult, bool]]] = [
        asyncio.create_task(p.append(batch(i))) for i in range(count)
    ]
    await asyncio.wait_for(durable.wait(), 5)
    p.writer.remove_durable_listener(reached)
    await asyncio.sleep(0)
    return tasks


@pytest.mark.asyncio
async def test_start_assigns_the_epoch_and_holds_commits(tmp_path: Path) -> None:
    """Scenario: two records already in partition 0, then b1 starts leading at epoch 4.
    Expected: each partition's leader-epochs ends with (4, its head), commits are held and
    the partitions' gate is the leader; after aclose the gate is gone."""
    async with leading(tmp_path, record(epoch=4), start=False) as (leader, topic, _, _):
        p0 = topic.partitions[0]
        await p0.append(batch(0))
        await p0.append(batch(1))
        await leader.start()
        assert tuple(p0.log.leader_epochs.latest() or ()) == (4, 2)
        assert tuple(topic.partitions[1].log.leader_epochs.latest() or ()) == (4, 0)
        assert p0.writer.commits_held
        assert p0.gate is leader
    assert p0.gate is None


@pytest.mark.asyncio
async def test_high_watermark_is_the_least_fetch_offset_over_the_isr(tmp_path: Path) -> None:
    """Scenario: 5 publishes durable on b1 (durable end 5); b2 fetches from 5, b3 from 3.
    Expected: the mark is 0 until both fetched, then 3 (b3's offset): readers see 3
    records; the publishes are not acknowledged."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        tasks = await publish(topic, 5)
        w = topic.partitions[0].writer
        assert w.high_water_mark == 0
        await fetch(leader, "b2", 5)
        assert w.high_water_mark == 0  # b3 has not fetched: its offset counts as 0
        resp = await fetch(leader, "b3", 3)
        assert w.high_water_mark == 3
        assert resp.logs[0].high_watermark == 3
        assert len(w.read(0)) == 3
        assert not any(t.done() for t in tasks)
        await fetch(leader, "b3", 5)
        await asyncio.gather(*tasks)


@pytest.mark.asyncio
async def test_publish_is_acknowledged_only_when_the_mark_passes_it(tmp_path: Path) -> None:
    """Scenario: one publish at offset 0; b2 fetches from 1, b3 from 0, then b3 from 1.
    Expected: not acknowledged after b2's fetch; acknowledged (offsets (0, 0), not a
    retry) right after b3's fetch from 1."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        (task,) = await publish(topic, 1)
        await fetch(leader, "b2", 1)
        await fetch(leader, "b3", 0)
        await asyncio.sleep(0.01)
        assert not task.done()
        await fetch(leader, "b3", 1)
        result, retry = await asyncio.wait_for(task, 1)
        assert (result.first_offset, result.last_offset, retry) == (0, 0, False)


@pytest.mark.asyncio
async def test_a_lagging_follower_leaves_the_isr_and_the_mark_moves(tmp_path: Path) -> None:
    """Scenario: 3 publishes; b2 keeps up, b3 fetched once from 0 and then stops.
    Expected: within lag_time_max_ms nothing changes; past it check_isr asks change_isr
    for (b1, b2); once that is committed the mark is 3 and the publishes are answered."""
    async with leading(tmp_path, record()) as (leader, topic, clock, isr):
        await fetch(leader, "b3", 0)
        tasks = await publish(topic, 3)
        await fetch(leader, "b2", 3)
        clock.now += LAG_MS / 1000 - 1
        assert await leader.check_isr() is None
        assert isr.asked == []
        clock.now += 2
        await fetch(leader, "b2", 3)  # b2 still caught up
        assert await leader.check_isr() == ("b1", "b2")
        assert isr.asked == [("b1", "b2")]
        assert topic.partitions[0].writer.high_water_mark == 3
        await asyncio.wait_for(asyncio.gather(*tasks), 1)
        assert leader.record.isr == ("b1", "b2")


@pytest.mark.asyncio
async def test_a_shrink_not_committed_changes_nothing(tmp_path: Path) -> None:
    """Scenario: b3 lags past lag_time_max_ms but change_isr answers False (lost race).
    Expected: the isr stays (b1, b2, b3) and the mark still waits for b3."""
    async with leading(tmp_path, record()) as (leader, topic, clock, isr):
        isr.committed = False
        tasks = await publish(topic, 1)
        await fetch(leader, "b2", 1)
        clock.now += LAG_MS / 1000 + 1
        await fetch(leader, "b2", 1)
        assert await leader.check_isr() is None
        assert isr.asked == [("b1", "b2")]
        assert leader.record.effective_isr() == ("b1", "b2", "b3")
        assert topic.partitions[0].writer.high_water_mark == 0
        assert not tasks[0].done()
        for t in tasks:
            t.cancel()


@pytest.mark.asyncio
async def test_a_caught_up_follower_joins_the_isr(tmp_path: Path) -> None:
    """Scenario: isr (b1, b2); 2 publishes; b2 fetches from 2 (mark 2); b3, outside the
    isr, fetches from 1 and then from 2 (the mark, past the epoch's start 0).
    Expected: nothing asked at 1; at 2 change_isr is asked for (b1, b2, b3) (in replica
    order) and the record's isr becomes it."""
    async with leading(tmp_path, record(isr=("b1", "b2"))) as (leader, topic, _, isr):
        await asyncio.gather(*await publish(topic, 2), fetch(leader, "b2", 2))
        await fetch(leader, "b3", 1)
        assert await leader.check_isr() is None
        await fetch(leader, "b3", 2)
        for _ in range(100):
            if isr.asked:
                break
            await asyncio.sleep(0.01)
        assert isr.asked == [("b1", "b2", "b3")]
        assert leader.record.isr == ("b1", "b2", "b3")


@pytest.mark.asyncio
async def test_not_enough_replicas_refused_before_anything_is_appended(tmp_path: Path) -> None:
    """Scenario: isr (b1) of 3 replicas, min_insync 2; a publish.
    Expected: TopicRefusedError, reason not-enough-replicas, naming this broker and epoch,
    the message naming 1 in-sync replica and the 2 needed; ABORTED; the log is empty."""
    async with leading(tmp_path, record(isr=("b1",), min_insync=2)) as (_, topic, _, _):
        p = topic.partitions[0]
        with pytest.raises(TopicRefusedError) as caught:
            await p.append(batch(0))
        refusal = caught.value.refusal
        assert (refusal.reason, refusal.owner_node, refusal.epoch) == (
            "not-enough-replicas",
            "b1",
            1,
        )
        assert "1 in-sync replica of 3" in refusal.message
        assert "at least 2 are needed" in refusal.message
        assert status_for(caught.value)[0] is grpc.StatusCode.ABORTED
        assert p.writer.head == 0


@pytest.mark.asyncio
async def test_leadership_lost_while_an_ack_waits_is_outcome_unknown(tmp_path: Path) -> None:
    """Scenario: a publish appended and waiting; then the record names b2 leader at epoch 2.
    Expected: the publish fails ReplicationOutcomeUnknownError (UNAVAILABLE); a new publish
    is refused not-owner naming b2; fetches are answered NOT_LEADER."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        (task,) = await publish(topic, 1)
        leader.update(record(epoch=2).replace(owner="b2"))
        with pytest.raises(ReplicationOutcomeUnknownError) as caught:
            await asyncio.wait_for(task, 1)
        assert status_for(caught.value)[0] is grpc.StatusCode.UNAVAILABLE
        assert "whether it is committed is unknown" in str(caught.value)
        with pytest.raises(TopicRefusedError) as refused:
            await topic.partitions[0].append(batch(1))
        assert (refused.value.refusal.reason, refused.value.refusal.owner_node) == (
            "not-owner",
            "b2",
        )
        assert (await fetch(leader, "b2", 0)).error == pb.NOT_LEADER


@pytest.mark.asyncio
async def test_isr_below_min_insync_while_an_ack_waits_is_outcome_unknown(tmp_path: Path) -> None:
    """Scenario: min_insync 2, a publish waiting; the record's isr becomes (b1).
    Expected: the publish fails outcome unknown, the next one is refused
    not-enough-replicas."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        (task,) = await publish(topic, 1)
        leader.update(record(isr=("b1",)))
        with pytest.raises(ReplicationOutcomeUnknownError):
            await asyncio.wait_for(task, 1)
        assert leader.refusal() is not None


@pytest.mark.asyncio
async def test_aclose_fails_waiting_acks(tmp_path: Path) -> None:
    """Scenario: a publish waiting for the followers; the leader closes.
    Expected: ReplicationOutcomeUnknownError naming 'the leader stopped'."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        (task,) = await publish(topic, 1)
        await leader.aclose()
        with pytest.raises(ReplicationOutcomeUnknownError, match="the leader stopped"):
            await asyncio.wait_for(task, 1)


@pytest.mark.asyncio
async def test_divergence_when_the_followers_epoch_ended_before_its_fetch_offset(
    tmp_path: Path,
) -> None:
    """Scenario: partition 0 holds offsets 0-4 of epoch 1 (entry (1, 0)); b1 then leads at
    epoch 3 (entry (3, 5)) and appends 5-6. Followers ask:
    last epoch 2 from 7 -> diverging (1, 5) (the leader has no epoch 2; epoch 1 ends at 5);
    last epoch 1 from 6 -> diverging (1, 5) (epoch 1 ended before 6);
    last epoch 1 from 5 -> no divergence, batches 5-6 and the epochs (1, 0), (3, 5)."""
    async with leading(tmp_path, record(epoch=3), start=False) as (leader, topic, _, _):
        p = topic.partitions[0]
        await asyncio.to_thread(p.log.leader_epochs.assign, 1, 0)
        for i in range(5):
            await p.append(batch(i))
        await leader.start()
        await publish(topic, 2)
        for last, offset, want in ((2, 7, (1, 5)), (1, 6, (1, 5))):
            resp = await fetch(leader, "b2", offset, last_epoch=last, epoch=3)
            data = resp.logs[0]
            assert data.HasField("diverging")
            assert (data.diverging.epoch, data.diverging.end_offset) == want
            assert data.batches == b""
        data = (await fetch(leader, "b2", 5, last_epoch=1, epoch=3)).logs[0]
        assert not data.HasField("diverging")
        assert [(e.epoch, e.start_offset) for e in data.epochs] == [(1, 0), (3, 5)]
        assert data.batches == b"".join(bytes(b.buffer) for b in p.log.read(5, 1 << 20, upper=7))


@pytest.mark.asyncio
async def test_offset_out_of_range(tmp_path: Path) -> None:
    """Scenario: partition 0 holds 2 records; a follower with no epoch fetches from 9.
    Expected: that log answers OFFSET_OUT_OF_RANGE with log_end 2; the other log (from 0)
    answers no error."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        await publish(topic, 2)
        resp = await leader.fetch(fetch_request("b2", {"p/0": 9, "p/1": 0}, last_epoch=-1))
        assert resp.error == pb.REPLICA_ERROR_NONE
        assert (resp.logs[0].error, resp.logs[0].log_end) == (pb.OFFSET_OUT_OF_RANGE, 2)
        assert resp.logs[1].error == pb.REPLICA_ERROR_NONE


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"leader_epoch": 0}, pb.FENCED_LEADER_EPOCH),
        ({"leader_epoch": 2}, pb.UNKNOWN_LEADER_EPOCH),
        ({"replica_node": "b9"}, pb.NOT_REPLICA),
        ({"replica_node": "b1"}, pb.NOT_REPLICA),
        ({"topic_id": "0" * 16}, pb.UNKNOWN_TOPIC),
        ({"topic": "other"}, pb.UNKNOWN_TOPIC),
    ],
)
@pytest.mark.asyncio
async def test_requests_refused(tmp_path: Path, change: dict[str, object], error: int) -> None:
    """Scenario: a fetch with one field wrong. Expected: the whole fetch answered with
    that ReplicaError, the leader's epoch, a message, and no logs."""
    async with leading(tmp_path, record()) as (leader, _, _, _):
        request = fetch_request("b2", {"p/0": 0})
        for field, value in change.items():
            setattr(request, field, value)
        resp = await leader.fetch(request)
        assert (resp.error, resp.leader_epoch, len(resp.logs)) == (error, 1, 0)
        assert resp.message


@pytest.mark.asyncio
async def test_unknown_log_and_offset_for_epoch(tmp_path: Path) -> None:
    """Scenario: a fetch naming log dlq/x; OffsetForLeaderEpoch questions.
    Expected: UNKNOWN_LOG for that log; epoch 1 (the latest) ends at the log's end 2;
    epoch 0 is unknown (-1, -1)."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        await publish(topic, 2)
        resp = await leader.fetch(fetch_request("b2", {"dlq/x": 0}))
        assert resp.logs[0].error == pb.UNKNOWN_LOG
        assert leader.offset_for_epoch(log_id(0), 1) == (1, 2)
        assert leader.offset_for_epoch(log_id(0), 0) == (-1, -1)


@pytest.mark.asyncio
async def test_long_poll_wakes_on_a_durable_append(tmp_path: Path) -> None:
    """Scenario: b2 fetches from the end (0) with max_wait_ms 5000; then a publish.
    Expected: the fetch is held until the append is durable, then answers with that batch
    well before 5 s; the publish is not acknowledged by that (b2 has not fetched past it)."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        poll = asyncio.create_task(fetch(leader, "b2", 0, max_wait_ms=5000))
        await asyncio.sleep(0.05)
        assert not poll.done()
        loop = asyncio.get_running_loop()
        started = loop.time()
        (task,) = await publish(topic, 1)
        resp = await asyncio.wait_for(poll, 2)
        assert loop.time() - started < 1
        assert resp.logs[0].batches == b"".join(
            bytes(b.buffer) for b in topic.partitions[0].log.read(0, 1 << 20)
        )
        assert not task.done()
        task.cancel()


@pytest.mark.asyncio
async def test_long_poll_times_out_with_nothing(tmp_path: Path) -> None:
    """Scenario: b2 fetches from the end with max_wait_ms 200 and nothing is appended.
    Expected: answered after ~200 ms (not before), no error, no batches."""
    async with leading(tmp_path, record()) as (leader, _, _, _):
        loop = asyncio.get_running_loop()
        started = loop.time()
        resp = await fetch(leader, "b2", 0, max_wait_ms=200)
        elapsed = loop.time() - started
        assert 0.19 <= elapsed < 2
        assert resp.error == pb.REPLICA_ERROR_NONE
        assert [d.batches for d in resp.logs] == [b"", b""]


@pytest.mark.asyncio
async def test_a_follower_log_ends_byte_identical(tmp_path: Path) -> None:
    """Scenario: 20 publishes; a follower fetches with max_bytes 100 (a batch or two at a
    time) and appends each answer with append_replicated until it has the leader's end.
    Expected: its segment file equals the leader's byte for byte; b3 doing the same
    commits everything and every publish is acknowledged."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        tasks = await publish(topic, 20)
        for node in ("b2", "b3"):
            async with await LogWriter.open(str(tmp_path / node)) as follower:
                while follower.head < 20:
                    resp = await leader.fetch(
                        fetch_request(node, {"p/0": follower.head}, last_epoch=1, max_bytes=100)
                    )
                    await follower.append_replicated(resp.logs[0].batches)
                await leader.fetch(fetch_request(node, {"p/0": 20, "p/1": 0}))
                name = "00000000000000000000.log"
                assert (tmp_path / node / name).read_bytes() == (
                    tmp_path / "orders" / "0" / name
                ).read_bytes()
        await asyncio.wait_for(asyncio.gather(*tasks), 2)
        assert topic.partitions[0].writer.high_water_mark == 20


@pytest.mark.asyncio
async def test_a_retry_of_an_uncommitted_batch_waits_for_the_commit(tmp_path: Path) -> None:
    """Scenario: an idempotent producer's batch (pid 7, seq 0) is durable on b1 but not
    committed; the producer resends the same batch (its first answer was lost).
    Expected: the retry is not written again and is not answered before the commit; once
    b2 and b3 fetched past it both answers come, the retry's flagged as one, at offset 0."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        p = topic.partitions[0]
        data = encode_columns([b"once"], producer_id=7, base_sequence=0)
        first = asyncio.create_task(p.append(data))
        await fetch(leader, "b2", 0, max_wait_ms=2000)  # returns once the batch is durable
        retry = asyncio.create_task(p.append(data))
        await asyncio.sleep(0.05)
        assert not first.done()
        assert not retry.done()
        assert p.writer.head == 1
        await fetch(leader, "b2", 1)
        await fetch(leader, "b3", 1)
        (r1, dup1), (r2, dup2) = await asyncio.wait_for(asyncio.gather(first, retry), 1)
        assert (r1.first_offset, dup1, r2.first_offset, dup2) == (0, False, 0, True)
        assert p.writer.head == 1


class _SlowDirSyncFs(FileSystem):
    """The real file system whose directory fsyncs under a ``leader-epochs`` file's
    directory take ``delay_s`` more (a slow disk), so serial syncs add up."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.slow = False

    def fsync_dir(self, path: str) -> None:
        if self.slow:
            time.sleep(self.delay_s)
        super().fsync_dir(path)


@pytest.mark.asyncio
async def test_start_syncs_every_partitions_epoch_file_side_by_side(tmp_path: Path) -> None:
    """Scenario: a topic of 4 partitions on a disk whose directory syncs take 0.2 s each;
    the leader starts at epoch 3.
    Expected: every partition's leader-epochs file holds (3, head) when start returns,
    and start took well under the 0.8 s the four syncs take one after another (they run
    on worker threads at once)."""
    fs = _SlowDirSyncFs(0.2)
    parts = [await Partition.open(i, str(tmp_path / "orders"), LogConfig(), fs) for i in range(4)]
    await parts[2].append(batch(0))
    topic = Topic("orders", parts, TOPIC_ID)
    leader = LeaderTopic(
        topic, record(epoch=3), "b1", lag_time_max_ms=LAG_MS, change_isr=Isr(), isr_check_s=3600
    )
    try:
        fs.slow = True
        started = time.monotonic()
        await leader.start()
        took = time.monotonic() - started
        fs.slow = False
        assert [p.log.leader_epochs.latest() for p in parts] == [
            (3, 0), (3, 0), (3, 1), (3, 0)
        ]  # fmt: skip
        assert took < 0.6, took
    finally:
        await leader.aclose()
        for p in parts:
            await p.aclose()


@pytest.mark.asyncio
async def test_only_the_first_log_with_data_may_pass_max_bytes(tmp_path: Path) -> None:
    """Scenario: partition 0 holds 20 small batches, partition 1 one batch of 300 KB;
    a follower asks for both with max_bytes 100 KB, p/0 first, then p/1 first.
    Expected: the first answer holds p/0's batches (within 100 KB) and none of p/1 (its
    batch would take the answer past max_bytes); the second holds p/1's whole batch
    (the first log with data gets one) and nothing of p/0: an answer is never more than
    max(max_bytes, one batch)."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        tasks = await publish(topic, 20)
        p1 = topic.partitions[1]
        tasks.append(asyncio.create_task(p1.append(encode_columns([b"x" * 300_000]))))
        await asyncio.sleep(0.2)
        assert p1.writer.durable_end == 1
        first = await leader.fetch(fetch_request("b2", {"p/0": 0, "p/1": 0}, max_bytes=100_000))
        sizes = {d.log: len(d.batches) for d in first.logs}
        assert 0 < sizes["p/0"] <= 100_000
        assert sizes["p/1"] == 0
        second = await leader.fetch(fetch_request("b2", {"p/1": 0, "p/0": 0}, max_bytes=100_000))
        sizes = {d.log: len(d.batches) for d in second.logs}
        assert sizes["p/1"] > 300_000
        assert sizes["p/0"] == 0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_fetch_naming_logs_again_and_again_gets_one_answer_per_log(
    tmp_path: Path,
) -> None:
    """Scenario: two records in p/0; a fetch (about 2.1 MB) asks p/0 from 0, then p/0
    100,000 more times, then 100,000 logs the topic does not have. Expected: the answer
    holds p/0 once (its two records) and at most 64 + 2 entries in all; without the bound
    it held 200,001 (a request of a few MiB set the answer's size and the work)."""
    async with leading(tmp_path, record()) as (leader, topic, _, _):
        await publish(topic, 2)
        request = fetch_request("b2", {"p/0": 0})
        request.logs.extend(pb.LogFetch(log="p/0", fetch_offset=0) for _ in range(100_000))
        request.logs.extend(pb.LogFetch(log=f"dlq/x{i}", fetch_offset=0) for i in range(100_000))
        resp = await leader.fetch(request)
        assert [d.log for d in resp.logs].count("p/0") == 1
        assert len(resp.logs) <= 2 + 64, len(resp.logs)
        assert resp.logs[0].log == "p/0"
        assert resp.logs[0].batches
