"""Cluster mode end to end: the admin listings show the whole cluster through one seed.

A real three-member etcd and three real ``headrace serve`` processes in cluster mode
(:mod:`tests.cluster.broker_processes`). ``topics list``, ``lag`` and ``subscriptions
list`` are given ONE seed, b1; the topics are spread over the three brokers. A broker's
answer alone knows only its own topics' figures and subscriptions: the client asks each
owner (client/_survey.py, docs/protocol.md 11.5).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.cli import cli
from client import AsyncAdminClient, AsyncFetcher, AsyncProducer
from tests.cluster.broker_processes import Brokers, cluster_brokers
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(180)]

TOPICS = ["alpha", "beta", "gamma"]


async def headrace(seed: str, *args: str) -> Result:
    """``headrace ARGS --broker SEED`` in-process, on a worker thread (its own loop)."""
    return await asyncio.to_thread(CliRunner().invoke, cli, [*args, "--broker", seed])


async def _spread(brokers: Brokers) -> dict[str, str]:
    """The three topics created through b1 (one per broker), ``n + 1`` records in the
    n-th, and a subscription ``s`` on each that acked nothing; topic -> owner. One copy
    each (``replication_factor=1``): a dead owner's topic is offline (issue 36)."""
    seed = brokers.all[0].address
    async with AsyncAdminClient(seed) as admin:
        for topic in TOPICS:
            await admin.create_topic(topic, partitions=1, replication_factor=1)
    owners = await brokers.wait_owners(TOPICS)
    async with AsyncProducer(seed) as producer:
        for n, topic in enumerate(TOPICS):
            for i in range(n + 1):
                await producer.send(topic, b"r%d" % i)
        await producer.flush()
    async with AsyncFetcher(seed) as fetcher:
        for topic in TOPICS:
            await fetcher.ack_up_to(topic, "s", 0, 0)
    return owners


async def _wait_offline(brokers: Brokers, topic: str, within_s: float = 15.0) -> None:
    """Wait until b1 sees ``topic`` offline (its owner's lease expired)."""
    deadline = time.monotonic() + within_s
    while (await brokers.route(topic)).online:
        assert time.monotonic() < deadline, f"{topic} still online"
        await asyncio.sleep(0.1)


async def test_listings_through_one_seed_show_every_broker(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: alpha, beta, gamma owned by three brokers, with 1, 2 and 3 records and a
    subscription each; ``topics list``, ``lag`` and ``subscriptions list`` through b1.
    Then the owner of a topic other than b1's is SIGKILLed and the listings run again.
    Expected: first, every topic with its owner and its owner's head (1, 2, 3; b1 alone
    knows only its own, the others' would be 0), every subscription with its owner's
    lag. After the kill: every command exits 0; the dead owner's topic is listed as
    ``offline`` with its owner named and zero figures, and as one OFFLINE row in lag and
    subscriptions list; the other two are as before."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        owners = await _spread(brokers)
        assert Counter(owners.values()) == {"b1": 1, "b2": 1, "b3": 1}
        seed = brokers.all[0].address
        listed = await headrace(seed, "topics", "list", "--json")
        lag = await headrace(seed, "lag", "--json")
        subs = await headrace(seed, "subscriptions", "list", "--json")
        for done in (listed, lag, subs):
            assert done.exit_code == 0, done.output
        topics = json.loads(listed.stdout)
        assert [(t["name"], t["owner"], t["offline"]) for t in topics] == [
            (t, owners[t], "") for t in TOPICS
        ]
        assert [t["partitions"][0]["head"] for t in topics] == [1, 2, 3]
        assert all(t["fsync"] == "always" for t in topics)
        assert [(r["topic"], r["lag"]) for r in json.loads(lag.stdout)] == [
            ("alpha", 1),
            ("beta", 2),
            ("gamma", 3),
        ]
        assert [(d["topic"], d["owner"]) for d in json.loads(subs.stdout)] == [
            (t, owners[t]) for t in TOPICS
        ]

        dead_topic = next(t for t in TOPICS if owners[t] != "b1")
        dead = owners[dead_topic]
        brokers.by_id[dead].kill()
        await _wait_offline(brokers, dead_topic)
        listed = await headrace(seed, "topics", "list", "--json")
        lag = await headrace(seed, "lag", "--json")
        subs = await headrace(seed, "subscriptions", "list", "--json")
    for done in (listed, lag, subs):
        assert done.exit_code == 0, done.output
    after = {t["name"]: t for t in json.loads(listed.stdout)}
    assert sorted(after) == TOPICS
    assert (after[dead_topic]["owner"], after[dead_topic]["offline"]) == (dead, "offline")
    assert after[dead_topic]["partitions"][0]["head"] == 0
    alive = [t for t in TOPICS if t != dead_topic]
    assert [after[t]["partitions"][0]["head"] for t in alive] == [
        TOPICS.index(t) + 1 for t in alive
    ]
    rows = json.loads(lag.stdout)
    assert [(r["topic"], r["state"] == "OFFLINE") for r in rows] == sorted(
        [(t, False) for t in alive] + [(dead_topic, True)], key=lambda x: x[1]
    )
    assert dead in rows[-1]["reason"]
    docs = json.loads(subs.stdout)
    assert [(d["topic"], d["state"] == "OFFLINE") for d in docs][-1] == (dead_topic, True)
    assert len(docs) == 3
