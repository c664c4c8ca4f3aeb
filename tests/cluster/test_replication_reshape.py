"""Reshaping replicated topics end to end (issue 37): ``reassign --cancel``, a rebalance
that moves replicas to a new broker, and a topic reassigned down to one replica; real
etcd and real ``headrace serve`` processes (:mod:`tests.cluster.broker_processes`, TTL
2 s), an idempotent producer sending throughout, and the real CLI.

What is checked from the outside: the producer's acks (no error, every acknowledged
record at its offset in what a consumer's Fetch reads, none twice), the Lookup answer
(leader, replicas, in-sync set), the partition files on each broker's disk, and the
CLI's output.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner, Result

from broker.cli import cli
from client import AsyncProducer
from cluster.etcd import EtcdStore
from cluster.records import BrokerRecord, Keys, TopicRecord, TopicState, encode
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from proto.cluster_pb2 import TopicRoute
from tests.cluster.broker_processes import (
    Brokers,
    ClusterBroker,
    cluster_brokers,
    create_replicated,
    read_topic,
)
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replicated_load import TOPIC, Load
from tests.cluster.test_replication_failover import (
    _identical,
    _read_leader,
    _wait_route,
)

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(240)]


def _check_load(
    load: Load,
    held: dict[tuple[int, int], bytes],
    acked: dict[tuple[int, int], bytes] | None = None,
) -> None:
    """No error reached the producer; every acknowledged record (``acked``: those acked
    before the read began, taken while the producer still runs; else all of
    ``load.acked``) is at its offset in ``held`` (what a consumer reads) and no value is
    there twice."""
    assert load.failed == [], load.failed[:5]
    values = list(held.values())
    assert len(values) == len(set(values)), "a value is in the topic twice"
    acked = load.acked if acked is None else acked
    missing = [p for p, v in acked.items() if held.get(p) != v]
    assert not missing, f"{len(missing)} of {len(acked)} acked not read, e.g. {missing[:3]}"


def _cli_config(root: Path, etcd: EtcdCluster, prefix: str) -> str:
    """A TOML file naming the cluster's etcd and prefix, for the CLI's ``--config``."""
    path = root / "cli.toml"
    endpoints = ", ".join(f'"{e}"' for e in etcd.endpoints)
    path.write_text(f'[cluster]\netcd = [{endpoints}]\nnode_id = "cli"\nprefix = "{prefix}"\n')
    return str(path)


async def _headrace(*args: str) -> Result:
    """Run ``headrace ARGS`` in process (on a thread: the CLI runs its own event loop)."""
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args))


async def _create(brokers: Brokers, topic: str, factor: int, min_insync: int) -> TopicRoute:
    """Create ``topic`` (2 partitions) and wait until its ``factor`` replicas are in sync."""
    await create_replicated(brokers.seeds, topic, 2, factor=factor, min_insync=min_insync)
    deadline = time.monotonic() + 30
    while True:
        route = await brokers.route(topic)
        if route.online and len(route.isr) == factor == len(route.replicas):
            return route
        assert time.monotonic() < deadline, f"{topic}: {route}"
        await asyncio.sleep(0.05)


def _topic_files(broker: ClusterBroker, topic: str) -> dict[str, bytes]:
    """``<partition>/<file>`` -> bytes of each segment of ``topic`` on ``broker``'s disk."""
    root = broker.data_dir / "topics" / topic
    return {f"{p.parent.name}/{p.name}": p.read_bytes() for p in sorted(root.glob("*/*.log"))}


async def _gone(broker: ClusterBroker, topic: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while (broker.data_dir / "topics" / topic).exists():
        assert time.monotonic() < deadline, f"{broker.node_id} still holds {topic}"
        await asyncio.sleep(0.1)


async def test_a_cancelled_reassignment_goes_back_and_keeps_serving(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, a topic of factor 2 / min_insync 2 on (a, b), an
    idempotent producer sending throughout; ``reassign TOPIC --replicas c,b --throttle
    2000`` (c catches up at 2000 B/s, so it is still catching up), then ``reassign TOPIC
    --cancel``. Expected: before the cancel, c has made its copy and ``--status`` shows
    the reassignment waiting for c; the cancel answers "cancelled, going back to a,b";
    the topic ends with replicas (a, b) in that order, both in sync, a still leading, the
    throttle and target cleared (``--status``: none running); c's copy is deleted; a's
    and b's files are byte-identical; the producer saw no error and every acknowledged
    record is read back once."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        route = await _create(brokers, TOPIC, 2, 2)
        a, b = route.replicas
        [c] = [x.node_id for x in brokers.all if x.node_id not in (a, b)]
        config = _cli_config(tmp_path, etcd, prefix)
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(600, within_s=60)
            asked = await _headrace(
                "cluster", "reassign", TOPIC, "--replicas", f"{c},{b}",
                "--throttle", "2000", "--config", config,
            )  # fmt: skip
            assert asked.exit_code == 0, asked.output
            await _wait_route(
                brokers, brokers.all[0], f"{c} added", 20, check=lambda r: c in r.replicas
            )
            copy = brokers.by_id[c].data_dir / "topics" / TOPIC
            deadline = time.monotonic() + 10
            while not copy.exists():
                assert time.monotonic() < deadline, f"{c} made no copy"
                await asyncio.sleep(0.05)
            status = await _headrace(
                "cluster", "reassign", "--status", "--json", "--config", config
            )
            [running] = json.loads(status.output)["reassignments"]
            assert (running["next"], running["waiting_for"], running["cancelled"]) == (
                "wait-in-sync",
                c,
                False,
            ), running
            cancelled = await _headrace(
                "cluster", "reassign", TOPIC, "--cancel", "--config", config
            )
            assert cancelled.exit_code == 0, cancelled.output
            assert f"cancelled, going back to {a},{b}" in cancelled.output
            back = await _wait_route(
                brokers,
                brokers.all[0],
                "back to the original replicas",
                20,
                check=lambda r: list(r.replicas) == [a, b] and sorted(r.isr) == sorted([a, b]),
            )
            assert back.owner_node == a
            await load.wait_more(len(load.acked) + 100, within_s=30)
        _check_load(load, await _read_leader(brokers.seeds))
        await _gone(brokers.by_id[c], TOPIC, within_s=10)
        await _identical([brokers.by_id[a], brokers.by_id[b]], within_s=15)
        after = await _headrace("cluster", "reassign", "--status", "--config", config)
        assert "no reassignment is running" in after.output, after.output
        again = await _headrace("cluster", "reassign", TOPIC, "--cancel", "--config", config)
        assert again.exit_code == 1
        assert f"no reassignment of topic {TOPIC} is running" in again.output


async def test_status_shows_a_cancel(tmp_path: Path, etcd: EtcdCluster, prefix: str) -> None:
    """Scenario: etcd only (no controller carries anything out): a topic record on
    (b1, b2) moving to (b3, b4) with b3, b4 added and b3 leading; brokers b1..b4 alive.
    ``reassign t --cancel``, then ``--status``. Expected: the cancel answers "going back
    to b1,b2"; ``--status --json`` shows target b1,b2, cancelled true, throttle 0 and the
    next step move-leadership (b3 leads); the text form has a "yes" in the cancelled
    column."""
    keys = Keys(prefix)
    store = await EtcdStore.connect(list(etcd.endpoints))
    async with store:
        for node in ("b1", "b2", "b3", "b4"):
            lease, _ = await store.grant(60)
            await store.put(keys.broker(node), _broker(node), lease=lease)
        record = TopicRecord("t", "00112233aabbccdd", 1, 0, "b3", 5, TopicState.READY).replace(
            replicas=("b3", "b4", "b1", "b2"), isr=("b3", "b1", "b2"), min_insync=2,
            reassign_to=("b3", "b4"), reassign_from=("b1", "b2"), reassign_throttle=2000,
        )  # fmt: skip
        await store.put(keys.topic("t"), encode(record))
    config = _cli_config(tmp_path, etcd, prefix)
    cancelled = await _headrace("cluster", "reassign", "t", "--cancel", "--config", config)
    assert cancelled.exit_code == 0, cancelled.output
    assert "going back to b1,b2" in cancelled.output
    status = await _headrace("cluster", "reassign", "--status", "--json", "--config", config)
    [row] = json.loads(status.output)["reassignments"]
    assert (row["target"], row["cancelled"], row["throttle"], row["next"]) == (
        "b1,b2",
        True,
        0,
        "move-leadership",
    )
    text = await _headrace("cluster", "reassign", "--status", "--config", config)
    header, line = text.output.splitlines()[:2]
    assert "cancelled" in header.split()
    assert line.split()[header.split().index("cancelled")] == "yes"


def _broker(node: str) -> bytes:
    return encode(BrokerRecord(node, f"127.0.0.1:{1000 + int(node[1:])}", 1, 0, "test"))


async def test_rebalance_moves_a_replica_to_a_new_broker(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, three topics of factor 2 / min_insync 2 (two replicas on
    each broker), records in each and a producer on one throughout; a fourth broker
    starts empty; ``rebalance --dry-run --json``, then ``rebalance``. Expected: the dry
    run lists one move of kind replicas, to the new broker, and writes nothing; the
    rebalance requests it; the new broker then holds a replica of that topic, in sync,
    byte-identical to the other replica; the replica it replaced is deleted; each
    broker holds one or two replicas; every acknowledged record of every topic is read
    back once; a second dry run finds nothing to move."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        names = [TOPIC, "payments", "refunds"]
        for name in names:
            await _create(brokers, name, 2, 2)
        async with AsyncProducer(brokers.seeds) as producer:
            sent = [await producer.send(n, f"{n}-{i}".encode()) for n in names for i in range(200)]
            await producer.flush()
        assert all(f.exception() is None for f in sent)
        config = _cli_config(tmp_path, etcd, prefix)
        b4 = ClusterBroker(tmp_path, "b4", etcd, prefix)
        brokers.all.append(b4)
        brokers.by_id["b4"] = b4
        await b4.start()
        await _wait_alive(brokers.all[0], 4)
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(300, within_s=60)
            dry = await _headrace("cluster", "rebalance", "--dry-run", "--json", "--config", config)
            assert dry.exit_code == 0, dry.output
            plan = json.loads(dry.output)
            [move] = [m for m in plan["moves"] if m["kind"] == "replicas"]
            assert "b4" in move["after"].split(",")
            assert "b4" not in move["before"].split(",")
            moved = move["topic"]
            [source] = set(move["before"].split(",")) - set(move["after"].split(","))
            status = await _headrace("cluster", "reassign", "--status", "--config", config)
            assert "no reassignment is running" in status.output, status.output
            done = await _headrace("cluster", "rebalance", "--config", config)
            assert done.exit_code == 0, done.output
            after = await _wait_route_of(
                brokers, moved, "b4 in sync", 60,
                lambda r: "b4" in r.replicas and source not in r.replicas and len(r.isr) == 2,
            )  # fmt: skip
            await load.wait_more(len(load.acked) + 100, within_s=30)
        _check_load(load, await _read_leader(brokers.seeds))
        for name in names:
            read = {v for rows in (await read_topic(brokers.seeds, name)).values() for _, v in rows}
            assert {f"{name}-{i}".encode() for i in range(200)} <= read, name
        await _gone(brokers.by_id[source], moved, within_s=10)
        holders = [brokers.by_id[n] for n in after.replicas]
        deadline = time.monotonic() + 15
        while len({str(sorted(_topic_files(h, moved).items())) for h in holders}) != 1:
            assert time.monotonic() < deadline, f"{moved}'s replicas differ"
            await asyncio.sleep(0.1)
        held = {
            b.node_id: sum((b.data_dir / "topics" / n).exists() for n in names) for b in brokers.all
        }
        assert sorted(held.values()) == [1, 1, 2, 2], held
        again = await _headrace("cluster", "rebalance", "--dry-run", "--json", "--config", config)
        assert [m for m in json.loads(again.output)["moves"] if m["kind"] == "replicas"] == []


async def _wait_alive(via: ClusterBroker, count: int, within_s: float = 15.0) -> None:
    """Until ``via``'s view shows ``count`` brokers alive (the CLI's view then does too,
    both read etcd)."""
    deadline = time.monotonic() + within_s
    while True:
        async with grpc.aio.insecure_channel(via.address) as channel:
            stub = _cluster_grpc.ClusterStub(channel)
            status = await stub.ClusterStatus(_cluster.ClusterStatusRequest(), timeout=5)
        alive = sum(b.alive for b in status.brokers)
        if alive >= count:
            return
        assert time.monotonic() < deadline, f"{via.node_id} sees {alive} brokers alive"
        await asyncio.sleep(0.1)


async def _wait_route_of(
    brokers: Brokers,
    topic: str,
    wanted: str,
    within_s: float,
    check: Callable[[TopicRoute], bool],
) -> TopicRoute:
    deadline = time.monotonic() + within_s
    while True:
        route = await brokers.route(topic)
        if check(route):
            return route
        assert time.monotonic() < deadline, f"{topic}, {wanted}: {route}"
        await asyncio.sleep(0.05)


async def test_a_topic_reassigned_to_one_replica_keeps_serving(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, a topic of factor 3 / min_insync 1, an idempotent producer
    sending throughout; ``reassign TOPIC --replicas L`` (L its leader); then L restarted
    (SIGTERM, same data directory) while the producer goes on; then ``reassign TOPIC
    --replicas L,M`` back to two. Expected: the topic ends with replicas (L), the other
    two copies deleted; the producer keeps getting acks and every acknowledged record is
    read back by a consumer's Fetch (the leader commits alone: its high watermark follows
    its durable end), before and after the restart; back at two replicas, both in sync
    and byte-identical, and still nothing lost."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        route = await _create(brokers, TOPIC, 3, 1)
        leader = route.owner_node
        others = [n for n in route.replicas if n != leader]
        config = _cli_config(tmp_path, etcd, prefix)
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(300, within_s=60)
            asked = await _headrace(
                "cluster", "reassign", TOPIC, "--replicas", leader, "--config", config
            )
            assert asked.exit_code == 0, asked.output
            await _wait_route_of(
                brokers, TOPIC, "one replica", 20, lambda r: list(r.replicas) == [leader]
            )
            for node in others:
                await _gone(brokers.by_id[node], TOPIC, within_s=10)
            await load.wait_more(len(load.acked) + 200, within_s=30)
            acked = dict(load.acked)  # the producer goes on: what it acked before the read
            _check_load(load, await _read_leader(brokers.seeds), acked)
            only = brokers.by_id[leader]
            assert await asyncio.to_thread(only.stop) == 0
            await only.start()
            await _wait_route_of(
                brokers, TOPIC, "online again", 20, lambda r: r.online and r.owner_node == leader
            )
            await load.wait_more(len(load.acked) + 200, within_s=30)
        _check_load(load, await _read_leader(brokers.seeds))
        grown = await _headrace(
            "cluster", "reassign", TOPIC, "--replicas", f"{leader},{others[0]}", "--config", config
        )
        assert grown.exit_code == 0, grown.output
        await _wait_route_of(
            brokers, TOPIC, "two in sync", 30, lambda r: len(r.replicas) == 2 == len(r.isr)
        )
        pair = [brokers.by_id[leader], brokers.by_id[others[0]]]
        await _identical(pair, within_s=15)
        _check_load(load, await _read_leader(brokers.seeds))


async def test_auto_rebalance_moves_a_replica_to_a_new_broker_by_itself(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: every broker runs with ``[cluster] auto_rebalance = true`` and
    ``rebalance_interval_s = 1``; three of them, three topics of factor 2 / min_insync 2
    with 200 records each; then a fourth broker starts empty; no command given.
    Expected: within 30 s the controller has moved one replica to it by itself (in
    sync, the replaced copy deleted), the brokers hold 2, 2, 1 and 1 replicas, and every
    record of every topic is read back."""
    brokers = [ClusterBroker(tmp_path, f"b{i + 1}", etcd, prefix) for i in range(4)]
    for broker in brokers:
        config = broker.data_dir.parent / "headrace.toml"
        config.write_text(config.read_text() + "auto_rebalance = true\nrebalance_interval_s = 1\n")
    names = [TOPIC, "payments", "refunds"]
    try:
        for broker in brokers[:3]:
            broker.spawn()
        for broker in brokers[:3]:
            await broker.wait_serving(30.0)
        cluster = Brokers(brokers[:3])
        for name in names:
            await _create(cluster, name, 2, 2)
        async with AsyncProducer(cluster.seeds) as producer:
            sent = [await producer.send(n, f"{n}-{i}".encode()) for n in names for i in range(200)]
            await producer.flush()
        assert all(f.exception() is None for f in sent)
        await brokers[3].start()
        cluster = Brokers(brokers)
        deadline = time.monotonic() + 30
        while True:
            routes = [await cluster.route(n) for n in names]
            on_b4 = [r for r in routes if "b4" in r.replicas and len(r.isr) == 2]
            held = {
                b.node_id: sum((b.data_dir / "topics" / n).exists() for n in names) for b in brokers
            }
            if on_b4 and sorted(held.values()) == [1, 1, 2, 2]:
                break
            assert time.monotonic() < deadline, f"{[list(r.replicas) for r in routes]}, {held}"
            await asyncio.sleep(0.2)
        assert len(on_b4) == 1
        for name in names:
            rows = (await read_topic(cluster.seeds, name)).values()
            read = {v for part in rows for _, v in part}
            assert {f"{name}-{i}".encode() for i in range(200)} <= read, name
    finally:
        for broker in brokers:
            try:
                broker.stop()
            finally:
                broker.kill()
