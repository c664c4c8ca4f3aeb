"""Cluster mode end to end: a topic whose owner is down or lost its data.

Real etcd and real ``headrace serve`` processes in cluster mode (session TTL 2 s).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import grpc
import pytest

from client import AsyncAdminClient
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from tests.cluster.broker_processes import cluster_brokers, refusal_of, wait_refused
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]


async def _controller(address: str) -> str:
    """The controller's node id, as the broker at ``address`` sees it (once there is one)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = _cluster_grpc.ClusterStub(channel)
        for _ in range(100):
            found = await stub.Lookup(_cluster.LookupRequest(), timeout=5)
            if found.controller:
                return str(found.controller)
            await asyncio.sleep(0.05)
    raise AssertionError("no controller")


async def test_create_placed_on_a_frozen_broker_is_refused_offline_then_made(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: two brokers, "b1" the controller and "b2" the other, topics created
    so that the next one is placed on b2; b2 is frozen (SIGSTOP) and at once ``late`` is
    created through b1 with a 6 s deadline. Expected: the call ends before its deadline
    with ABORTED, reason ``offline``, naming b2, and a message saying the topic exists
    and becomes ready when b2 is up (not DEADLINE_EXCEEDED, not UNAVAILABLE); a second
    create of the name is ALREADY_EXISTS; once b2 is thawed it makes the topic and
    serves it. Every topic has one copy (``replication_factor=1``): one owner, placed by
    partitions (issue 36)."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=2) as brokers:
        controller = await _controller(brokers.all[0].address)
        # The victim must not be the controller (a frozen controller places nothing
        # until its lease runs out, and then on the live broker): call it b2 here.
        b1 = brokers.by_id[controller]
        b2 = next(b for b in brokers.all if b.node_id != controller)
        async with AsyncAdminClient(b1.address) as admin:  # the next placement: b2
            for i in range(1 if b2.node_id > b1.node_id else 2):
                await admin.create_topic(f"early{i}", partitions=1, replication_factor=1)
        b2.freeze()
        try:
            async with grpc.aio.insecure_channel(b1.address) as channel:
                stub = _admin_grpc.AdminStub(channel)
                request = _admin.CreateTopicRequest(name="late", partitions=1, replication_factor=1)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.CreateTopic(request, timeout=6)
                with pytest.raises(grpc.aio.AioRpcError) as again:
                    await stub.CreateTopic(request, timeout=6)
        finally:
            b2.thaw()
        assert refused.value.code() == grpc.StatusCode.ABORTED, refused.value
        trailers = dict(refused.value.trailing_metadata() or ())
        assert trailers["headrace-refusal"] == "offline"
        assert trailers["headrace-owner-node"] == b2.node_id
        assert "exists" in (refused.value.details() or "")
        assert b2.node_id in (refused.value.details() or "")
        assert again.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert await brokers.wait_owners(["late"], within_s=20) == {"late": b2.node_id}
        assert await refusal_of(b2.address, "late") == {}


async def test_an_owner_restarted_with_an_empty_data_directory_serves_it_as_data_missing(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: two brokers, ``beta`` owned by b2; b2 is SIGKILLed, its data directory
    removed, and b2 restarted (same node id, empty disk). Expected: b2 does not recreate
    ``beta`` empty: a call there is refused ``data-missing`` naming b2 and saying to
    restore the data directory; b2's directory holds no ``beta``; b1's topic still
    serves. One copy each (``replication_factor=1``): nothing to copy ``beta`` from."""
    async with cluster_brokers(tmp_path, etcd, prefix, count=2) as brokers:
        b1, b2 = brokers.all
        async with AsyncAdminClient(b1.address) as admin:
            await admin.create_topic("alpha", partitions=1, replication_factor=1)
            await admin.create_topic("beta", partitions=1, replication_factor=1)
        assert await brokers.wait_owners(["alpha", "beta"]) == {"alpha": "b1", "beta": "b2"}
        b2.kill()
        shutil.rmtree(b2.data_dir)
        await b2.start()
        facts = await wait_refused(b2.address, "beta", "data-missing", 15)
        assert facts["headrace-owner-node"] == "b2"
        assert "restore the data directory" in facts["message"]
        await asyncio.sleep(0.5)  # a reconcile pass or two: still not recreated
        assert not (b2.data_dir / "topics" / "beta").exists()
        assert await refusal_of(b1.address, "alpha") == {}
