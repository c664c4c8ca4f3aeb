"""A second language against a real broker: the Node client of tests/interop/node.

The client (grpc-js, installed from npm by this test) was written from docs/protocol.md and
proto/*.proto alone. It checks its codec against the conformance vectors, creates a topic,
publishes 1000 records, reads them back by Fetch (its own decoder, CRC-32C checked) and by
Subscribe (credit, acks, drain), and prints what it saw; this test compares that with what
it published, and decodes the published batches with our own codec too.

Without node or npm the test skips, except under CI (``CI`` set), where it fails.
node_modules is cached in tests/interop/node/node_modules (git-ignored).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest

from proto import broker_pb2 as pb
from proto.vectors import VECTORS_DIR, decoded_json
from tests.broker.conftest import broker_config, serving
from wal import decode_batch

NODE_DIR = Path(__file__).resolve().parent / "node"
PROTO_DIR = Path(__file__).resolve().parents[2] / "proto"
COUNT = 1000


def _tools() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = "node" if node is None else "npm"
        if os.environ.get("CI"):
            pytest.fail(f"{missing} is not installed; CI must provide node and npm (>= 18)")
        pytest.skip(f"{missing} is not installed")
    return node, npm


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary, with the client's npm dependencies installed (once; then cached)."""
    node, npm = _tools()
    stamp = NODE_DIR / "node_modules" / ".package-lock.json"
    lock = NODE_DIR / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"npm ci failed: {done.stderr}"
    return node


async def run_client(node: str, port: int, topic: str, *, simple: bool) -> dict[str, Any]:
    """Run client.mjs against the broker on ``port``; its JSON output."""
    args = [
        str(NODE_DIR / "client.mjs"),
        "--target",
        f"127.0.0.1:{port}",
        "--proto",
        str(PROTO_DIR),
        "--topic",
        topic,
        "--count",
        str(COUNT),
        "--vectors",
        str(VECTORS_DIR),
    ]
    proc = await asyncio.create_subprocess_exec(
        node,
        *args,
        *(["--simple"] if simple else []),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    result = json.loads(out)
    assert isinstance(result, dict)
    return result


async def python_reads(channel: grpc.aio.Channel, topic: str) -> list[dict[str, object]]:
    """Every record of ``topic`` partition 0, decoded by our codec (headers in order)."""
    stub_fetch = channel.unary_unary(
        "/headrace.v1.Broker/Fetch",
        request_serializer=pb.FetchRequest.SerializeToString,
        response_deserializer=pb.FetchResponse.FromString,
    )
    records: list[dict[str, object]] = []
    while len(records) < COUNT:
        response = await stub_fetch(pb.FetchRequest(topic=topic, partition=0, offset=len(records)))
        for raw in response.batches:
            batch = decode_batch(raw)
            assert batch is not None
            doc = decoded_json(batch)
            batch_records = doc["records"]
            assert isinstance(batch_records, list)
            records += batch_records
    return records


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "simple",
    [
        pytest.param(False, id="binary-publish"),
        pytest.param(True, id="simple-publish"),
    ],
)
async def test_node_client_publishes_fetches_and_consumes_byte_exact(
    node: str, tmp_path: Path, simple: bool
) -> None:
    """Scenario: the Node client publishes 1000 records (keys null, empty and set;
    unicode header names, and repeated ones in binary batches; out-of-order timestamps),
    fetches from 0 and from 5, subscribes and acks, against a real broker. Expected: every
    vector checks out in its codec; what it fetched and consumed equals what it published,
    offset for offset; the Fetch at 5 returned the batch starting at 0 and the client
    skipped to 5; our codec reads the same records from the broker."""
    async with serving(broker_config(tmp_path / "data")) as (broker, client):
        result = await run_client(node, broker.port, "node-interop", simple=simple)
        ours = await python_reads(client.channel, "node-interop")
    published = result["published"]
    assert len(published) == COUNT
    vectors = len(list(VECTORS_DIR.glob("*.bin"))) + len(list(VECTORS_DIR.glob("invalid/*.bin")))
    assert result["vectors"] == {"checked": vectors}
    assert result["fetched"] == published
    assert result["consumed"] == published
    assert result["fetch_at_5"] == {"first_batch_base_offset": 0, "first_offset_returned": 5}
    assert result["subscribed"]["max_unacked"] > 0
    assert ours == published
    repeats = any(len({h[0] for h in r["headers"]}) < len(r["headers"]) for r in published)
    assert repeats is not simple  # binary batches carry a repeated header name
