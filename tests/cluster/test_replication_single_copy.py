"""A topic of one copy moved to another broker by a reassignment (issue 37): real etcd,
two real ``headrace serve`` processes (:mod:`tests.cluster.broker_processes`, TTL 2 s),
the real CLI (``headrace cluster reassign``) and an idempotent producer sending
throughout.

A topic created with ``replication_factor=1`` has no ``replicas`` in its record; the
controller first makes it a replicated topic of one replica (``cluster.replica_txn
.replicate_single``), its owner switches its local topic over when it claims it again,
and the reassignment then goes on as for any replicated topic. What is checked from the
outside: the route, the files on each broker's disk, the producer's acks read back, the
subscriptions' cursors (DescribeSubscription), a consumer's deliveries and the
dead-letter queue (CountDeadLetters, PeekDeadLetters).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from client import AsyncProducer
from cluster.etcd import EtcdStore
from cluster.moves import request
from cluster.records import Keys, TopicRecord, decode
from cluster.session import EXPIRY_SLACK_S
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from proto import broker_pb2 as _broker
from proto import broker_pb2_grpc as _broker_grpc
from tests.cluster.broker_processes import (
    TTL_S,
    Brokers,
    ClusterBroker,
    cluster_brokers,
    create_replicated,
)
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replicated_load import TOPIC, Load, check_acked
from tests.cluster.test_replication_failover import _read_leader
from tests.cluster.test_replication_moves import _cli_config, _headrace
from tests.cluster.test_replication_reshape import _gone, _wait_route_of
from tests.cluster.test_replication_state import _cursors, _cursors_eventually, _open, _Stream

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(240)]


async def _subscriptions(address: str) -> None:
    """On the owner at ``address``: 20 records in each partition; ``billing`` committed
    to 10 (partition 0) and 6 (partition 1) by AckUpTo; ``live`` consumed by a stream
    that acks partition 0's offsets 0-9, dead-letters offsets 10 and 11 (reason "bad
    json") and leaves every other delivery pending; the first dead letter (sequence 0)
    is acked by AckDeadLetters, so the queue holds sequence 1 only (its first_sequence
    1, while the topic has one copy)."""
    async with AsyncProducer(address) as producer:
        for n in range(40):
            await producer.send(TOPIC, f"s{n}".encode(), partition=n % 2)
        await producer.flush()
    await _open(address, "billing")
    async with grpc.aio.insecure_channel(address) as channel:
        broker = _broker_grpc.BrokerStub(channel)
        for partition, offset in ((0, 10), (1, 6)):
            request = _broker.AckUpToRequest(
                topic=TOPIC, subscription="billing", partition=partition, offset=offset
            )
            await broker.AckUpTo(request, timeout=10)
    stream = _Stream(address, "live", credit=40)
    try:
        assert len(await stream.offsets(40, within_s=15)) == 40
        await stream.ack([(0, 0, 10)])
        nack = _broker.Nack(partition=0, begin=10, end=12, reason="bad json", dead_letter=True)
        await stream._requests.put(_broker.SubscribeRequest(ack=_broker.Acks(nacks=[nack])))
        await _dead_letters(address, 2, within_s=10)
        async with grpc.aio.insecure_channel(address) as channel:
            acked = await _admin_grpc.AdminStub(channel).AckDeadLetters(
                _admin.AckDeadLettersRequest(topic=TOPIC, subscription="live", up_to_sequence=0),
                timeout=10,
            )
        assert acked.acked == 1
        await _dead_letters(address, 1, within_s=10)
        deadline = time.monotonic() + 10
        while await _cursors(address, "live") != [12, 0]:
            assert time.monotonic() < deadline, await _cursors(address, "live")
            await asyncio.sleep(0.1)
    finally:
        await stream.aclose()


async def _dead_letters(address: str, wanted: int, within_s: float) -> list[_admin.DeadLetterEntry]:
    """``live``'s dead-letter queue on ``address`` once it counts ``wanted`` (a broker
    that has just taken the topic over may refuse a moment); its entries."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                admin = _admin_grpc.AdminStub(channel)
                counted = await admin.CountDeadLetters(
                    _admin.CountDeadLettersRequest(topic=TOPIC, subscription="live"), timeout=10
                )
                if counted.count == wanted:
                    peeked = await admin.PeekDeadLetters(
                        _admin.PeekDeadLettersRequest(topic=TOPIC, subscription="live"),
                        timeout=10,
                    )
                    return list(peeked.entries)
        except grpc.aio.AioRpcError as exc:
            last = f"{exc.code()}: {exc.details()}"
        else:
            last = f"counted {counted.count}"
        assert time.monotonic() < deadline, f"{address} never counted {wanted} dead letters: {last}"
        await asyncio.sleep(0.1)


async def _check_subscriptions(address: str) -> None:
    """``address`` holds ``billing`` at [10, 6] and ``live`` at [12, 0] with its one
    dead letter left (sequence 1: partition 0, offset 11, value s22, "bad json"; the
    acked sequence 0 does not come back), and a consumer of ``live`` there is sent every
    pending record (partition 0 from 12, partition 1 from 0) and nothing it acked or
    dead-lettered."""
    assert await _cursors_eventually(address, "billing", 15) == [10, 6]
    assert await _cursors_eventually(address, "live", 15) == [12, 0]
    [letter] = await _dead_letters(address, 1, within_s=10)
    assert (letter.sequence, letter.partition, letter.offset, letter.value, letter.reason) == (
        1,
        0,
        11,
        b"s22",
        "bad json",
    )
    pending = {(0, o) for o in range(12, 20)} | {(1, o) for o in range(20)}
    stream = _Stream(address, "live", credit=1000)
    got: set[tuple[int, int]] = set()
    try:
        async with asyncio.timeout(20):
            while not pending <= got:
                got |= await stream.offsets(1, within_s=20)
    finally:
        await stream.aclose()
    assert not {(0, o) for o in range(12)} & got, sorted(got)[:20]


@dataclass(frozen=True, slots=True)
class _OneCopy:
    """``TOPIC``, of one copy, on two brokers: its first owner ``old`` (O), the other
    broker ``new`` (N), and the CLI's ``--config`` file; the steps the tests here share."""

    brokers: Brokers
    old: str
    new: str
    config: str

    @property
    def owner(self) -> ClusterBroker:
        return self.brokers.by_id[self.old]

    async def reassign(self, *replicas: str) -> None:
        """``headrace cluster reassign TOPIC --replicas <replicas>``; it exits 0."""
        args = ("--replicas", ",".join(replicas), "--config", self.config)
        done = await _headrace("cluster", "reassign", TOPIC, *args)
        assert done.exit_code == 0, done.output

    async def both_in_sync(self) -> None:
        """Wait until the topic is online with replicas (O, N), both in sync."""
        await _wait_route_of(
            self.brokers,
            TOPIC,
            "two in sync",
            40,
            lambda r: r.online and list(r.replicas) == [self.old, self.new] and len(r.isr) == 2,
        )

    async def move_to_new(self) -> None:
        """``--replicas N``; wait until the topic is online on N only, led by N, and O's
        copy is deleted."""
        await self.reassign(self.new)
        await _wait_route_of(
            self.brokers,
            TOPIC,
            f"on {self.new} only",
            40,
            lambda r: r.online and list(r.replicas) == [self.new] and r.owner_node == self.new,
        )
        await _gone(self.owner, TOPIC, within_s=15)

    async def check_moved(self, load: Load) -> None:
        """Every record ``load`` got acknowledged is read back once (through the leader),
        and N holds the subscriptions (:func:`_check_subscriptions`)."""
        check_acked(load, await _read_leader(self.brokers.seeds))
        await _check_subscriptions(self.brokers.by_id[self.new].address)


async def _one_copy(brokers: Brokers, config: Path) -> _OneCopy:
    """Create ``TOPIC`` with one copy (2 partitions, factor 1), wait until it is online,
    and make the subscriptions of :func:`_subscriptions` on its owner."""
    await create_replicated(brokers.seeds, TOPIC, 2, factor=1, min_insync=1)
    route = await _wait_route_of(brokers, TOPIC, "online", 20, lambda r: r.online)
    assert list(route.replicas) in ([], [route.owner_node]), route
    old = route.owner_node
    [new] = [b.node_id for b in brokers.all if b.node_id != old]
    await _subscriptions(brokers.by_id[old].address)
    return _OneCopy(brokers, old, new, str(config))


async def test_a_topic_of_one_copy_moves_to_another_broker(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: two brokers; a topic of one copy (factor 1, 2 partitions) on its owner
    O, with subscriptions ``billing`` (committed to [10, 6]) and ``live`` (partition 0's
    offsets 0-9 acked, offsets 10 and 11 dead-lettered and the first letter acked, the
    rest pending); an idempotent producer
    sends from then on; ``cluster reassign TOPIC --replicas O,N``, then ``--replicas N``.
    Expected: the topic first has replicas (O, N), both in sync; then replicas (N), led
    by N, and O's copy is deleted; the producer saw no error and every acknowledged record
    is read back (from N) once; N holds both subscriptions at their cursors and the dead
    letter, and a consumer of ``live`` on N is sent every pending record and none it
    acked; the acked letter does not come back."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=2) as brokers:
        topic = await _one_copy(brokers, _cli_config(tmp_path, etcd, prefix))
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(100, within_s=30)
            await topic.reassign(topic.old, topic.new)
            await topic.both_in_sync()
            await load.wait_more(len(load.acked) + 100, within_s=30)
            await topic.move_to_new()
            await load.wait_more(len(load.acked) + 100, within_s=30)
        await topic.check_moved(load)


async def _record(store: EtcdStore, keys: Keys) -> TopicRecord:
    held = await store.get(keys.topic(TOPIC))
    assert held is not None
    return decode(held.key, held.value, TopicRecord)


async def _before_its_switch(store: EtcdStore, keys: Keys, topic: _OneCopy) -> None:
    """O frozen (SIGSTOP) and at once the reassignment to (O, N) asked (while O's key is
    still there); back once the controller (N, once O's session ended, if O held it) made
    the record replicated and added N: replicas (O,) at epoch + 1, then (O, N) with isr
    (O,). O's files are still those of a topic of one copy: O never ran its switch."""
    before = await _record(store, keys)
    assert before.replicas == ()
    topic.owner.freeze()
    await request(store, keys, TOPIC, [topic.old, topic.new])
    deadline = time.monotonic() + TTL_S + EXPIRY_SLACK_S + 20
    while (now := await _record(store, keys)).replicas != (topic.old, topic.new):
        assert time.monotonic() < deadline, now
        await asyncio.sleep(0.1)
    assert (now.owner, now.epoch, now.isr) == (topic.old, before.epoch + 1, (topic.old,))


async def _during_its_switch(store: EtcdStore, keys: Keys, topic: _OneCopy) -> None:
    """The reassignment to (O, N) asked; back the moment O's switch begins: its state
    log's directory appears (it opens it before the leader starts and before the
    subscriptions are snapshotted; polled every millisecond)."""
    switch = topic.owner.data_dir / "subscriptions" / TOPIC / "state-log"
    assert not switch.exists()
    await request(store, keys, TOPIC, [topic.old, topic.new])
    deadline = time.monotonic() + 20
    while not switch.exists():
        assert time.monotonic() < deadline, "the owner never began its switch"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize(
    "kill_at",
    [_before_its_switch, _during_its_switch],
    ids=["before-its-switch", "during-its-switch"],
)
async def test_an_owner_killed_in_its_switch_comes_back_with_the_whole_topic(
    tmp_path: Path,
    etcd: EtcdCluster,
    prefix: str,
    kill_at: Callable[[EtcdStore, Keys, _OneCopy], Awaitable[None]],
) -> None:
    """Scenario: two brokers; the topic of one copy on O with the subscriptions of the
    test above and 100 acknowledged records more; the reassignment to (O, N) is asked
    (``cluster.moves.request``, what the CLI calls) and O is SIGKILLed at a point of its
    switch to the replicated path, then started again on its data directory. The points:
    ``before-its-switch``, O frozen (SIGSTOP) as the request is made and killed once the
    record names (O, N), its files still those of a topic of one copy;
    ``during-its-switch``, killed the moment its switch begins (its state log's directory
    appears: before the leader starts and before the subscriptions are snapshotted).
    Expected: before its switch, the record went replicas (O,) at epoch + 1 then (O, N)
    with isr (O,) while O was frozen; at either point, back, O claims the topic on the
    replicated path (its switch runs at that claim) and leads it, N copies it and both
    end in sync; every acknowledged record is read back once; after ``--replicas N`` the
    topic is on N only, O's copy is deleted, and N holds both subscriptions at their
    cursors and the one dead letter left."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=2) as brokers:
        topic = await _one_copy(brokers, _cli_config(tmp_path, etcd, prefix))
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(100, within_s=30)
        check_acked(load, await _read_leader(brokers.seeds))
        keys = Keys(prefix)
        store = await EtcdStore.connect(list(etcd.endpoints))
        async with store:
            await kill_at(store, keys, topic)
            topic.owner.kill()
        await topic.owner.start()
        await topic.both_in_sync()
        check_acked(load, await _read_leader(brokers.seeds))
        await topic.move_to_new()
        await topic.check_moved(load)
