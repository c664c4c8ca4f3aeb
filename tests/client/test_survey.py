"""Admin listings of the whole cluster (client/_survey.py and AsyncAdminClient's
``list_topics`` / ``subscription_listing``), whichever broker they reach.

The plan is pure (no loop); the listings run against real brokers on loopback: a single
broker (one call, no Lookup) and :mod:`tests.client.static_cluster` (three brokers, a
static ownership map, real gRPC, guard and Cluster service).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.app import Broker
from client import (
    AdminClient,
    AsyncAdminClient,
    AsyncConsumer,
    AsyncFetcher,
    AsyncProducer,
    TopicInfo,
)
from client._survey import LOCAL_NODE, UNREACHABLE, Owner, is_cluster, plan
from proto import cluster_pb2 as _cluster
from tests.client.conftest import address
from tests.client.static_cluster import StaticCluster, static_cluster

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("node_id", "cluster"),
    [("", False), (LOCAL_NODE, False), ("b1", True), ("node-7", True)],
)
def test_is_cluster(node_id: str, cluster: bool) -> None:
    """A list answer's node id: ``""`` (a broker before issue 36) and ``local`` are a
    single broker, whose answer is the whole answer; any other id is a cluster member."""
    assert is_cluster(node_id) is cluster


def test_plan_groups_topics_by_owner() -> None:
    """A Lookup of every topic, answered for a listing that b1 answered: b1's topics are
    its own answer's, b2's two topics are one ask of b2 at its address, b3's offline topic
    and a placing one are listed as not readable with their reasons, an absent topic
    (deleted meanwhile) is left out; the partition counts come from the routes."""
    found = _cluster.LookupResponse(
        node_id="b1",
        routes=[
            _cluster.TopicRoute(
                topic="a", owner_node="b1", owner_address="h:1", online=True, partitions=2
            ),
            _cluster.TopicRoute(
                topic="b", owner_node="b2", owner_address="h:2", online=True, partitions=1
            ),
            _cluster.TopicRoute(
                topic="c", owner_node="b2", owner_address="h:2", online=True, partitions=3
            ),
            _cluster.TopicRoute(
                topic="d",
                owner_node="b3",
                owner_address="h:3",
                state="ready",
                reason="offline",
                partitions=4,
            ),
            _cluster.TopicRoute(topic="e", state="placing", partitions=1),
            _cluster.TopicRoute(topic="gone", state="absent"),
        ],
    )
    got = plan("b1", found)
    assert got.mine == frozenset({"a"})
    assert got.owners == (Owner("b2", "h:2", frozenset({"b", "c"})),)
    assert [(g.topic, g.owner, g.reason) for g in got.offline] == [
        ("d", "b3", "offline"),
        ("e", "", "placing"),
    ]
    assert "b3 is offline" in got.offline[0].message
    assert got.partitions == {"a": 2, "b": 1, "c": 3, "d": 4, "e": 1}


@pytest.mark.asyncio
async def test_single_broker_listing_is_one_call(broker: Broker) -> None:
    """A single broker: list_topics and subscription_listing answer as before (no owner,
    nothing offline) and never call Lookup: the answer's node id ``local`` says the
    broker's answer is the whole answer."""
    seed = address(broker)
    async with AsyncAdminClient(seed) as admin:
        await admin.create_topic("solo", 2)
        async with AsyncConsumer("solo", "s", broker=seed):
            topics = await admin.list_topics()
            listing = await admin.subscription_listing()
        assert admin.router.table.lookups == 0
    assert [(t.name, t.owner, t.offline, len(t.partitions)) for t in topics] == [
        ("solo", "", "", 2)
    ]
    assert [(s.topic, s.subscription, s.owner) for s in listing.subscriptions] == [
        ("solo", "s", "")
    ]
    assert listing.offline == ()


def _blocking_topics(seed: str) -> list[TopicInfo]:
    """``AdminClient(seed).list_topics()``, from a thread with no event loop."""
    with AdminClient(seed) as admin:
        return admin.list_topics()


async def _three_owned(cluster: StaticCluster) -> None:
    """t1, t2, t3 owned by b1, b2, b3 with 1, 2, 3 records, each with a subscription
    ``s-tN`` that acked nothing; b1 also holds an empty stale copy of t2 and t3 (its
    own figures for them must never be shown)."""
    await cluster.create("t1", "b1")
    await cluster.create("t2", "b2", also=["b1"])
    await cluster.create("t3", "b3", also=["b1"])
    seed = cluster.address("b1")
    async with AsyncProducer(seed) as producer:
        for n, topic in enumerate(("t1", "t2", "t3"), start=1):
            for i in range(n):
                await (await producer.send(topic, b"v%d" % i))
    async with AsyncFetcher(seed) as fetcher:
        for topic in ("t1", "t2", "t3"):
            await fetcher.ack_up_to(topic, f"s-{topic}", 0, 0)  # makes the subscription


@pytest.mark.asyncio
async def test_listings_through_one_seed_show_every_owner(tmp_path: Path) -> None:
    """Three brokers, a topic each; the admin client is given b1 only. list_topics shows
    the three topics with their owners' heads (1, 2, 3; not b1's stale copies, head 0),
    and list_subscriptions every topic's subscription with its owner and lag; each
    listing makes one Lookup, on b1. The blocking twin lists the same."""
    async with static_cluster(tmp_path, 3) as cluster:
        await _three_owned(cluster)
        seed = cluster.address("b1")
        cluster.map.lookups.clear()
        async with AsyncAdminClient(seed) as admin:
            topics = await admin.list_topics()
            assert cluster.map.lookups == {"b1": 1}
            subs = await admin.list_subscriptions()
            assert cluster.map.lookups == {"b1": 2}
        assert await asyncio.to_thread(_blocking_topics, seed) == topics
    assert [(t.name, t.owner, t.offline, t.partitions[0].head) for t in topics] == [
        ("t1", "b1", "", 1),
        ("t2", "b2", "", 2),
        ("t3", "b3", "", 3),
    ]
    assert all(t.fsync for t in topics)
    assert [(s.topic, s.subscription, s.owner, s.lag) for s in subs] == [
        ("t1", "s-t1", "b1", 1),
        ("t2", "s-t2", "b2", 2),
        ("t3", "s-t3", "b3", 3),
    ]


@pytest.mark.asyncio
async def test_an_offline_or_silent_owner_is_reported_not_dropped(tmp_path: Path) -> None:
    """b3 is offline in the Lookup answers and b2 is stopped (registered, not answering).
    Through b1: list_topics still shows t2 and t3, with zero figures, their owners and
    ``offline`` = ``unreachable`` / ``offline``, and t1 with b1's figures; the
    subscription listing has t1's subscription and names t2 and t3 as offline with a
    message naming the owner."""
    async with static_cluster(tmp_path, 3) as cluster:
        await _three_owned(cluster)
        cluster.map.offline.add("b3")
        await cluster.brokers["b2"].aclose()
        async with AsyncAdminClient(cluster.address("b1"), timeout_s=5) as admin:
            topics = await admin.list_topics()
            listing = await admin.subscription_listing()
    assert [(t.name, t.owner, t.offline, [p.head for p in t.partitions]) for t in topics] == [
        ("t1", "b1", "", [1]),
        ("t2", "b2", UNREACHABLE, [0]),
        ("t3", "b3", "offline", [0]),
    ]
    assert [t.fsync for t in topics] == [topics[0].fsync, "", ""]
    assert [s.subscription for s in listing.subscriptions] == ["s-t1"]
    assert [(g.topic, g.owner, g.reason) for g in listing.offline] == [
        ("t2", "b2", UNREACHABLE),
        ("t3", "b3", "offline"),
    ]
    assert "b2 did not answer" in listing.offline[0].message
    assert "b3 is offline" in listing.offline[1].message
