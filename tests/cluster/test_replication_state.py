"""Subscription state replicated with its topic, end to end (issue 37): real etcd and
three real ``headrace serve`` processes (:mod:`tests.cluster.broker_processes`), a topic
of factor 3 / min_insync 2. Subscriptions are made and moved on the leader (a new
subscription, ``AckUpTo`` commits, a ``Seek``: saves that are durable before their
reply), the leader is SIGKILLed, and the new leader is asked what it holds: the same
cursors, never less (a committed save lost) and never more (a skip)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from client import AsyncProducer
from cluster.session import EXPIRY_SLACK_S
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from proto import broker_pb2 as _broker
from proto import broker_pb2_grpc as _broker_grpc
from tests.cluster.broker_processes import TTL_S, cluster_brokers
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replicated_load import TOPIC
from tests.cluster.test_replication_failover import (
    _all_in_sync,
    _create,
    _route,
    _wait_route,
)

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]


async def _open(address: str, name: str) -> None:
    """Make subscription ``name`` (exclusive, from the earliest offset) through a
    Subscribe stream on ``address``; the stream is closed once it is answered."""
    requests: asyncio.Queue[_broker.SubscribeRequest | None] = asyncio.Queue()
    open_ = _broker.OpenSubscription(topic=TOPIC, subscription=name, initial_credit=0)
    await requests.put(_broker.SubscribeRequest(open=open_))

    async def send() -> AsyncIterator[_broker.SubscribeRequest]:
        while (request := await requests.get()) is not None:
            yield request

    async with grpc.aio.insecure_channel(address) as channel:
        stream = _broker_grpc.BrokerStub(channel).Subscribe(send())
        answer = await asyncio.wait_for(stream.read(), 15)
        assert answer.HasField("subscribed"), answer
        await requests.put(None)
        stream.cancel()


async def _cursors(address: str, name: str) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        info = await _admin_grpc.AdminStub(channel).DescribeSubscription(
            _admin.DescribeSubscriptionRequest(topic=TOPIC, subscription=name), timeout=10
        )
    return [p.cursor for p in sorted(info.partitions, key=lambda p: p.partition)]


async def _cursors_eventually(address: str, name: str, within_s: float) -> list[int]:
    """The cursors as ``address`` answers once it serves the subscription (a broker
    that has just been elected may refuse for a moment)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await _cursors(address, name)
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_committed_cursors_and_a_seek_survive_the_leaders_sigkill(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers; the topic (2 partitions, factor 3, min_insync 2) gets 60
    records; on its leader, subscription ``billing`` is made and committed with AckUpTo
    to 20 in partition 0 and 12 in partition 1, and subscription ``audit`` is made and
    sought to offset 5. The leader is SIGKILLed. Expected: a follower leads at a higher
    epoch, and it holds both subscriptions at exactly those cursors ([20, 12] and
    [5, 5]): nothing committed is lost, nothing skipped. Then ``audit`` is sought to 7
    on the new leader, the old leader restarted (it follows, its state log caught up)
    and, all three in sync, the new leader SIGKILLed too: the third leader holds
    ``billing`` at [20, 12] and ``audit`` at [7, 7]."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        first = await _create(brokers)
        victim = brokers.by_id[first]
        others = [b for b in brokers.all if b is not victim]
        epoch = (await _route(brokers, others[0])).epoch
        async with AsyncProducer(brokers.seeds) as producer:
            for n in range(60):
                await producer.send(TOPIC, f"v{n}".encode(), partition=n % 2)
            await producer.flush()
        await _open(victim.address, "billing")
        await _open(victim.address, "audit")
        async with grpc.aio.insecure_channel(victim.address) as channel:
            broker = _broker_grpc.BrokerStub(channel)
            for partition, offset in ((0, 20), (1, 12)):
                await broker.AckUpTo(
                    _broker.AckUpToRequest(
                        topic=TOPIC, subscription="billing", partition=partition, offset=offset
                    ),
                    timeout=10,
                )
            await _admin_grpc.AdminStub(channel).Seek(
                _admin.SeekRequest(topic=TOPIC, subscription="audit", offset=5), timeout=10
            )
        assert await _cursors(victim.address, "billing") == [20, 12]
        assert await _cursors(victim.address, "audit") == [5, 5]
        victim.kill()
        route = await _wait_route(
            brokers,
            others[0],
            "a new leader",
            within_s=TTL_S + EXPIRY_SLACK_S + 5,
            check=lambda r: r.online and r.owner_node != first and r.epoch > epoch,
        )
        leader = brokers.by_id[route.owner_node]
        assert await _cursors_eventually(leader.address, "billing", 10) == [20, 12]
        assert await _cursors(leader.address, "audit") == [5, 5]
        # Again: the old leader back as a follower, all in sync, the new leader killed.
        async with grpc.aio.insecure_channel(leader.address) as channel:
            await _admin_grpc.AdminStub(channel).Seek(
                _admin.SeekRequest(topic=TOPIC, subscription="audit", offset=7), timeout=10
            )
        await victim.start()
        await _all_in_sync(brokers, leader, within_s=30)
        leader.kill()
        second = await _wait_route(
            brokers,
            victim,
            "a third leader",
            within_s=TTL_S + EXPIRY_SLACK_S + 5,
            check=lambda r: r.online and r.owner_node not in {"", route.owner_node},
        )
        third = brokers.by_id[second.owner_node]
        assert await _cursors_eventually(third.address, "billing", 10) == [20, 12]
        assert await _cursors(third.address, "audit") == [7, 7]


class _Stream:
    """A raw Subscribe stream: open, read deliveries, ack ranges."""

    def __init__(self, address: str, name: str, credit: int) -> None:
        self._requests: asyncio.Queue[_broker.SubscribeRequest | None] = asyncio.Queue()
        open_ = _broker.OpenSubscription(topic=TOPIC, subscription=name, initial_credit=credit)
        self._requests.put_nowait(_broker.SubscribeRequest(open=open_))
        self._channel = grpc.aio.insecure_channel(address)
        self.call = _broker_grpc.BrokerStub(self._channel).Subscribe(self._send())

    async def _send(self) -> AsyncIterator[_broker.SubscribeRequest]:
        while (request := await self._requests.get()) is not None:
            yield request

    async def offsets(self, wanted: int, within_s: float) -> set[tuple[int, int]]:
        """``(partition, offset)`` of the deliveries read until ``wanted`` are in."""
        got: set[tuple[int, int]] = set()
        async with asyncio.timeout(within_s):
            while len(got) < wanted:
                answer = await self.call.read()
                assert answer != grpc.aio.EOF
                if answer.HasField("delivery"):
                    d = answer.delivery
                    got.update((d.partition, o) for o in range(d.from_offset, d.to_offset))
        return got

    async def ack(self, ranges: list[tuple[int, int, int]]) -> None:
        acks = _broker.Acks(
            ranges=[_broker.OffsetRange(partition=p, begin=b, end=e) for p, b, e in ranges]
        )
        await self._requests.put(_broker.SubscribeRequest(ack=acks))

    async def aclose(self) -> None:
        await self._requests.put(None)
        self.call.cancel()
        await self._channel.close()


async def test_a_consumers_acks_are_never_skipped_after_the_leaders_sigkill(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, the topic (2 partitions, factor 3, min_insync 2) with 30
    records in each partition; a consumer of subscription ``live`` on the leader gets
    all 60 and acks offsets 0-19 of partition 0 and 0-9 of partition 1 (acks are saved
    in the background, not before a reply); a second later the leader is SIGKILLed.
    Expected: on the new leader the subscription exists, its cursors are at most the
    acked ends (20, 10) and at least the create's (0, 0): nothing unacknowledged is
    skipped; a consumer there receives every record at or above its cursors (acks that
    did not reach the new leader come again: at least once)."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        first = await _create(brokers)
        victim = brokers.by_id[first]
        others = [b for b in brokers.all if b is not victim]
        epoch = (await _route(brokers, others[0])).epoch
        async with AsyncProducer(brokers.seeds) as producer:
            for n in range(60):
                await producer.send(TOPIC, f"v{n}".encode(), partition=n % 2)
            await producer.flush()
        stream = _Stream(victim.address, "live", credit=100)
        try:
            answer = await asyncio.wait_for(stream.call.read(), 15)
            assert answer.HasField("subscribed"), answer
            delivered = await stream.offsets(60, within_s=15)
            assert delivered == {(p, o) for p in (0, 1) for o in range(30)}
            await stream.ack([(0, 0, 20), (1, 0, 10)])
            await asyncio.sleep(1.0)
            assert await _cursors(victim.address, "live") == [20, 10]
            victim.kill()
        finally:
            await stream.aclose()
        route = await _wait_route(
            brokers,
            others[0],
            "a new leader",
            within_s=TTL_S + EXPIRY_SLACK_S + 5,
            check=lambda r: r.online and r.owner_node != first and r.epoch > epoch,
        )
        leader = brokers.by_id[route.owner_node]
        cursors = await _cursors_eventually(leader.address, "live", 10)
        assert cursors[0] <= 20, cursors
        assert cursors[1] <= 10, cursors
        again = _Stream(leader.address, "live", credit=100)
        try:
            answer = await asyncio.wait_for(again.call.read(), 15)
            assert answer.HasField("subscribed"), answer
            wanted = (30 - cursors[0]) + (30 - cursors[1])
            redelivered = await again.offsets(wanted, within_s=15)
        finally:
            await again.aclose()
        expected = {(p, o) for p, c in enumerate(cursors) for o in range(c, 30)}
        assert redelivered == expected
