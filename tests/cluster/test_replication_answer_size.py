"""A leader's ReplicaFetch answer is not bounded by the broker's ``max_request_bytes``
(issue 37): real etcd, two real ``headrace serve`` processes
(:mod:`tests.cluster.broker_processes`, TTL 2 s) with ``max_request_bytes`` lowered to
1 MiB, and a replicated topic (factor 2, min_insync 2, 8 partitions).

An answer is the batches a follower asked for (1 MiB by default) or one whole batch past
it, plus its envelope (every log id of the topic, each log's marks and epochs): it can be
a little bigger than the largest request the broker accepts, and a dead-letter batch
(several letters, their bookkeeping headers) can be far bigger. A server whose send limit
is ``max_request_bytes`` refuses such an answer at every fetch, so the follower never
gets past that batch: acknowledgements wait for it, then the in-sync set shrinks below
``min_insync`` and the topic refuses every publish.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from proto import broker_pb2 as _broker
from proto import broker_pb2_grpc as _broker_grpc
from proto.batch import encode_columns
from tests.cluster.broker_processes import Brokers, ClusterBroker, create_replicated
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]

LIMIT = 1 << 20
"""The brokers' ``max_request_bytes`` in this test."""


def _full_request(topic: str, partition: int) -> _broker.PublishRequest:
    """A publish of :data:`LIMIT` serialized bytes (the largest the broker takes; a
    batch's columns are 8-byte aligned: up to 7 bytes short): ten records, the last one's value
    sized to fill it."""
    values = [b"v" * 100_000 for _ in range(10)]
    now_ms = int(time.time() * 1000)

    def request() -> _broker.PublishRequest:
        batch = encode_columns(values, timestamps_ms=now_ms)
        return _broker.PublishRequest(topic=topic, partition=partition, batch=batch)

    for _ in range(5):  # the varints' lengths settle within a few rounds
        short = LIMIT - request().ByteSize()
        values[-1] = b"v" * (len(values[-1]) + short)
    while request().ByteSize() > LIMIT:  # a step past it: one byte less
        values[-1] = values[-1][:-1]
    made = request()
    assert LIMIT - 8 < made.ByteSize() <= LIMIT, made.ByteSize()
    return made


async def _publish(address: str, request: _broker.PublishRequest) -> _broker.PublishResponse:
    async with grpc.aio.insecure_channel(
        address, options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        got = await _broker_grpc.BrokerStub(channel).Publish(request, timeout=20)
    assert isinstance(got, _broker.PublishResponse)
    return got


async def test_a_publish_of_max_request_bytes_reaches_the_follower_and_is_acked(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: two brokers with ``max_request_bytes = 1 MiB``; topic ``big`` (8
    partitions, factor 2, min_insync 2); a publish of 1 MiB (the largest the
    broker takes, within 8 bytes) to partition 0 of the leader, then a small one. Expected: both are
    acknowledged (offsets 0-9, then 10) within 20 s each: the follower fetched the big
    batch (its answer is a little over 1 MiB). Without the fix the leader's server refuses
    to send that answer at every fetch (RESOURCE_EXHAUSTED), so the first publish is never
    acknowledged (it times out, or is refused once the in-sync set shrank)."""
    async with _brokers(tmp_path, etcd, prefix) as brokers:
        await create_replicated(brokers.seeds, "big", 8, 2, min_insync=2)
        route = await _online(brokers, "big")
        leader = brokers.by_id[route]
        first = await _publish(leader.address, _full_request("big", 0))
        assert (first.base_offset, first.last_offset) == (0, 9)
        small = _broker.PublishRequest(
            topic="big", partition=0, records=[_broker.Record(value=b"after")]
        )
        second = await _publish(leader.address, small)
        assert (second.base_offset, second.last_offset) == (10, 10)


@contextlib.asynccontextmanager
async def _brokers(tmp_path: Path, etcd: EtcdCluster, prefix: str) -> AsyncIterator[Brokers]:
    """Two brokers as :func:`~tests.cluster.broker_processes.cluster_brokers` starts them,
    with ``[broker] max_request_bytes = LIMIT`` in their configuration."""
    brokers = [ClusterBroker(tmp_path, f"b{i}", etcd, prefix) for i in (1, 2)]
    try:
        for broker in brokers:
            config = tmp_path / broker.node_id / "headrace.toml"
            text = config.read_text()
            assert "[broker]\n" in text
            config.write_text(
                text.replace("[broker]\n", f"[broker]\nmax_request_bytes = {LIMIT}\n")
            )
            broker.spawn()
        for broker in brokers:
            await broker.wait_serving(30.0)
        yield Brokers(brokers)
    finally:
        for broker in brokers:
            with contextlib.suppress(Exception):
                broker.stop()
            broker.kill()


async def _online(brokers: Brokers, topic: str) -> str:
    owners = await brokers.wait_owners([topic])
    return owners[topic]
