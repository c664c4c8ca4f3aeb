"""Operations on replicated topics end to end (issue 37): rolling restart (controlled
shutdown), reassignment and rebalance, with real etcd and three real ``headrace serve``
processes (:mod:`tests.cluster.broker_processes`, TTL 2 s), an idempotent producer
sending throughout, and the real CLI (``headrace cluster reassign`` / ``rebalance``).

What is checked from the outside: the producer's acks (no error, every acknowledged
record at its offset in the leader's log, none twice), the Lookup answer (leader,
replicas, in-sync set), the partition files on each broker's disk, and the CLI's output.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.cli import cli
from cluster.session import EXPIRY_SLACK_S
from proto.cluster_pb2 import TopicRoute
from tests.cluster.broker_processes import (
    TTL_S,
    Brokers,
    ClusterBroker,
    cluster_brokers,
    create_replicated,
)
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replicated_load import TOPIC, Load
from tests.cluster.test_replication_failover import (
    _all_in_sync,
    _files,
    _identical,
    _read_leader,
    _route,
    _wait_route,
)

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(240)]


async def _create(brokers: Brokers, factor: int) -> TopicRoute:
    """Create ``TOPIC`` (2 partitions, ``factor`` replicas, min_insync 2) and wait until
    every replica is in sync (asked again while brokers join); its route."""
    await create_replicated(brokers.seeds, TOPIC, 2, factor=factor)
    return await _wait_route(
        brokers,
        brokers.all[0],
        f"{factor} replicas in sync",
        20,
        check=lambda r: r.online and len(r.isr) == factor and len(r.replicas) == factor,
    )


def _led_by_other(gone: str) -> Callable[[TopicRoute], bool]:
    return lambda route: route.online and route.owner_node != gone


def _check_load(load: Load, held: dict[tuple[int, int], bytes]) -> None:
    """No error reached the producer; every acknowledged record is at its offset in
    ``held`` (the leader's log) and no value is there twice."""
    assert load.failed == [], load.failed[:5]
    values = list(held.values())
    assert len(values) == len(set(values)), "a value is in the leader's log twice"
    for position, value in load.acked.items():
        assert held.get(position) == value, f"{position}: acked {value!r} lost"


def _cli_config(root: Path, etcd: EtcdCluster, prefix: str) -> Path:
    """A TOML file naming the cluster's etcd and prefix, for the CLI's ``--config``."""
    path = root / "cli.toml"
    endpoints = ", ".join(f'"{e}"' for e in etcd.endpoints)
    path.write_text(f'[cluster]\netcd = [{endpoints}]\nnode_id = "cli"\nprefix = "{prefix}"\n')
    return path


async def _headrace(*args: str) -> Result:
    """Run ``headrace ARGS`` in process (on a thread: the CLI runs its own event loop)."""
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args))


async def test_a_rolling_restart_under_an_idempotent_producer_costs_it_nothing(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, a topic of factor 3 / min_insync 2, an idempotent
    producer sending throughout; each broker in turn is stopped with SIGTERM (after the
    other two are in sync) and restarted on its data directory, the leader included.
    Expected: each exits 0; when the leader stops, another broker leads as soon as it has
    exited (handed over, not elected after the TTL), less than a second after; the
    producer sees no error and its acks keep coming (the leadership moves on with each
    stop); at the end every acknowledged record is at its offset once, and all three
    replicas are in sync and byte-identical."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        await _create(brokers, 3)
        load = Load(brokers.seeds)
        handed_over_after: list[float] = []
        async with load.running():
            await load.wait_more(100, within_s=30)
            for broker in brokers.all:
                others = [b for b in brokers.all if b is not broker]
                before = await _all_in_sync(brokers, others[0], within_s=30)
                was_leader = before.owner_node == broker.node_id
                status = await asyncio.to_thread(broker.stop)
                stopped = time.monotonic()
                assert status == 0, broker.log.read_text()[-2000:]
                if was_leader:
                    await _wait_route(
                        brokers,
                        others[0],
                        "a new leader",
                        TTL_S + EXPIRY_SLACK_S + 5,
                        check=_led_by_other(broker.node_id),
                    )
                    handed_over_after.append(time.monotonic() - stopped)
                acked = len(load.acked)
                await load.wait_more(acked + 50, within_s=30)
                await broker.start()
            await _all_in_sync(brokers, brokers.all[0], within_s=30)
            await load.wait_more(len(load.acked) + 50, within_s=30)
        assert handed_over_after, "no leader was stopped"
        slowest = max(handed_over_after)
        assert slowest < 1.0, f"a new leader {slowest:.2f} s after the old one exited"
        _check_load(load, await _read_leader(brokers.seeds))
        await _identical(brokers.all, within_s=15)
        assert "handed to" in "".join(b.log.read_text() for b in brokers.all)


async def test_a_reassignment_under_load_moves_the_topic_and_keeps_serving(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, a topic of factor 2 on {a, b} (placed by the
    controller), an idempotent producer sending throughout; ``headrace cluster reassign
    TOPIC --replicas b,c --throttle 20000`` (c the third broker). Expected: ``reassign
    --status --json`` shows the reassignment running while c catches up at the
    throttle; the topic ends with replicas (b, c), b leading, both in sync, a's copy
    deleted, c's partition files byte-identical to b's; the producer saw no error and
    lost nothing; ``--status`` then says none is running."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        route = await _create(brokers, 2)
        a, b = route.replicas
        [c] = [x.node_id for x in brokers.all if x.node_id not in (a, b)]
        config = str(_cli_config(tmp_path, etcd, prefix))
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(600, within_s=60)
            asked = await _headrace(
                "cluster", "reassign", TOPIC, "--replicas", f"{b},{c}",
                "--throttle", "20000", "--config", config,
            )  # fmt: skip
            assert asked.exit_code == 0, asked.output
            assert f"to {b},{c} requested" in asked.output
            status = await _headrace(
                "cluster", "reassign", "--status", "--json", "--config", config
            )
            assert status.exit_code == 0, status.output
            [running] = json.loads(status.output)["reassignments"]
            assert (running["topic"], running["target"], running["throttle"]) == (
                TOPIC,
                f"{b},{c}",
                20000,
            )
            assert running["next"] in ("add-replicas", "wait-in-sync"), running
            done = await _wait_route(
                brokers,
                brokers.by_id[c],
                "the reassignment done",
                60,
                check=lambda r: list(r.replicas) == [b, c] and sorted(r.isr) == sorted([b, c]),
            )
            await _wait_route(
                brokers, brokers.by_id[c], f"{b} leading", 10, check=lambda r: r.owner_node == b
            )
            acked = len(load.acked)
            await load.wait_more(acked + 100, within_s=30)
        assert done.online
        _check_load(load, await _read_leader(brokers.seeds))
        kept = [brokers.by_id[b], brokers.by_id[c]]
        files = await _identical(kept, within_s=15)
        assert sum(len(v) for k, v in files.items() if k.endswith(".log")) > 0
        deadline = time.monotonic() + 10
        while _files(brokers.by_id[a]):
            assert time.monotonic() < deadline, f"{a} still holds its copy"
            await asyncio.sleep(0.1)
        after = await _headrace("cluster", "reassign", "--status", "--config", config)
        assert after.exit_code == 0, after.output
        assert "no reassignment is running" in after.output, after.output


async def test_rebalance_moves_leadership_back_to_the_preferred_leader(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, a topic of factor 3 led by its preferred leader p; p is
    stopped (controlled: leadership moves away) and restarted, and rejoins the in-sync
    set. Expected: leadership stays away from p; ``headrace cluster rebalance --dry-run
    --json`` lists one move for the topic and writes nothing (the leader is unchanged);
    ``headrace cluster rebalance`` makes p lead again, with all three in sync."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        route = await _create(brokers, 3)
        preferred = route.replicas[0]
        assert route.owner_node == preferred
        p = brokers.by_id[preferred]
        other = next(b for b in brokers.all if b is not p)
        assert await asyncio.to_thread(p.stop) == 0
        away = await _wait_route(
            brokers, other, "a new leader", 10, check=lambda r: r.owner_node != preferred
        )
        await p.start()
        await _all_in_sync(brokers, other, within_s=30)
        assert (await _route(brokers, other)).owner_node == away.owner_node
        config = str(_cli_config(tmp_path, etcd, prefix))
        dry = await _headrace("cluster", "rebalance", "--dry-run", "--json", "--config", config)
        assert dry.exit_code == 0, dry.output
        plan = json.loads(dry.output)
        assert plan["dry_run"] is True
        assert [(m["topic"], m["leader"]) for m in plan["moves"]] == [(TOPIC, away.owner_node)]
        await asyncio.sleep(1.0)
        assert (await _route(brokers, other)).owner_node == away.owner_node
        done = await _headrace("cluster", "rebalance", "--config", config)
        assert done.exit_code == 0, done.output
        assert "1 move(s) requested" in done.output
        back = await _wait_route(
            brokers,
            other,
            "the preferred leader back",
            15,
            check=lambda r: r.owner_node == preferred,
        )
        assert back.replicas[0] == preferred
        await _all_in_sync(brokers, other, within_s=30)


async def test_auto_rebalance_moves_leadership_back_without_a_command(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: as above, but every broker runs with ``[cluster] auto_rebalance = true``
    and ``rebalance_interval_s = 1``; p stopped and restarted, no command given.
    Expected: once p is back in sync, the controller makes it lead again by itself."""
    brokers = [ClusterBroker(tmp_path, f"b{i + 1}", etcd, prefix) for i in range(3)]
    for broker in brokers:
        config = broker.data_dir.parent / "headrace.toml"
        config.write_text(config.read_text() + "auto_rebalance = true\nrebalance_interval_s = 1\n")
    try:
        for broker in brokers:
            broker.spawn()
        for broker in brokers:
            await broker.wait_serving(30.0)
        cluster = Brokers(brokers)
        route = await _create(cluster, 3)
        preferred = route.replicas[0]
        p = cluster.by_id[preferred]
        other = next(b for b in brokers if b is not p)
        assert await asyncio.to_thread(p.stop) == 0
        await _wait_route(
            cluster, other, "a new leader", 10, check=lambda r: r.owner_node != preferred
        )
        await p.start()
        await _wait_route(
            cluster,
            other,
            "the preferred leader back by itself",
            30,
            check=lambda r: r.owner_node == preferred and len(r.isr) == 3,
        )
    finally:
        for broker in brokers:
            try:
                broker.stop()
            finally:
                broker.kill()
