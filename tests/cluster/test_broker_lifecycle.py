"""Cluster mode end to end: joining, leaving, auto-create and delete across brokers.

Real etcd and real ``headrace serve`` processes in cluster mode
(:mod:`tests.cluster.broker_processes`).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from broker.cli import cli
from client import AsyncAdminClient, NotFound
from cluster.config_defaults import EtcdDefaults
from cluster.etcd import EtcdStore
from cluster.records import Keys
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _broker_grpc
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from tests.broker.test_serve_process import free_port
from tests.cluster.broker_processes import ClusterBroker, cluster_brokers
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]


async def _brokers_seen(address: str) -> dict[str, _cluster.BrokerInfo]:
    """node id -> BrokerInfo, as the broker at ``address`` answers Lookup."""
    async with grpc.aio.insecure_channel(address) as channel:
        found = await _cluster_grpc.ClusterStub(channel).Lookup(_cluster.LookupRequest(), timeout=5)
    return {b.node_id: b for b in found.brokers}


async def _publish(address: str, request: _pb.PublishRequest) -> _pb.PublishResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        got = await _broker_grpc.BrokerStub(channel).Publish(request, timeout=15)
    assert isinstance(got, _pb.PublishResponse)
    return got


async def test_a_live_node_id_stops_a_second_broker_with_one_line(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: b1 serves; a second ``headrace serve --node-id b1`` (its own port and
    data directory) starts. Expected: it waits out one TTL, then exits with status 1 and
    one ``Error:`` line saying it cannot join as b1 and naming the live broker's
    address; the first b1 still serves and is still registered."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=1) as brokers:
        first = brokers.all[0]
        twin = ClusterBroker(tmp_path / "twin", "b1", etcd, prefix)
        twin.spawn()
        assert twin.process is not None
        status = await asyncio.to_thread(twin.process.wait, 30)
        twin.process = None
        assert status == 1
        errors = [line for line in twin.log.read_text().splitlines() if "Error" in line]
        assert len(errors) == 1, twin.log.read_text()
        assert "cannot join the cluster as b1" in errors[0]
        assert first.address in errors[0]
        seen = await _brokers_seen(first.address)
        assert seen["b1"].alive
        assert seen["b1"].address == first.address


async def test_listen_on_port_0_advertises_the_bound_port(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: a broker ``z`` started with ``--listen 127.0.0.1:0`` and no
    ``--advertise``, beside b1. Expected: b1's Lookup lists z alive at 127.0.0.1 with a
    real port (not 0), and a topic created through b1 that lands on z is served at that
    address."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=1) as brokers:
        z = ClusterBroker(tmp_path, "z", etcd, prefix)
        at = z.command.index("--listen")
        z.command[at + 1] = "127.0.0.1:0"
        del z.command[z.command.index("--advertise") : z.command.index("--advertise") + 2]
        z.spawn()
        try:
            deadline = time.monotonic() + 30
            while "z" not in (seen := await _brokers_seen(brokers.all[0].address)):
                assert time.monotonic() < deadline, z.log.read_text()
                await asyncio.sleep(0.1)
            host, _, port = seen["z"].address.rpartition(":")
            assert host == "127.0.0.1"
            assert int(port) != 0
            async with AsyncAdminClient(brokers.all[0].address) as admin:
                # One copy each: placed by partitions, as in issue 36.
                await admin.create_topic("first", partitions=2, replication_factor=1)  # b1
                await admin.create_topic("second", partitions=1, replication_factor=1)  # so z
            owners = await brokers.wait_owners(["second"])
            assert owners == {"second": "z"}
            async with AsyncAdminClient(seen["z"].address) as direct:
                info = await direct.describe_topic("second")
            assert len(info.partitions) == 1
        finally:
            z.stop()


async def test_publish_auto_creates_cluster_wide_and_delete_reaches_the_owner(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers with auto_create_topics, b1 holding one topic; a Publish
    to ``fresh``, which exists nowhere, is sent to b1, then where its refusal points;
    then ``headrace topics list`` through b3, then DeleteTopic through b1 (not the owner),
    then ``fresh`` created again. Expected: b1 creates ``fresh`` cluster-wide, placed on
    b2, and refuses the publish (``not-owner``, owner b2 and its address: nothing written
    here); b2 serves it at offset 0; one broker's data directory holds it, the one Lookup
    names; the CLI list through b3 shows both topics with their partition counts; after
    the delete no broker holds it, it is gone from every list and Lookup says
    ``absent``; it can be created again, with a new id. The cluster's default
    replication_factor is 1 here (set before the brokers start): this is issue 36's
    auto-create of a topic of one copy."""
    async with await EtcdStore.connect(etcd.endpoints) as store:
        await EtcdDefaults(store, Keys(prefix)).change({"replication_factor": 1})
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        seed = brokers.all[0].address
        async with AsyncAdminClient(seed) as admin:  # b1 gets one, so fresh goes elsewhere
            await admin.create_topic("taken", partitions=1)
        request = _pb.PublishRequest(topic="fresh", partition=-1, records=[_pb.Record(value=b"hi")])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _publish(seed, request)
        assert refused.value.code() == grpc.StatusCode.ABORTED
        trailers = dict(refused.value.trailing_metadata() or ())
        assert trailers["headrace-refusal"] == "not-owner"
        assert trailers["headrace-owner-node"] == "b2"  # b1 holds "taken": fewest partitions
        served = await _publish(str(trailers["headrace-owner-address"]), request)
        assert (served.base_offset, served.last_offset) == (0, 0)
        owner = (await brokers.wait_owners(["fresh"]))["fresh"]
        assert owner == "b2"
        holders = [b.node_id for b in brokers.all if (b.data_dir / "topics" / "fresh").is_dir()]
        assert holders == [owner]

        listed = await asyncio.to_thread(
            CliRunner().invoke,
            cli,
            ["topics", "list", "--json", "--broker", brokers.all[2].address],
        )
        assert listed.exit_code == 0, listed.output
        by_name = {t["name"]: t for t in json.loads(listed.stdout)}
        assert set(by_name) == {"taken", "fresh"}
        assert len(by_name["fresh"]["partitions"]) == 1

        async with AsyncAdminClient(seed) as admin:
            first_id = (await admin.describe_topic("fresh")).topic_id
            await admin.delete_topic("fresh")
            with pytest.raises(NotFound):
                await admin.describe_topic("fresh")
            deadline = time.monotonic() + 5  # b1's view follows etcd's watch
            while (names := [t.name for t in await admin.list_topics()]) != ["taken"]:
                assert time.monotonic() < deadline, names
                await asyncio.sleep(0.05)
            assert not any((b.data_dir / "topics" / "fresh").exists() for b in brokers.all)
            assert (await brokers.route("fresh", via=brokers.all[1])).state == "absent"
            again = await admin.create_topic("fresh", partitions=1)
        assert again.topic_id != first_id


async def test_a_clean_shutdown_leaves_the_cluster_at_once(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: two brokers with a 10 s session TTL; b2 is stopped with SIGTERM.
    Expected: it exits 0, and b1's Lookup no longer lists b2 alive within 2 s, far
    sooner than the TTL (its lease was revoked, not left to expire)."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=2, ttl_s=10) as brokers:
        b1, b2 = brokers.all
        deadline = time.monotonic() + 5  # b1's view follows etcd's watch
        while not ((seen := await _brokers_seen(b1.address)).get("b2") and seen["b2"].alive):
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.05)
        stopped_at = time.monotonic()
        assert await asyncio.to_thread(b2.stop) == 0
        while (seen := await _brokers_seen(b1.address)).get("b2") and seen["b2"].alive:
            assert time.monotonic() - stopped_at < 2.0, seen  # not the TTL's 10 s
            await asyncio.sleep(0.05)


async def test_a_cluster_broker_exports_its_node_and_member_metrics(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: one cluster broker b1, restarted with a metrics listener, then a topic
    created through it. Expected: /metrics has ``headrace_node_info{node_id="b1"} 1``,
    ``headrace_cluster_session_alive 1``, ``headrace_cluster_owned_topics 1`` and
    ``headrace_cluster_is_controller 1`` (the only broker), and the refusal counter
    family is declared."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=1) as brokers:
        b1 = brokers.all[0]
        b1.stop()
        metrics_port = free_port()
        b1.command[b1.command.index("--metrics-listen") + 1] = f"127.0.0.1:{metrics_port}"
        await b1.start()
        async with AsyncAdminClient(b1.address) as admin:
            await admin.create_topic("orders", partitions=2)
        wanted = (
            'headrace_node_info{node_id="b1"} 1.0',
            "headrace_cluster_session_alive 1.0",
            "headrace_cluster_owned_topics 1.0",
            "headrace_cluster_is_controller 1.0",
            "# TYPE headrace_cluster_refusals_total counter",
        )
        deadline = time.monotonic() + 10
        while True:
            text = await asyncio.to_thread(_scrape, f"http://127.0.0.1:{metrics_port}/metrics")
            missing = [line for line in wanted if line not in text]
            if not missing:
                break
            assert time.monotonic() < deadline, missing
            await asyncio.sleep(0.2)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())
