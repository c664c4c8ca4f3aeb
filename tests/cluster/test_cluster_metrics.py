"""Cluster metrics from real members on a real etcd: each broker's session, controller,
owned topics and etcd reachability, and the topics its view says are offline, scraped
from the exporter's thread as Prometheus would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.cluster_metrics import loop_sampler
from broker.errors import TopicRefusedError
from broker.metrics import BrokerMetrics
from broker.topic_guard import TopicGuard
from cluster.member import ClusterMember
from cluster.ownership import Refusal
from tests.broker.test_metric_names import naming_errors
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.members import members, start_member, stop_member

pytestmark = pytest.mark.asyncio

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def watched(member: ClusterMember) -> BrokerMetrics:
    """A broker's metrics registry, wired to ``member`` as the broker wires it."""
    metrics = BrokerMetrics()
    metrics.set_node(member.node_id)
    metrics.watch_cluster(loop_sampler(member, asyncio.get_running_loop()))
    return metrics


async def scrape(metrics: BrokerMetrics) -> tuple[Samples, dict[str, str]]:
    """Every sample and family type, scraped on another thread (as the exporter does)."""
    text = (await asyncio.to_thread(generate_latest, metrics.registry)).decode()
    samples: Samples = {}
    kinds: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        kinds[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, kinds


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


async def until(check: Callable[[], object], timeout_s: float) -> float:
    start = time.monotonic()
    while not await check():  # type: ignore[misc]
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        await asyncio.sleep(0.1)
    return time.monotonic() - start


async def test_each_broker_exports_its_session_role_and_topics_and_the_offline_ones(
    etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: brokers b1 and b2 join; four topics are created (placed two and two);
    both are scraped; then b2 dies without leaving (its lease runs out, TTL 2 s).
    Expected: each names itself in headrace_node_info; session alive 1, sessions 1, etcd
    reachable 1, age > 0; exactly one is controller; owned topics 2 each and partitions
    summing to 8; nothing offline; every family keeps the naming rule. After b2's death,
    b1 exports headrace_cluster_topic_offline 1 for b2's two topics (owner b2, reason
    offline) within 6 s."""
    async with members(etcd.endpoints, prefix, 1) as (b1,):
        b2 = await start_member(etcd.endpoints, prefix, "b2")
        try:
            made = [await b1.create_topic_record(f"t{i}", 2, timeout_s=10) for i in range(4)]
            on_b2 = sorted(r.name for r in made if r.owner == "b2")
            assert len(on_b2) == 2
            m1, m2 = watched(b1), watched(b2)
            seen = []
            for node, metrics in (("b1", m1), ("b2", m2)):
                samples, kinds = await scrape(metrics)
                ours = {n: k for n, k in kinds.items() if n.startswith("headrace_")}
                assert naming_errors(ours) == []
                assert value(samples, "headrace_node_info", node_id=node) == 1
                assert value(samples, "headrace_cluster_session_alive") == 1
                assert value(samples, "headrace_cluster_sessions_total") == 1
                assert value(samples, "headrace_cluster_etcd_reachable") == 1
                assert (value(samples, "headrace_cluster_session_age_seconds") or 0) > 0
                assert value(samples, "headrace_cluster_owned_topics") == 2
                assert not [k for k in samples if k[0] == "headrace_cluster_topic_offline"]
                seen.append(samples)
            controllers = [value(s, "headrace_cluster_is_controller") or 0 for s in seen]
            assert sorted(controllers) == [0, 1]
            partitions = [value(s, "headrace_cluster_owned_partitions") or 0 for s in seen]
            assert sum(partitions) == 8

            await b2.abandon()  # as a SIGKILL: the lease expires on etcd's clock

            async def offline() -> bool:
                samples, _ = await scrape(m1)
                return all(
                    value(
                        samples, "headrace_cluster_topic_offline",
                        topic=name, owner_node="b2", reason="offline",
                    ) == 1
                    for name in on_b2
                )  # fmt: skip

            await until(offline, 6.0)
        finally:
            await stop_member(b2)


async def test_etcd_unreachable_shows_before_the_session_is_lost(
    own_etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: one broker (TTL 2 s); every etcd member is frozen (SIGSTOP).
    Expected: etcd reachable goes to 0 within 2 s, and session alive to 0 within 3 s
    (the broker stops writing before its lease can have expired); after the thaw both
    are 1 again within 10 s."""
    b1 = await start_member(own_etcd.endpoints, prefix, "b1")
    try:
        metrics = watched(b1)

        async def flag(name: str, want: float) -> bool:
            samples, _ = await scrape(metrics)
            return value(samples, name) == want

        assert await flag("headrace_cluster_etcd_reachable", 1)
        for member in own_etcd.members:
            own_etcd.freeze(member)
        try:
            await until(lambda: flag("headrace_cluster_etcd_reachable", 0), 2.0)
            await until(lambda: flag("headrace_cluster_session_alive", 0), 3.0)
        finally:
            for member in own_etcd.members:
                own_etcd.thaw(member)
        await until(lambda: flag("headrace_cluster_session_alive", 1), 10.0)
        await until(lambda: flag("headrace_cluster_etcd_reachable", 1), 10.0)
    finally:
        await stop_member(b1)


class NotHere:
    """An ownership that serves nothing: every topic is owned by b9."""

    def refusal(self, topic: str, *, write: bool) -> Refusal | None:
        return Refusal("not-owner", topic, "b9", "127.0.0.1:7009", 3, "call b9")


async def test_a_single_broker_is_node_local_and_refusals_are_counted() -> None:
    """Scenario: BrokerMetrics with no cluster; a TopicGuard over an ownership that
    refuses every topic, counting into it; two checks (a write and a read).
    Expected: both raise TopicRefusedError; headrace_node_info{node_id="local"} 1, no
    session gauges, and headrace_cluster_refusals_total{reason="not-owner"} 2."""
    metrics = BrokerMetrics()
    guard = TopicGuard(NotHere(), on_refusal=metrics.refused)
    for write in (True, False):
        with pytest.raises(TopicRefusedError):
            guard.check("orders", write=write)
    samples, _ = await scrape(metrics)
    assert value(samples, "headrace_node_info", node_id="local") == 1
    assert value(samples, "headrace_cluster_refusals_total", reason="not-owner") == 2
    assert not [k for k in samples if k[0].startswith("headrace_cluster_session")]


async def test_a_leader_exports_its_replicated_topics_sets(etcd: EtcdCluster, prefix: str) -> None:
    """Scenario: three members (in-memory topics, so no follower ever fetches and each
    replicated topic's in-sync set stays its leader alone); ``r3`` of factor 3 with
    min_insync 2, ``r2`` of factor 2 with min_insync 1, ``one`` of factor 1; every member
    scraped. Expected: only r3's leader exports r3, with replicas 3, in-sync 1 and
    min_insync 2 (an alert on in-sync < min_insync fires); only r2's leader exports r2
    (2, 1, 1); nobody exports ``one``; the families keep the naming rule."""
    async with members(etcd.endpoints, prefix, 3) as group:
        r3 = await group[0].create_topic_record("r3", 1, timeout_s=10, factor=3, min_insync=2)
        r2 = await group[1].create_topic_record("r2", 1, timeout_s=10, factor=2, min_insync=1)
        await group[2].create_topic_record("one", 1, timeout_s=10)
        names = ("replicas", "in_sync_replicas", "min_insync_replicas")
        for member in group:
            samples, kinds = await scrape(watched(member))
            ours = {k: v for k, v in kinds.items() if k.startswith("headrace_cluster_topic_")}
            assert naming_errors(ours) == []
            exported = {
                (dict(labels)["topic"], name.removeprefix("headrace_cluster_topic_")): v
                for (name, labels), v in samples.items()
                if name.removeprefix("headrace_cluster_topic_") in names
            }
            wanted: dict[tuple[str, str], float] = {}
            if member.node_id == r3.owner:
                wanted |= {("r3", n): v for n, v in zip(names, (3, 1, 2), strict=True)}
            if member.node_id == r2.owner:
                wanted |= {("r2", n): v for n, v in zip(names, (2, 1, 1), strict=True)}
            assert exported == wanted, member.node_id
