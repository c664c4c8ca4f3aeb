"""Brokers in network namespaces, their topics, and the instruments the split tests read
them with: probers that time every Publish, a raw reader of a partition's whole log, and
a raw Lookup.

Role: :func:`cluster` starts brokers ``b1`` and ``b2`` (:class:`~tests.netsplit.hosts.
NetBroker`, session TTL :data:`TTL_S`) over the module's etcd, creates :data:`TOPICS`
(two partitions each, spread over both) and gives one :class:`Prober` per partition,
aimed at its owner. A prober sends one record at a time (a raw ``Publish`` with producer
id :data:`PRODUCER_ID` and the partition's next sequence; a refused or failed record is
resent with the same sequence) and keeps every :class:`Attempt` with its send and answer
times on the monotonic clock, which is one clock for every process on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from client import AsyncAdminClient
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _pb_grpc
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from proto.batch import decode_batch
from tests.netsplit.hosts import BROKER_NODES, Net, NetBroker

TTL_S = 2
PAUSE_S = 0.02  # between a prober's sends: ~40 records/s per partition, gentle on 2 cores
PRODUCER_ID = 0x5EED
TOPICS = ["t0", "t1", "t2", "t3"]


@dataclass(frozen=True)
class Attempt:
    """One Publish of one record: when it was sent and answered, and how.

    Attributes:
        seq: the record's sequence (its value is ``<topic>/<partition>/<seq>``).
        sent_at: monotonic seconds just before the call.
        done_at: monotonic seconds when the answer came.
        offset: the offset acknowledged; -1 when not acknowledged.
        refusal: ``""`` when acknowledged, else the ``headrace-refusal`` reason or the
            gRPC status name.
    """

    seq: int
    sent_at: float
    done_at: float
    offset: int
    refusal: str

    @property
    def acked(self) -> bool:
        return self.offset >= 0


@dataclass
class Prober:
    """Sends the records of one partition, one at a time, to ``address``."""

    address: str
    topic: str
    partition: int
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def acks(self) -> list[Attempt]:
        return [a for a in self.attempts if a.acked]

    def refusals(self, after: float = 0.0) -> list[Attempt]:
        return [a for a in self.attempts if not a.acked and a.sent_at >= after]

    async def run(self, stop: asyncio.Event) -> None:
        seq = 0
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = _pb_grpc.BrokerStub(channel)
            while not stop.is_set():
                attempt = await self._send(stub, seq)
                self.attempts.append(attempt)
                seq += attempt.acked
                await asyncio.sleep(PAUSE_S if attempt.acked else 0.05)

    async def _send(self, stub: _pb_grpc.BrokerStub, seq: int) -> Attempt:
        value = f"{self.topic}/{self.partition}/{seq}".encode()
        request = _pb.PublishRequest(
            topic=self.topic,
            partition=self.partition,
            records=[_pb.Record(value=value)],
            producer_id=PRODUCER_ID,
            base_sequence=seq,
        )
        sent_at = time.monotonic()
        try:
            got = await stub.Publish(request, timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            trailers = dict(exc.trailing_metadata() or ())
            reason = str(trailers.get("headrace-refusal", exc.code().name))
            return Attempt(seq, sent_at, time.monotonic(), -1, reason)
        return Attempt(seq, sent_at, time.monotonic(), got.base_offset, "")

    async def wait_acks(self, more_than: int, after: float, within_s: float) -> None:
        """Wait until more than ``more_than`` records sent after ``after`` are acked."""
        deadline = time.monotonic() + within_s
        while sum(a.sent_at >= after for a in self.acks) <= more_than:
            assert time.monotonic() < deadline, f"{self}: no ack after {after} in {within_s} s"
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def probing(probers: list[Prober]) -> AsyncIterator[None]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(p.run(stop)) for p in probers]
    try:
        yield
    finally:
        stop.set()
        for done in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(done, BaseException):
                raise done


@dataclass(frozen=True)
class Row:
    """One record read back from a partition's log."""

    offset: int
    producer_id: int
    sequence: int
    value: bytes


async def read_log(address: str, topic: str, partition: int) -> tuple[list[Row], int]:
    """Every record of one partition at ``address`` (raw Fetch, whole batches), and the
    high-water mark it reported."""
    rows: list[Row] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = _pb_grpc.BrokerStub(channel)
        while True:
            offset = rows[-1].offset + 1 if rows else 0
            request = _pb.FetchRequest(topic=topic, partition=partition, offset=offset)
            got = await stub.Fetch(request, timeout=5.0)
            for raw in got.batches:
                batch = decode_batch(raw)
                assert batch is not None
                for i, (at, value) in enumerate(zip(batch.offsets(), batch.values(), strict=True)):
                    if at >= offset:
                        rows.append(Row(at, batch.producer_id, batch.base_sequence + i, value))
            if not got.batches or (rows and rows[-1].offset + 1 >= got.high_water_mark):
                return rows, got.high_water_mark


async def lookup(address: str, topic: str) -> _cluster.TopicRoute:
    """``address``'s route of ``topic`` (its view of etcd)."""
    async with grpc.aio.insecure_channel(address) as channel:
        got = await _cluster_grpc.ClusterStub(channel).Lookup(
            _cluster.LookupRequest(topics=[topic]), timeout=5
        )
    [route] = got.routes
    assert isinstance(route, _cluster.TopicRoute)
    return route


@dataclass
class Cluster:
    """The test's brokers over the module's etcd, and the probers of its topics."""

    net: Net
    prefix: str
    brokers: dict[str, NetBroker]
    owners: dict[str, str] = field(default_factory=dict)
    probers: list[Prober] = field(default_factory=list)

    @property
    def seeds(self) -> str:
        return ",".join(b.address for b in self.brokers.values())

    def topic_record(self, topic: str) -> dict[str, object]:
        record = self.net.etcd.get_json(f"{self.prefix}topics/{topic}")
        assert record is not None, topic
        return record

    def broker_key_lease(self, node_id: str) -> int | None:
        """The lease of ``brokers/<node_id>`` in etcd; None when the key is gone."""
        out = self.net.etcd.etcdctl("get", f"{self.prefix}brokers/{node_id}", "-w", "json")
        kvs = json.loads(out).get("kvs", [])
        return int(kvs[0].get("lease", 0)) if kvs else None

    async def create_topics(self) -> None:
        """The topics, one copy each (``replication_factor=1``): these splits are about a
        topic's one owner (issue 36), which the cluster's default factor would fail over."""
        async with AsyncAdminClient(self.seeds) as admin:
            for topic in TOPICS:
                await admin.create_topic(topic, partitions=2, replication_factor=1)
        deadline = time.monotonic() + 20
        first = next(iter(self.brokers.values()))
        while True:
            routes = [await lookup(first.address, t) for t in TOPICS]
            if all(r.online for r in routes):
                break
            assert time.monotonic() < deadline, routes
            await asyncio.sleep(0.1)
        self.owners = {r.topic: r.owner_node for r in routes}
        for topic, owner in self.owners.items():
            self.probers += [Prober(self.brokers[owner].address, topic, p) for p in (0, 1)]


@contextlib.asynccontextmanager
async def cluster(net: Net, root: Path, prefix: str) -> AsyncIterator[Cluster]:
    """Brokers ``b1``, ``b2`` in their namespaces, serving, with four topics; stopped after."""
    brokers = {
        name: NetBroker(net.lab, name, net.etcd, root, prefix=prefix, ttl_s=TTL_S)
        for name in BROKER_NODES
    }
    try:
        for broker in brokers.values():
            broker.spawn()
        for broker in brokers.values():
            await broker.wait_serving()
        made = Cluster(net, prefix, brokers)
        await made.create_topics()
        yield made
    finally:
        for broker in brokers.values():
            broker.stop()
