"""Replication settings through real brokers (issue 37): CreateTopic's replication_factor
and min_insync_replicas, and where the replica sets show (DescribeTopic, Lookup,
ClusterStatus, ``headrace topics describe`` and ``cluster status``).

A real three-member etcd (:mod:`tests.cluster.etcd_harness`) and three real ``headrace
serve --cluster-etcd ...`` processes (:mod:`tests.cluster.broker_processes`), driven
through the client library, raw gRPC and the CLI. What the replicas then do with the
records (fetch, commit, elections) is the subject of ``tests/cluster/test_replication_*``;
these tests assert only what placement and the surfaces promise, whatever the in-sync set
has become by the time they look: it holds the leader and is a subset of the replicas.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner, Result

from broker.cli import cli
from client import AsyncAdminClient, FailedPrecondition, InvalidArgument, TopicInfo
from cluster.config_defaults import EtcdDefaults
from cluster.etcd import EtcdStore
from cluster.records import Keys
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from tests.cluster.broker_processes import Brokers, cluster_brokers, wait_alive
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]

APPLIED_WITHIN_S = 2.0
"""How long the tests give every broker to see a change of the cluster's defaults."""


def _check_sets(info: TopicInfo, factor: int, min_insync: int) -> None:
    """``info``'s replication as placement promises it."""
    assert len(set(info.replicas)) == len(info.replicas) == factor, info
    assert info.leader == info.replicas[0], info
    assert info.leader in info.isr, info
    assert set(info.isr) <= set(info.replicas), info
    assert info.min_insync_replicas == min_insync, info
    assert info.epoch >= 1, info


async def _raw_create(address: str, **fields: object) -> grpc.aio.AioRpcError:
    """CreateTopic with raw fields (values the client never sends); its error."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = _admin_grpc.AdminStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.CreateTopic(_admin.CreateTopicRequest(**fields), timeout=10)  # type: ignore[arg-type]
    return failed.value


async def _status(brokers: Brokers) -> _cluster.ClusterStatusResponse:
    async with grpc.aio.insecure_channel(brokers.all[2].address) as channel:
        stub = _cluster_grpc.ClusterStub(channel)
        answer: _cluster.ClusterStatusResponse = await stub.ClusterStatus(
            _cluster.ClusterStatusRequest(), timeout=5
        )
    return answer


async def _listed(address: str, name: str) -> _admin.TopicInfo:
    """``name`` in a raw ListTopics answered by the broker at ``address`` alone."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = _admin_grpc.AdminStub(channel)
        answer = await stub.ListTopics(_admin.ListTopicsRequest(), timeout=5)
    [info] = [t for t in answer.topics if t.name == name]
    assert isinstance(info, _admin.TopicInfo)
    return info


async def _check_listings(brokers: Brokers, made: TopicInfo) -> None:
    """A raw ListTopics through the leader gives ``orders``' figures (its fsync); through a
    follower, which holds a copy, only what etcd holds (no fsync), both with the sets."""
    for broker in brokers.all:
        assert (broker.data_dir / "topics" / "orders").is_dir()  # every replica has a copy
        info = await _listed(broker.address, "orders")
        assert list(info.replicas) == list(made.replicas)
        assert info.leader == made.leader
        assert info.fsync == ("always" if broker.node_id == made.leader else ""), broker.node_id


async def _cli(seed: str, *args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, cli, [*args, "--broker", seed])


async def test_create_topic_takes_factors_0_1_3_and_refuses_too_many(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers with no cluster defaults; once b2 sees all three alive,
    CreateTopic through b2 with factor 0 (the default), 1, 3 with min_insync 2, then 4;
    min_insync 4 with factor 3; factor -1 and min_insync -1 over raw gRPC. Expected: 0
    makes a topic on all three brokers with min_insync 2 (issue 37's built-in defaults);
    1 makes a topic of one replica (its owner alone, in sync, min_insync 1); 3 makes a
    topic on all three brokers, led by its first replica, min_insync 2; 4 is
    FAILED_PRECONDITION naming 4 and the 3 live brokers, and
    nothing is left (the name is free: a factor-1 create of it succeeds); min_insync 4 and
    the negative values are INVALID_ARGUMENT naming the field."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        via = brokers.all[1].address
        await wait_alive(via, 3)  # a default factor is clamped to the live brokers seen
        async with AsyncAdminClient(via) as admin:
            default = await admin.create_topic("t0", 2)
            one = await admin.create_topic("t1", 1, replication_factor=1)
            three = await admin.create_topic("t3", 2, replication_factor=3, min_insync_replicas=2)
            with pytest.raises(FailedPrecondition) as too_many:
                await admin.create_topic("t4", 1, replication_factor=4)
            with pytest.raises(InvalidArgument) as too_strict:
                await admin.create_topic("t5", 1, replication_factor=3, min_insync_replicas=4)
            assert "replication factor 4 needs 4 live brokers and 3 are up" in str(too_many.value)
            assert "min_insync_replicas" in str(too_strict.value)
            assert "exceeds the replication factor 3" in str(too_strict.value)
            _check_sets(one, 1, 1)
            assert one.isr == one.replicas
            for info in (default, three):
                _check_sets(info, 3, 2)
                assert sorted(info.replicas) == ["b1", "b2", "b3"]
            refused = [
                await _raw_create(via, name="neg", replication_factor=-1),
                await _raw_create(via, name="neg", min_insync_replicas=-1),
            ]
            for error, field in zip(
                refused, ("replication_factor", "min_insync_replicas"), strict=True
            ):
                assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert field in (error.details() or "")
            listed = {t.name for t in await admin.list_topics()}
            assert listed == {"t0", "t1", "t3"}
            again = await admin.create_topic("t4", 1, replication_factor=1)
        _check_sets(again, 1, 1)


async def test_describe_lookup_status_and_the_cli_show_the_replica_sets(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers; a factor-3 topic (min_insync 2) and a factor-1 topic
    created through b1; each broker asked for Lookup; DescribeTopic through b3's seed;
    ClusterStatus; ``topics describe`` (table and --json) and ``cluster status --json``.
    Expected: every broker's route names the same replicas, leader (the owner) and
    min_insync, the in-sync set holding the leader within the replicas; the factor-1
    route lists its owner alone; DescribeTopic gives the same sets; ClusterStatus lists
    ``orders`` as under-replicated (replicas, leader, min_insync, a message) when its
    route's isr is shorter than its replicas, and nothing once it is not; never the
    factor-1 topic; the CLI prints the leader,
    epoch, replicas, isr and min_insync lines, the JSON has the same values, and the
    status JSON has the under_replicated key; a raw ListTopics gives the topic's figures
    only through its leader (a follower's copy is not the topic's)."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        seed = brokers.all[0].address
        async with AsyncAdminClient(seed) as admin:
            made = await admin.create_topic(
                "orders", 1, replication_factor=3, min_insync_replicas=2
            )
            await admin.create_topic("audit", 1, replication_factor=1)
        await brokers.wait_owners(["orders", "audit"])
        routes = [await brokers.route("orders", via=b) for b in brokers.all]
        for route in routes:
            assert list(route.replicas) == list(made.replicas)
            assert route.owner_node == route.replicas[0]
            assert route.owner_node in route.isr
            assert set(route.isr) <= set(route.replicas)
            assert route.min_insync == 2
        audit = await brokers.route("audit")
        assert list(audit.replicas) == list(audit.isr) == [audit.owner_node]
        assert audit.min_insync == 1
        async with AsyncAdminClient(brokers.all[2].address) as admin:
            described = await admin.describe_topic("orders")
        _check_sets(described, 3, 2)
        assert described.replicas == made.replicas
        # In a healthy cluster the in-sync set only grows after creation, so: a route
        # read after status 1 that is short was short at status 1 too, and one that is
        # full stays full at status 2.
        before = await _status(brokers)
        route = await brokers.route("orders", via=brokers.all[2])
        after = await _status(brokers)
        listed_before = {u.topic: u for u in before.under_replicated}
        assert "audit" not in listed_before
        if len(route.isr) < len(route.replicas):
            under = listed_before["orders"]
            assert list(under.replicas) == list(made.replicas)
            assert under.owner_node == made.replicas[0]
            assert under.min_insync == 2
            assert "of 3 replicas in sync" in under.message
        else:
            assert [u.topic for u in after.under_replicated] == []
        await _check_listings(brokers, made)
        await _check_cli(seed, described)


async def _check_cli(seed: str, described: TopicInfo) -> None:
    """``topics describe`` (table and --json) and ``cluster status --json`` show the
    replication of ``orders`` (factor 3, min_insync 2) as ``described``."""
    table = await _cli(seed, "topics", "describe", "orders")
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert f"leader     {described.leader} (epoch " in table.output
    assert any(line.startswith("replicas   " + ", ".join(described.replicas)) for line in lines)
    assert any(line.startswith("isr        ") for line in lines)
    assert "min_insync 2" in lines
    as_json = await _cli(seed, "topics", "describe", "orders", "--json")
    assert as_json.exit_code == 0, as_json.output
    [doc] = json.loads(as_json.output)
    assert doc["replicas"] == list(described.replicas)
    assert doc["leader"] == described.replicas[0]
    assert doc["min_insync_replicas"] == 2
    assert doc["leader"] in doc["isr"]
    status_json = await _cli(seed, "cluster", "status", "--json")
    assert status_json.exit_code == 0, status_json.output
    assert "under_replicated" in json.loads(status_json.output)


async def test_the_cluster_defaults_apply_clamped_to_the_live_brokers(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers; the cluster defaults set to replication_factor 5 and
    min_insync_replicas 4 (as ``headrace cluster config set`` stores them); after the
    brokers saw it, CreateTopic with no factor, then with factor 2 and no min_insync.
    Expected: the first topic gets the default clamped to the 3 live brokers and its
    min_insync clamped to 3; the second keeps its explicit factor 2 and gets min_insync 2
    (the default clamped to the factor): defaults are clamped, explicit values are not."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        store = await EtcdStore.connect(etcd.endpoints)
        async with store:
            await EtcdDefaults(store, Keys(prefix)).change(
                {"replication_factor": 5, "min_insync_replicas": 4}
            )
        await asyncio.sleep(APPLIED_WITHIN_S)
        async with AsyncAdminClient(brokers.all[0].address) as admin:
            default = await admin.create_topic("d", 1)
            two = await admin.create_topic("two", 1, replication_factor=2)
        _check_sets(default, 3, 3)
        _check_sets(two, 2, 2)
