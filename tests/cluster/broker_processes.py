"""Real ``headrace serve`` processes in cluster mode, on loopback, for the broker tests.

Role: start N brokers (``--cluster-etcd`` the harness's endpoints, ``--node-id b<i>``,
``--advertise 127.0.0.1:<port>``, each its own data directory and a config file with a
short session TTL) and kill, freeze, thaw or restart one, as ``tests/broker/test_kill.py``
does for a single broker. Also: read every record of a topic through a routed fetcher,
and ask any broker for a topic's owner (a raw Lookup) or for its refusal of a topic (a raw
DescribeTopic: the ``headrace-*`` trailers).

Shared with ``tests/netsplit``: :func:`wait_serving` (a broker process's health says
SERVING) and :func:`create_replicated` (create a replicated topic while the brokers are
still joining).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import AsyncAdminClient, AsyncFetcher, FailedPrecondition, TopicInfo
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from tests.broker.test_serve_process import free_port
from tests.cluster.etcd_harness import EtcdCluster

ROOT = Path(__file__).resolve().parents[2]
TTL_S = 2
"""The brokers' session TTL in these tests: a dead broker is seen dead within ~2 s."""

CONFIG = """\
[broker]
grace_seconds = 1.0
auto_create_topics = true

[wal]
fsync = "always"

[cluster]
"""


async def wait_serving(
    process: subprocess.Popen[bytes], address: str, name: str, log: Path, within_s: float
) -> None:
    """Ask ``address``'s health service every 50 ms until it says SERVING.

    Raises:
        AssertionError: ``process`` exited first, or ``within_s`` passed; the message holds
            ``name`` and the text of ``log`` (the broker's stderr).
    """
    deadline = time.monotonic() + within_s
    request = health_pb2.HealthCheckRequest()
    while time.monotonic() < deadline and process.poll() is None:
        async with grpc.aio.insecure_channel(address) as channel:
            with contextlib.suppress(grpc.RpcError):
                got = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=0.5)
                if got.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        await asyncio.sleep(0.05)
    raise AssertionError(f"broker {name} did not serve:\n{log.read_text()}")


async def create_replicated(
    seeds: str,
    topic: str,
    partitions: int,
    factor: int,
    *,
    min_insync: int = 2,
    within_s: float = 10.0,
) -> TopicInfo:
    """Create ``topic`` with ``factor`` replicas; what the create answered.

    A broker serves before it joins, so the answering broker's view may not show
    ``factor`` brokers alive yet: it refuses the factor (FAILED_PRECONDITION), and the
    create is asked again every 100 ms for up to ``within_s``. ``exist_ok``: a resend
    after a lost answer finds the topic made, which is not what these tests are about.

    Raises:
        AssertionError: still refused after ``within_s``.
    """
    deadline = time.monotonic() + within_s
    async with AsyncAdminClient(seeds) as admin:
        while True:
            try:
                return await admin.create_topic(
                    topic,
                    partitions,
                    replication_factor=factor,
                    min_insync_replicas=min_insync,
                    exist_ok=True,
                )
            except FailedPrecondition:
                assert time.monotonic() < deadline, f"{factor} brokers never seen alive"
                await asyncio.sleep(0.1)


class ClusterBroker:
    """One ``headrace serve`` of the cluster; restartable on its port and data directory."""

    def __init__(
        self, root: Path, node_id: str, etcd: EtcdCluster, prefix: str, ttl_s: int = TTL_S
    ) -> None:
        self.node_id = node_id
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.data_dir = root / node_id / "data"
        self.log = root / node_id / "serve.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        config = root / node_id / "headrace.toml"
        config.write_text(CONFIG + f'session_ttl_s = {ttl_s}\nprefix = "{prefix}"\n')
        self.command = [
            sys.executable,
            "-c",
            "from broker.cli import main; main()",
            "serve",
            "--config",
            str(config),
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.address,
            "--metrics-listen",
            "",
            "--cluster-etcd",
            ",".join(etcd.endpoints),
            "--node-id",
            node_id,
            "--advertise",
            self.address,
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        """Start the process (do not wait)."""
        assert self.process is None
        with self.log.open("ab") as stderr:
            self.process = subprocess.Popen(self.command, cwd=ROOT, stderr=stderr)

    async def start(self, within_s: float = 30.0) -> None:
        """Start it and wait until its health service says SERVING."""
        self.spawn()
        await self.wait_serving(within_s)

    async def wait_serving(self, within_s: float) -> None:
        assert self.process is not None
        await wait_serving(self.process, self.address, self.node_id, self.log, within_s)

    def kill(self) -> None:
        """SIGKILL and reap it (nothing if not running)."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)  # a frozen one dies too
                os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def freeze(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> int:
        """SIGTERM (a clean shutdown), reap it and return its exit status."""
        process, self.process = self.process, None
        if process is None:
            return 0
        process.send_signal(signal.SIGCONT)
        process.terminate()
        return process.wait(timeout=30)


class Brokers:
    """The cluster's brokers and helpers to look at them."""

    def __init__(self, brokers: list[ClusterBroker]) -> None:
        self.all = brokers
        self.by_id = {b.node_id: b for b in brokers}

    @property
    def seeds(self) -> str:
        """Every broker's address, comma-separated."""
        return ",".join(b.address for b in self.all)

    async def owner(self, topic: str, via: ClusterBroker | None = None) -> str:
        """The node id that ``via`` (default: the first) says owns ``topic``."""
        route = await self.route(topic, via)
        return route.owner_node

    async def route(self, topic: str, via: ClusterBroker | None = None) -> _cluster.TopicRoute:
        target = via or self.all[0]
        async with grpc.aio.insecure_channel(target.address) as channel:
            stub = _cluster_grpc.ClusterStub(channel)
            got = await stub.Lookup(_cluster.LookupRequest(topics=[topic]), timeout=5)
        [route] = got.routes
        assert isinstance(route, _cluster.TopicRoute)
        return route

    async def wait_owners(self, topics: list[str], within_s: float = 20.0) -> dict[str, str]:
        """Wait until every topic is online, as the first broker sees it; topic -> owner."""
        deadline = time.monotonic() + within_s
        while True:
            routes = [await self.route(t) for t in topics]
            if all(r.online for r in routes):
                return {r.topic: r.owner_node for r in routes}
            if time.monotonic() > deadline:
                raise AssertionError(f"not all online: {routes}")
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def cluster_brokers(
    root: Path, etcd: EtcdCluster, prefix: str, count: int = 3, ttl_s: int = TTL_S
) -> AsyncIterator[Brokers]:
    """``count`` brokers ``b1``..``b<count>`` started (all at once) and serving; stopped
    (SIGTERM, then SIGKILL for any left) at the end."""
    brokers = [ClusterBroker(root, f"b{i + 1}", etcd, prefix, ttl_s) for i in range(count)]
    try:
        for broker in brokers:
            broker.spawn()
        for broker in brokers:
            await broker.wait_serving(30.0)
        yield Brokers(brokers)
    finally:
        for broker in brokers:
            with contextlib.suppress(Exception):
                broker.stop()
            broker.kill()


async def read_topic(seeds: str, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """Every (offset, value) of every partition of ``topic``, through routed clients."""
    async with AsyncAdminClient(seeds) as admin:
        info = await admin.describe_topic(topic)
    found: dict[int, list[tuple[int, bytes]]] = {}
    async with AsyncFetcher(seeds) as fetcher:
        for part in info.partitions:
            rows: list[tuple[int, bytes]] = []
            offset = 0
            while True:
                got = await fetcher.fetch(topic, part.partition, offset)
                batch_rows = [
                    (o, v)
                    for b in got.batches
                    for o, v in zip(b.offsets(), b.values(), strict=True)
                    if o >= offset
                ]
                rows.extend(batch_rows)
                if not batch_rows:
                    break
                offset = batch_rows[-1][0] + 1
            found[part.partition] = rows
    return found


async def refusal_of(address: str, topic: str) -> dict[str, str]:
    """The ``headrace-*`` trailers of a DescribeTopic of ``topic`` at ``address`` (empty
    when it is served there)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = _admin_grpc.AdminStub(channel)
        try:
            await stub.DescribeTopic(_admin.DescribeTopicRequest(name=topic), timeout=3)
        except grpc.aio.AioRpcError as exc:
            failed = exc
        else:
            return {}
    assert failed.code() == grpc.StatusCode.ABORTED, failed
    trailers = failed.trailing_metadata() or ()
    facts = {k: v for k, v in trailers if isinstance(v, str) and k.startswith("headrace-")}
    return {**facts, "message": failed.details() or ""}


async def wait_refused(address: str, topic: str, reason: str, within_s: float) -> dict[str, str]:
    """Ask until ``address`` refuses ``topic`` for ``reason``; its refusal facts."""
    deadline = time.monotonic() + within_s
    while True:
        facts = await refusal_of(address, topic)
        if facts.get("headrace-refusal") == reason:
            return facts
        assert time.monotonic() < deadline, f"{topic} at {address}: {facts}, not {reason}"
        await asyncio.sleep(0.1)


async def wait_alive(address: str, count: int, within_s: float = 10.0) -> None:
    """Ask ``address``'s ClusterStatus until its view shows ``count`` brokers alive: a
    create with no factor takes the default clamped to the brokers that view counts."""
    deadline = time.monotonic() + within_s
    while True:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = _cluster_grpc.ClusterStub(channel)
            status = await stub.ClusterStatus(_cluster.ClusterStatusRequest(), timeout=5)
        alive = sum(b.alive for b in status.brokers)
        if alive >= count:
            return
        assert time.monotonic() < deadline, f"{address} sees {alive} brokers alive"
        await asyncio.sleep(0.1)
