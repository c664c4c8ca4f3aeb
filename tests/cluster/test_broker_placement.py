"""Cluster mode end to end: topics placed over real brokers, names unique cluster-wide.

A real three-member etcd (:mod:`tests.cluster.etcd_harness`) and three real ``headrace
serve --cluster-etcd ... --node-id ... --advertise ...`` processes
(:mod:`tests.cluster.broker_processes`), driven through the client library with a seed
list.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import grpc
import pytest

from client import AlreadyExists, AsyncAdminClient
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from tests.cluster.broker_processes import cluster_brokers
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]


async def test_topics_created_through_different_brokers_spread_over_all(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: six topics of two partitions each, created two through each of three
    brokers (each admin client has that one broker as its only seed). Expected: each
    create answers with the topic's id and two partitions; every broker owns exactly two
    of them (placement: fewest partitions first); ListTopics through any broker shows all
    six with the same ids; every broker's Lookup agrees on each owner; ClusterStatus
    through b2 names b2, every broker alive at its address with 2 topics and 4
    partitions, a controller among them, every etcd endpoint healthy, nothing offline.
    One copy each (``replication_factor=1``): issue 36's placement by partitions."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        ids: dict[str, str] = {}
        for i in range(6):
            via = brokers.all[i % 3]
            async with AsyncAdminClient(via.address) as admin:
                info = await admin.create_topic(f"t{i}", partitions=2, replication_factor=1)
            assert info.name == f"t{i}"
            assert len(info.partitions) == 2
            assert len(info.topic_id) == 16
            ids[info.name] = info.topic_id
        owners = await brokers.wait_owners(sorted(ids))
        assert Counter(owners.values()) == {"b1": 2, "b2": 2, "b3": 2}
        for broker in brokers.all:
            async with AsyncAdminClient(broker.address) as admin:
                listed = await admin.list_topics()
            assert {t.name: t.topic_id for t in listed} == ids
            for topic in ids:
                assert await brokers.owner(topic, via=broker) == owners[topic]
        async with grpc.aio.insecure_channel(brokers.all[1].address) as channel:
            stub = _cluster_grpc.ClusterStub(channel)
            status = await stub.ClusterStatus(_cluster.ClusterStatusRequest(), timeout=5)
        assert status.node_id == "b2"
        assert {
            (b.node_id, b.address, b.alive, b.topics, b.partitions) for b in status.brokers
        } == {(b.node_id, b.address, True, 2, 4) for b in brokers.all}
        assert status.controller in brokers.by_id
        assert sorted(e.endpoint for e in status.etcd if e.healthy) == sorted(etcd.endpoints)
        assert list(status.offline_topics) == []


async def test_a_name_is_unique_cluster_wide_even_when_created_at_once(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers each asked to create ``orders`` at the same moment, then
    one asked again. Expected: exactly one create succeeds, the two others and the late
    one fail with AlreadyExists; the topic lives on one broker only (one data directory
    holds it) with the winner's id. One copy (``replication_factor=1``), so one holder."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:

        async def create(address: str) -> str | BaseException:
            async with AsyncAdminClient(address) as admin:
                try:
                    made = await admin.create_topic("orders", partitions=3, replication_factor=1)
                    return made.topic_id
                except AlreadyExists as exc:
                    return exc

        results = await asyncio.gather(*(create(b.address) for b in brokers.all))
        won = [r for r in results if isinstance(r, str)]
        assert len(won) == 1, results
        assert sum(isinstance(r, AlreadyExists) for r in results) == 2
        async with AsyncAdminClient(brokers.all[1].address) as admin:
            with pytest.raises(AlreadyExists):
                await admin.create_topic("orders", partitions=1)
        owner = await brokers.owner("orders")
        holders = [b.node_id for b in brokers.all if (b.data_dir / "topics" / "orders").is_dir()]
        assert holders == [owner]
        meta = (brokers.by_id[owner].data_dir / "topics" / "orders" / "topic.json").read_text()
        assert won[0] in meta
