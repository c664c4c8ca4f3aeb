"""A client cut off from one topic owner, not from the other broker or from etcd (issue 36):
a routed, idempotent producer keeps writing to the owner it still reaches, and its
writes to the one it does not are delayed, then written once.

Hosts as in :mod:`tests.netsplit.test_etcd_split` (three etcd members and two brokers,
each in its own namespace; the producer in the root namespace). The cut drops the
owner's packets to the client only: its requests still arrive (the owner may append
them) while the answers vanish, which is what an "outcome unknown" looks like on a real
network. With one
copy of each topic there is no other broker to fail over to: the client can only wait
(the other broker's Lookup keeps naming the owner, online) and its retry after the heal
must not write a record twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from client import AsyncProducer, RecordFuture
from tests.netsplit.brokers import cluster, lookup, read_log
from tests.netsplit.hosts import Net
from tests.netsplit.netns import HOST

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(180)]

CUT_S = 3.0
"""How long the owner's answers to the client are dropped."""


@dataclass
class Load:
    """One idempotent producer writing unique values to some topics, and what it got."""

    seeds: str
    topics: list[str]
    #: topic -> value -> (partition, offset) acknowledged
    acked: dict[str, dict[bytes, tuple[int, int]]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def count(self, topic: str) -> int:
        return len(self.acked[topic])

    async def wait_more(self, topic: str, than: int, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while self.count(topic) <= than:
            assert time.monotonic() < deadline, f"{topic}: no ack beyond {than} in {within_s} s"
            await asyncio.sleep(0.05)

    async def _produce(self, producer: AsyncProducer, topic: str, stop: asyncio.Event) -> None:
        window = asyncio.Semaphore(20)
        n = 0
        while not stop.is_set():
            await window.acquire()
            value = f"{topic}:{n}".encode()
            n += 1
            future = await producer.send(topic, value)

            def settled(f: RecordFuture, value: bytes = value) -> None:
                window.release()
                if f.cancelled() or f.exception() is not None:
                    self.failed.append(f"{value!r}: {f.exception()}")
                    return
                meta = f.result()
                self.acked[topic][value] = (meta.partition, meta.offset)

            future.add_done_callback(settled)
            await asyncio.sleep(0.02)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        """Produce until the block ends, then flush what is in flight."""
        stop = asyncio.Event()
        self.acked = {t: {} for t in self.topics}
        async with AsyncProducer(self.seeds, delivery_timeout_s=60.0) as producer:
            tasks = [asyncio.create_task(self._produce(producer, t, stop)) for t in self.topics]
            try:
                yield self
            finally:
                stop.set()
                await asyncio.gather(*tasks)
                await producer.flush()


async def test_a_client_cut_off_from_one_owner_writes_to_it_once_after_the_heal(
    net: Net, tmp_path: Path, prefix: str
) -> None:
    """Scenario: two brokers, topics on both; one producer (idempotent, seeds = both
    brokers) writes to ``t0`` and to a topic of the other broker; the owner of ``t0``'s
    packets to the client are dropped for three seconds, then healed.
    Expected: during the cut the other broker's topic keeps being acknowledged, and the
    other broker still routes ``t0`` to its owner, online (nothing is wrong with it);
    ``t0`` is acknowledged again after the heal; no record failed; in both topics' logs
    every value is once and every acknowledged value at its acknowledged offset."""
    async with cluster(net, tmp_path / "brokers", prefix) as c:
        victim = c.owners["t0"]
        other_topic = next(t for t, o in c.owners.items() if o != victim)
        other = next(b for n, b in c.brokers.items() if n != victim)
        load = Load(c.seeds, ["t0", other_topic])
        async with load.running():
            for topic in load.topics:
                await load.wait_more(topic, 20, within_s=20)
            net.lab.cut_one_way(victim, HOST)
            cut_at = time.monotonic()
            await load.wait_more(other_topic, load.count(other_topic) + 20, within_s=10)
            route = await lookup(other.address, "t0")
            assert (route.owner_node, route.online) == (victim, True), route
            await asyncio.sleep(max(0.0, cut_at + CUT_S - time.monotonic()))
            assert net.lab.dropped() > 0
            served = load.count("t0")
            net.lab.heal()
            await load.wait_more("t0", served + 20, within_s=30)
        assert load.failed == []
        for topic in load.topics:
            owner = c.brokers[c.owners[topic]]
            held: dict[tuple[int, int], bytes] = {}
            for partition in (0, 1):
                rows, _ = await read_log(owner.address, topic, partition)
                held.update({(partition, r.offset): r.value for r in rows})
            values = list(held.values())
            assert len(values) == len(set(values)), f"{topic}: a value is in the log twice"
            for value, position in load.acked[topic].items():
                assert held.get(position) == value, f"{topic} {position}: acked {value!r}"
