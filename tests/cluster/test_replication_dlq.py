"""Dead-letter queues replicated with their topic, end to end (issue 37): real etcd and
three real ``headrace serve`` processes (:mod:`tests.cluster.broker_processes`), a topic
of factor 3 / min_insync 2. A consumer on the leader rejects records into its
subscription's dead-letter queue, an operator acks one of them, the leader is
SIGKILLed, and the new leader's queue is peeked: the entries that were dead-lettered,
without the acked one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from client import AsyncProducer
from cluster.session import EXPIRY_SLACK_S
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from proto import broker_pb2 as _broker
from tests.cluster.broker_processes import TTL_S, cluster_brokers
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replicated_load import TOPIC
from tests.cluster.test_replication_failover import _create, _route, _wait_route
from tests.cluster.test_replication_state import _Stream

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]


async def _count(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        answer = await _admin_grpc.AdminStub(channel).CountDeadLetters(
            _admin.CountDeadLettersRequest(topic=TOPIC, subscription="billing"), timeout=10
        )
    return int(answer.count)


async def _count_becomes(address: str, wanted: int, within_s: float) -> None:
    """Wait until ``address`` counts ``wanted`` entries (a new leader may refuse a
    moment; dead letters are written after the reject's answer)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if await _count(address) == wanted:
                return
        except grpc.aio.AioRpcError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{address} never counted {wanted} dead letters")
        await asyncio.sleep(0.1)


async def test_dead_letters_and_an_ack_survive_the_leaders_sigkill(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers; the topic (2 partitions, factor 3, min_insync 2) gets 10
    records; a consumer of ``billing`` on the leader receives them and rejects offsets
    0-2 of partition 0 (Nack dead_letter, reason "bad json"): 3 entries in the queue;
    AckDeadLetters up to sequence 0 removes one. The leader is SIGKILLed. Expected: a
    follower leads at a higher epoch and its queue holds exactly sequences 1 and 2,
    offsets 1 and 2 of partition 0, reason "bad json", values v2 and v4 (the acked entry
    does not come back; nothing dead-lettered is lost)."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        first = await _create(brokers)
        victim = brokers.by_id[first]
        others = [b for b in brokers.all if b is not victim]
        epoch = (await _route(brokers, others[0])).epoch
        async with AsyncProducer(brokers.seeds) as producer:
            for n in range(10):
                await producer.send(TOPIC, f"v{n}".encode(), partition=n % 2)
            await producer.flush()
        stream = _Stream(victim.address, "billing", credit=10)
        try:
            got = await stream.offsets(10, within_s=15)
            assert {(0, o) for o in range(3)} <= got
            nack = _broker.Nack(partition=0, begin=0, end=3, reason="bad json", dead_letter=True)
            await stream._requests.put(_broker.SubscribeRequest(ack=_broker.Acks(nacks=[nack])))
            await _count_becomes(victim.address, 3, within_s=10)
        finally:
            await stream.aclose()
        async with grpc.aio.insecure_channel(victim.address) as channel:
            acked = await _admin_grpc.AdminStub(channel).AckDeadLetters(
                _admin.AckDeadLettersRequest(topic=TOPIC, subscription="billing", up_to_sequence=0),
                timeout=10,
            )
        assert acked.acked == 1
        victim.kill()
        route = await _wait_route(
            brokers,
            others[0],
            "a new leader",
            within_s=TTL_S + EXPIRY_SLACK_S + 5,
            check=lambda r: r.online and r.owner_node != first and r.epoch > epoch,
        )
        leader = brokers.by_id[route.owner_node]
        await _count_becomes(leader.address, 2, within_s=10)
        async with grpc.aio.insecure_channel(leader.address) as channel:
            peeked = await _admin_grpc.AdminStub(channel).PeekDeadLetters(
                _admin.PeekDeadLettersRequest(topic=TOPIC, subscription="billing"), timeout=10
            )
        assert [(e.sequence, e.partition, e.offset) for e in peeked.entries] == [
            (1, 0, 1),
            (2, 0, 2),
        ]
        assert [e.value for e in peeked.entries] == [b"v2", b"v4"]
        assert {e.reason for e in peeked.entries} == {"bad json"}
