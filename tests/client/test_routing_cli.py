"""The ``headrace`` client commands take seed brokers and reach each topic's owner.

Two real brokers on loopback (:mod:`tests.client.static_cluster`); the commands run
in-process through click's runner on a worker thread (each makes its own event loop, as
from a shell), given ``--broker DEAD,B1``: a seed that listens nowhere, then a broker
that does not own the topic. The listings (``topics list``, ``lag``, ``subscriptions
list``) show every owner's topics through one seed, and an offline owner's topics marked.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.cli import cli
from client import AsyncFetcher, AsyncProducer
from tests.broker.test_serve_process import free_port
from tests.client.conftest import read_partition
from tests.client.static_cluster import StaticCluster, static_cluster

pytestmark = pytest.mark.timeout(120)


async def headrace(seeds: str, *args: str, stdin: str = "") -> Result:
    """``headrace ARGS --broker SEEDS`` in-process, off the brokers' loop."""
    argv = [*args, "--broker", seeds]
    return await asyncio.to_thread(CliRunner().invoke, cli, argv, input=stdin)


@pytest.mark.asyncio
async def test_cli_commands_reach_the_owner_through_seeds(tmp_path: Path) -> None:
    """``orders`` is owned by b2; every command is given a dead seed and b1. produce,
    consume, topics describe, lag, seek and dlq count all succeed, and the records are in
    b2's log."""
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("orders", "b2")
        seeds = f"127.0.0.1:{free_port()},{cluster.address('b1')}"
        made = await headrace(seeds, "produce", "orders", stdin="a\nb\nc\n")
        assert made.exit_code == 0, made.output
        values = [v for _, v, _ in await read_partition(cluster.brokers["b2"], "orders", 0)]
        assert values == [b"a", b"b", b"c"]

        got = await headrace(seeds, "consume", "orders", "-s", "cli", "--count", "3")
        assert got.exit_code == 0, got.output
        assert got.stdout.split() == ["a", "b", "c"]

        described = await headrace(seeds, "topics", "describe", "orders", "--json")
        assert described.exit_code == 0, described.output
        [topic] = json.loads(described.stdout)
        assert [p["head"] for p in topic["partitions"]] == [3]

        lag = await headrace(seeds, "lag", "-t", "orders", "--json")
        assert lag.exit_code == 0, lag.output
        assert [(r["subscription"], r["lag"]) for r in json.loads(lag.stdout)] == [("cli", 0)]

        sought = await headrace(seeds, "seek", "orders", "-s", "cli", "--to", "earliest")
        assert sought.exit_code == 0, sought.output
        counted = await headrace(seeds, "dlq", "count", "orders", "-s", "cli")
        assert counted.exit_code == 0, counted.output
        assert counted.stdout.strip().startswith("0")


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("127.0.0.1:1,garbage", "entry 2 of 2, 'garbage', is not HOST:PORT"),
        ("a:1,b:99999", "entry 2 of 2, 'b:99999', is not HOST:PORT"),
    ],
)
def test_a_bad_seed_is_a_usage_error_naming_it(value: str, named: str) -> None:
    """A list of seeds with one bad entry: exit 2 before any connection, naming the
    entry and its place."""
    done = CliRunner().invoke(cli, ["topics", "list", "--broker", value])
    assert done.exit_code == 2
    assert named in done.stderr


async def _owned_by_each(cluster: StaticCluster) -> None:
    """``t1`` owned by b1 (one record), ``t2`` by b2 (two records), each with a
    subscription ``s`` that acked nothing; b1 holds an empty stale copy of ``t2``."""
    await cluster.create("t1", "b1")
    await cluster.create("t2", "b2", also=["b1"])
    seed = cluster.address("b1")
    async with AsyncProducer(seed) as producer:
        for topic, count in (("t1", 1), ("t2", 2)):
            for i in range(count):
                await (await producer.send(topic, b"v%d" % i))
    async with AsyncFetcher(seed) as fetcher:
        for topic in ("t1", "t2"):
            await fetcher.ack_up_to(topic, "s", 0, 0)


@pytest.mark.asyncio
async def test_cli_listings_show_every_owner_through_one_seed(tmp_path: Path) -> None:
    """``topics list``, ``lag`` and ``subscriptions list`` given b1 only: every topic with
    its owner's head (t2: 2, not b1's stale 0) and owner; every topic's subscription with
    its owner's lag; the tables gain ``owner`` and ``state`` columns."""
    async with static_cluster(tmp_path) as cluster:
        await _owned_by_each(cluster)
        seed = cluster.address("b1")
        listed = await headrace(seed, "topics", "list", "--json")
        table = await headrace(seed, "topics", "list")
        lag = await headrace(seed, "lag", "--json")
        subs = await headrace(seed, "subscriptions", "list", "--json")
    for done in (listed, table, lag, subs):
        assert done.exit_code == 0, done.output
    topics = json.loads(listed.stdout)
    assert [(t["name"], t["owner"], t["offline"]) for t in topics] == [
        ("t1", "b1", ""),
        ("t2", "b2", ""),
    ]
    assert [t["partitions"][0]["head"] for t in topics] == [1, 2]
    head, *rows = table.stdout.splitlines()
    assert head.split()[-2:] == ["owner", "state"]
    assert [r.split()[-2:] for r in rows] == [["b1", "online"], ["b2", "online"]]
    assert [(r["topic"], r["subscription"], r["lag"]) for r in json.loads(lag.stdout)] == [
        ("t1", "s", 1),
        ("t2", "s", 2),
    ]
    assert [(r["topic"], r["owner"], r["lag"]) for r in json.loads(subs.stdout)] == [
        ("t1", "b1", 1),
        ("t2", "b2", 2),
    ]


@pytest.mark.asyncio
async def test_cli_listings_mark_an_offline_owner_and_exit_0(tmp_path: Path) -> None:
    """b2 is offline in the Lookup answers: through b1, ``topics list`` still lists t2
        with owner b2, state OFFLINE and no figures (and says so on stderr), ``lag`` and
        ``subscriptions list`` show t1's subscription plus one OFFLINE row for t2 naming b2;
        every command exits 0. With ``--state OFFLINE`` lag shows that row only. ``seek -s s``
    without a topic refuses to guess t1 (t2, unread, may hold ``s`` too) and says so."""
    async with static_cluster(tmp_path) as cluster:
        await _owned_by_each(cluster)
        cluster.map.offline.add("b2")
        seed = cluster.address("b1")
        listed = await headrace(seed, "topics", "list", "--json")
        table = await headrace(seed, "topics", "list")
        lag = await headrace(seed, "lag", "--json")
        lag_table = await headrace(seed, "lag")
        only = await headrace(seed, "lag", "--state", "offline", "--json")
        subs = await headrace(seed, "subscriptions", "list", "--json")
        sought = await headrace(seed, "seek", "-s", "s", "--to", "earliest")
    assert sought.exit_code == 1
    assert "subscription 's' exists on topic t1, and the owners of topics t2" in sought.stderr
    for done in (listed, table, lag, lag_table, only, subs):
        assert done.exit_code == 0, done.output
    topics = json.loads(listed.stdout)
    assert [(t["name"], t["owner"], t["offline"]) for t in topics] == [
        ("t1", "b1", ""),
        ("t2", "b2", "offline"),
    ]
    assert "topic t2: not read from its owner b2 (offline)" in table.stderr
    t2_row = table.stdout.splitlines()[2].split()
    assert t2_row == ["t2", "0", "-", "-", "-", "-", "-", "b2", "OFFLINE"]
    rows = json.loads(lag.stdout)
    assert [(r["topic"], r["subscription"], r["lag"]) for r in rows] == [
        ("t1", "s", 1),
        ("t2", None, None),
    ]
    assert [r["state"] == "OFFLINE" for r in rows] == [False, True]
    assert "b2 is offline" in rows[1]["reason"]
    assert "OFFLINE" in lag_table.stdout.splitlines()[-1]
    assert [r["topic"] for r in json.loads(only.stdout)] == ["t2"]
    docs = json.loads(subs.stdout)
    assert [(d["topic"], d["subscription"], d["owner"], d["lag"]) for d in docs] == [
        ("t1", "s", "b1", 1),
        ("t2", None, "b2", None),
    ]
    assert [d["state"] == "OFFLINE" for d in docs] == [False, True]
    assert "b2 is offline" in docs[1]["reason"]
