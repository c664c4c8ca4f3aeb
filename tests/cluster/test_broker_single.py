"""A single broker is unchanged by cluster mode: no etcd client loaded, same answers.

A real ``headrace serve`` process with no cluster settings. At its exit (SIGTERM, a clean
shutdown) the process writes down which of its modules name etcd or the cluster member;
meanwhile the test creates a topic, produces, consumes and asks Lookup, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import AsyncAdminClient, AsyncConsumer, AsyncProducer
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from tests.broker.test_serve_process import free_port

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]

# Run serve as `headrace serve` does, and note the loaded modules when it exits.
PROGRAM = """\
import atexit, json, sys
target = sys.argv.pop(1)
def note():
    names = sorted(m for m in sys.modules if "etcd" in m or m.startswith("cluster."))
    with open(target, "w") as out:
        json.dump(names, out)
atexit.register(note)
from broker.cli import main
main()
"""


def _spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` (Popen only forks and execs: it does not wait for the child)."""
    with log.open("wb") as stderr:
        return subprocess.Popen(command, cwd=ROOT, stderr=stderr)


async def _serving(address: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        async with grpc.aio.insecure_channel(address) as channel:
            with contextlib.suppress(grpc.RpcError):
                got = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=0.5
                )
                if got.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        await asyncio.sleep(0.05)
    raise AssertionError("the single broker did not serve")


async def test_serve_without_cluster_settings_never_loads_etcd(tmp_path: Path) -> None:
    """Scenario: ``headrace serve`` with no [cluster] and no cluster flags; create a
    topic, produce 3 records, consume them, Lookup; then SIGTERM. Expected: all as
    before (the records come back in order; Lookup names node ``local`` as the owner,
    online); exit status 0; the process never imported ``etcd3aio``, ``cluster.etcd`` or
    ``cluster.member``, nor ``broker.cluster_defaults``, whose built-in replication
    defaults (factor 3, min_insync 2) are the cluster's alone: a single broker keeps one
    copy, its topic answering min_insync 1."""
    address = f"127.0.0.1:{free_port()}"
    modules = tmp_path / "modules.json"
    command = [
        sys.executable,
        "-c",
        PROGRAM,
        str(modules),
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
        "--listen",
        address,
        "--metrics-listen",
        "",
    ]
    log = tmp_path / "serve.log"
    process = _spawn(command, log)
    try:
        await _serving(address, 20)
        async with AsyncAdminClient(address) as admin:
            made = await admin.create_topic("orders", partitions=1)
        assert (made.leader, made.min_insync_replicas) == ("local", 1)
        async with AsyncProducer(address) as producer:
            for value in (b"a", b"b", b"c"):
                await producer.send("orders", value)
            await producer.flush()
        async with AsyncConsumer("orders", "s", broker=address) as consumer:
            got = [(await consumer.receive(timeout=10)).value for _ in range(3)]
        assert got == [b"a", b"b", b"c"]
        async with grpc.aio.insecure_channel(address) as channel:
            stub = _cluster_grpc.ClusterStub(channel)
            found = await stub.Lookup(_cluster.LookupRequest(topics=["orders"]), timeout=5)
        [route] = found.routes
        assert (route.owner_node, route.online) == ("local", True)
    finally:
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=30)
    assert status == 0, log.read_text()
    loaded = json.loads(modules.read_text())
    assert "etcd3aio" not in loaded
    assert "cluster.etcd" not in loaded
    assert "cluster.member" not in loaded
    assert "broker.cluster_defaults" not in loaded
