"""The Spark source and sink against two brokers: the ``broker`` option is one seed that
does not own the topic; the driver finds the owner, the tasks read from it, the acks and
the sink's writes reach it.

Two real brokers (:mod:`tests.client.static_cluster`: the real refusal and Lookup, a dict
instead of etcd) run on an event loop of their own in a thread of the test process; a real
SparkSession (the session fixture) reads from them over loopback. Kept to one query: Spark
is slow here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from client import AdminClient, Producer
from tests.client.conftest import read_partition
from tests.client.static_cluster import StaticCluster, static_cluster

T = TypeVar("T")

pytestmark = pytest.mark.timeout(300)


class ClusterThread:
    """:func:`static_cluster` on a loop in a thread; :meth:`run` runs a coroutine there."""

    def __init__(self, tmp_path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._ready: Future[StaticCluster] = Future()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._done = asyncio.run_coroutine_threadsafe(self._serve(tmp_path), self.loop)
        self.cluster = self._ready.result(30)

    async def _serve(self, tmp_path: Path) -> None:
        async with static_cluster(tmp_path) as cluster:
            self._ready.set_result(cluster)
            await self._stop.wait()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._done.result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[ClusterThread]:
    """Brokers b1 and b2; ``orders`` is made on both and owned by b2, ``copy`` by b1."""
    running = ClusterThread(tmp_path)
    try:
        running.run(running.cluster.create("orders", "b2", also=["b1"]))
        running.run(running.cluster.create("copy", "b1", also=["b2"]))
        yield running
    finally:
        running.close()


def test_a_stream_through_a_non_owner_seed_reads_from_the_owner_once_and_acks_there(
    spark: Any, two_brokers: ClusterThread, tmp_path: Path
) -> None:
    """Scenario: 200 records in ``orders`` (owned by b2) produced through seed b1; an
    availableNow query with ``broker`` = b1 reads them through subscription ``sp`` and
    writes each value to ``copy`` (owned by b1) through seed b2.
    Expected: the driver looked the owner up on its seed; ``copy`` on b1 holds the 200
    values exactly once; the subscription on the owner b2 has its cursor at 200 (lag 0);
    b1's copy of ``orders`` stays empty."""
    cluster = two_brokers.cluster
    b1, b2 = cluster.address("b1"), cluster.address("b2")
    with Producer(b1) as producer:
        for i in range(200):
            producer.send("orders", b"v%03d" % i)
    query = (
        spark.readStream.format("headrace")
        .option("broker", b1)
        .option("topic", "orders")
        .option("subscription", "sp")
        .load()
        .selectExpr("value")
        .writeStream.format("headrace")
        .option("broker", b2)
        .option("topic", "copy")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    assert cluster.map.lookups.get("b1", 0) >= 1  # the driver asked its seed for the owner
    with AdminClient(b1) as admin:  # routed: the subscription lives on b2
        info = admin.describe_subscription("orders", "sp")
    assert [(p.cursor, p.head) for p in info.partitions] == [(200, 200)]
    cluster.map.owners.clear()  # each broker serves its own copy to the log reader
    copied = two_brokers.run(read_partition(cluster.brokers["b1"], "copy", 0))
    assert sorted(v for _, v, _ in copied) == [b"v%03d" % i for i in range(200)]
    assert two_brokers.run(read_partition(cluster.brokers["b1"], "orders", 0)) == []
    assert two_brokers.run(read_partition(cluster.brokers["b2"], "copy", 0)) == []
