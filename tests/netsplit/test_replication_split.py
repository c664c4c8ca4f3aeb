"""Replicated topics across network splits (issue 37), checked by
:mod:`tests.cluster.replica_checker` after each heal.

Three etcd members and three brokers, each in a network namespace of its own
(:mod:`tests.netsplit.hosts`: brokers ``b1``..``b3``, session TTL 2 s, fsync ``always``);
one topic of two partitions, replication factor 3, min_insync 2, written by an idempotent
producer in the root namespace (every broker a seed), read by Fetch tails and by a
consumer of each subscription type, plus a producer pinned to the first leader's address
(raw Publishes) that shows what the old leader acknowledges during the split.

The splits, each healed after a few seconds:

- the leader cut from both followers (both ways): it keeps its session, so nobody is
  elected; its followers stop fetching, so nothing it appends can be committed and no
  ack is given until the heal;
- the leader cut from every etcd member: its session lapses, a follower is elected; the
  old leader, still reached by clients, acknowledges nothing sent after the election;
- asymmetric: every packet from the leader to its followers dropped, theirs to it still
  delivered (their fetches arrive, the answers vanish): as the first.

After each heal, with every replica back in sync, the checker's rules hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.session import EXPIRY_SLACK_S
from tests.cluster.broker_processes import create_replicated
from tests.cluster.etcd_harness import etcd_binary
from tests.cluster.replica_runs import (
    Load,
    Pinned,
    Subscribers,
    Tail,
    settle_and_check,
    wait_route,
)
from tests.netsplit.hosts import ETCD_NODES, Net, NetBroker, NetEtcd
from tests.netsplit.netns import Lab, require_netns

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(150)]

BROKERS = ["b1", "b2", "b3"]
TOPIC = "split"
PARTITIONS = 2
TTL_S = 2
SPLIT_S = 4.0
"""How long a split lasts when nothing is awaited during it."""


@pytest.fixture(scope="module")
def shared_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    """This module's lab: the conftest's, with a third broker host ``b3``."""
    require_netns()
    etcd_binary()
    with Lab([*ETCD_NODES, *BROKERS]) as lab:
        etcd = NetEtcd(lab, ETCD_NODES, tmp_path_factory.mktemp("repl-split-etcd"))
        etcd.start()
        yield Net(lab, etcd)


@dataclass
class _Split:
    net: Net
    brokers: dict[str, NetBroker]
    load: Load
    tail: Tail
    pinned: Pinned
    leader: str
    epoch: int

    @property
    def followers(self) -> list[str]:
        return [b for b in BROKERS if b != self.leader]


@contextlib.asynccontextmanager
async def _split_run(net: Net, root: Path, prefix: str) -> AsyncIterator[_Split]:
    """Three brokers, the topic all in sync, the loads running; after the block (healed
    by the test), the checker over every producer's acks."""
    brokers = {
        n: NetBroker(net.lab, n, net.etcd, root, prefix=prefix, ttl_s=TTL_S) for n in BROKERS
    }
    try:
        for broker in brokers.values():
            broker.spawn()
        for broker in brokers.values():
            await broker.wait_serving()
        await _registered(net, prefix)
        seeds = ",".join(b.address for b in brokers.values())
        await create_replicated(seeds, TOPIC, PARTITIONS, factor=3)
        got = await wait_route(
            [b.address for b in brokers.values()],
            TOPIC,
            "all three in sync",
            30,
            check=lambda r: r.online and sorted(r.isr) == BROKERS,
        )
        run = _Split(
            net,
            brokers,
            Load(seeds, TOPIC),
            Tail(seeds, TOPIC, PARTITIONS),
            Pinned(brokers[got.owner_node].address, TOPIC),
            got.owner_node,
            got.epoch,
        )
        subscribers = Subscribers(seeds, TOPIC)
        async with subscribers.running():
            async with run.tail.running(), run.load.running(), run.pinned.running():
                await run.load.wait_more(100, within_s=30)
                assert run.pinned.acked, "the leader acknowledged nothing before the split"
                yield run
                net.lab.heal()
                await run.load.wait_more(len(run.load.acked) + 100, within_s=40)
            assert run.load.failed == [], run.load.failed[:3]
            run.pinned.add_to(run.load.acked)
            await settle_and_check(
                list(brokers.values()),
                TOPIC,
                PARTITIONS,
                run.load.acked,
                tail=run.tail,
                subscribers=subscribers,
            )
    finally:
        net.lab.heal()  # a broker cut from etcd would wait for it to mark itself leaving
        for broker in brokers.values():
            broker.stop()


async def _registered(net: Net, prefix: str, within_s: float = 20) -> None:
    """Wait until every broker's key is in etcd (serving comes before joining)."""
    deadline = time.monotonic() + within_s
    while True:
        out = net.etcd.etcdctl("get", f"{prefix}brokers/", "--prefix", "--keys-only")
        if all(f"{prefix}brokers/{b}" in out.split() for b in BROKERS):
            return
        assert time.monotonic() < deadline, f"brokers in etcd: {out.split()}"
        await asyncio.sleep(0.1)


async def _no_ack_while(run: _Split, seconds: float) -> None:
    """Wait ``seconds`` and assert that no record was acknowledged meanwhile, by either
    producer (the acks that were in flight when it began are let through first)."""
    await asyncio.sleep(1.0)
    before, pinned = len(run.load.acked), len(run.pinned.acked)
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        assert len(run.load.acked) == before, "acknowledged while the leader was cut off"
        assert len(run.pinned.acked) == pinned, "the pinned producer was acknowledged"
        await asyncio.sleep(0.1)


async def test_a_leader_cut_from_both_followers_commits_nothing_until_healed(
    net: Net, tmp_path: Path, prefix: str
) -> None:
    """Scenario: the leader's host cut from both followers' hosts, both ways, for a few
    seconds (it still reaches etcd and the clients), then healed. Expected: the leader
    keeps its leadership (same epoch); after the acks in flight, no record is
    acknowledged during the split; after the heal acks flow again; the checker holds."""
    async with _split_run(net, tmp_path, prefix) as run:
        for follower in run.followers:
            net.lab.cut(run.leader, follower)
        await _no_ack_while(run, SPLIT_S)
        got = await wait_route(
            [run.brokers[run.leader].address], TOPIC, "a route", 5, lambda r: True
        )
        assert got.owner_node == run.leader
        assert got.epoch == run.epoch


@pytest.mark.timeout(120)
async def test_a_leader_cut_from_etcd_is_replaced_and_acknowledges_nothing_after(
    net: Net, tmp_path: Path, prefix: str
) -> None:
    """Scenario: the leader's host cut from every etcd member, both ways (it still reaches
    its followers and the clients); a producer pinned to it keeps publishing. Expected: a
    follower leads at a higher epoch within TTL + expiry slack + 1 s (seen through a
    follower); the old leader acknowledges nothing sent after that; healed, it follows
    and rejoins; the checker holds over both producers."""
    async with _split_run(net, tmp_path, prefix) as run:
        for member in ETCD_NODES:
            net.lab.cut(run.leader, member)
        cut_at = time.monotonic()
        got = await wait_route(
            [run.brokers[f].address for f in run.followers],
            TOPIC,
            "a new leader",
            TTL_S + EXPIRY_SLACK_S + 8,
            check=lambda r: r.online and r.owner_node != run.leader and r.epoch > run.epoch,
        )
        elected_at = time.monotonic()
        print(f"new leader {got.owner_node} after {elected_at - cut_at:.2f} s")
        await asyncio.sleep(4.0)
        answers = Counter(a[2] or "ack" for a in run.pinned.sent_after(cut_at))
        print(f"the cut-off leader's answers since the cut: {dict(answers)}")
        await run.load.wait_more(len(run.load.acked) + 100, within_s=30)
        late = run.pinned.acked_sent_after(elected_at)
        assert late == [], f"the cut-off leader acknowledged {len(late)} records"
        assert run.pinned.sent_after(elected_at), "the cut-off leader was not asked"
        assert elected_at - cut_at < TTL_S + EXPIRY_SLACK_S + 1.0


async def test_an_asymmetric_split_leader_to_followers_commits_nothing_until_healed(
    net: Net, tmp_path: Path, prefix: str
) -> None:
    """Scenario: every packet from the leader's host to each follower's host dropped, the
    other direction delivered (the followers' fetches arrive, the answers do not), for a
    few seconds, then healed. Expected: as the symmetric cut: no ack during the split
    (after those in flight), the same leader and epoch, acks after the heal, the
    checker holds."""
    async with _split_run(net, tmp_path, prefix) as run:
        for follower in run.followers:
            net.lab.cut_one_way(run.leader, follower)
        await _no_ack_while(run, SPLIT_S)
        got = await wait_route(
            [run.brokers[run.leader].address], TOPIC, "a route", 5, lambda r: True
        )
        assert got.owner_node == run.leader
        assert got.epoch == run.epoch
