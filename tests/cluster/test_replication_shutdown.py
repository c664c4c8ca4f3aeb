"""How long a broker of a replicated topic takes to stop (SIGTERM), and what it keeps.

Real etcd and real ``headrace serve`` processes (:mod:`tests.cluster.broker_processes`).
A stop first hands the topics it leads to in-sync followers (the controlled shutdown,
``[cluster] controlled_shutdown_timeout_s``, default 10 s): only to one that is fetching
from it and not stopping too, and never longer than that bound, so a stop is quick when
there is nothing to hand to. Each test times the stop (generous bounds, each well under
the 10 s a stop took when it waited for a target that could never claim) and then reads
the topic back: every acknowledged record is there.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from client import AsyncProducer
from tests.cluster.broker_processes import (
    Brokers,
    ClusterBroker,
    cluster_brokers,
    create_replicated,
    read_topic,
)
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(150)]

RECORDS = 40
"""Records acknowledged per topic before the stop."""

QUICK_S = 5.0
"""A stop with nothing to wait for ends within this (it took 10 s when it waited)."""


async def _publish(seeds: str, topic: str, count: int) -> list[bytes]:
    """``count`` records acknowledged on ``topic``; their values."""
    values = [f"{topic}-{i}".encode() for i in range(count)]
    async with AsyncProducer(seeds) as producer:
        for value in values:
            await (await producer.send(topic, value))
    return values


def _timed_stop(broker: ClusterBroker) -> float:
    """SIGTERM ``broker``; seconds until it exited (status 0)."""
    started = time.monotonic()
    assert broker.stop() == 0
    return time.monotonic() - started


async def _all_read(brokers: Brokers, acked: dict[str, list[bytes]]) -> None:
    """Every topic online again, every acknowledged record read back (once each)."""
    await brokers.wait_owners(list(acked), within_s=30.0)
    for topic, values in acked.items():
        read = [v for rows in (await read_topic(brokers.seeds, topic)).values() for _, v in rows]
        assert sorted(read) == sorted(values), topic


async def test_a_stop_hands_over_to_a_fetching_follower_quickly(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Three brokers, a factor-3 topic, all in sync; its leader gets SIGTERM. Expected:
    it exits within QUICK_S, having handed the topic to one of the two others (its log
    says so), which leads it with every acknowledged record."""
    async with cluster_brokers(tmp_path, etcd, prefix, 3) as brokers:
        await create_replicated(brokers.seeds, "t", 1, 3)
        acked = {"t": await _publish(brokers.seeds, "t", RECORDS)}
        leader = brokers.by_id[await brokers.owner("t")]
        took = _timed_stop(leader)
        assert took < QUICK_S, took
        assert "controlled shutdown: topic t handed to" in leader.log.read_text()
        others = [b for b in brokers.all if b is not leader]
        assert await brokers.owner("t", via=others[0]) in {b.node_id for b in others}
        await _all_read(Brokers(others), acked)


async def test_a_stop_does_not_hand_over_to_a_follower_killed_within_its_ttl(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Two brokers with a 10 s session TTL, a factor-2 topic; its follower is SIGKILLed
    and, 1.5 s later (its session still alive in etcd), the leader gets SIGTERM.
    Expected: the leader exits within QUICK_S (it took 10 s when it handed the topic to
    the dead follower and waited for its claim), its log names the topic not handed over;
    both restarted, the topic comes back with every acknowledged record."""
    async with cluster_brokers(tmp_path, etcd, prefix, 2, ttl_s=10) as brokers:
        await create_replicated(brokers.seeds, "t", 2, 2)
        acked = {"t": await _publish(brokers.seeds, "t", RECORDS)}
        leader = brokers.by_id[await brokers.owner("t")]
        [follower] = [b for b in brokers.all if b is not leader]
        follower.kill()
        await asyncio.sleep(1.5)  # past the leader's "fetching lately" window, within the TTL
        took = _timed_stop(leader)
        assert took < QUICK_S, took
        log = leader.log.read_text()
        assert f"not handed to ['{follower.node_id}']: not fetching from here" in log
        assert "not handed over (no target, or out of time): t" in log
        await asyncio.sleep(10)  # the follower's session ends: it joins again as itself
        for broker in brokers.all:
            broker.spawn()
        for broker in brokers.all:
            await broker.wait_serving(30.0)
        await _all_read(brokers, acked)


async def test_stopping_every_broker_at_once_is_quick_and_loses_nothing(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Three brokers, three factor-3 topics led across them; all three get SIGTERM at
    once (``headrace cluster local`` on Ctrl-C), each trying to hand over to peers that
    are stopping too. Expected: all have exited within QUICK_S of the signals (a broker
    handed a topic to a peer that then exited, and waited the whole 10 s for its claim);
    all three restarted, every topic is online with every acknowledged record."""
    async with cluster_brokers(tmp_path, etcd, prefix, 3) as brokers:
        topics = ["t1", "t2", "t3"]
        for topic in topics:
            await create_replicated(brokers.seeds, topic, 2, 3)
        acked = {topic: await _publish(brokers.seeds, topic, RECORDS) for topic in topics}
        processes = [b.process for b in brokers.all]
        started = time.monotonic()
        for process in processes:
            assert process is not None
            process.terminate()
        for broker, process in zip(brokers.all, processes, strict=True):
            assert process is not None
            assert process.wait(timeout=30) == 0, broker.node_id
            broker.process = None
        took = time.monotonic() - started
        assert took < QUICK_S, took
        for broker in brokers.all:
            broker.spawn()
        for broker in brokers.all:
            await broker.wait_serving(30.0)
        await _all_read(brokers, acked)


async def test_a_stop_with_etcd_gone_is_bounded(
    tmp_path: Path, own_etcd: EtcdCluster, prefix: str
) -> None:
    """Two brokers, a factor-2 topic; every etcd member is SIGKILLed, then the topic's
    leader gets SIGTERM. Expected: it exits within 8 s, status 0, its log saying the
    topic was not handed over: its leaving key is given up on after 2 s (nothing can be
    handed over without etcd), the lease's revoke after 2 s (it took 10 s: 5 s for each
    etcd call's own timeout)."""
    async with cluster_brokers(tmp_path, own_etcd, prefix, 2) as brokers:
        await create_replicated(brokers.seeds, "t", 1, 2)
        await _publish(brokers.seeds, "t", RECORDS)
        leader = brokers.by_id[await brokers.owner("t")]
        for member in own_etcd.members:
            own_etcd.kill(member)
        took = _timed_stop(leader)
        print(f"stop with etcd gone: {took:.2f} s")
        assert took < 8.0, took
        assert "not handed over" in leader.log.read_text()
