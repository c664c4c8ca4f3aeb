"""Replication end to end (issue 37): real etcd (three members) and three real ``headrace
serve`` processes in cluster mode (:mod:`tests.cluster.broker_processes`, TTL 2 s); a topic
of 2 partitions with replicas on all three, min_insync 2, written by an idempotent
producer that has every broker as a seed.

What is checked, from the outside (the Lookup answer, the producer's acks, the partition
files on each broker's disk):

- every replica's partition logs (segments and ``leader-epochs``) become byte-identical;
- the leader SIGKILLed under load: a follower leads within TTL + 1 s, the producer goes
  on, every acknowledged record is at its offset in the new
  leader's log and none is there twice;
- the old leader restarted follows the new one, drops any tail that was never
  committed, rejoins the in-sync set, and its logs become byte-identical again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from cluster.session import EXPIRY_SLACK_S
from proto import broker_pb2 as _broker
from proto import broker_pb2_grpc as _broker_grpc
from proto.cluster_pb2 import TopicRoute
from tests.cluster.broker_processes import (
    TTL_S,
    Brokers,
    ClusterBroker,
    cluster_brokers,
    create_replicated,
    read_topic,
)
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replicated_load import TOPIC, Load, check_acked

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(120)]

PARTITIONS = 2


def _files(broker: ClusterBroker) -> dict[str, bytes]:
    """``<partition>/<file>`` -> bytes of every segment and leader-epochs file of the
    topic on ``broker``'s disk (indexes and producer snapshots are caches: left out)."""
    root = broker.data_dir / "topics" / TOPIC
    found = {}
    for path in sorted(root.glob("*/*")):
        if path.suffix == ".log" or path.name == "leader-epochs":
            found[f"{path.parent.name}/{path.name}"] = path.read_bytes()
    return found


async def _route(brokers: Brokers, via: ClusterBroker) -> TopicRoute:
    return await brokers.route(TOPIC, via)


async def _wait_route(
    brokers: Brokers,
    via: ClusterBroker,
    wanted: str,
    within_s: float,
    check: Callable[[TopicRoute], bool],
) -> TopicRoute:
    deadline = time.monotonic() + within_s
    while True:
        with contextlib.suppress(grpc.RpcError):
            route = await _route(brokers, via)
            if check(route):
                return route
        assert time.monotonic() < deadline, f"{wanted}: {await _route(brokers, via)}"
        await asyncio.sleep(0.05)


async def _all_in_sync(brokers: Brokers, via: ClusterBroker, within_s: float) -> TopicRoute:
    every = sorted(b.node_id for b in brokers.all)
    return await _wait_route(
        brokers,
        via,
        "all three in sync",
        within_s,
        check=lambda r: r.online and sorted(r.isr) == every,
    )


async def _identical(brokers: list[ClusterBroker], within_s: float) -> dict[str, bytes]:
    """Wait until every broker's topic files are equal (followers catch up); them."""
    deadline = time.monotonic() + within_s
    while True:
        files = [_files(b) for b in brokers]
        if all(f == files[0] for f in files) and files[0]:
            return files[0]
        if time.monotonic() > deadline:
            sizes = [{k: len(v) for k, v in f.items()} for f in files]
            raise AssertionError(f"replicas differ: {sizes}")
        await asyncio.sleep(0.1)


async def _create(brokers: Brokers) -> str:
    """Create the topic (factor 3, min_insync 2; asked again while brokers join) and wait
    until all three are in sync; its leader."""
    await create_replicated(brokers.seeds, TOPIC, PARTITIONS, factor=3)
    route = await _all_in_sync(brokers, brokers.all[0], within_s=20)
    assert route.replicas[0] == route.owner_node
    return route.owner_node


async def _read_to_end(stream: grpc.aio.StreamStreamCall[Any, Any]) -> None:
    while await stream.read() != grpc.aio.EOF:
        pass


async def _read_leader(seeds: str) -> dict[tuple[int, int], bytes]:
    partitions = await read_topic(seeds, TOPIC)
    return {(p, o): v for p, rows in partitions.items() for o, v in rows}


async def test_replicas_are_byte_identical_after_acknowledged_writes(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers; the topic created with factor 3 and min_insync 2; 300
    records published by an idempotent producer, each acknowledged. Expected: the
    followers join the in-sync set, every acknowledged record is at its offset (read
    through the leader), and every replica's segment and leader-epochs files are
    byte-identical to the leader's."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        await _create(brokers)
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(300, within_s=30)
        assert load.failed == []
        held = await _read_leader(brokers.seeds)
        for position, value in load.acked.items():
            assert held.get(position) == value, f"{position}: acked {value!r} not there"
        files = await _identical(brokers.all, within_s=10)
        assert sum(len(v) for k, v in files.items() if k.endswith(".log")) > 0


async def test_the_leader_sigkilled_under_load_loses_nothing_and_rejoins(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, the topic led by the preferred replica with all three in
    sync; an idempotent producer keeps sending; the leader is SIGKILLed, later restarted
    on its data directory. Expected: a follower leads (online, a higher epoch) within TTL
    + 1 s of the kill; the producer's records keep being
    acknowledged; no record failed; every acknowledged record is at its offset in the new
    leader's log and no value is there twice; the restarted broker follows the new leader,
    rejoins the in-sync set, and its files become byte-identical to the new leader's."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        first = await _create(brokers)
        victim = brokers.by_id[first]
        others = [b for b in brokers.all if b is not victim]
        epoch = (await _route(brokers, others[0])).epoch
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(200, within_s=30)
            victim.kill()
            killed = time.monotonic()
            route = await _wait_route(
                brokers,
                others[0],
                "a new leader",
                within_s=TTL_S + EXPIRY_SLACK_S + 5,
                check=lambda r: r.online and r.owner_node != first and r.epoch > epoch,
            )
            took = time.monotonic() - killed
            # Measured here: 1.6 to 2.5 s with TTL 2 (the lease ends between TTL - TTL/3
            # and TTL + etcd's expiry check after the last keepalive; the rank-0 follower
            # elects as soon as its view sees the broker key go).
            assert took < TTL_S + 1.0, f"new leader after {took:.2f} s"
            acked = len(load.acked)
            await load.wait_more(acked + 200, within_s=30)
        check_acked(load, await _read_leader(",".join(b.address for b in others)))
        await victim.start()
        await _all_in_sync(brokers, others[0], within_s=30)
        rejoined = await _route(brokers, others[0])
        assert rejoined.owner_node == route.owner_node
        await _identical(brokers.all, within_s=15)


async def test_an_old_leaders_unacknowledged_tail_is_truncated_when_it_returns(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three brokers, all in sync, an idempotent producer sending; both
    followers are frozen (SIGSTOP) for a second, less than their TTL, so the leader goes
    on appending records it cannot commit (their acks wait: none arrives after the acks
    already under way at the freeze); the leader is then
    SIGKILLed and the followers thawed. Expected: before the restart the old leader's
    files differ from the new leader's (it holds a tail of epoch 1 nobody else has); a
    follower leads; nothing acknowledged is lost and nothing is twice in the new
    leader's log (the producer's resends of the frozen window were appended once there);
    the old leader restarted truncates its tail to the divergence point, catches up,
    rejoins the isr and its files become byte-identical to the new leader's."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        first = await _create(brokers)
        victim = brokers.by_id[first]
        others = [b for b in brokers.all if b is not victim]
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(100, within_s=30)
            for follower in others:
                follower.freeze()
            try:
                # Acks of records committed just before the freeze may still be on their
                # way to the producer: count from when those have arrived.
                await asyncio.sleep(0.3)
                before = len(load.acked)
                await asyncio.sleep(0.7)
                assert len(load.acked) == before, "acknowledged while no follower fetched"
                victim.kill()
            finally:
                for follower in others:
                    follower.thaw()
            route = await _wait_route(
                brokers,
                others[0],
                "a new leader",
                within_s=TTL_S + EXPIRY_SLACK_S + 5,
                check=lambda r: r.online and r.owner_node != first,
            )
            await load.wait_more(len(load.acked) + 100, within_s=30)
        assert load.failed == []
        leader = brokers.by_id[route.owner_node]
        assert _files(victim) != _files(leader), "the old leader had no tail of its own"
        check_acked(load, await _read_leader(",".join(b.address for b in others)))
        await victim.start()
        await _all_in_sync(brokers, others[0], within_s=30)
        await _identical(brokers.all, within_s=15)


async def test_a_deposed_leader_ends_its_consumers_streams_naming_the_new_leader(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: a consumer's Subscribe stream is open on the leader; the leader is frozen
    (SIGSTOP) past its TTL, so a follower is elected, then thawed. Expected: the old
    leader follows the new one and ends the stream ABORTED with the refusal
    ``not-owner`` naming the new leader (the consumer looks it up and goes there)."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        first = await _create(brokers)
        victim = brokers.by_id[first]
        others = [b for b in brokers.all if b is not victim]
        requests: asyncio.Queue[_broker.SubscribeRequest | None] = asyncio.Queue()
        open_ = _broker.OpenSubscription(topic=TOPIC, subscription="s", initial_credit=10)
        await requests.put(_broker.SubscribeRequest(open=open_))

        async def send() -> AsyncIterator[_broker.SubscribeRequest]:
            while (request := await requests.get()) is not None:
                yield request

        async with grpc.aio.insecure_channel(victim.address) as channel:
            stream = _broker_grpc.BrokerStub(channel).Subscribe(send())
            first_answer = await stream.read()
            assert first_answer.HasField("subscribed"), first_answer
            victim.freeze()
            try:
                route = await _wait_route(
                    brokers,
                    others[0],
                    "a new leader",
                    within_s=TTL_S + EXPIRY_SLACK_S + 5,
                    check=lambda r: r.online and r.owner_node != first,
                )
            finally:
                victim.thaw()
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await asyncio.wait_for(_read_to_end(stream), 15)
            await requests.put(None)
        assert ended.value.code() == grpc.StatusCode.ABORTED, ended.value
        facts = dict(ended.value.trailing_metadata() or ())
        assert facts.get("headrace-refusal") == "not-owner", facts
        assert facts.get("headrace-owner-node") == route.owner_node, facts
