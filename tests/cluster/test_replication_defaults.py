"""A topic created with no replication settings in a cluster (issue 37's defaults): real
etcd (three members) and three real ``headrace serve`` processes in cluster mode
(:mod:`tests.cluster.broker_processes`, TTL 2 s), no cluster defaults document.

The issue: "In cluster mode, replication_factor 3 and min_insync_replicas 2 per topic".
What is checked, from the outside: the create's answer, every broker's Lookup and
``headrace topics describe --json`` name three replicas and min_insync 2; the topic then
survives its leader's SIGKILL under an idempotent producer with no acknowledged record
lost (:func:`tests.cluster.replica_runs.settle_and_check` reads every replica's files).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.cli import cli
from client import AsyncAdminClient
from cluster.session import EXPIRY_SLACK_S
from tests.cluster.broker_processes import TTL_S, cluster_brokers, wait_alive
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replica_runs import Load, route, settle_and_check, wait_route

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
        for broker in brokers.all:
            seen = await route(broker.address, TOPIC)
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
