"""The pipelined replication path: a leader serves its followers what it has *written*
(before its own sync), and a follower on ``ReplicaStream`` fetches again before its
append is durable, reporting its durable end in ``progress_only`` messages.

What must hold (``broker.replica.leader`` and ``broker.replica.fetcher`` docstrings):
nothing is acknowledged before the leader *and* the in-sync followers synced it; a
report counts only what the follower says it has durably, within what it was served;
the stream answers fetches one by one, in order, with a bounded backlog; a follower's
report moves the watermark while its next fetch is held. Real logs on tmp dirs, the real
``ReplicationService`` on a loopback gRPC server, a file system whose ``fdatasync`` the
test holds (a slow disk, deterministically).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.partition import Partition
from broker.replica.fetch_rules import batch_headers
from broker.replica.fetcher import FollowerTopic
from broker.replica.leader import LeaderTopic
from broker.replica.service import ReplicationService, add_to_server
from broker.topics import Topic
from cluster.records import TopicRecord
from proto import replication_pb2 as pb
from proto import replication_pb2_grpc as pb_grpc
from tests._helpers import eventually
from tests.broker.replica.fake_leader import (
    FakeLeader,
    Publisher,
    close_topic,
    open_topic,
    serving,
)
from tests.broker.replica.fake_leader import record as fake_record
from tests.broker.replica.test_leader import TOPIC_ID, Isr, batch, record
from tests.wal._helpers import CrashableFs
from tests.wal._replica import log_files
from wal import FileSystem, FsyncPolicy, LogConfig


class HeldSyncs(FileSystem):
    """The real file system, whose ``fdatasync`` waits while :attr:`held` (a disk that
    has not synced yet); ``syncing`` is set while one waits."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()
        self.released.set()
        self.syncing = threading.Event()

    def hold(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def fdatasync(self, fd: int) -> None:
        if not self.released.is_set():
            self.syncing.set()
            self.released.wait(10)
        super().fdatasync(fd)


@asynccontextmanager
async def leading(
    tmp_path: Path, fs: FileSystem | None = None
) -> AsyncIterator[tuple[LeaderTopic, Topic]]:
    """``orders`` (2 partitions) led by b1 at epoch 1; followers b2 and b3 in sync."""
    fs = fs or FileSystem()
    parts = [await Partition.open(i, str(tmp_path / "b1"), LogConfig(), fs) for i in range(2)]
    topic = Topic("orders", parts, TOPIC_ID)
    leader = LeaderTopic(
        topic, record(), "b1", lag_time_max_ms=60_000, change_isr=Isr(), isr_check_s=3600
    )
    await leader.start()
    try:
        yield leader, topic
    finally:
        await leader.aclose()
        for p in parts:
            await p.aclose()


def ask(
    node: str,
    fetch_offset: int,
    durable: int | None = None,
    *,
    progress_only: bool = False,
    max_wait_ms: int = 0,
) -> pb.ReplicaFetchRequest:
    """``node``'s fetch (or report) of p/0 from ``fetch_offset``, durable up to
    ``durable`` (None: the field not set)."""
    log = pb.LogFetch(log="p/0", fetch_offset=fetch_offset, last_fetched_epoch=1)
    if fetch_offset == 0:
        log.last_fetched_epoch = -1
    if durable is not None:
        log.durable_offset = durable
    return pb.ReplicaFetchRequest(
        topic="orders",
        topic_id=TOPIC_ID,
        replica_node=node,
        leader_epoch=1,
        logs=[log],
        max_bytes=1 << 20,
        max_wait_ms=max_wait_ms,
        progress_only=progress_only,
    )


@pytest.mark.asyncio
async def test_followers_get_what_the_leader_wrote_before_its_sync_and_nothing_commits_early(
    tmp_path: Path,
) -> None:
    """Scenario: the leader's disk holds its sync of a one-record publish; b2 and b3 fetch
    p/0 from 0, then both report the record durable on their side.
    Expected: each fetch is answered with the record's batch while the leader's durable
    end is still 0; after both reports the mark is still 0 and the publish is not
    acknowledged (the leader has not synced); once the leader's sync ends, the mark is 1
    and the publish is acknowledged."""
    fs = HeldSyncs()
    async with leading(tmp_path, fs) as (leader, topic):
        p0 = topic.partitions[0]
        fs.hold()
        publish = asyncio.create_task(p0.append(batch(1)))
        await asyncio.to_thread(fs.syncing.wait, 5)
        answers = [await leader.fetch(ask(node, 0, max_wait_ms=2000)) for node in ("b2", "b3")]
        assert [len(a.logs[0].batches) > 0 for a in answers] == [True, True]
        assert [a.logs[0].log_end for a in answers] == [1, 1]  # what it serves: written
        assert p0.writer.durable_end == 0
        for node in ("b2", "b3"):
            leader.note_progress(ask(node, 1, 1, progress_only=True))
        await asyncio.sleep(0.05)
        assert p0.writer.high_water_mark == 0
        assert not publish.done()
        fs.release()
        offsets, duplicate = await asyncio.wait_for(publish, 5)
        assert (offsets.first_offset, duplicate) == (0, False)
        assert p0.writer.high_water_mark == 1


@pytest.mark.asyncio
async def test_a_report_moves_the_mark_while_the_next_fetch_is_held(tmp_path: Path) -> None:
    """Scenario: a publish of one record is durable on the leader; b2 and b3 have
    written it and each sent its next fetch (from 1, durable end 0, long poll of 30 s),
    held by the leader; then each reports its durable end 1.
    Expected: nothing is acknowledged while the fetches say durable 0; the reports
    acknowledge the publish (mark 1) while both fetches are still held."""
    async with leading(tmp_path) as (leader, topic):
        p0 = topic.partitions[0]
        publish = asyncio.create_task(p0.append(batch(1)))
        await asyncio.wait_for(_durable(p0, 1), 5)
        held = [
            asyncio.create_task(leader.fetch(ask(node, 1, 0, max_wait_ms=30_000)))
            for node in ("b2", "b3")
        ]
        await asyncio.sleep(0.05)
        assert not publish.done()
        assert p0.writer.high_water_mark == 0
        for node in ("b2", "b3"):
            leader.note_progress(ask(node, 1, 1, progress_only=True))
        await asyncio.wait_for(publish, 2)
        assert p0.writer.high_water_mark == 1
        assert not any(h.done() for h in held)
        for h in held:
            h.cancel()
        await asyncio.gather(*held, return_exceptions=True)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fetch_offset", "durable", "node", "epoch"),
    [
        (1, 2, "b2", 1),  # durable past its own fetch offset
        (5, 5, "b2", 1),  # past anything the leader wrote
        (1, 1, "b9", 1),  # not a replica
        (1, 1, "b1", 1),  # the leader itself
        (1, 1, "b2", 0),  # a fenced epoch
    ],
)
async def test_a_forged_report_counts_nothing(
    tmp_path: Path, fetch_offset: int, durable: int, node: str, epoch: int
) -> None:
    """Scenario: one record durable on the leader; b3 reports it durable; then a
    report that is not true of any follower arrives (durable past its fetch offset, past
    the leader's end, from a node outside the replica set, from the leader's own id, at an
    older epoch).
    Expected: the report counts nothing: b2's progress stays at 0, the mark at 0 and the
    publish waits (b2 is in the in-sync set); the leader keeps serving (a true report
    from b2 then acknowledges it)."""
    async with leading(tmp_path) as (leader, topic):
        p0 = topic.partitions[0]
        publish = asyncio.create_task(p0.append(batch(1)))
        await asyncio.wait_for(_durable(p0, 1), 5)
        leader.note_progress(ask("b3", 1, 1, progress_only=True))
        forged = ask(node, fetch_offset, durable, progress_only=True)
        forged.leader_epoch = epoch
        leader.note_progress(forged)
        await asyncio.sleep(0.05)
        assert leader.progress("p/0")["b2"].fetch_offset == 0
        assert p0.writer.high_water_mark == 0
        assert not publish.done()
        leader.note_progress(ask("b2", 1, 1, progress_only=True))
        await asyncio.wait_for(publish, 2)


@asynccontextmanager
async def served(leader: LeaderTopic) -> AsyncIterator[tuple[grpc.aio.Channel, int]]:
    """The real Replication service over ``leader`` on loopback: a channel to it, its
    port."""
    server = grpc.aio.server()
    add_to_server(ReplicationService(lambda name: leader if name == "orders" else None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, port
    finally:
        await channel.close()
        await server.stop(0)


@pytest.mark.asyncio
async def test_the_stream_answers_fetches_in_order_and_counts_reports_unanswered(
    tmp_path: Path,
) -> None:
    """Scenario: three records on the leader's p/0, each durable; over one ReplicaStream
    b2 sends a fetch from 0, a fetch from 1 and a fetch from 2 without reading, then
    (with b3 reported in sync) a progress report of durable end 3, then ends its side.
    Expected: exactly three answers, in order, each with the batches from its fetch
    offset; the report is not answered but counts: all three publishes are acknowledged;
    the call ends OK once its side is done."""
    async with leading(tmp_path) as (leader, topic):
        p0 = topic.partitions[0]
        publishes = [asyncio.create_task(p0.append(batch(i))) for i in range(3)]
        await asyncio.wait_for(_durable(p0, 3), 5)
        leader.note_progress(ask("b3", 3, 3, progress_only=True))
        async with served(leader) as (channel, _port):
            call = pb_grpc.ReplicationStub(channel).ReplicaStream()
            for offset in (0, 1, 2):
                await call.write(ask("b2", offset, offset))
            await call.write(ask("b2", 3, 3, progress_only=True))
            await call.done_writing()
            answers = [a async for a in call]
            assert await call.code() == grpc.StatusCode.OK
        firsts = [_first_offset(a.logs[0].batches) for a in answers]
        assert firsts == [0, 1, 2]
        await asyncio.wait_for(asyncio.gather(*publishes), 2)
        assert p0.writer.high_water_mark == 3


@pytest.mark.asyncio
async def test_a_stream_message_that_does_not_parse_ends_it_invalid_argument(
    tmp_path: Path,
) -> None:
    """Scenario: over ReplicaStream, a fetch, then bytes that are no ReplicaFetchRequest.
    Expected: the fetch is answered, then the call ends INVALID_ARGUMENT; the leader
    still answers a fetch on a new call."""
    async with leading(tmp_path) as (leader, _topic), served(leader) as (channel, _port):
        raw = channel.stream_stream(
            "/headrace.v1.Replication/ReplicaStream",
            request_serializer=lambda b: b,
            response_deserializer=pb.ReplicaFetchResponse.FromString,
        )
        call = raw()
        await call.write(ask("b2", 0, 0).SerializeToString())
        await call.write(b"\xff\xff\xff\xff not a message")
        await call.done_writing()
        first = await asyncio.wait_for(call.read(), 5)
        assert isinstance(first, pb.ReplicaFetchResponse)
        assert first.error == pb.REPLICA_ERROR_NONE
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await asyncio.wait_for(call.read(), 5)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        again = pb_grpc.ReplicationStub(channel).ReplicaStream()
        await again.write(ask("b2", 0, 0))
        answer = await asyncio.wait_for(again.read(), 5)
        assert isinstance(answer, pb.ReplicaFetchResponse)
        assert answer.error == 0
        again.cancel()


@pytest.mark.asyncio
async def test_a_follower_on_the_stream_acks_a_publish_without_waiting_for_a_new_answer(
    tmp_path: Path,
) -> None:
    """Scenario: b2 follows over ReplicaStream with a 30 s long poll (replicas and isr
    b1, b2); a publish of one record, then, once b2 has it, another.
    Expected: the second publish is acknowledged within 2 s: b2 fetched the record, sent
    its next fetch before its append was durable (held 30 s by the leader), and its
    report of the durable end moved the mark; b2's log holds both records, 2 is the
    durable end the leader counts for it."""
    parts_dir = tmp_path / "b2"
    mine = await open_topic(parts_dir)
    parts = [
        await Partition.open(i, str(tmp_path / "b1"), LogConfig(), FileSystem()) for i in range(2)
    ]
    topic = Topic("orders", parts, TOPIC_ID)
    two = record().replace(replicas=("b1", "b2"), isr=("b1", "b2"))
    leader = LeaderTopic(
        topic,
        two,
        "b1",
        lag_time_max_ms=60_000,
        change_isr=Isr(),
        isr_check_s=3600,
    )
    await leader.start()
    async with (
        served(leader) as (_channel, port),
        _follow(mine, two, "b2", port, max_wait_ms=30_000),
    ):
        # The first record of the epoch comes with its epoch entry, written before
        # it (not pipelined); the second is the steady state.
        first, _ = await asyncio.wait_for(parts[0].append(batch(1)), 2)
        await asyncio.sleep(0.2)  # its next fetch is held: nothing to send
        second, _ = await asyncio.wait_for(parts[0].append(batch(2)), 2)
        assert (first.first_offset, second.first_offset) == (0, 1)
        assert mine.partitions[0].writer.head == 2
        assert leader.progress("p/0")["b2"].fetch_offset == 2
    await leader.aclose()
    for p in parts:
        await p.aclose()
    await close_topic(mine)


async def _durable(partition: Partition, end: int) -> None:
    """Return once ``partition``'s durable end reaches ``end``."""
    reached = asyncio.Event()

    def told(durable: int) -> None:
        if durable >= end:
            reached.set()

    partition.writer.add_durable_listener(told)
    try:
        if partition.writer.durable_end < end:
            await reached.wait()
    finally:
        partition.writer.remove_durable_listener(told)


def _first_offset(batches: bytes) -> int:
    return batch_headers(batches)[0].first_offset


class HeldCrashableFs(CrashableFs):
    """A file system whose process can "die" and lose power (:class:`CrashableFs`), and
    whose ``fdatasync`` waits while :attr:`released` is clear (a slow disk)."""

    def __init__(self) -> None:
        super().__init__(page_size=64)
        self.released = threading.Event()
        self.released.set()
        self.syncing = threading.Event()

    def fdatasync(self, fd: int) -> None:
        if not self.released.is_set():
            self.syncing.set()
            self.released.wait(10)
        super().fdatasync(fd)


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", range(3))
async def test_a_leader_that_dies_before_its_sync_rejoins_as_a_prefix_and_catches_up(
    tmp_path: Path, seed: int
) -> None:
    """Scenario: b1 leads (replicas and isr b1, b2) and b2 follows over ReplicaStream;
    5 records are acknowledged. b1's disk then holds its sync while 3 more are published:
    b2 gets them (served before b1's sync) and syncs them. b1's process dies and its
    power is cut (unsynced pages lost or kept at random). b2 leads at epoch 2 and
    publishes one record; b1, reopened, follows it.
    Expected: none of the 3 was acknowledged by b1; b1 reopens with a prefix of whole
    batches (at least the 5 acknowledged); it needs no cut (its log is a prefix of b2's),
    copies the rest and ends byte-identical to b2, epochs [(1, 0), (2, 8)]; b2's epoch-2
    record is acknowledged once b1 has it."""
    two = record().replace(replicas=("b1", "b2"), isr=("b1", "b2"))
    fs = HeldCrashableFs()
    old = await open_topic(tmp_path / "b1", fs=fs)
    new = await open_topic(tmp_path / "b2")
    leader = LeaderTopic(old, two, "b1", lag_time_max_ms=60_000, change_isr=Isr(), isr_check_s=3600)
    await leader.start()
    p0 = old.partitions[0]
    async with served(leader) as (_channel, port):
        async with _follow(new, two, "b2", port) as follower:
            for i in range(5):
                await asyncio.wait_for(p0.append(batch(i)), 5)
            fs.released.clear()
            unsynced = [asyncio.create_task(p0.append(batch(i))) for i in range(5, 8)]
            await eventually(lambda: leader.progress("p/0")["b2"].fetch_offset == 8)
            assert new.partitions[0].writer.head == 8
            assert p0.writer.durable_end < 8
            assert not any(t.done() for t in unsynced)
        fs.die()  # b1's process is gone: its descriptors closed unsynced
        fs.power_cut(random.Random(seed))
        fs.released.set()
        await asyncio.gather(*unsynced, return_exceptions=True)
        assert not any(t.exception() is None for t in unsynced)  # none acknowledged
        with contextlib.suppress(Exception):
            await leader.aclose()
        for p in old.partitions:
            with contextlib.suppress(Exception):
                await p.aclose()
    reopened = await open_topic(tmp_path / "b1")
    kept = reopened.partitions[0].writer.head
    assert 5 <= kept <= 8
    promoted = two.replace(owner="b2", epoch=2)
    for p in new.partitions:
        p.writer.release_commits()
        p.writer.hold_commits()
    new_leader = LeaderTopic(
        new, promoted, "b2", lag_time_max_ms=60_000, change_isr=Isr(), isr_check_s=3600
    )
    await new_leader.start()
    try:
        async with (
            served(new_leader) as (_channel, port),
            _follow(reopened, promoted, "b1", port) as follower,
        ):
            ack = asyncio.create_task(new.partitions[0].append(batch(8)))
            offsets, _ = await asyncio.wait_for(ack, 10)
            assert offsets.first_offset == 8
            await eventually(lambda: reopened.partitions[0].writer.head == 9)
            assert follower.truncations == 0
    finally:
        await new_leader.aclose()
    for mine, theirs in zip(reopened.partitions, new.partitions, strict=True):
        assert log_files(mine.log.path) == log_files(theirs.log.path)  # byte for byte
    # (p/1 holds no record: its entries date nothing and may differ.)
    for topic in (reopened, new):
        assert [tuple(e) for e in topic.partitions[0].log.leader_epochs.entries()] == [
            (1, 0),
            (2, 8),
        ]
    await close_topic(reopened)
    await close_topic(new)


@asynccontextmanager
async def _follow(
    topic: Topic, rec: TopicRecord, node: str, port: int, **options: Any
) -> AsyncIterator[FollowerTopic]:
    """A started follower ``node`` of ``topic`` whose leader is on ``port``; ``options``
    override the short test defaults (200 ms long polls, 10-100 ms backoff)."""
    settings: dict[str, Any] = {
        "max_wait_ms": 200,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.1,
        **options,
    }
    follower = FollowerTopic(
        topic,
        rec,
        node,
        f"127.0.0.1:{port}",
        channel=grpc.aio.insecure_channel,
        credential=None,
        **settings,
    )
    await follower.start()
    try:
        yield follower
    finally:
        await follower.aclose()


@pytest.mark.asyncio
async def test_a_replicated_partition_hints_one_batch_in_flight(tmp_path: Path) -> None:
    """Scenario: a partition whose commit cost would have producers keep 2 batches in
    flight; it is led as a replicated topic, then the leader stops.
    Expected: the hint is 1 while it is led (its answers wait for the followers' syncs;
    records share batches), the commit cost's 2 once no leader gates it."""
    async with leading(tmp_path) as (leader, topic):
        p0 = topic.partitions[0]
        p0.writer.commit_cost.pipelined = True
        assert p0.writer.commit_cost.in_flight_hint == 2
        assert p0.in_flight_hint == 1
        await leader.aclose()
        assert p0.in_flight_hint == 2


class _OneAnswerPerCall(FakeLeader):
    """A :class:`FakeLeader` whose ReplicaStream answers one fetch, then ends the call
    (status OK): a leader that closes streams (a restart of its service, a proxy)."""

    def __init__(self, topic: Topic, epoch: int) -> None:
        super().__init__(topic, epoch)
        self.calls = 0

    async def ReplicaStream(  # noqa: N802 - the RPC's name
        self, requests: AsyncIterator[pb.ReplicaFetchRequest], context: Any
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        self.calls += 1
        async for request in requests:
            if not request.progress_only:
                yield await self.ReplicaFetch(request, context)
                return


@pytest.mark.asyncio
async def test_a_stream_the_leader_ends_is_opened_again(tmp_path: Path) -> None:
    """Scenario: a leader holding 40 batches per partition ends each ReplicaStream call
    after one answer; the follower fetches 1 KiB at a time.
    Expected: the follower opens a new call after each end (many calls, not one call
    read again and again) and catches up, byte-identical."""
    leader = await open_topic(tmp_path / "leader")
    mine = await open_topic(tmp_path / "follower")
    await Publisher().publish(leader, 1, 40)
    fake = _OneAnswerPerCall(leader, 1)
    async with serving(fake) as port:
        options = {"max_bytes": 1024, "backoff_base_s": 0.001, "backoff_max_s": 0.005}
        async with _follow(mine, fake_record(1), "b2", port, **options) as follower:
            ends = {f"p/{p.index}": p.writer.durable_end for p in leader.partitions}
            await eventually(lambda: follower.fetch_offsets == ends, 15)
    assert fake.calls > 10
    for mine_p, theirs in zip(mine.partitions, leader.partitions, strict=True):
        assert log_files(mine_p.log.path) == log_files(theirs.log.path)
    await close_topic(leader)
    await close_topic(mine)


@asynccontextmanager
async def serving_unary_only(leader: FakeLeader) -> AsyncIterator[int]:
    """``leader`` as a broker before ReplicaStream serves it: ReplicaFetch and
    OffsetForLeaderEpoch only (a ReplicaStream call ends UNIMPLEMENTED)."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "ReplicaFetch": grpc.unary_unary_rpc_method_handler(
            leader.ReplicaFetch,
            request_deserializer=pb.ReplicaFetchRequest.FromString,
            response_serializer=pb.ReplicaFetchResponse.SerializeToString,
        ),
        "OffsetForLeaderEpoch": grpc.unary_unary_rpc_method_handler(
            leader.OffsetForLeaderEpoch,
            request_deserializer=pb.OffsetForLeaderEpochRequest.FromString,
            response_serializer=pb.OffsetForLeaderEpochResponse.SerializeToString,
        ),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("headrace.v1.Replication", handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


@pytest.mark.asyncio
async def test_an_older_leader_without_the_stream_is_fetched_from_one_fetch_at_a_time(
    tmp_path: Path,
) -> None:
    """Scenario: the leader is a broker from before ReplicaStream (its calls end
    UNIMPLEMENTED; a rolling upgrade); it holds 30 batches per partition and publishes
    20 more while the follower (1 KiB fetches) catches up.
    Expected: the follower switches to unary ReplicaFetch by itself and catches up,
    byte-identical; every fetch the old leader got asked from the follower's durable end
    (fetch_offset == durable_offset: that leader counts the fetch offset as durable, so
    nothing may be pipelined)."""
    leader = await open_topic(tmp_path / "leader")
    mine = await open_topic(tmp_path / "follower")
    producer = Publisher()
    await producer.publish(leader, 1, 30)
    fake = FakeLeader(leader, 1)
    async with (
        serving_unary_only(fake) as port,
        _follow(mine, fake_record(1), "b2", port, max_bytes=1024) as follower,
    ):
        await eventually(lambda: follower.fetch_offsets["p/0"] > 0, 10)
        await producer.publish(leader, 1, 20)
        ends = {f"p/{p.index}": p.writer.durable_end for p in leader.partitions}
        await eventually(lambda: follower.fetch_offsets == ends, 15)
    assert len(fake.requests) >= 10
    asks = [ask for request in fake.requests for ask in request.logs]
    assert all(ask.durable_offset == ask.fetch_offset for ask in asks)
    for mine_p, theirs in zip(mine.partitions, leader.partitions, strict=True):
        assert log_files(mine_p.log.path) == log_files(theirs.log.path)
    await close_topic(leader)
    await close_topic(mine)


@pytest.mark.asyncio
async def test_under_the_interval_policy_followers_get_records_before_the_periodic_sync(
    tmp_path: Path,
) -> None:
    """Scenario: a leader's log under fsync ``interval`` with a 60 s interval; one
    record published; b2 fetches p/0 from 0.
    Expected: the answer holds the record at once (served as written), though the
    leader's durable end is still 0 (the periodic sync has not run): the mark and the
    acknowledgement wait for it, as they always did."""
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=60_000)
    parts = [await Partition.open(i, str(tmp_path / "b1"), config, FileSystem()) for i in range(2)]
    topic = Topic("orders", parts, TOPIC_ID)
    leader = LeaderTopic(
        topic, record(), "b1", lag_time_max_ms=60_000, change_isr=Isr(), isr_check_s=3600
    )
    await leader.start()
    try:
        publish = asyncio.create_task(parts[0].append(batch(1)))
        answer = await asyncio.wait_for(leader.fetch(ask("b2", 0, max_wait_ms=5000)), 2)
        assert _first_offset(answer.logs[0].batches) == 0
        assert parts[0].writer.durable_end == 0
        assert parts[0].writer.high_water_mark == 0
        assert not publish.done()
        publish.cancel()
        await asyncio.gather(publish, return_exceptions=True)
    finally:
        await leader.aclose()
        for p in parts:
            await p.aclose()
