"""Cluster mode under faults: a broker SIGKILLed or frozen, the etcd leader SIGKILLed.

Real etcd (three members) and real ``headrace serve`` processes in cluster mode
(:mod:`tests.cluster.broker_processes`, session TTL 2-3 s), with an idempotent producer
per topic sending unique values through every broker as seeds. Every test ends with the
same check: each acknowledged record is in its partition's log at the offset it was
acknowledged at, and no value is in any log twice (one writer per topic, no retry
appended twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from client import AsyncAdminClient, AsyncProducer, RecordFuture
from proto.cluster_pb2 import TopicRoute
from tests.cluster.broker_processes import (
    Brokers,
    cluster_brokers,
    read_topic,
    wait_refused,
)
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(180)]

IN_FLIGHT = 20  # records sent and not yet settled, per topic
PAUSE_S = 0.01  # between sends of one topic: ~100 records/s each, gentle on 2 cores


@dataclass
class Load:
    """Idempotent producers, one task per topic, and what they got acknowledged."""

    seeds: str
    topics: list[str]
    #: topic -> (partition, offset) -> value acknowledged there.
    acked: dict[str, dict[tuple[int, int], bytes]] = field(default_factory=dict)
    failed: int = 0

    def count(self, topic: str) -> int:
        return len(self.acked[topic])

    async def wait_more(self, topic: str, than: int, within_s: float) -> None:
        """Wait until ``topic`` has more than ``than`` acknowledged records."""
        deadline = time.monotonic() + within_s
        while self.count(topic) <= than:
            assert time.monotonic() < deadline, f"{topic}: no ack beyond {than} in {within_s} s"
            await asyncio.sleep(0.05)

    async def _produce(self, producer: AsyncProducer, topic: str, stop: asyncio.Event) -> None:
        window = asyncio.Semaphore(IN_FLIGHT)
        n = 0
        while not stop.is_set():
            await window.acquire()
            value = f"{topic}:{n}".encode()
            n += 1
            future = await producer.send(topic, value)

            def settled(f: RecordFuture, value: bytes = value) -> None:
                window.release()
                if f.cancelled() or f.exception() is not None:
                    self.failed += 1
                    return
                meta = f.result()
                assert meta.offset >= 0
                self.acked[topic][(meta.partition, meta.offset)] = value

            future.add_done_callback(settled)
            await asyncio.sleep(PAUSE_S)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        """Produce to every topic until the block ends; then flush what is in flight."""
        stop = asyncio.Event()
        self.acked = {t: {} for t in self.topics}
        async with AsyncProducer(self.seeds, delivery_timeout_s=60.0) as producer:
            tasks = [asyncio.create_task(self._produce(producer, t, stop)) for t in self.topics]
            try:
                yield self
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                with contextlib.suppress(Exception):
                    await producer.flush()

    async def check_logs(self) -> None:
        """Every acknowledged record at its offset; no value twice in any log."""
        for topic in self.topics:
            partitions = await read_topic(self.seeds, topic)
            held = {(p, o): v for p, rows in partitions.items() for o, v in rows}
            values = [v for rows in partitions.values() for _, v in rows]
            assert len(values) == len(set(values)), f"{topic}: a value is in the log twice"
            for position, value in self.acked[topic].items():
                assert held.get(position) == value, f"{topic} {position}: acked {value!r} lost"


async def _wait_route(
    brokers: Brokers, topic: str, wanted: Callable[[TopicRoute], bool], within_s: float
) -> TopicRoute:
    """b1's route of ``topic`` once ``wanted`` holds (its view follows etcd's watch)."""
    deadline = time.monotonic() + within_s
    while not wanted(route := await brokers.route(topic)):
        assert time.monotonic() < deadline, f"{topic}: route still {route}"
        await asyncio.sleep(0.05)
    return route


async def _three_topics(brokers: Brokers) -> dict[str, str]:
    """Create alpha, beta, gamma through b1 (placed one on each broker); topic -> owner.

    One copy each (``replication_factor=1``): these tests are about a topic's one owner
    (issue 36), which the cluster's default factor (3) would replace by failover."""
    topics = ["alpha", "beta", "gamma"][: len(brokers.all)]
    async with AsyncAdminClient(brokers.all[0].address) as admin:
        for topic in topics:
            await admin.create_topic(topic, partitions=2, replication_factor=1)
    owners = await brokers.wait_owners(topics)
    assert sorted(owners.values()) == sorted(b.node_id for b in brokers.all)
    return owners


async def test_a_broker_sigkilled_under_load_is_offline_then_loses_nothing(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, one topic each, producers on all three; the owner of
    gamma is SIGKILLed, later restarted with the same node id and data directory.
    Expected: within the TTL and a few seconds, b1 refuses gamma as ``offline`` naming
    the dead owner; meanwhile alpha and beta keep being acknowledged; after the restart
    gamma is acknowledged again; every acknowledged record of every topic is in its log
    exactly once."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        owners = await _three_topics(brokers)
        victim = brokers.by_id[owners["gamma"]]
        others = [t for t in owners if t != "gamma"]
        load = Load(brokers.seeds, list(owners))
        async with load.running():
            for topic in owners:
                await load.wait_more(topic, 30, within_s=20)
            victim.kill()
            facts = await wait_refused(brokers.all[0].address, "gamma", "offline", 15)
            assert facts["headrace-owner-node"] == victim.node_id
            assert victim.node_id in facts["message"]
            for topic in others:  # the others keep serving while gamma is offline
                await load.wait_more(topic, load.count(topic) + 20, within_s=10)
            served = load.count("gamma")
            await victim.start()
            await load.wait_more("gamma", served + 20, within_s=30)
        assert load.failed == 0
        await load.check_logs()


async def test_a_broker_frozen_past_its_lease_stops_writing_and_resumes_once(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: two brokers (TTL 2 s), one topic each, producers on both; the owner of
    beta is frozen with SIGSTOP for three TTLs, then thawed. Expected: while it is frozen
    b1 refuses beta as ``offline`` (no other broker takes it: one copy, topics never
    move) and alpha keeps being acknowledged; after the thaw the owner starts a new
    session and claims beta again at a higher epoch before it writes; beta is
    acknowledged again; every acknowledged record is in its log exactly once (the
    requests queued while it was frozen were refused, not appended, then resent)."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=2) as brokers:
        owners = await _three_topics(brokers)
        victim = brokers.by_id[owners["beta"]]
        epoch = (await brokers.route("beta")).epoch
        load = Load(brokers.seeds, list(owners))
        async with load.running():
            for topic in owners:
                await load.wait_more(topic, 30, within_s=20)
            victim.freeze()
            try:
                facts = await wait_refused(brokers.all[0].address, "beta", "offline", 15)
                assert facts["headrace-owner-node"] == victim.node_id
                await load.wait_more("alpha", load.count("alpha") + 20, within_s=10)
                await asyncio.sleep(2.0)
            finally:
                victim.thaw()
            served = load.count("beta")
            await load.wait_more("beta", served + 20, within_s=30)
            route = await _wait_route(brokers, "beta", lambda r: r.epoch > epoch, 5.0)
            assert route.online
            assert route.owner_node == victim.node_id
        assert load.failed == 0
        await load.check_logs()


async def test_the_etcd_leader_sigkilled_under_load_changes_nothing_for_clients(
    tmp_path: Path, own_etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers (TTL 3 s), one topic each, producers on all; the etcd
    Raft leader is SIGKILLed and stays down for two TTLs. Expected: every topic keeps
    being acknowledged after the kill, every route stays online with its owner, no
    broker loses its session (epochs unchanged), and every acknowledged record is in
    its log exactly once."""
    async with cluster_brokers(tmp_path, own_etcd, prefix, ttl_s=3) as brokers:
        owners = await _three_topics(brokers)
        epochs = {t: (await brokers.route(t)).epoch for t in owners}
        load = Load(brokers.seeds, list(owners))
        async with load.running():
            for topic in owners:
                await load.wait_more(topic, 30, within_s=20)
            own_etcd.kill(own_etcd.leader())
            counts = {t: load.count(t) for t in owners}
            await asyncio.sleep(6.0)
            for topic in owners:
                await load.wait_more(topic, counts[topic] + 20, within_s=10)
                route = await brokers.route(topic, via=brokers.by_id[owners[topic]])
                assert route.online, route
                assert (route.owner_node, route.epoch) == (owners[topic], epochs[topic])
        assert load.failed == 0
        await load.check_logs()
