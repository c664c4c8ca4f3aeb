"""Unclean leader election end to end (issue 37): real etcd (three members) and three real
``headrace serve`` processes (:mod:`tests.cluster.broker_processes`, TTL 2 s); a topic of
one partition on all three, min_insync 1.

The followers are made out of sync the way it happens: both frozen (SIGSTOP) past the
TTL, so the leader takes them out of the in-sync set and goes on acknowledging alone;
then the leader is SIGKILLed and the followers thawed. What only the leader had is then
either kept (the switch off: nobody may lead, the topic stays offline until the leader
is back) or given up (``headrace cluster config set unclean_leader_election=true``: a
follower leads, says in its log and its metrics how many records it gave up, and the old
leader, restarted, cuts its divergent tail).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import grpc
import pytest

from client import AsyncProducer
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _broker_grpc
from tests.broker.metrics_workload import parse, scrape_text, total
from tests.broker.test_serve_process import free_port
from tests.cluster.broker_processes import (
    TTL_S,
    Brokers,
    ClusterBroker,
    create_replicated,
    read_topic,
    wait_refused,
)
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.test_broker_config_defaults import config_cli
from tests.cluster.test_config_defaults import cli_config

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(150)]

TOPIC = "orders"
BEFORE = 30
"""Records acknowledged while all three are in sync (every replica has them)."""
ALONE = 25
"""Records acknowledged by the leader alone, its followers frozen and out of the isr."""


class _Cluster:
    """Three brokers, each with a metrics port of its own."""

    def __init__(self, root: Path, etcd: EtcdCluster, prefix: str) -> None:
        self.brokers = [ClusterBroker(root, f"b{i}", etcd, prefix) for i in (1, 2, 3)]
        self.metrics: dict[str, int] = {}
        for broker in self.brokers:
            port = free_port()
            at = broker.command.index("--metrics-listen")
            broker.command[at + 1] = f"127.0.0.1:{port}"
            self.metrics[broker.node_id] = port
        self.view = Brokers(self.brokers)

    async def start(self) -> None:
        for broker in self.brokers:
            broker.spawn()
        for broker in self.brokers:
            await broker.wait_serving(30.0)

    def close(self) -> None:
        for broker in self.brokers:
            try:
                broker.stop()
            finally:
                broker.kill()

    async def samples(self, node: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return parse(await asyncio.to_thread(scrape_text, self.metrics[node]))


async def _publish(producer: AsyncProducer, prefix: str, count: int) -> list[bytes]:
    """``count`` records, each acknowledged before this returns; their values."""
    values = [f"{prefix}{i}".encode() for i in range(count)]
    for value in values:
        await (await producer.send(TOPIC, value))
    return values


async def _make_followers_out_of_sync(cluster: _Cluster) -> tuple[ClusterBroker, list[bytes]]:
    """The topic on all three; BEFORE records acked in sync; both followers frozen past
    the TTL; ALONE records acked by the leader alone; the leader SIGKILLed after it
    published its marks (a second), the followers thawed. Returns the old leader and
    every acknowledged value in order."""
    await create_replicated(cluster.view.seeds, TOPIC, 1, 3, min_insync=1)
    leader_id = (await cluster.view.wait_owners([TOPIC]))[TOPIC]
    leader = cluster.view.by_id[leader_id]
    followers = [b for b in cluster.brokers if b is not leader]
    async with AsyncProducer(leader.address) as producer:
        acked = await _publish(producer, "in-sync-", BEFORE)
        for follower in followers:
            follower.freeze()
        try:
            # acknowledged once the leader took the frozen followers out of the isr
            async with asyncio.timeout(TTL_S * 5):
                acked += await _publish(producer, "alone-", ALONE)
            await asyncio.sleep(2.5)  # the leader's marks, published every second
            leader.kill()
        finally:
            for follower in followers:
                follower.thaw()
    return leader, acked


async def _raw_publish(address: str) -> grpc.aio.AioRpcError:
    """One raw Publish to ``address``, which must be refused; the error."""
    request = _pb.PublishRequest(topic=TOPIC, partition=0, records=[_pb.Record(value=b"x")])
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _broker_grpc.BrokerStub(channel).Publish(request, timeout=10)
    return refused.value


async def _truncates_and_follows(
    cluster: _Cluster, old: ClusterBroker, epoch_start: int, head: int
) -> None:
    """Restart the old leader ``old``: it must cut its log back to the new leader's
    ``epoch_start`` (once) and then hold the new leader's log up to ``head``."""
    await old.start()
    cut = re.compile(r"p/0: truncating to (\d+)")
    async with asyncio.timeout(20):
        while True:
            cuts = cut.findall(old.log.read_text())
            if cuts:
                break
            await asyncio.sleep(0.1)
    assert cuts == [str(epoch_start)], cuts
    key = ("headrace_partition_head_offset", frozenset({("topic", TOPIC), ("partition", "0")}))
    async with asyncio.timeout(20):
        while True:
            if (await cluster.samples(old.node_id)).get(key) == head:
                break
            await asyncio.sleep(0.2)


async def test_with_unclean_election_off_the_topic_stays_offline_and_loses_nothing(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """The switch off (the default). Both followers frozen past the TTL, 25 records
    acked by the leader alone, the leader SIGKILLed, the followers thawed. Expected: after
    TTL + the unclean grace + 4 s nobody leads: each follower refuses the topic as
    ``offline`` (DescribeTopic and a raw Publish: ABORTED, naming the dead leader), and
    neither counts an election; the old leader restarted leads again and all 55 acked
    records are read back in order."""
    cluster = _Cluster(tmp_path, etcd, prefix)
    try:
        await cluster.start()
        leader, acked = await _make_followers_out_of_sync(cluster)
        await asyncio.sleep(TTL_S + 2.0 + 4.0)
        for follower in (b for b in cluster.brokers if b is not leader):
            facts = await wait_refused(follower.address, TOPIC, "offline", within_s=5)
            assert facts["headrace-owner-node"] == leader.node_id, facts
            refused = await _raw_publish(follower.address)
            assert refused.code() == grpc.StatusCode.ABORTED, refused
            trailers = dict(refused.trailing_metadata() or ())
            assert trailers["headrace-refusal"] == "offline", trailers
            samples = await cluster.samples(follower.node_id)
            assert total(samples, "headrace_cluster_leader_elections_total") == 0
            assert total(samples, "headrace_cluster_unclean_elections_total") == 0
        await leader.start()
        assert (await cluster.view.wait_owners([TOPIC], within_s=20))[TOPIC] == leader.node_id
        read = await read_topic(cluster.view.seeds, TOPIC)
        assert [v for _, v in read[0]] == acked
        assert [o for o, _ in read[0]] == list(range(BEFORE + ALONE))
    finally:
        cluster.close()


async def test_with_unclean_election_on_a_follower_leads_and_counts_what_it_gave_up(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """`headrace cluster config set unclean_leader_election=true`, then as above: 30
    records acked in sync, 25 by the leader alone, the leader SIGKILLed, the followers
    thawed. Expected: a follower leads at the next epoch within TTL + the grace + 10 s;
    its log has the WARNING "UNCLEAN election: broker <it> ... at least N records" and its
    metrics headrace_cluster_unclean_elections_total 1,
    headrace_cluster_leader_elections_total 1 and
    headrace_cluster_unclean_lost_records_total{topic} N, where N is exactly the number of
    acknowledged records missing from the topic as read afterwards (22 to 25: the 25 the
    leader acked alone, less any a fetch answer in flight at the freeze gave the
    followers); the topic reads as the acked records it kept then 10 new ones; the old
    leader, restarted, follows and cuts its log back to the new leader's epoch start (its
    divergent tail of N), then holds the new leader's records."""
    cluster = _Cluster(tmp_path, etcd, prefix)
    config = cli_config(tmp_path, etcd, prefix)
    try:
        await cluster.start()
        done = await config_cli(config, "set", "unclean_leader_election=true")
        assert done.returncode == 0, done.stderr
        shown = await config_cli(config, "show")
        assert re.search(r"unclean_leader_election\s+true\s+built-in false", shown.stdout)
        await asyncio.sleep(2.0)  # every broker applies a changed default within 2 s
        old, acked = await _make_followers_out_of_sync(cluster)
        killed = time.monotonic()
        async with asyncio.timeout(TTL_S + 2.0 + 10.0):
            while True:
                route = await cluster.view.route(
                    TOPIC, via=next(b for b in cluster.brokers if b is not old)
                )
                if route.online and route.owner_node != old.node_id:
                    break
                await asyncio.sleep(0.1)
        took = time.monotonic() - killed
        new = cluster.view.by_id[route.owner_node]
        said = re.findall(
            r"UNCLEAN election: broker (\w+) .*at least (\d+) records", new.log.read_text()
        )
        assert len(said) == 1, new.log.read_text()[-3000:]
        samples = await cluster.samples(new.node_id)
        assert total(samples, "headrace_cluster_unclean_elections_total") == 1
        assert total(samples, "headrace_cluster_leader_elections_total") == 1
        lost = total(samples, "headrace_cluster_unclean_lost_records_total", topic=TOPIC)
        assert said[0] == (new.node_id, str(int(lost)))
        async with AsyncProducer(cluster.view.seeds) as producer:
            fresh = await _publish(producer, "after-", 10)
        read = [v for _, v in (await read_topic(cluster.view.seeds, TOPIC))[0]]
        kept = len(acked) - int(lost)
        # exactly the acknowledged records the new leader lacks were counted; a fetch
        # answer in flight at the freeze may have given it the first of the leader's own
        assert ALONE - 3 <= lost <= ALONE, (lost, took)
        assert read == acked[:kept] + fresh
        await _truncates_and_follows(cluster, old, kept, kept + len(fresh))
    finally:
        cluster.close()
