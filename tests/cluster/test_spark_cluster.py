"""A Spark structured streaming query over a real cluster (issue 36): topics owned by
different brokers, read and written exactly once, lag 0 on every owner.

A real three-member etcd and three real ``headrace serve`` processes in cluster mode
(:mod:`tests.cluster.broker_processes`), and a real local SparkSession (one for the
module: it costs ~10 s to start). The query unions one ``format("headrace")`` stream per
topic (a stream reads one topic) and writes through the connector's exactly-once sink; each
source's ``broker`` option is the seed list with a broker that does NOT own its topic
first, so the driver finds the owner through the seed's Lookup and its acks reach the
owner. The second test SIGKILLs an owner (of an input topic, or of the sink's topic) under a
running query and starts it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from broker.cli import cli
from client import AdminClient, Producer
from tests.cluster.broker_processes import Brokers, ClusterBroker, read_topic
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = pytest.mark.timeout(300)

TOPICS = ["alpha", "beta", "gamma"]
SUBSCRIPTION = "spark-all"
PER_TOPIC = 300
"""Records published to each input topic per round (over its 2 partitions)."""


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One local SparkSession for this module (``local[2,2]``: a failed task is tried
    once more, as on a cluster), its Python workers this interpreter."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import spark_connector

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("headrace-cluster-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_connector.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def brokers(spark: Any, tmp_path: Path, etcd: EtcdCluster, prefix: str) -> Iterator[Brokers]:
    """Brokers b1..b3 in cluster mode over the module's etcd, serving (started after the
    SparkSession, whose JVM is forked before any gRPC channel exists); SIGTERM at the end,
    then SIGKILL for any left."""
    started = [ClusterBroker(tmp_path, f"b{i + 1}", etcd, prefix) for i in range(3)]
    try:
        for broker in started:
            broker.spawn()
        for broker in started:
            asyncio.run(broker.wait_serving(30.0))
        yield Brokers(started)
    finally:
        for broker in started:
            try:
                broker.stop()
            finally:
                broker.kill()


def seeds_not_owned_first(brokers: Brokers, owner: str) -> str:
    """The seed list with a broker other than ``owner`` first (and the owner last)."""
    ordered = sorted(brokers.all, key=lambda b: b.node_id == owner)
    assert ordered[0].node_id != owner
    return ",".join(b.address for b in ordered)


def publish(seeds: str, first: int, count: int) -> None:
    """Records ``<topic>-<n>`` for n in ``first .. first + count - 1`` to every input
    topic, keyed ``k<n % 5>`` (both partitions), through a routed producer."""
    with Producer(seeds) as producer:
        for topic in TOPICS:
            numbers = range(first, first + count)
            producer.send_many(
                topic,
                [b"%s-%04d" % (topic.encode(), n) for n in numbers],
                keys=[b"k%d" % (n % 5) for n in numbers],
            ).result()


def run_query(spark: Any, brokers: Brokers, owners: dict[str, str], checkpoint: Path) -> list[int]:
    """One availableNow run of the query: the union of a stream per input topic (its
    ``broker`` the seed list, a non-owner first; subscription ``spark-all``), values
    written to ``out`` through the sink (its seeds with ``out``'s non-owner first).
    Returns the input rows of each micro-batch of the run."""
    streams = [
        spark.readStream.format("headrace")
        .option("broker", seeds_not_owned_first(brokers, owners[topic]))
        .option("topic", topic)
        .option("subscription", SUBSCRIPTION)
        .option("maxRecordsPerTrigger", "250")
        .load()
        .selectExpr("value")
        for topic in TOPICS
    ]
    union = streams[0].unionByName(streams[1]).unionByName(streams[2])
    query = (
        union.writeStream.format("headrace")
        .option("broker", seeds_not_owned_first(brokers, owners["out"]))
        .option("topic", "out")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    assert not query.isActive
    return [int(p["numInputRows"]) for p in query.recentProgress]


def lag_rows(seed: str) -> list[dict[str, Any]]:
    """``headrace lag --json --broker SEED`` in-process: every owner's rows."""
    done = CliRunner().invoke(cli, ["lag", "--json", "--broker", seed])
    assert done.exit_code == 0, done.output
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def expected_values(count: int) -> list[bytes]:
    """The values :func:`publish` wrote for n < ``count``, over every topic, sorted."""
    return sorted(b"%s-%04d" % (t.encode(), n) for t in TOPICS for n in range(count))


@pytest.mark.timeout(400)
def test_a_stream_over_topics_of_three_brokers_is_exactly_once_with_lag_0(
    spark: Any, brokers: Brokers, tmp_path: Path
) -> None:
    """Scenario: alpha, beta, gamma (2 partitions each) created through b1 land on three
    different brokers, and ``out`` (2 partitions) on one of them; 300 records published
    to each through the seed list. One query unions a ``format("headrace")`` stream per
    topic (subscription ``spark-all``, at most 250 records per trigger, so several
    micro-batches; each ``broker`` option a seed list that starts at a non-owner) and
    writes the values to ``out`` through the sink, run with availableNow. Then 300 more
    per topic and the query is run again from its checkpoint.
    Expected: each run ends without error after at least two micro-batches that read the
    900 new records; ``out`` holds every record published so far
    exactly once (900, then 1,800), none twice; ``headrace lag --json`` through one seed
    lists ``spark-all`` on each input topic with lag 0 on every partition (cursor = head
    = what was published), and each owner asked directly says the same."""
    seed = brokers.all[0].address
    with AdminClient(seed) as admin:
        for topic in TOPICS:
            admin.create_topic(topic, partitions=2)
    owners = asyncio.run(brokers.wait_owners(TOPICS))
    assert Counter(owners.values()) == {"b1": 1, "b2": 1, "b3": 1}, owners
    with AdminClient(seed) as admin:
        admin.create_topic("out", partitions=2)
    owners |= asyncio.run(brokers.wait_owners(["out"]))
    for topic, owner in owners.items():  # the owner agrees, asked itself
        assert asyncio.run(brokers.owner(topic, via=brokers.by_id[owner])) == owner

    checkpoint = tmp_path / "checkpoint"
    for done in (1, 2):
        publish(brokers.seeds, (done - 1) * PER_TOPIC, PER_TOPIC)
        batches = run_query(spark, brokers, owners, checkpoint)
        assert sum(batches) == len(TOPICS) * PER_TOPIC
        assert len([n for n in batches if n]) >= 2, batches  # acks between batches too

        out = asyncio.run(read_topic(brokers.seeds, "out"))
        values = sorted(v for rows in out.values() for _, v in rows)
        assert values == expected_values(done * PER_TOPIC)  # every one, exactly once

        rows = [r for r in lag_rows(seed) if r["subscription"] == SUBSCRIPTION]
        heads = dict.fromkeys(TOPICS, 0)
        for row in rows:
            heads[row["topic"]] += row["head"]
        assert sorted({r["topic"] for r in rows}) == TOPICS
        assert len(rows) == 2 * len(TOPICS)
        assert [(r["topic"], r["partition"], r["lag"]) for r in rows if r["lag"]] == []
        assert all(r["cursor"] == r["head"] for r in rows), rows
        assert heads == dict.fromkeys(TOPICS, done * PER_TOPIC)
        for topic in TOPICS:
            with AdminClient(brokers.by_id[owners[topic]].address) as owner_admin:
                info = owner_admin.describe_subscription(topic, SUBSCRIPTION)
            assert sum(p.head for p in info.partitions) == done * PER_TOPIC
            assert [p.lag for p in info.partitions] == [0, 0], (topic, info.partitions)


def out_count(seeds: str) -> int:
    """How many records ``out`` holds, over its partitions."""
    return sum(len(rows) for rows in asyncio.run(read_topic(seeds, "out")).values())


def wait_out(seeds: str, more_than: int, within_s: float) -> int:
    """Poll ``out`` until it holds more than ``more_than`` records; how many it holds."""
    deadline = time.monotonic() + within_s
    while (count := out_count(seeds)) <= more_than:
        assert time.monotonic() < deadline, f"out: {count} records, not over {more_than}"
        time.sleep(0.3)
    return count


@pytest.mark.timeout(400)
@pytest.mark.parametrize("victim_owns", ["input", "out"])
def test_a_running_stream_rides_over_an_owner_sigkilled_and_restarted(
    spark: Any, brokers: Brokers, tmp_path: Path, victim_owns: str
) -> None:
    """Scenario: as above, 1,000 records per input topic, and a query with a 200 ms
    processingTime trigger and at most 150 records per trigger (many micro-batches)
    running. Once ``out`` holds some of them, a broker is SIGKILLed and started again on
    its data directory and node id: the owner of an input topic that does not own
    ``out`` (``input``: the reads and acks), or the owner of ``out`` (``out``: the
    sink's idempotent writes); 500
    more per topic are published through the seeds; the query runs until ``out`` holds
    4,500 records, then is stopped. Every topic has one copy (``replication_factor=1``):
    the victim's topics are offline until it is back (issue 36), not failed over.
    Expected: the query never fails; ``out`` holds every record exactly once; after the
    stop ``headrace lag`` through one seed shows ``spark-all`` with lag 0 on every
    partition of every input topic (the last batch is acked at the next trigger)."""
    seed = brokers.all[0].address
    with AdminClient(seed) as admin:  # one copy: the victim's topics are offline a while
        for topic in [*TOPICS, "out"]:
            admin.create_topic(topic, partitions=2, replication_factor=1)
    owners = asyncio.run(brokers.wait_owners([*TOPICS, "out"]))
    if victim_owns == "out":
        victim = owners["out"]
    else:
        victim = next(owners[t] for t in TOPICS if owners[t] != owners["out"])
    publish(brokers.seeds, 0, 1000)
    streams = [
        spark.readStream.format("headrace")
        .option("broker", seeds_not_owned_first(brokers, owners[topic]))
        .option("topic", topic)
        .option("subscription", SUBSCRIPTION)
        .option("maxRecordsPerTrigger", "150")
        .load()
        .selectExpr("value")
        for topic in TOPICS
    ]
    query = (
        streams[0]
        .unionByName(streams[1])
        .unionByName(streams[2])
        .writeStream.format("headrace")
        .option("broker", seeds_not_owned_first(brokers, owners["out"]))
        .option("topic", "out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_out(brokers.seeds, 300, 120)
        broker = brokers.by_id[victim]
        broker.kill()
        broker.spawn()
        asyncio.run(broker.wait_serving(30.0))
        asyncio.run(brokers.wait_owners(TOPICS))
        publish(brokers.seeds, 1000, 500)
        wait_out(brokers.seeds, len(TOPICS) * 1500 - 1, 180)
        assert query.exception() is None, query.exception()
        deadline = time.monotonic() + 30
        while any(r["lag"] for r in lag_rows(seed) if r["subscription"] == SUBSCRIPTION):
            assert time.monotonic() < deadline, lag_rows(seed)
            time.sleep(0.3)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    out = asyncio.run(read_topic(brokers.seeds, "out"))
    assert sorted(v for rows in out.values() for _, v in rows) == expected_values(1500)
    rows = [r for r in lag_rows(seed) if r["subscription"] == SUBSCRIPTION]
    assert len(rows) == 2 * len(TOPICS)
    assert all((r["cursor"], r["lag"]) == (r["head"], 0) for r in rows), rows
