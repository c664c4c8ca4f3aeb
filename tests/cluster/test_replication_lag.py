"""Each follower's lag where operators look (issue 37): DescribeTopic answered by a
replicated topic's leader lists every follower per partition (fetch offset, records and
seconds behind, in sync), and ``headrace topics describe`` prints it (table and --json).

A real three-member etcd and three real ``headrace serve`` processes
(:mod:`tests.cluster.broker_processes`, TTL 2 s); a topic of one partition on all three,
min_insync 2. A follower is frozen (SIGSTOP) for a little under the TTL while records are
sent, so it falls behind by a known count.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner, Result

from broker.cli import cli
from client import AsyncProducer, RecordFuture
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from tests.cluster.broker_processes import cluster_brokers, create_replicated
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]

TOPIC = "orders"


async def _describe(address: str) -> _admin.TopicInfo:
    """A raw DescribeTopic answered by the broker at ``address`` alone."""
    async with grpc.aio.insecure_channel(address) as channel:
        info = await _admin_grpc.AdminStub(channel).DescribeTopic(
            _admin.DescribeTopicRequest(name=TOPIC), timeout=5
        )
    assert isinstance(info, _admin.TopicInfo)
    return info


async def _until(
    address: str, check: Callable[[_admin.TopicInfo], bool], within_s: float
) -> _admin.TopicInfo:
    deadline = time.monotonic() + within_s
    while True:
        info = await _describe(address)
        if check(info):
            return info
        assert time.monotonic() < deadline, f"not within {within_s} s: {info}"
        await asyncio.sleep(0.1)


def _caught_up(info: _admin.TopicInfo) -> bool:
    followers = info.partitions[0].followers
    return len(followers) == 2 and all(f.lag_records == 0 and f.in_sync for f in followers)


async def _cli(seed: str, *args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, cli, [*args, "--broker", seed])


async def test_describe_through_the_leader_shows_each_followers_lag(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: 20 records published and acknowledged; then one follower frozen for
    1.2 s while 10 more are sent (their acks wait for it), then thawed. Expected: once
    caught up, the leader's DescribeTopic lists both followers in replica order at fetch
    offset 20, 0 records and 0 s behind, in sync (a follower refuses DescribeTopic:
    not-owner);
    while frozen, the leader says the frozen one is 10 records and at least 1 s behind
    (the other 0); ``topics describe`` through the leader prints the follower table
    (the frozen one's row says 10) and its --json the same numbers; after the thaw both
    are caught up again and every send is acknowledged. The answer and both outputs also
    have one ``state`` row per follower (the topic's subscription-state log; no ``dlq``
    row: the topic has no dead-letter queue)."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        made = await create_replicated(brokers.seeds, TOPIC, 1, factor=3)
        await brokers.wait_owners([TOPIC])
        leader = brokers.by_id[made.leader]
        followers = [brokers.by_id[n] for n in made.replicas if n != made.leader]
        async with AsyncProducer(brokers.seeds, delivery_timeout_s=60.0) as producer:
            for i in range(20):
                await (await producer.send(TOPIC, b"v%d" % i))
            info = await _until(leader.address, _caught_up, within_s=15)
            assert [f.node for f in info.partitions[0].followers] == [b.node_id for b in followers]
            for f in info.partitions[0].followers:
                assert (f.fetch_offset, f.lag_records, f.lag_s) == (20, 0, 0.0)
            assert info.partitions[0].head == 20
            with pytest.raises(grpc.aio.AioRpcError) as refused:  # only the leader answers
                await _describe(followers[0].address)
            assert refused.value.code() is grpc.StatusCode.ABORTED

            frozen, running = followers[1], followers[0]
            frozen.freeze()
            try:
                sent: list[RecordFuture] = [
                    await producer.send(TOPIC, b"w%d" % i) for i in range(10)
                ]
                await _until(leader.address, lambda i: i.partitions[0].head == 30, within_s=5)
                await asyncio.sleep(1.2)
                lagging = await _describe(leader.address)
                table = await _cli(leader.address, "topics", "describe", TOPIC)
                as_json = await _cli(leader.address, "topics", "describe", TOPIC, "--json")
            finally:
                frozen.thaw()
            lags = {f.node: f for f in lagging.partitions[0].followers}
            assert (lags[frozen.node_id].fetch_offset, lags[frozen.node_id].lag_records) == (20, 10)
            assert lags[frozen.node_id].lag_s >= 1.0
            assert lags[running.node_id].lag_records == 0
            assert table.exit_code == 0, table.output
            assert "lag_records" in table.output
            row = [line.split() for line in table.output.splitlines() if frozen.node_id in line]
            assert ["0", frozen.node_id, "20", "10"] in [r[:4] for r in row]
            assert as_json.exit_code == 0, as_json.output
            [doc] = json.loads(as_json.output)
            by_node = {f["node"]: f for f in doc["partitions"][0]["followers"]}
            assert by_node[frozen.node_id]["lag_records"] == 10
            assert by_node[running.node_id]["lag_records"] == 0
            # the topic's state log: one row per follower (no subscription saved: 0 behind
            # except the frozen one's share of the leader's first snapshot, if any)
            states = {f.node: f for f in lagging.log_followers if f.log == "state"}
            assert set(states) == {frozen.node_id, running.node_id}
            assert states[running.node_id].lag_records == 0
            assert [r[:2] for r in row if r[0] == "state"] == [["state", frozen.node_id]]
            assert {f["log"] for f in doc["log_followers"]} == {"state"}
            for future in sent:
                await future
            info = await _until(leader.address, _caught_up, within_s=20)
            assert [f.fetch_offset for f in info.partitions[0].followers] == [30, 30]
