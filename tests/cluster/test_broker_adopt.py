"""Cluster mode end to end: a broker's own topics when it joins, strays never served, and
creates their owner can never carry out.

Real etcd and real ``headrace serve`` processes (:mod:`tests.cluster.broker_processes`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from broker.cli import cli
from client import AsyncAdminClient, AsyncProducer
from cluster.etcd import EtcdStore
from cluster.records import Keys
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _broker_grpc
from tests.cluster.broker_processes import (
    Brokers,
    ClusterBroker,
    read_topic,
    refusal_of,
    wait_refused,
)
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]


def _local_id(broker: ClusterBroker, topic: str) -> str:
    meta = json.loads((broker.data_dir / "topics" / topic / "topic.json").read_text())
    return str(meta["id"])


async def _publish_code(address: str, topic: str) -> grpc.StatusCode:
    """The status of one Publish of ``topic`` at ``address`` (OK when it was written)."""
    request = _pb.PublishRequest(topic=topic, partition=-1, records=[_pb.Record(value=b"x")])
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await _broker_grpc.BrokerStub(channel).Publish(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def _run_alone(broker: ClusterBroker) -> None:
    """Run ``broker`` as a single broker (no cluster flags) on its data directory: it
    makes ``orders`` (2 partitions, 3 records) and ``shared`` (1 partition, 1 record)."""
    cluster_command = broker.command
    cut = cluster_command.index("--cluster-etcd")
    broker.command = [*cluster_command[:4], *cluster_command[6:cut]]  # no --config either
    try:
        await broker.start()
        async with AsyncAdminClient(broker.address) as admin:
            await admin.create_topic("orders", partitions=2)
            await admin.create_topic("shared", partitions=1)
        async with AsyncProducer(broker.address) as producer:
            for value in (b"a", b"b", b"c"):
                await producer.send("orders", value)
            await producer.send("shared", b"mine")
    finally:
        assert broker.stop() == 0
        broker.command = cluster_command


async def test_a_broker_joining_adopts_its_topics_and_never_serves_a_stray(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: b2 serves in a cluster that holds ``shared`` (on b2). b1 first runs alone
    and makes ``orders`` (3 records) and its own ``shared``; then it is restarted with
    ``--cluster-etcd``. Expected: ``orders`` is adopted before b1 serves: Lookup through
    b2 names b1 at epoch 1, the cluster's id is b1's local id, its 3 records read through
    the seeds, and b1's log says so at INFO. b1's ``shared`` is a stray: a WARNING names
    the topic, both ids and its directory, and ``cluster status --json`` through b1 lists
    it under ``strays`` (the human form too); b1 refuses it (not-owner, b2) for reads and
    publishes; the local copy keeps its id and its file. Then ``orders``' key is deleted
    in etcd behind b1's back: a publish to it at b1 is NOT_FOUND (auto-create on: still
    nothing lands), and its local directory stays."""
    b2 = ClusterBroker(tmp_path, "b2", etcd, prefix)
    b1 = ClusterBroker(tmp_path, "b1", etcd, prefix)
    try:
        await b2.start()
        async with AsyncAdminClient(b2.address) as admin:
            cluster_shared = await admin.create_topic("shared", partitions=1)
        await _run_alone(b1)
        local_orders, local_shared = _local_id(b1, "orders"), _local_id(b1, "shared")
        await b1.start()
        brokers = Brokers([b2, b1])

        route = await brokers.route("orders", via=b2)
        assert (route.owner_node, route.epoch, route.online) == ("b1", 1, True)
        async with AsyncAdminClient(brokers.seeds) as admin:
            assert (await admin.describe_topic("orders")).topic_id == local_orders
        rows = await read_topic(brokers.seeds, "orders")
        assert sorted(v for part in rows.values() for _, v in part) == [b"a", b"b", b"c"]
        log = b1.log.read_text()
        assert "adopted local topic orders" in log

        [warning] = [line for line in log.splitlines() if "'shared'" in line]
        assert "WARNING" in warning
        for fact in (local_shared, cluster_shared.topic_id, str(b1.data_dir / "topics")):
            assert fact in warning, warning
        facts = await refusal_of(b1.address, "shared")
        assert (facts["headrace-refusal"], facts["headrace-owner-node"]) == ("not-owner", "b2")
        assert await _publish_code(b1.address, "shared") == grpc.StatusCode.ABORTED
        assert _local_id(b1, "shared") == local_shared
        shown = await asyncio.to_thread(
            CliRunner().invoke, cli, ["cluster", "status", "--json", "--broker", b1.address]
        )
        assert shown.exit_code == 0, shown.output
        [stray] = json.loads(shown.stdout)["strays"]
        human = await asyncio.to_thread(
            CliRunner().invoke, cli, ["cluster", "status", "--broker", b1.address]
        )
        assert "stray local topics on b1 (not served):" in human.stdout, human.output
        assert stray["topic"] == "shared"
        assert (stray["local_id"], stray["cluster_id"]) == (local_shared, cluster_shared.topic_id)
        assert (stray["owner_node"], stray["path"]) == (
            "b2",
            str(b1.data_dir / "topics" / "shared"),
        )

        async with await EtcdStore.connect(etcd.endpoints) as store:
            await store.delete_prefix(Keys(prefix).topic("orders"))
        deadline = time.monotonic() + 5
        while (await brokers.route("orders", via=b1)).state != "absent":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert await _publish_code(b1.address, "orders") == grpc.StatusCode.NOT_FOUND
        async with grpc.aio.insecure_channel(b1.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as described:
                await _admin_grpc.AdminStub(channel).DescribeTopic(
                    _admin.DescribeTopicRequest(name="orders"), timeout=5
                )
        assert described.value.code() == grpc.StatusCode.NOT_FOUND
        assert _local_id(b1, "orders") == local_orders
    finally:
        for broker in (b1, b2):
            broker.stop()
            broker.kill()


async def test_a_create_the_owner_cannot_fit_fails_fast_and_frees_the_name(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: b1, and b2 whose open-files limit is 600 (so a few hundred partitions at
    most); ``small`` goes to b1, then ``big`` with 1000 partitions is created through b1
    and placed on b2. Expected: CreateTopic ends RESOURCE_EXHAUSTED within 10 s (not its
    30 s wait), its message naming b2 and the file descriptors; Lookup then says ``big``
    is absent; b2 made nothing; ``big`` with 2 partitions is created after (on b2). Every
    topic has one copy (``replication_factor=1``): placement by partitions, issue 36's."""
    b1 = ClusterBroker(tmp_path, "b1", etcd, prefix)
    b2 = ClusterBroker(tmp_path, "b2", etcd, prefix)
    b2.command[2] = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (600, 600)); "
        "from broker.cli import main; main()"
    )
    assert b2.command[0] == sys.executable
    brokers = Brokers([b1, b2])
    try:
        for broker in brokers.all:
            broker.spawn()
        for broker in brokers.all:
            await broker.wait_serving(30)
        async with AsyncAdminClient(b1.address) as admin:
            await admin.create_topic("small", partitions=1, replication_factor=1)
        assert (await brokers.wait_owners(["small"]))["small"] == "b1"
        async with grpc.aio.insecure_channel(b1.address) as channel:
            stub = _admin_grpc.AdminStub(channel)
            began = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.CreateTopic(
                    _admin.CreateTopicRequest(name="big", partitions=1000, replication_factor=1),
                    timeout=40,
                )
            took = time.monotonic() - began
        assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, failed.value
        message = failed.value.details() or ""
        assert "broker b2 cannot create topic 'big'" in message
        assert "file descriptors" in message
        assert took < 10, took
        assert (await brokers.route("big", via=b1)).state == "absent"
        assert not (b2.data_dir / "topics" / "big").exists()
        async with AsyncAdminClient(b1.address) as admin:
            again = await admin.create_topic("big", partitions=2, replication_factor=1)
        assert len(again.partitions) == 2
        assert (await brokers.wait_owners(["big"]))["big"] == "b2"
        await wait_refused(b1.address, "big", "not-owner", 5)
    finally:
        for broker in brokers.all:
            broker.stop()
            broker.kill()
