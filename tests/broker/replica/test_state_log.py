"""A replicated topic's subscription states over real gRPC: a leader's
:class:`~broker.replica.leader.LeaderTopic` and a follower's
:class:`~broker.replica.fetcher.FollowerTopic` in one process, each with the topic's
``state`` log (:mod:`broker.replica.state_log`) and a real
:class:`~dispatcher.SubscriptionRegistry`, as the broker wires them
(:class:`~broker.replica.state_log.StateReplication` without the manager).

Checks the issue's rule: a save that must be durable before a reply (a new subscription,
a seek, a delete) returns only once its state-log record is committed (the follower has
it), and the follower, promoted, replays the states the leader had committed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import grpc
import pytest

from broker.errors import ReplicationOutcomeUnknownError
from broker.partition import Partition
from broker.replica.fetcher import FollowerTopic
from broker.replica.leader import LeaderTopic
from broker.replica.manager import Channels
from broker.replica.state_log import LeaderStateSink, StateLogs, read_states
from broker.topics import Topic
from cluster.records import TopicRecord
from dispatcher import SubscriptionRegistry, cursor_journal, state_file
from dispatcher.state_log import CHUNK_PREFIX, RECORD_BYTES, SNAPSHOT_KEY, chunk_key, record_values
from proto import replication_pb2_grpc as pb_grpc
from proto.record import Record
from tests._helpers import eventually
from tests.broker.replica.fake_leader import TOPIC, Publisher, close_topic, open_topic, record
from tests.broker.replica.test_fetcher_leader import Servicer
from tests.wal._replica import log_files
from wal import LogConfig, LogWriter, encode_records


async def _no_change(_isr: tuple[str, ...]) -> bool:
    return False


class Broker:
    """One broker's side: the topic, its state log, its subscriptions."""

    def __init__(self, topic: Topic, logs: StateLogs, subs: SubscriptionRegistry) -> None:
        self.topic, self.logs, self.subs = topic, logs, subs

    @classmethod
    async def open(cls, directory: Path, config: LogConfig | None = None) -> Broker:
        topic = await open_topic(directory / "topics")
        subs = SubscriptionRegistry(str(directory / "data"), flush_interval_s=0.05)
        await subs.open({TOPIC: [p.writer for p in topic.partitions]})
        logs = StateLogs(subs.root, config)
        await logs.open(TOPIC)
        return cls(topic, logs, subs)

    def extra(self) -> dict[str, Partition]:
        return cast(dict[str, Partition], self.logs.extra_logs(TOPIC))

    @property
    def writers(self) -> list[object]:
        return [p.writer for p in self.topic.partitions]

    async def aclose(self) -> None:
        await self.subs.aclose()
        await self.logs.aclose()
        await close_topic(self.topic)


@asynccontextmanager
async def leading(
    b: Broker, rec: TopicRecord, record_bytes: int = RECORD_BYTES
) -> AsyncIterator[tuple[LeaderTopic, int]]:
    """``b`` (node ``rec.owner``) leads at ``rec.epoch``: the leader started, its saves
    go to the state log (records of at most ``record_bytes`` of entries), its
    subscriptions replayed from it (what ``StateReplication.leading`` does)."""
    leader = LeaderTopic(
        b.topic, rec, rec.owner, lag_time_max_ms=60_000, change_isr=_no_change, extra_logs=b.extra()
    )
    await leader.start()
    log = b.logs.get(TOPIC)
    assert log is not None
    b.subs.set_state_sink(TOPIC, LeaderStateSink(log.writer, leader.committed, record_bytes))
    states = await asyncio.to_thread(read_states, log.writer)
    await b.subs.take_over(TOPIC, [p.writer for p in b.topic.partitions], states)
    server = grpc.aio.server(  # as the broker's (broker.app): no send limit
        options=[("grpc.max_send_message_length", -1)]
    )
    pb_grpc.add_ReplicationServicer_to_server(Servicer(leader), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield leader, port
    finally:
        b.subs.set_state_sink(TOPIC, None)
        await leader.aclose()
        await server.stop(0)


@asynccontextmanager
async def following(
    b: Broker,
    port: int,
    epoch: int,
    channel: Callable[[str], grpc.aio.Channel] = grpc.aio.insecure_channel,
) -> AsyncIterator[FollowerTopic]:
    follower = FollowerTopic(
        b.topic,
        record(epoch),
        "b2",
        f"127.0.0.1:{port}",
        channel=channel,
        credential=None,
        max_wait_ms=200,
        extra_logs=b.extra(),
    )
    await follower.start()
    try:
        yield follower
    finally:
        await follower.aclose()


def _cursors(subs: SubscriptionRegistry) -> dict[str, list[int]]:
    return {s.name: [p.cursor for p in s.snapshot()] for s in subs.subscriptions(TOPIC)}


@pytest.mark.asyncio
async def test_durable_saves_wait_for_the_follower_which_replays_them_when_promoted(
    tmp_path: Path,
) -> None:
    """Scenario: b1 leads ``orders`` (isr b1, b2; min_insync 2), 10 batches of 3 records
    in each partition; a subscription is created (no follower yet), then b2 follows;
    then a seek to (6, 9), a second subscription, its delete. b1 stops; b2 is promoted
    (leads at epoch 2 and replays its state log). Expected: the create is not answered
    before b2 fetches, then is; b2's state log ends byte-identical with b1's; the
    promoted b2 has exactly the subscription b1 had, at the cursors (6, 9) of the seek,
    and not the deleted one; its files say the same after a restart of its registry."""
    b1, b2 = await Broker.open(tmp_path / "b1"), await Broker.open(tmp_path / "b2")
    await Publisher().publish(b1.topic, None, 10)
    writers1 = [p.writer for p in b1.topic.partitions]
    async with leading(b1, record(1).replace(min_insync=2)) as (_leader, port):
        create = asyncio.create_task(b1.subs.subscribe(TOPIC, "billing", writers1))
        await asyncio.sleep(0.3)
        assert not create.done()  # its record is on b1 only: not committed
        async with following(b2, port, 1):
            async with asyncio.timeout(15):
                sub = await create
            await sub.seek([6, 9])
            await b1.subs.save(sub)
            other = await b1.subs.subscribe(TOPIC, "audit", writers1)
            await b1.subs.delete(TOPIC, other.name)
            log1, log2 = b1.logs.get(TOPIC), b2.logs.get(TOPIC)
            assert log1 is not None
            assert log2 is not None
            await eventually(lambda: log2.writer.head == log1.writer.durable_end)
            assert log_files(log2.writer.log.path) == log_files(log1.writer.log.path)
    assert _cursors(b1.subs) == {"billing": [6, 9]}
    for p in b2.topic.partitions:
        p.writer.release_commits()
    async with leading(b2, record(2, leader="b2").replace(isr=("b2",))):
        assert _cursors(b2.subs) == {"billing": [6, 9]}
    await b2.subs.aclose()
    again = SubscriptionRegistry(str(tmp_path / "b2" / "data"))
    await again.open({TOPIC: [p.writer for p in b2.topic.partitions]})
    assert _cursors(again) == {"billing": [6, 9]}
    await again.aclose()
    await b1.aclose()
    await b2.logs.aclose()
    await close_topic(b2.topic)


@pytest.mark.asyncio
async def test_a_save_fails_when_leadership_is_lost_before_it_is_committed(
    tmp_path: Path,
) -> None:
    """Scenario: b1 leads (isr b1, b2; min_insync 2) with no follower fetching; a seek's
    save waits for the commit; b1 stops leading. Expected: the save raises (the broker
    answers UNAVAILABLE: outcome unknown) instead of replying that it is saved."""
    b1 = await Broker.open(tmp_path / "b1")
    await Publisher().publish(b1.topic, None, 4)
    writers1 = [p.writer for p in b1.topic.partitions]
    async with leading(b1, record(1).replace(min_insync=2)) as (leader, _port):
        create = asyncio.create_task(b1.subs.subscribe(TOPIC, "billing", writers1))
        await asyncio.sleep(0.2)
        assert not create.done()
        await leader.aclose()
        with pytest.raises(ReplicationOutcomeUnknownError, match="the leader stopped"):
            await create
    await b1.aclose()


@pytest.mark.asyncio
async def test_the_followers_state_log_drops_what_the_leaders_snapshot_replaced(
    tmp_path: Path,
) -> None:
    """Scenario: the state logs roll at 1 KiB; b1 leads (isr b1, b2) and b2 follows; b1
    appends 60 records of 200 bytes, then a snapshot record, and deletes its segments
    wholly before the snapshot (what a checkpoint does). Expected: b2's state log ends
    at b1's end and its first offset follows b1's (above 0): a follower's copy does not
    grow forever."""
    small = LogConfig(segment_bytes=1024)
    b1, b2 = await Broker.open(tmp_path / "b1", small), await Broker.open(tmp_path / "b2", small)
    async with leading(b1, record(1)) as (leader, port), following(b2, port, 1):
        log1, log2 = b1.logs.get(TOPIC), b2.logs.get(TOPIC)
        assert log1 is not None
        assert log2 is not None
        sink = LeaderStateSink(log1.writer, leader.committed)
        for n in range(60):
            await sink.append(b"x%d" % n + b"." * 200, key=None)
        snapshot = await sink.append(b"s", key=SNAPSHOT_KEY)
        await sink.committed(snapshot)
        await sink.trim_before(snapshot)
        assert log1.writer.first_offset > 0
        await eventually(lambda: log2.writer.head == log1.writer.durable_end)
        await eventually(lambda: log2.writer.first_offset == log1.writer.first_offset)
    await b1.aclose()
    await b2.aclose()


def _keys(log: LogWriter) -> list[bytes | None]:
    """The key of every record of ``log``, in order."""
    keys: list[bytes | None] = []
    for batch in log.log.read(log.first_offset, 1 << 30, upper=log.head):
        keys.extend(r.key for r in batch.records())
    return keys


@pytest.mark.asyncio
async def test_a_chunked_snapshot_of_many_subscriptions_reaches_the_promoted_follower(
    tmp_path: Path,
) -> None:
    """Scenario: 1500 subscriptions of ``orders`` on b1, each sought to its own cursors;
    b1 leads with records of at most 16 KiB of entries (the production bound is 1 MiB:
    the same split, at a size a test makes fast), so its first snapshot is a series of
    chunks; b2 follows over real gRPC; then b1 stops and b2 is promoted. Expected: the
    log holds several ``snapshot/<id>/<i>/<n>`` chunks and no record over the bound
    (+ the frame's header); b2's copy is byte-identical; the promoted b2 holds all 1500
    subscriptions at exactly their cursors."""
    b1, b2 = await Broker.open(tmp_path / "b1"), await Broker.open(tmp_path / "b2")
    await Publisher().publish(b1.topic, None, 10)
    writers1 = [p.writer for p in b1.topic.partitions]
    names = [f"s{n:04}" for n in range(1500)]
    subs = await asyncio.gather(*(b1.subs.subscribe(TOPIC, n, writers1) for n in names))
    for n, sub in enumerate(subs):
        await sub.seek([n % 11, n % 13])
    await asyncio.gather(*(b1.subs.save(sub) for sub in subs))
    expected = {name: [n % 11, n % 13] for n, name in enumerate(names)}
    rec = record(1).replace(min_insync=2)
    async with leading(b1, rec, 16 * 1024) as (_leader, port), following(b2, port, 1):
        log1, log2 = b1.logs.get(TOPIC), b2.logs.get(TOPIC)
        assert log1 is not None
        assert log2 is not None
        await eventually(lambda: log2.writer.head == log1.writer.durable_end, timeout_s=30)
        assert log_files(log2.writer.log.path) == log_files(log1.writer.log.path)
        keys = _keys(log1.writer)
        chunks = [k for k in keys if k is not None and k.startswith(CHUNK_PREFIX)]
        assert len(chunks) >= 5, keys
        assert chunks[-1].endswith(b"/%d/%d" % (len(chunks) - 1, len(chunks)))
        sizes = [
            len(r.value)
            for batch in log1.writer.log.read(0, 1 << 30, upper=log1.writer.head)
            for r in batch.records()
        ]
        assert max(sizes) <= 16 * 1024 + 12
    assert _cursors(b1.subs) == expected
    for p in b2.topic.partitions:
        p.writer.release_commits()
    async with leading(b2, record(2, leader="b2").replace(isr=("b2",))):
        assert _cursors(b2.subs) == expected
    await b1.aclose()
    await b2.aclose()


@pytest.mark.asyncio
async def test_a_snapshot_cut_between_chunks_is_not_taken_as_whole_by_the_promoted_follower(
    tmp_path: Path,
) -> None:
    """Scenario: b1 leads with subscriptions ``keep`` and ``moved`` (its first snapshot
    names both) and b2 follows; b1 appends chunk 0 of 2 of a snapshot naming only
    ``moved``, at cursors (5, 5), and stops before chunk 1 (a crash between chunks);
    b2 has it and is promoted. Expected: b2's replay does not take the cut series as a
    snapshot: ``keep`` still exists at its cursors (0, 0), and ``moved`` is at (5, 5)
    (the chunk's entries apply as a delta)."""
    b1, b2 = await Broker.open(tmp_path / "b1"), await Broker.open(tmp_path / "b2")
    await Publisher().publish(b1.topic, None, 10)
    writers1 = [p.writer for p in b1.topic.partitions]
    for name in ("keep", "moved"):
        await b1.subs.subscribe(TOPIC, name, writers1)
    async with leading(b1, record(1)) as (leader, port), following(b2, port, 1):
        log1, log2 = b1.logs.get(TOPIC), b2.logs.get(TOPIC)
        assert log1 is not None
        assert log2 is not None
        moved = b1.subs.get(TOPIC, "moved")
        await moved.seek([5, 5])
        doc = state_file.StateDoc(  # what a checkpoint writes of it
            version=state_file.VERSION,
            seq=1_000_000,
            topic=TOPIC,
            subscription="moved",
            type=moved.type.value,
            partitions=[state_file.partition_doc(snap) for snap in moved.snapshot()],
        )
        (value,) = record_values([cursor_journal.Entry(doc.seq, "moved", doc)])
        sink = LeaderStateSink(log1.writer, leader.committed)
        offset = await sink.append(value, key=chunk_key("cut", 0, 2))
        await sink.committed(offset)
        await eventually(lambda: log2.writer.head == log1.writer.durable_end)
    for p in b2.topic.partitions:
        p.writer.release_commits()
    async with leading(b2, record(2, leader="b2").replace(isr=("b2",))):
        assert _cursors(b2.subs) == {"keep": [0, 0], "moved": [5, 5]}
    await b1.aclose()
    await b2.aclose()


@pytest.mark.asyncio
async def test_a_first_snapshot_cut_between_chunks_leaves_the_subscriptions_on_disk(
    tmp_path: Path,
) -> None:
    """Scenario: b1 holds subscriptions ``keep`` and ``moved`` on disk (a topic of one
    copy), and its state log holds only chunk 0 of 2 of a first snapshot naming
    ``moved`` at cursors (5, 5): its switch to the replicated path was killed between
    chunks. b1 leads. Expected: read_states gives None for that log (not the chunk as a
    delta over nothing, which would drop ``keep``): both subscriptions are at their
    cursors on disk, (0, 0); the takeover's own snapshot is then whole, and the log
    replays to both."""
    b1 = await Broker.open(tmp_path / "b1")
    await Publisher().publish(b1.topic, None, 10)
    writers = [p.writer for p in b1.topic.partitions]
    for name in ("keep", "moved"):
        await b1.subs.subscribe(TOPIC, name, writers)
    moved = b1.subs.get(TOPIC, "moved")
    doc = state_file.StateDoc(
        version=state_file.VERSION,
        seq=1_000_000,
        topic=TOPIC,
        subscription="moved",
        type=moved.type.value,
        partitions=[state_file.PartitionDoc(5, [], 5, []) for _ in moved.snapshot()],
    )
    (value,) = record_values([cursor_journal.Entry(doc.seq, "moved", doc)])
    log = b1.logs.get(TOPIC)
    assert log is not None
    await log.writer.append(encode_records([Record(value, key=chunk_key("cut", 0, 2))]))
    assert await asyncio.to_thread(read_states, log.writer) is None
    async with leading(b1, record(1).replace(isr=("b1",))):
        assert _cursors(b1.subs) == {"keep": [0, 0], "moved": [0, 0]}
        states = await asyncio.to_thread(read_states, log.writer)
        assert states is not None
        assert sorted(states) == ["keep", "moved"]
    await b1.aclose()


@pytest.mark.asyncio
async def test_a_record_over_grpcs_default_message_size_reaches_the_follower(
    tmp_path: Path,
) -> None:
    """Scenario: b1 leads (its server sends up to 17 MiB, as a broker's) and appends one
    6 MiB state-log record (one subscription's state bigger than a chunk: a record is
    never split inside an entry) and a small one after it; b2 follows over a channel
    from the broker's :class:`~broker.replica.manager.Channels`. Expected: b2's state log
    reaches b1's end and is byte-identical (a channel with gRPC's default 4 MiB receive
    limit fails every fetch of that record with RESOURCE_EXHAUSTED, for good)."""
    b1, b2 = await Broker.open(tmp_path / "b1"), await Broker.open(tmp_path / "b2")
    async with leading(b1, record(1)) as (leader, port):
        log1, log2 = b1.logs.get(TOPIC), b2.logs.get(TOPIC)
        assert log1 is not None
        assert log2 is not None
        sink = LeaderStateSink(log1.writer, leader.committed)
        await sink.append(b"x" * (6 << 20), key=None)
        await sink.append(b"small", key=None)
        async with following(b2, port, 1, Channels().get):
            await eventually(lambda: log2.writer.head == log1.writer.durable_end, timeout_s=20)
        assert log_files(log2.writer.log.path) == log_files(log1.writer.log.path)
    await b1.aclose()
    await b2.aclose()


def _dispatch_tasks() -> list[str]:
    """The names of the running dispatch tasks of ``orders``' subscriptions."""
    return sorted(
        t.get_name()
        for t in asyncio.all_tasks()
        if t.get_name().startswith(f"dispatch {TOPIC}/") and not t.done()
    )


@pytest.mark.asyncio
async def test_a_follower_holds_no_live_subscription_and_a_promotion_delivers(
    tmp_path: Path,
) -> None:
    """Scenario: b2 led ``orders`` (epoch 1, alone in sync) and made subscriptions
    ``billing`` and ``audit``; then b1 leads (epoch 2) and b2 follows it and releases the
    topic's subscriptions (what ``StateReplication.following`` does); b1 makes
    ``billing`` and seeks it to (7, 8). Then b1 stops (and releases its own) and b2 is
    promoted (epoch 3). Expected: while b2 follows, it has no subscription of the topic
    in memory, no dispatch task of it runs and its heartbeat samples none (it had two
    dispatch tasks before), and the retention floor stays; once promoted it holds what
    the group's state log says (b1 never had epoch 1's saves: ``billing`` only, made on
    b1), at (7, 8), with its dispatch task, and a consumer of it there receives the
    records from offsets 7 and 8."""
    b1, b2 = await Broker.open(tmp_path / "b1"), await Broker.open(tmp_path / "b2")
    await Publisher().publish(b2.topic, None, 10)
    await Publisher().publish(b1.topic, None, 10)
    async with leading(b2, record(1, leader="b2").replace(isr=("b2",))):
        writers2 = [p.writer for p in b2.topic.partitions]
        for name in ("audit", "billing"):
            await b2.subs.subscribe(TOPIC, name, writers2)
        assert _dispatch_tasks() == [f"dispatch {TOPIC}/audit", f"dispatch {TOPIC}/billing"]
    floor = b2.subs.saved_floor(TOPIC)
    assert floor == [0, 0]
    async with leading(b1, record(2)) as (_leader, port), following(b2, port, 2):
        assert await b2.subs.release(TOPIC) == 2
        assert b2.subs.subscriptions(TOPIC) == []
        assert _dispatch_tasks() == []
        assert [s for s in b2.subs.samples() if s.topic == TOPIC] == []
        assert b2.subs.saved_floor(TOPIC) == floor
        assert await b2.subs.release(TOPIC) == 0  # idempotent
        writers1 = [p.writer for p in b1.topic.partitions]
        billing = await b1.subs.subscribe(TOPIC, "billing", writers1)
        await billing.seek([7, 8])
        await b1.subs.save(billing)
        log1, log2 = b1.logs.get(TOPIC), b2.logs.get(TOPIC)
        assert log1 is not None
        assert log2 is not None
        await eventually(lambda: log2.writer.head == log1.writer.durable_end)
    assert await b1.subs.release(TOPIC) == 1  # b1 follows from now on (not started here)
    for p in b2.topic.partitions:
        p.writer.release_commits()
    async with leading(b2, record(3, leader="b2").replace(isr=("b2",))):
        assert _cursors(b2.subs) == {"billing": [7, 8]}
        assert _dispatch_tasks() == [f"dispatch {TOPIC}/billing"]
        session = b2.subs.get(TOPIC, "billing").attach("c", 100)  # both partitions' rest
        first: dict[int, int] = {}
        async with asyncio.timeout(10):
            while len(first) < 2:
                delivery = await session.next()
                assert delivery is not None
                first.setdefault(delivery.partition, delivery.from_offset)
        assert first == {0: 7, 1: 8}
    await b1.aclose()
    await b2.aclose()


@pytest.mark.asyncio
async def test_released_subscriptions_come_back_from_their_files_when_the_log_is_empty(
    tmp_path: Path,
) -> None:
    """Scenario: b2 holds ``billing`` at (4, 5) and ``audit`` at (0, 0) in its files, and
    releases them (it follows); its state log is empty when it takes the topic over (no
    leader ever saved: the replay gives ``None``). Expected: both subscriptions are
    read back from the files at those cursors, with a dispatch task each."""
    b2 = await Broker.open(tmp_path / "b2")
    await Publisher().publish(b2.topic, None, 10)
    for name in ("audit", "billing"):
        await b2.subs.subscribe(TOPIC, name, [p.writer for p in b2.topic.partitions])
    billing = b2.subs.get(TOPIC, "billing")
    await billing.seek([4, 5])
    await b2.subs.save(billing)
    assert await b2.subs.release(TOPIC) == 2
    assert _dispatch_tasks() == []
    await b2.subs.take_over(TOPIC, [p.writer for p in b2.topic.partitions], None)
    assert _cursors(b2.subs) == {"audit": [0, 0], "billing": [4, 5]}
    assert _dispatch_tasks() == [f"dispatch {TOPIC}/audit", f"dispatch {TOPIC}/billing"]
    await b2.aclose()
