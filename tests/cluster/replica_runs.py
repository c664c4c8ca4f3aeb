"""The load, the readers and the end-of-run check the replication fault tests share
(issue 37): :mod:`tests.cluster.test_replication_nemesis` (brokers on loopback) and
:mod:`tests.netsplit.test_replication_split` (brokers in network namespaces).

Role:

- :class:`Load`: one idempotent :class:`~client.AsyncProducer` (every broker a seed)
  sending unique values ``v<n>`` to one topic until stopped, noting every ack with its
  send number in a :class:`~tests.cluster.replica_checker.Acked`.
- :class:`Tail`: a consumer per partition that reads committed records through the
  routed :class:`~client.AsyncFetcher` as they come (long polls), noting every
  ``(offset, value)`` it saw; at the end it reads on to the high watermark.
- :func:`settle_and_check`: once the faults are over, wait until every replica is in sync,
  take each partition's high watermark from the leader (a raw Fetch), read every
  replica's files from disk and run :func:`~tests.cluster.replica_checker.check_all`.

A replica is named by a :class:`Replica` (node id, address, data directory), so both
kinds of broker process fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc

from client import AsyncConsumer, AsyncFetcher, AsyncProducer, ClientError, RecordFuture
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _pb_grpc
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from tests.cluster.replica_checker import Acked, check_all, check_delivered, read_replica

logger = logging.getLogger(__name__)

IN_FLIGHT = 20
PAUSE_S = 0.005
FLUSH_WITHIN_S = 20.0


class Replica(Protocol):
    """A broker process as the checker needs it."""

    node_id: str
    address: str
    data_dir: Path


@dataclass
class Load:
    """One idempotent producer sending unique values to ``topic`` until stopped."""

    seeds: str
    topic: str
    acked: Acked = field(default_factory=Acked)
    failed: list[str] = field(default_factory=list)

    async def wait_more(self, than: int, within_s: float) -> None:
        """Wait until more than ``than`` records are acknowledged."""
        deadline = time.monotonic() + within_s
        while len(self.acked) <= than:
            assert time.monotonic() < deadline, f"no ack beyond {than} in {within_s} s"
            await asyncio.sleep(0.02)

    async def _produce(self, producer: AsyncProducer, stop: asyncio.Event) -> None:
        window = asyncio.Semaphore(IN_FLIGHT)
        n = 0
        while not stop.is_set():
            await window.acquire()
            value = f"v{n}".encode()
            future = await producer.send(self.topic, value)

            def settled(f: RecordFuture, value: bytes = value, n: int = n) -> None:
                window.release()
                if f.cancelled() or f.exception() is not None:
                    self.failed.append(repr(f.exception()))
                    return
                meta = f.result()
                self.acked.add(meta.partition, n, meta.offset, value)

            future.add_done_callback(settled)
            n += 1
            await asyncio.sleep(PAUSE_S)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        stop = asyncio.Event()
        async with AsyncProducer(self.seeds, delivery_timeout_s=90.0) as producer:
            task = asyncio.create_task(self._produce(producer, stop))
            try:
                yield self
            finally:
                stop.set()
                await asyncio.gather(task, return_exceptions=True)
                try:
                    await asyncio.wait_for(producer.flush(), FLUSH_WITHIN_S)
                except TimeoutError:
                    self.failed.append(f"records still unsettled {FLUSH_WITHIN_S} s after the end")


@dataclass
class Tail:
    """Consumers of every partition of ``topic`` through routed Fetches (committed
    records only); ``seen`` is what they got, per partition."""

    seeds: str
    topic: str
    partitions: int
    seen: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)

    async def _follow(self, fetcher: AsyncFetcher, partition: int, stop: asyncio.Event) -> None:
        rows = self.seen.setdefault(partition, [])
        while not stop.is_set():
            await self._read_once(fetcher, partition, rows, max_wait_ms=200)

    async def _read_once(
        self, fetcher: AsyncFetcher, partition: int, rows: list[tuple[int, bytes]], max_wait_ms: int
    ) -> int:
        """One fetch from the next offset; the high watermark told (-1 on an error)."""
        offset = rows[-1][0] + 1 if rows else 0
        try:
            got = await fetcher.fetch(self.topic, partition, offset, max_wait_ms=max_wait_ms)
        except (ClientError, grpc.RpcError) as exc:
            logger.info("tail %s/%d at %d: %r", self.topic, partition, offset, exc)
            await asyncio.sleep(0.1)
            return -1
        for batch in got.batches:
            for at, value in zip(batch.offsets(), batch.values(), strict=True):
                if at >= offset:
                    rows.append((at, value))
        return got.high_water_mark

    async def drain_to(self, high_watermarks: dict[int, int], within_s: float) -> None:
        """Read every partition on until its next offset reaches its high watermark."""
        deadline = time.monotonic() + within_s
        async with AsyncFetcher(self.seeds) as fetcher:
            for partition, hw in high_watermarks.items():
                rows = self.seen.setdefault(partition, [])
                while (rows[-1][0] + 1 if rows else 0) < hw:
                    assert time.monotonic() < deadline, f"tail p{partition} short of {hw}"
                    await self._read_once(fetcher, partition, rows, max_wait_ms=0)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Tail]:
        stop = asyncio.Event()
        async with AsyncFetcher(self.seeds) as fetcher:
            tasks = [
                asyncio.create_task(self._follow(fetcher, p, stop)) for p in range(self.partitions)
            ]
            try:
                yield self
            finally:
                stop.set()
                for task in tasks:  # a fetch may wait on a broker that cannot answer
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Pinned:
    """A producer of its own that only ever talks to the broker at ``address`` (a zombie
    leader's last client): raw Publishes of one record to one partition, resent with the
    same sequence until acknowledged; each attempt timed on the monotonic clock."""

    address: str
    topic: str
    partition: int = 0
    producer_id: int = 0x20B1E
    acked: Acked = field(default_factory=Acked)
    #: (sent_at, done_at, answer) of every attempt: "" when acknowledged, else the
    #: ``headrace-refusal`` reason or the gRPC status name
    attempts: list[tuple[float, float, str]] = field(default_factory=list)

    def acked_sent_after(self, at: float) -> list[tuple[float, float, str]]:
        return [a for a in self.attempts if not a[2] and a[0] >= at]

    def sent_after(self, at: float) -> list[tuple[float, float, str]]:
        return [a for a in self.attempts if a[0] >= at]

    def add_to(self, acked: Acked) -> None:
        """Put this producer's acks into ``acked`` (its own stream, "pinned")."""
        for (producer, partition), rows in self.acked.streams.items():
            for order, offset, value in rows:
                acked.add(partition, order, offset, value, producer=producer)

    async def run(self, stop: asyncio.Event) -> None:
        seq = 0
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = _pb_grpc.BrokerStub(channel)
            while not stop.is_set():
                value = f"z{seq}".encode()
                request = _pb.PublishRequest(
                    topic=self.topic,
                    partition=self.partition,
                    records=[_pb.Record(value=value)],
                    producer_id=self.producer_id,
                    base_sequence=seq,
                )
                sent = time.monotonic()
                try:
                    got = await stub.Publish(request, timeout=3.0)
                except grpc.aio.AioRpcError as exc:
                    facts = dict(exc.trailing_metadata() or ())
                    reason = str(facts.get("headrace-refusal", exc.code().name))
                    self.attempts.append((sent, time.monotonic(), reason))
                    await asyncio.sleep(0.05)
                    continue
                self.attempts.append((sent, time.monotonic(), ""))
                self.acked.add(self.partition, seq, got.base_offset, value, producer="pinned")
                seq += 1
                await asyncio.sleep(0.01)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Pinned]:
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop))
        try:
            yield self
        finally:
            stop.set()
            await task


SUBSCRIPTION_TYPES = ("exclusive", "failover", "shared", "key_shared")


@dataclass
class Subscribers:
    """One at-least-once consumer of each subscription type on ``topic`` (the
    subscription is named after its type), acking all it gets; ``received`` is what each
    got, as ``(partition, offset, value)``, redeliveries included."""

    seeds: str
    topic: str
    received: dict[str, set[tuple[int, int, bytes]]] = field(default_factory=dict)

    async def _consume(self, kind: str) -> None:
        got = self.received.setdefault(kind, set())
        async with AsyncConsumer(self.topic, kind, broker=self.seeds, type=kind) as consumer:
            while True:
                try:
                    batch = await consumer.receive_batch(timeout=0.5)
                except TimeoutError:
                    continue
                for message in batch:
                    got.add((message.partition, message.offset, message.value))
                    consumer.ack(message)

    async def wait_for(self, high_watermarks: dict[int, int], within_s: float) -> None:
        """Wait until each subscription got every offset below the watermarks."""
        want = sum(high_watermarks.values())
        deadline = time.monotonic() + within_s
        while True:
            counts = {
                k: len({(p, o) for p, o, _ in v if o < high_watermarks.get(p, 0)})
                for k, v in self.received.items()
            }
            if len(counts) == len(SUBSCRIPTION_TYPES) and all(c >= want for c in counts.values()):
                return
            if time.monotonic() > deadline:
                return  # the checker names what is missing
            await asyncio.sleep(0.1)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Subscribers]:
        tasks = [asyncio.create_task(self._consume(k)) for k in SUBSCRIPTION_TYPES]
        try:
            yield self
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def route(address: str, topic: str) -> _cluster.TopicRoute:
    """``address``'s Lookup of ``topic`` (its view of etcd)."""
    async with grpc.aio.insecure_channel(address) as channel:
        got = await _cluster_grpc.ClusterStub(channel).Lookup(
            _cluster.LookupRequest(topics=[topic]), timeout=5
        )
    [found] = got.routes
    assert isinstance(found, _cluster.TopicRoute)
    return found


async def wait_route(
    addresses: Sequence[str],
    topic: str,
    wanted: str,
    within_s: float,
    check: Callable[[_cluster.TopicRoute], bool],
) -> _cluster.TopicRoute:
    """Ask each address in turn until one's route passes ``check``; that route."""
    deadline = time.monotonic() + within_s
    last: _cluster.TopicRoute | None = None
    while True:
        for address in addresses:
            with contextlib.suppress(grpc.RpcError):
                last = await route(address, topic)
                if check(last):
                    return last
        assert time.monotonic() < deadline, f"{wanted} within {within_s} s: {last}"
        await asyncio.sleep(0.05)


async def high_watermark(address: str, topic: str, partition: int) -> int:
    """The high watermark the broker at ``address`` reports (a raw Fetch at 0)."""
    async with grpc.aio.insecure_channel(address) as channel:
        got = await _pb_grpc.BrokerStub(channel).Fetch(
            _pb.FetchRequest(topic=topic, partition=partition, offset=0, max_bytes=1), timeout=5
        )
    return int(got.high_water_mark)


async def settle_and_check(
    replicas: Sequence[Replica],
    topic: str,
    partitions: int,
    acked: Acked,
    *,
    tail: Tail | None = None,
    subscribers: Subscribers | None = None,
    within_s: float = 40.0,
) -> None:
    """Wait until every replica is in sync, then check the run (module docstring)."""
    every = sorted(r.node_id for r in replicas)
    got = await wait_route(
        [r.address for r in replicas],
        topic,
        "every replica in sync",
        within_s,
        check=lambda r: r.online and sorted(r.isr) == every,
    )
    leader = next(r for r in replicas if r.node_id == got.owner_node)
    hws = {p: await high_watermark(leader.address, topic, p) for p in range(partitions)}
    if tail is not None:
        await tail.drain_to(hws, within_s=30)
    if subscribers is not None:
        await subscribers.wait_for(hws, within_s=30)
    on_disk = {r.node_id: read_replica(r.data_dir, topic) for r in replicas}
    epochs = {p: [tuple(e) for e in log.epochs] for p, log in on_disk[leader.node_id].items()}
    seen = sum(len(v) for v in tail.seen.values()) if tail is not None else 0
    print(f"checker: {len(acked)} acked, {seen} seen, hw {hws}, leader {leader.node_id} {epochs}")
    check_all(
        on_disk,
        leader=leader.node_id,
        isr=list(got.isr),
        high_watermarks=hws,
        acked=acked,
        seen=tail.seen if tail is not None else None,
    )
    if subscribers is not None:
        check_delivered(subscribers.received, on_disk[leader.node_id], hws)
        print(f"subscriptions: { {k: len(v) for k, v in subscribers.received.items()} }")
