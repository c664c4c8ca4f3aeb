"""A replicated topic's dead-letter queues over real gRPC: a leader's
:class:`~broker.replica.leader.LeaderTopic` and a follower's
:class:`~broker.replica.fetcher.FollowerTopic` in one process, each broker with the
topic's ``state`` log, a real :class:`~dispatcher.SubscriptionRegistry` and a
:class:`~broker.replica.dlq_log.DlqReplication`, wired as the broker wires them (the
manager's role switches done by hand).

Checks: a dead letter's ``put`` returns only once the follower has it; the follower's
``dlq/<subscription>`` log, opened when the leader names it, is the leader's byte for
byte; the follower's registry opens no queue of the followed topic (the fetcher is the
log's only writer); promoted, the follower's queue shows the entry, and a purge done
before the failover holds after it; a put whose commit never comes fails 'outcome
unknown' when leadership is lost."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import grpc
import pytest

from broker.errors import ReplicationOutcomeUnknownError
from broker.partition import Partition
from broker.replica.dlq_log import DlqReplication, dlq_log_id
from broker.replica.fetcher import FollowerTopic
from broker.replica.leader import LeaderTopic
from broker.replica.state_log import LeaderStateSink, StateLogs, read_states
from cluster.records import TopicRecord
from dispatcher import SubscriptionRegistry
from dispatcher.dead_letter_records import DeadLetter
from dispatcher.errors import DlqFollowedError
from proto import replication_pb2_grpc as pb_grpc
from tests._helpers import eventually
from tests.broker.replica.fake_leader import TOPIC, Publisher, close_topic, open_topic, record
from tests.broker.replica.test_fetcher_leader import Servicer
from tests.wal._replica import log_files


async def _no_change(_isr: tuple[str, ...]) -> bool:
    return False


class Broker:
    """One broker's side: the topic, its state log, its subscriptions and queues."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.leader: LeaderTopic | None = None

    async def open(self) -> Broker:
        self.topic = await open_topic(self.directory / "topics")
        self.subs = SubscriptionRegistry(str(self.directory / "data"), flush_interval_s=0.05)
        await self.subs.open({TOPIC: [p.writer for p in self.topic.partitions]})
        self.logs = StateLogs(self.subs.root)
        await self.logs.open(TOPIC)
        self.dlq = DlqReplication(self.subs, lambda _name: self.leader)
        return self

    def extra(self) -> dict[str, Partition]:
        return cast(dict[str, Partition], self.logs.extra_logs(TOPIC))

    async def aclose(self) -> None:
        await self.dlq.aclose()
        await self.subs.aclose()
        await self.logs.aclose()
        await close_topic(self.topic)


def letter(n: int) -> DeadLetter:
    return DeadLetter(
        topic=TOPIC,
        partition=0,
        offset=n,
        subscription="billing",
        key=b"k%d" % n,
        value=b"poison %d" % n,
        headers=(("h", b"v"),),
        timestamp_ms=1_700_000_000_000 + n,
        attempts=5,
        reason="bad json",
        attempt_times_ms=(1, 2, 3, 4, 5),
    )


@asynccontextmanager
async def leading(b: Broker, rec: TopicRecord) -> AsyncIterator[tuple[LeaderTopic, int]]:
    """``b`` leads at ``rec.epoch`` as the broker's role switch does: the leader started,
    the state log's sink and replay (``StateReplication.leading``), then the queues
    (``DlqReplication.leading``); at the end ``not_leading`` before the leader closes."""
    leader = LeaderTopic(
        b.topic, rec, rec.owner, lag_time_max_ms=60_000, change_isr=_no_change, extra_logs=b.extra()
    )
    await leader.start()
    b.leader = leader
    log = b.logs.get(TOPIC)
    assert log is not None
    b.subs.set_state_sink(TOPIC, LeaderStateSink(log.writer, leader.committed))
    states = await asyncio.to_thread(read_states, log.writer)
    await b.subs.take_over(TOPIC, [p.writer for p in b.topic.partitions], states)
    await b.dlq.leading(TOPIC)
    server = grpc.aio.server()
    pb_grpc.add_ReplicationServicer_to_server(Servicer(leader), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield leader, port
    finally:
        await b.dlq.not_leading(TOPIC)
        await b.subs.drop_state_sink(TOPIC)
        await leader.aclose()
        b.leader = None
        await server.stop(0)


@asynccontextmanager
async def following(b: Broker, port: int, epoch: int) -> AsyncIterator[FollowerTopic]:
    follower = FollowerTopic(
        b.topic,
        record(epoch),
        "b2",
        f"127.0.0.1:{port}",
        channel=grpc.aio.insecure_channel,
        credential=None,
        max_wait_ms=200,
        extra_logs=b.extra(),
        open_log=b.dlq.opener(TOPIC),
    )
    await follower.start()
    try:
        yield follower
    finally:
        await follower.aclose()


@pytest.mark.asyncio
async def test_a_dead_letter_is_on_the_follower_byte_for_byte_and_shows_after_promotion(
    tmp_path: Path,
) -> None:
    """Scenario: b1 leads ``orders`` (isr b1, b2; min_insync 2) with subscription
    ``billing``; b2 follows. A poison record's letter is put in billing's dead-letter
    queue on b1 (what the dispatch task's sink does), then two more. b1 stops; b2 is
    promoted (epoch 2, isr b2). Expected: each put returns only once b2 holds it; b2's
    ``dlq/billing`` log is byte-identical with b1's; b2's registry refuses to open the
    queue while it follows (DlqFollowedError); promoted, b2's queue peeks the three
    entries, equal to b1's (key, value, reason, attempts, sequence)."""
    b1, b2 = await Broker(tmp_path / "b1").open(), await Broker(tmp_path / "b2").open()
    await Publisher().publish(b1.topic, None, 4)
    writers1 = [p.writer for p in b1.topic.partitions]
    async with contextlib.AsyncExitStack() as stack:
        leader, port = await stack.enter_async_context(leading(b1, record(1).replace(min_insync=2)))
        follower = await stack.enter_async_context(following(b2, port, 1))
        async with asyncio.timeout(15):
            await b1.subs.subscribe(TOPIC, "billing", writers1)
        queue1 = await b1.subs.dead_letter_queue(TOPIC, "billing")
        assert queue1 is not None
        async with asyncio.timeout(15):
            await queue1.put([letter(1)])
        log_id = dlq_log_id("billing")
        assert follower.fetch_offsets[log_id] == 1  # put returned once b2 had it
        async with asyncio.timeout(15):
            await queue1.put([letter(2), letter(3)])
        assert follower.fetch_offsets[log_id] == 3
        assert leader.progress(log_id)["b2"].fetch_offset == 3
        with pytest.raises(DlqFollowedError):
            await b2.subs.dead_letter_queue(TOPIC, "billing")
        seen1 = await queue1.peek()
        dlq1 = tmp_path / "b1" / "data" / "dlq" / TOPIC / "billing" / "log"
        dlq2 = tmp_path / "b2" / "data" / "dlq" / TOPIC / "billing" / "log"
        assert log_files(str(dlq2)) == log_files(str(dlq1))
    for p in b2.topic.partitions:
        p.writer.release_commits()
    async with leading(b2, record(2, leader="b2").replace(isr=("b2",))):
        queue2 = await b2.subs.dead_letter_queue(TOPIC, "billing", create=False)
        assert queue2 is not None
        seen2 = await queue2.peek()
    assert [e.sequence for e in seen2] == [0, 1, 2]
    assert [(e.key, e.value, e.reason, e.attempts) for e in seen2] == [
        (b"k1", b"poison 1", "bad json", 5),
        (b"k2", b"poison 2", "bad json", 5),
        (b"k3", b"poison 3", "bad json", 5),
    ]
    assert seen2 == seen1
    await b1.aclose()
    await b2.aclose()


@pytest.mark.asyncio
async def test_a_purge_before_the_failover_holds_after_it(tmp_path: Path) -> None:
    """Scenario: as above, b1 leads and b2 follows; 3 letters put in billing's queue,
    then the queue purged on b1 (its segments deleted: the log starts at 3). b1 stops
    and b2 is promoted. Expected: b2's queue log starts at 3 too (its start followed the
    leader's), and promoted, b2's queue is empty: peek gives nothing, count 0, the next
    sequence 3."""
    b1, b2 = await Broker(tmp_path / "b1").open(), await Broker(tmp_path / "b2").open()
    writers1 = [p.writer for p in b1.topic.partitions]
    async with contextlib.AsyncExitStack() as stack:
        _leader, port = await stack.enter_async_context(
            leading(b1, record(1).replace(min_insync=2))
        )
        follower = await stack.enter_async_context(following(b2, port, 1))
        async with asyncio.timeout(15):
            await b1.subs.subscribe(TOPIC, "billing", writers1)
            queue1 = await b1.subs.dead_letter_queue(TOPIC, "billing")
            assert queue1 is not None
            await queue1.put([letter(1), letter(2), letter(3)])
        assert await queue1.purge() == 3
        assert queue1.writer.first_offset == 3
        plain = await b2.dlq.open_follower_log(TOPIC, dlq_log_id("billing"))
        assert plain is not None
        await eventually(lambda: plain.writer.first_offset == 3)
        assert follower.fetch_offsets[dlq_log_id("billing")] == 3
    for p in b2.topic.partitions:
        p.writer.release_commits()
    async with leading(b2, record(2, leader="b2").replace(isr=("b2",))):
        queue2 = await b2.subs.dead_letter_queue(TOPIC, "billing", create=False)
        assert queue2 is not None
        assert await queue2.peek() == []
        assert (queue2.count(), queue2.next_sequence) == (0, 3)
    await b1.aclose()
    await b2.aclose()


@pytest.mark.asyncio
async def test_an_ack_before_the_failover_holds_after_it(tmp_path: Path) -> None:
    """Scenario: b1 leads (isr b1, b2; min_insync 2) and b2 follows; 3 letters put in
    billing's queue (one segment: no segment can be deleted), then AckDeadLetters up to
    sequence 0 on b1. b1 stops and b2 is promoted. Expected: the ack returns once its
    first sequence is committed in the state log (b2's state log holds b1's end); b2's
    own queue files never saw the ack, yet promoted, its queue peeks sequences 1 and 2
    only, counts 2, and says so again after its queue is closed and opened anew."""
    b1, b2 = await Broker(tmp_path / "b1").open(), await Broker(tmp_path / "b2").open()
    writers1 = [p.writer for p in b1.topic.partitions]
    async with contextlib.AsyncExitStack() as stack:
        _leader, port = await stack.enter_async_context(
            leading(b1, record(1).replace(min_insync=2))
        )
        await stack.enter_async_context(following(b2, port, 1))
        async with asyncio.timeout(15):
            await b1.subs.subscribe(TOPIC, "billing", writers1)
            queue1 = await b1.subs.dead_letter_queue(TOPIC, "billing")
            assert queue1 is not None
            await queue1.put([letter(1), letter(2), letter(3)])
            assert await queue1.ack_up_to(0) == 1
        state1, state2 = b1.logs.get(TOPIC), b2.logs.get(TOPIC)
        assert state1 is not None
        assert state2 is not None
        assert state2.writer.head == state1.writer.durable_end  # committed: b2 has it
        assert queue1.writer.first_offset == 0  # the segment stays: only the save moved
    for p in b2.topic.partitions:
        p.writer.release_commits()
    async with leading(b2, record(2, leader="b2").replace(isr=("b2",))):
        queue2 = await b2.subs.dead_letter_queue(TOPIC, "billing", create=False)
        assert queue2 is not None
        assert [e.sequence for e in await queue2.peek()] == [1, 2]
        assert queue2.count() == 2
        await b2.subs.dead_letters.close(TOPIC, "billing")
        again = await b2.subs.dead_letter_queue(TOPIC, "billing", create=False)
        assert again is not None
        assert [e.sequence for e in await again.peek()] == [1, 2]
    await b1.aclose()
    await b2.aclose()


@pytest.mark.asyncio
async def test_a_deleted_subscriptions_queue_is_no_longer_fetched(tmp_path: Path) -> None:
    """Scenario: b1 leads (isr b1, b2) and b2 follows; a letter put in billing's queue
    (b2 fetches dlq/billing); then billing is deleted on b1 (its queue closed and
    removed). Expected: b1 leads no dlq/billing log any more, b2 stops asking for it
    (its fetch offsets name the partitions and the state log only) and no fetch of b2
    fails over it for half a second of rounds (no UNKNOWN_LOG back-off)."""
    b1, b2 = await Broker(tmp_path / "b1").open(), await Broker(tmp_path / "b2").open()
    writers1 = [p.writer for p in b1.topic.partitions]
    async with contextlib.AsyncExitStack() as stack:
        leader, port = await stack.enter_async_context(leading(b1, record(1)))
        follower = await stack.enter_async_context(following(b2, port, 1))
        async with asyncio.timeout(15):
            await b1.subs.subscribe(TOPIC, "billing", writers1)
            queue1 = await b1.subs.dead_letter_queue(TOPIC, "billing")
            assert queue1 is not None
            await queue1.put([letter(1)])
        log_id = dlq_log_id("billing")
        await eventually(lambda: follower.fetch_offsets.get(log_id) == 1)
        await b1.subs.delete(TOPIC, "billing")
        with pytest.raises(KeyError):
            leader.progress(log_id)
        await eventually(lambda: log_id not in follower.fetch_offsets)
        failures = follower.failures
        await asyncio.sleep(0.5)
        assert follower.failures == failures
        assert sorted(follower.fetch_offsets) == ["p/0", "p/1", "state"]
    await b1.aclose()
    await b2.aclose()


@pytest.mark.asyncio
async def test_a_put_fails_outcome_unknown_when_leadership_is_lost_first(
    tmp_path: Path,
) -> None:
    """Scenario: b1 leads (isr b1, b2; min_insync 2) with no follower fetching; a letter
    is put in billing's queue (its record is on b1 only); b1 stops leading. Expected:
    the put does not return while uncommitted, then raises ReplicationOutcomeUnknownError
    (the subscription keeps the record unacked and retries), and the queue closes."""
    b1 = await Broker(tmp_path / "b1").open()
    writers1 = [p.writer for p in b1.topic.partitions]
    async with leading(b1, record(1).replace(isr=("b1",))) as (leader, _port):
        await b1.subs.subscribe(TOPIC, "billing", writers1)
        leader.update(leader.record.replace(isr=("b1", "b2"), min_insync=2))
        queue = await b1.subs.dead_letter_queue(TOPIC, "billing")
        assert queue is not None
        put = asyncio.create_task(queue.put([letter(1)]))
        await asyncio.sleep(0.3)
        assert not put.done()
        await b1.dlq.not_leading(TOPIC)
        with pytest.raises(ReplicationOutcomeUnknownError):
            await put
        assert b1.subs.dead_letters.opened(TOPIC, "billing") is None
    await b1.aclose()
