"""The cluster's configuration defaults with real ``headrace serve`` processes over a real
three-member etcd: a default set once with ``headrace cluster config`` is what every
broker gives the topics created after it, whichever broker takes the create and
whichever owns the topic; a broker's ``[wal.topics.<name>]`` still wins for that topic.

Every broker's file says ``auto_create_topics = true`` and ``fsync = "always"``
(:data:`tests.cluster.broker_processes.CONFIG`) and 1 partition by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from pathlib import Path

import grpc
import pytest

from client import AsyncAdminClient
from cluster.config_defaults import defaults_key
from cluster.etcd import EtcdStore
from cluster.records import Keys
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _broker_grpc
from tests.broker.test_cli_client import CLI
from tests.cluster.broker_processes import Brokers, ClusterBroker
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.test_config_defaults import cli_config

pytestmark = pytest.mark.asyncio

APPLIED_WITHIN_S = 2.0
"""How soon every broker uses a changed default (the docs say "a second or two")."""

PINNED = '\n[wal.topics.pinned]\nfsync = "always"\n'


async def config_cli(config: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``headrace cluster config ARGS --config CONFIG`` as a process, off the loop."""
    return await asyncio.to_thread(
        subprocess.run,
        [*CLI, "cluster", "config", *args, "--config", config],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def create(address: str, name: str) -> None:
    """CreateTopic at ``address`` without a partition count (0: the default)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = _admin_grpc.AdminStub(channel)
        await stub.CreateTopic(_admin.CreateTopicRequest(name=name), timeout=30)


async def publish(address: str, topic: str) -> None:
    """One raw Publish of one record to ``topic`` at ``address`` (no routing)."""
    request = _pb.PublishRequest(topic=topic, partition=-1, records=[_pb.Record(value=b"x")])
    async with grpc.aio.insecure_channel(address) as channel:
        await _broker_grpc.BrokerStub(channel).Publish(request, timeout=15)


async def described(seeds: str, name: str) -> tuple[int, str]:
    """(partitions, fsync) of ``name`` as its owner describes it (routed by the seeds)."""
    async with AsyncAdminClient(seeds) as admin:
        info = await admin.describe_topic(name)
    return len(info.partitions), info.fsync


async def test_a_default_set_once_is_what_every_owner_gives_new_topics(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers (each file: fsync always, 1 partition by default, auto-create
    on, and [wal.topics.pinned] fsync always). `headrace cluster config set
    default_partitions=3 fsync=never`; after 2 s, six topics created without a count
    through b2 (placed over the brokers), `pinned` created too; then a bad value is set;
    then auto_create_topics=false and a raw Publish to a new topic at b3, then unset and
    the Publish again.
    Expected: every one of the six topics, whichever broker owns it, has 3 partitions and
    fsync never (more than one owner among them); `pinned` has 3 partitions and fsync
    always (the file's per-topic key wins); the bad value exits 1 naming the key and range
    and show is unchanged; the publish with auto-create off is NOT_FOUND; after the unset
    it creates the topic with 3 partitions."""
    brokers = [ClusterBroker(tmp_path, f"b{i}", etcd, prefix) for i in (1, 2, 3)]
    for broker in brokers:
        toml = tmp_path / broker.node_id / "headrace.toml"
        toml.write_text(toml.read_text() + PINNED)
    config = cli_config(tmp_path, etcd, prefix)
    try:
        for broker in brokers:
            broker.spawn()
        for broker in brokers:
            await broker.wait_serving(30.0)
        cluster = Brokers(brokers)
        b2, b3 = brokers[1], brokers[2]
        done = await config_cli(config, "set", "default_partitions=3", "fsync=never")
        assert done.returncode == 0, done.stderr
        await asyncio.sleep(APPLIED_WITHIN_S)
        names = [f"t{i}" for i in range(6)]
        for name in [*names, "pinned"]:
            await create(b2.address, name)
        owners = await cluster.wait_owners([*names, "pinned"])
        assert len({owners[n] for n in names}) > 1, owners  # the defaults held on each owner
        for name in names:
            assert await described(cluster.seeds, name) == (3, "never"), (name, owners[name])
        assert await described(cluster.seeds, "pinned") == (3, "always")

        bad = await config_cli(config, "set", "fsync_interval_ms=0")
        assert bad.returncode == 1
        assert "fsync_interval_ms = 0" in bad.stderr
        assert "from 1 to 3600000" in bad.stderr
        show = await config_cli(config, "show", "--json")
        assert '"fsync_interval_ms": null' in show.stdout, show.stdout

        done = await config_cli(config, "set", "auto_create_topics=false")
        assert done.returncode == 0, done.stderr
        await asyncio.sleep(APPLIED_WITHIN_S)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await publish(b3.address, "fresh")
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        done = await config_cli(config, "unset", "auto_create_topics")
        assert done.returncode == 0, done.stderr
        await asyncio.sleep(APPLIED_WITHIN_S)
        with contextlib.suppress(grpc.aio.AioRpcError):  # made; served here or not-owner
            await publish(b3.address, "fresh")
        assert await described(cluster.seeds, "fresh") == (3, "never")
    finally:
        for broker in brokers:
            try:
                broker.stop()
            finally:
                broker.kill()


async def test_a_restarted_owner_reopens_its_topics_with_the_cluster_defaults(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: a document that is not a defaults document is in etcd when a broker (its
    file: fsync always) starts; then `set fsync=never` and topic `a` is created; then
    `set fsync=interval` and the broker is restarted (SIGTERM, start again).
    Expected: the broker starts despite the bad document (logged, ignored); the set
    replaces the bad document; `a` is made with fsync never; while it stays open it
    keeps never; after the restart it is reopened with interval (the defaults are read
    before the topics open)."""
    config = cli_config(tmp_path, etcd, prefix)
    store = await EtcdStore.connect(etcd.endpoints)
    async with store:
        await store.put(defaults_key(Keys(prefix)), b"not json")
    broker = ClusterBroker(tmp_path, "b1", etcd, prefix)
    try:
        await broker.start()
        assert "cannot be read and are ignored" in broker.log.read_text()
        assert (await config_cli(config, "set", "fsync=never")).returncode == 0
        await asyncio.sleep(APPLIED_WITHIN_S)
        await create(broker.address, "a")
        assert await described(broker.address, "a") == (1, "never")
        assert (await config_cli(config, "set", "fsync=interval")).returncode == 0
        await asyncio.sleep(APPLIED_WITHIN_S)
        assert await described(broker.address, "a") == (1, "never")
        assert broker.stop() == 0
        await broker.start()
        assert await described(broker.address, "a") == (1, "interval")
    finally:
        try:
            broker.stop()
        finally:
            broker.kill()
