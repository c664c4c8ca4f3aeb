"""Replicated topics through the failures an operator meets (issue 37), each with no
operator step: the leader's broker restarted on an empty data directory (a lost disk),
also before any follower could be elected, and etcd losing its majority.

Real etcd (three members; the etcd test kills two of its own), three real ``headrace
serve`` processes in cluster mode (:mod:`tests.cluster.broker_processes`, TTL 2 s), a
topic of 2 partitions on all three with min_insync 2, written by the idempotent producer
of :mod:`tests.cluster.replicated_load`. What is checked is what a user can
see: the producer's acks and failures, the records read back through the seeds, the
route (leader, epoch, in-sync set) and each broker's files.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from tests.cluster.broker_processes import TTL_S, Brokers, cluster_brokers
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replicated_load import Load, check_acked
from tests.cluster.test_replication_failover import (
    _all_in_sync,
    _create,
    _identical,
    _read_leader,
    _route,
)

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(150)]


async def test_the_leader_restarted_on_an_empty_data_directory_re_replicates(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: all three in sync under an idempotent producer; the leader's broker is
    SIGKILLed, its whole data directory removed (a lost disk), and it is started again
    at once with the same node id on the empty directory.
    Expected: with no operator step, a follower leads (a higher epoch); the restarted
    broker makes an empty copy, copies the topic from the new leader, rejoins the
    in-sync set and ends byte-identical; no record failed, nothing acknowledged is lost
    or written twice."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        await _wipe_the_leader(brokers, followers_frozen=False)


async def test_a_wiped_leader_back_before_any_election_hands_the_topic_over(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: all three in sync under an idempotent producer; both followers frozen
    (SIGSTOP), so nobody can be elected; the leader SIGKILLed, its data directory
    removed, restarted on the empty directory (it registers once its old session ended,
    and the record still names it leader); then the followers thawed.
    Expected: the restarted broker does not lead a topic whose data it lacks, nor keep
    it unserved: it hands the topic to an in-sync follower (a higher epoch, itself out
    of the in-sync set), then copies it back and rejoins; the producer goes on with no
    record failed, nothing acknowledged lost or written twice, and the replicas end
    byte-identical."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        await _wipe_the_leader(brokers, followers_frozen=True)


async def test_etcd_losing_its_majority_stops_writes_keeps_reads_and_loses_nothing(
    tmp_path: Path, own_etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: all three in sync under an idempotent producer; two of the three etcd
    members are SIGKILLed (no majority), then restarted once the producer has stalled.
    Expected: the acknowledgements stop within the TTL plus etcd's own step-down (its
    leader may renew leases until it notices it lost its majority; measured here) and
    none comes for 3 s after, yet every record acknowledged before is read back through
    the seeds; once etcd is back the producer's records are acknowledged again by
    themselves (the topic never at a lower epoch); no record failed, nothing
    acknowledged is lost or written twice."""
    async with cluster_brokers(tmp_path, own_etcd, prefix) as brokers:
        await _create(brokers)
        epoch = (await _route(brokers, brokers.all[0])).epoch
        load = Load(brokers.seeds)
        async with load.running():
            await load.wait_more(200, within_s=30)
            down = own_etcd.members[:2]
            for member in down:
                own_etcd.kill(member)
            killed = time.monotonic()
            try:
                stalled_s = await _until_stalled(load, quiet_s=1.0, within_s=TTL_S + 8)
                stalled = len(load.acked)
                held = await _read_leader(brokers.seeds)  # reads go on
                for position, value in list(load.acked.items()):
                    assert held.get(position) == value, f"{position}: not readable"
                await asyncio.sleep(3.0)
                assert len(load.acked) == stalled, "a publish was acknowledged without etcd"
            finally:
                for member in down:
                    await asyncio.to_thread(own_etcd.restart, member)
            print(f"acks stopped {stalled_s - killed:.2f} s after the majority was lost")
            await load.wait_more(stalled + 100, within_s=40)
        check_acked(load, await _read_leader(brokers.seeds))
        route = await _all_in_sync(brokers, brokers.all[0], within_s=30)
        assert route.epoch >= epoch


async def _until_stalled(load: Load, *, quiet_s: float, within_s: float) -> float:
    """Wait until no ack has come for ``quiet_s``; when the last one came (monotonic)."""
    deadline = time.monotonic() + within_s
    count, since = len(load.acked), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"acks went on for {within_s} s without etcd"
        await asyncio.sleep(0.05)
        if len(load.acked) != count:
            count, since = len(load.acked), time.monotonic()
    return since


async def _wipe_the_leader(brokers: Brokers, *, followers_frozen: bool) -> None:
    """The run of the two tests above: all three in sync under an idempotent producer;
    the leader's broker SIGKILLed, its data directory removed and the broker started
    again on the empty directory, with both followers frozen (SIGSTOP) from before the
    kill until it is back when ``followers_frozen``, then thawed. Checks that all three
    end in sync (asked of a follower, or of the restarted broker after a freeze) under
    another leader at a higher epoch, that the producer goes on (100 acks more), that no
    record failed and nothing acknowledged is lost or written twice, and that the
    replicas end byte-identical."""
    first = await _create(brokers)
    victim = brokers.by_id[first]
    others = [b for b in brokers.all if b is not victim]
    frozen = others if followers_frozen else []
    epoch = (await _route(brokers, others[0])).epoch
    load = Load(brokers.seeds)
    async with load.running():
        await load.wait_more(200, within_s=30)
        for follower in frozen:
            follower.freeze()
        victim.kill()
        shutil.rmtree(victim.data_dir)
        # It waits out its old session, then registers (the record still names it
        # leader if nobody could be elected meanwhile).
        await victim.start()
        for follower in frozen:
            follower.thaw()
        via = victim if followers_frozen else others[0]
        route = await _all_in_sync(brokers, via, within_s=60)
        assert route.owner_node != first
        assert route.epoch > epoch
        await load.wait_more(len(load.acked) + 100, within_s=30)
    check_acked(load, await _read_leader(brokers.seeds))
    files = await _identical(brokers.all, within_s=15)
    assert any(k.endswith(".log") and v for k, v in files.items())
