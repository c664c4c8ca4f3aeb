"""A topic created with no replication settings in a cluster (issue 37's defaults): real
etcd (three members) and three real ``headrace serve`` processes in cluster mode
(:mod:`tests.cluster.broker_processes`, TTL 2 s), no cluster defaults document.

The issue: "In cluster mode, replication_factor 3 and min_insync_replicas 2 per topic".
What is checked, from the outside: the create's answer, every broker's Lookup and
``headrace topics describe --json`` name three replicas and min_insync 2; the topic then
survives its leader's SIGKILL under an idempotent producer with no acknowledged record
lost (:func:`tests.cluster.replica_runs.settle_and_check` reads every replica's files).
On two brokers the default factor is clamped to 2 and min_insync stays 2: a broker down
stops publishes (``not-enough-replicas``) but not reads, until it is back in sync.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from broker.cli import cli
from client import AsyncAdminClient, AsyncProducer
from cluster.session import EXPIRY_SLACK_S
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _pb_grpc
from tests.cluster.broker_processes import TTL_S, cluster_brokers, read_topic, wait_alive
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replica_runs import Load, settle_and_check, wait_route

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]

TOPIC = "plain"
PARTITIONS = 2
BROKERS = ["b1", "b2", "b3"]


async def test_a_topic_created_without_a_factor_has_three_replicas_and_survives_its_leader(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, no cluster defaults; once b1 sees all three alive, a topic
    of 2 partitions created through b1 with neither replication_factor nor
    min_insync_replicas; an idempotent producer (every broker a seed) sends; once all
    three are in sync and 150 more records are acknowledged, the leader is SIGKILLed;
    150 more after a new leader; the old leader restarted.
    Expected: the create answers three distinct replicas (b1, b2, b3), the first leading,
    min_insync 2; every broker's Lookup and ``topics describe --json`` say the same; a
    follower leads at a higher epoch within TTL + 1 s (plus etcd's expiry slack);
    no send failed; once all three are in sync again every acknowledged record is at its
    offset in the leader's log, once, and the replicas agree (the checker)."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        b1 = brokers.all[0]
        await wait_alive(b1.address, 3)
        async with AsyncAdminClient(b1.address) as admin:
            made = await admin.create_topic(TOPIC, PARTITIONS)
        assert sorted(made.replicas) == BROKERS, made
        assert (made.leader, made.min_insync_replicas) == (made.replicas[0], 2), made
        for broker in brokers.all:  # each view follows etcd's watch: wait for the record
            seen = await wait_route(
                [broker.address], TOPIC, "the topic in the view", 5, lambda r: bool(r.replicas)
            )
            assert (list(seen.replicas), seen.min_insync) == (list(made.replicas), 2), seen
        shown = await asyncio.to_thread(
            CliRunner().invoke,
            cli,
            ["topics", "describe", TOPIC, "--json", "--broker", brokers.seeds],
        )
        assert shown.exit_code == 0, shown.output
        [doc] = json.loads(shown.output)
        assert (doc["replicas"], doc["min_insync_replicas"]) == (list(made.replicas), 2), doc

        addresses = [b.address for b in brokers.all]
        in_sync = await wait_route(
            addresses,
            TOPIC,
            "all three in sync",
            20,
            check=lambda r: r.online and sorted(r.isr) == BROKERS,
        )
        victim = brokers.by_id[in_sync.owner_node]
        others = [b.address for b in brokers.all if b is not victim]
        load = Load(brokers.seeds, TOPIC)
        async with load.running():
            await load.wait_more(150, within_s=30)
            victim.kill()
            killed = time.monotonic()
            await wait_route(
                others,
                TOPIC,
                "a new leader",
                TTL_S + EXPIRY_SLACK_S + 6,
                check=lambda r: (
                    r.online and r.owner_node != victim.node_id and r.epoch > in_sync.epoch
                ),
            )
            took = time.monotonic() - killed
            assert took < TTL_S + EXPIRY_SLACK_S + 1.0, f"a new leader after {took:.2f} s"
            await load.wait_more(len(load.acked) + 150, within_s=30)
        assert load.failed == [], load.failed[:3]
        await victim.start()
        await settle_and_check(brokers.all, TOPIC, PARTITIONS, load.acked)


async def _publish_refusal(address: str, topic: str) -> str:
    """One raw Publish of ``topic`` at ``address``: ``""`` when written, else its
    ``headrace-refusal`` reason (``ABORTED``) or its status code's name."""
    request = _pb.PublishRequest(topic=topic, partition=0, records=[_pb.Record(value=b"x")])
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await _pb_grpc.BrokerStub(channel).Publish(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            trailers = dict(exc.trailing_metadata() or ())
            return str(trailers.get("headrace-refusal", exc.code().name))
    return ""


async def test_on_two_brokers_the_default_is_two_copies_both_needed_for_a_publish(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: two brokers, no cluster defaults; once b1 sees both alive, a topic of one
    partition created through b1 with no replication settings; 20 records acknowledged;
    the follower SIGKILLed; once the leader's in-sync set has shrunk to itself, a Publish
    at the leader and a read of the topic; the follower restarted.
    Expected: the create answers replicas b1 and b2 and min_insync 2 (the default factor 3
    clamped to the 2 live brokers, min_insync 2 kept), and b1's log warns of the clamp;
    with the follower down the Publish is refused ``not-enough-replicas`` and the 20
    records still read back in order; once the follower is back in sync, a publish is
    acknowledged again at offset 20."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=2) as brokers:
        b1 = brokers.all[0]
        await wait_alive(b1.address, 2)
        async with AsyncAdminClient(b1.address) as admin:
            made = await admin.create_topic("pair", 1)
        assert sorted(made.replicas) == ["b1", "b2"], made
        assert made.min_insync_replicas == 2, made
        assert "topic pair gets 2 copies, not the cluster's default 3" in b1.log.read_text()
        addresses = [b.address for b in brokers.all]
        both = await wait_route(
            addresses, "pair", "both in sync", 20, lambda r: r.online and len(r.isr) == 2
        )
        values = [b"r%d" % i for i in range(20)]
        async with AsyncProducer(brokers.seeds) as producer:
            for value in values:
                await producer.send("pair", value)
            await producer.flush()
        leader = brokers.by_id[both.owner_node]
        follower = next(b for b in brokers.all if b is not leader)
        follower.kill()
        await wait_route(
            [leader.address],
            "pair",
            "the isr shrunk to the leader",
            TTL_S + EXPIRY_SLACK_S + 10,
            lambda r: list(r.isr) == [leader.node_id],
        )
        assert await _publish_refusal(leader.address, "pair") == "not-enough-replicas"
        rows = await read_topic(leader.address, "pair")
        assert [v for _, v in rows[0]] == values
        await follower.start()
        await wait_route(
            [leader.address], "pair", "both in sync again", 30, lambda r: len(r.isr) == 2
        )
        async with AsyncProducer(brokers.seeds) as producer:
            future = await producer.send("pair", b"after")
            await producer.flush()
        assert (future.result().partition, future.result().offset) == (0, 20)
