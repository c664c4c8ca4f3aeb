"""A broker cut off from etcd by a real network split (issue 36): it stops accepting writes
in time, keeps serving reads, no topic ever has two writers, and after the heal it writes
again with nothing lost.

Hosts: three etcd members and two brokers, each in its own network namespace
(:mod:`tests.netsplit.hosts`); the test's clients run in the root namespace, whose path
to every broker stays open. The split drops packets (:mod:`tests.netsplit.netns`): TCP
connections stay open and the broker's keepalives vanish into a timeout, as on a real
network. Session TTL 2 s, so the broker's write window closes at most
``TTL - margin`` = 1.5 s after the last keepalive it sent (``cluster.session``).

Load: one prober per partition of every topic, in the root namespace, sending one record
at a time straight to the topic's owner (a raw ``Publish``, idempotent: producer id and
sequence) and timing each attempt; a refused record is resent with the same sequence.
So every acknowledgement and every refusal has a send and an answer time on the same
monotonic clock as the cut (``CLOCK_MONOTONIC`` is one clock for every process here).

Checked in every split:
- the first refusal (``no-session``) came before the TTL ran out, counted from the cut
  (no keepalive of the cut broker can have been sent later); every failed attempt was a
  refusal (``no-session``, or ``offline`` once its own view shows its lease gone);
- no record sent after the write window had surely closed (cut + TTL - margin), or after
  the first refusal, was acknowledged before the heal;
- etcd expired its lease; the other broker then reports its topics offline, still owned
  by it at the same epoch (nobody else claimed them) while its own topics keep being
  acknowledged;
- reads kept being served during the split, with exactly what was acknowledged (the
  high-water mark did not move: a refused write appended nothing);
- after the heal it writes again within seconds, and only once reclaimed: at its first
  acknowledgement etcd already holds a higher epoch;
- one writer per partition, from each partition's log (every batch, read back): every
  batch is the prober's, offsets 0.. and sequences 0.. with no gap and no repeat, each
  acknowledged record at the offset acknowledged; each topic's data exists only in its
  owner's data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from client import AsyncAdminClient
from cluster.session import EXPIRY_SLACK_S, margin_for
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _pb_grpc
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from proto.batch import decode_batch
from tests.netsplit.conftest import ETCD_NODES, Net
from tests.netsplit.hosts import NetBroker
from tests.netsplit.netns import Lab

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(180)]

TTL_S = 2
MARGIN_S = margin_for(TTL_S)
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
        async with AsyncAdminClient(self.seeds) as admin:
            for topic in TOPICS:
                await admin.create_topic(topic, partitions=2)
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
        for name in ("b1", "b2")
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


def cut_both_ways(lab: Lab, victim: str) -> None:
    for member in ETCD_NODES:
        lab.cut(victim, member)


def cut_to_etcd(lab: Lab, victim: str) -> None:
    for member in ETCD_NODES:
        lab.cut_one_way(victim, member)


def cut_from_etcd(lab: Lab, victim: str) -> None:
    for member in ETCD_NODES:
        lab.cut_one_way(member, victim)


@dataclass
class Split:
    """What one split run saw, for the checks."""

    victim: str
    cut_at: float = 0.0
    first_refusal: Attempt | None = None
    healed_at: float = 0.0
    epochs: dict[str, int] = field(default_factory=dict)
    reads_refused: list[str] = field(default_factory=list)


class ReadsRefusedError(AssertionError):
    """Raised when the cut broker refused reads of its own topics during the split (checked
    last, after every safety check, so that a known defect there hides none of them)."""


async def run_split(net: Net, root: Path, prefix: str, cut: Callable[[Lab, str], None]) -> None:
    """The scenario every test here runs (module docstring), with ``cut`` as the split
    between the victim (the owner of ``t0``) and every etcd member."""
    async with cluster(net, root, prefix) as c:
        split = Split(victim=c.owners["t0"])
        victims = [p for p in c.probers if c.owners[p.topic] == split.victim]
        others = [p for p in c.probers if c.owners[p.topic] != split.victim]
        assert victims, c.owners
        assert others, c.owners
        split.epochs = {t: int(str(c.topic_record(t)["epoch"])) for t in TOPICS}
        async with probing(c.probers):
            for prober in c.probers:
                await prober.wait_acks(10, after=0.0, within_s=20)
            cut(net.lab, split.victim)
            split.cut_at = time.monotonic()
            await during_the_split(c, split, victims, others)
            net.lab.heal()
            split.healed_at = time.monotonic()
            await after_the_heal(c, split, victims)
        check_timing(split, victims)
        await check_logs(c, split)
    if split.reads_refused:
        raise ReadsRefusedError(f"reads refused during the split: {split.reads_refused}")


async def during_the_split(
    c: Cluster, split: Split, victims: list[Prober], others: list[Prober]
) -> None:
    """Wait for the refusals; check reads, etcd's records and the other broker's view."""
    for prober in victims:
        deadline = time.monotonic() + TTL_S + 5
        while not prober.refusals(after=split.cut_at):
            assert time.monotonic() < deadline, f"{prober.topic}: never refused"
            await asyncio.sleep(0.02)
    refused = [a for p in victims for a in p.refusals(after=split.cut_at)]
    split.first_refusal = min(refused, key=lambda a: a.done_at)
    other = next(b for n, b in c.brokers.items() if n != split.victim)
    deadline = time.monotonic() + TTL_S + EXPIRY_SLACK_S + 5.0
    while await asyncio.to_thread(c.broker_key_lease, split.victim) is not None:
        assert time.monotonic() < deadline, f"{split.victim}'s lease did not expire"
        await asyncio.sleep(0.1)
    for prober in victims:
        route = await lookup(other.address, prober.topic)
        deadline = time.monotonic() + 5.0
        while route.online:  # its watch is about to show the lease gone
            assert time.monotonic() < deadline, route
            await asyncio.sleep(0.05)
            route = await lookup(other.address, prober.topic)
        assert route.owner_node == split.victim, route  # nobody else took it
        assert route.reason == "offline", route
        try:
            rows, hwm = await read_log(prober.address, prober.topic, prober.partition)
        except grpc.aio.AioRpcError as exc:
            split.reads_refused.append(f"{prober.topic}/{prober.partition}: {exc.details()}")
            continue
        acked = {a.offset: a.seq for a in prober.acks}
        assert hwm == len(acked), f"{prober.topic}/{prober.partition}: {hwm} != {len(acked)}"
        assert [r.offset for r in rows] == sorted(acked), "reads during the split"
    for prober in others:  # the other broker's topics keep being written
        await prober.wait_acks(10, after=split.cut_at, within_s=10)
    for topic in TOPICS:
        record = c.topic_record(topic)
        assert record["owner"] == c.owners[topic], record
        assert record["epoch"] == split.epochs[topic], record


async def after_the_heal(c: Cluster, split: Split, victims: list[Prober]) -> None:
    """Writes resume, each topic only once reclaimed in the new session: at the first
    acknowledgement after the heal, etcd already holds a higher epoch for its topic (a
    claim is committed before the write it allows, so an older epoch read after the ack
    proves a write served on the previous session's claim)."""
    for prober in victims:
        await prober.wait_acks(0, after=split.healed_at, within_s=20)
        record = await asyncio.to_thread(c.topic_record, prober.topic)
        epoch = int(str(record["epoch"]))
        assert epoch > split.epochs[prober.topic], (
            f"{prober.topic}/{prober.partition}: acknowledged after the heal at epoch {epoch}, "
            "before its owner reclaimed it in its new session"
        )
    for prober in victims:
        await prober.wait_acks(10, after=split.healed_at, within_s=20)


def check_timing(split: Split, victims: list[Prober]) -> None:
    """The cut broker refused in time and acknowledged nothing once it had to stop."""
    first = split.first_refusal
    assert first is not None
    assert first.refusal == "no-session", first
    assert first.done_at < split.cut_at + TTL_S, (
        f"first refusal {first.done_at - split.cut_at:.3f} s after the cut, TTL {TTL_S} s"
    )
    window_closed = min(split.cut_at + TTL_S - MARGIN_S, first.done_at)
    for prober in victims:
        late = [a for a in prober.acks if window_closed <= a.sent_at < split.healed_at]
        assert not late, f"{prober.topic}/{prober.partition}: acked after the stop: {late}"
        assert not [a for a in prober.refusals() if a.sent_at < split.cut_at]
        # Refusals only (no other error: the clients' path is open). "offline" once its
        # view shows its own lease gone (the watch still hears etcd, or relists after the
        # heal), until its new session shows there.
        reasons = {a.refusal for a in prober.refusals(after=split.cut_at)}
        assert reasons <= {"no-session", "offline"}, reasons


async def check_logs(c: Cluster, split: Split) -> None:
    """One writer per partition, every acknowledged record once at its offset; each
    topic's data only on its owner; the victim reclaimed its topics after the heal (a
    higher epoch), the other broker's topics kept theirs."""
    for prober in c.probers:
        rows, _ = await read_log(prober.address, prober.topic, prober.partition)
        assert [r.offset for r in rows] == list(range(len(rows)))
        assert {r.producer_id for r in rows} == {PRODUCER_ID}, "a second writer"
        assert [r.sequence for r in rows] == list(range(len(rows))), "a gap or a repeat"
        expected = [f"{prober.topic}/{prober.partition}/{r.sequence}".encode() for r in rows]
        assert [r.value for r in rows] == expected
        for ack in prober.acks:
            assert rows[ack.offset].sequence == ack.seq, ack
    for topic, owner in c.owners.items():
        for name, broker in c.brokers.items():
            exists = (broker.data_dir / "topics" / topic / "topic.json").exists()
            assert exists is (name == owner), f"{topic} on {name}"
        epoch = int(str(c.topic_record(topic)["epoch"]))
        if owner == split.victim:  # reclaimed in its new session, by no one else
            assert epoch > split.epochs[topic], topic
        else:
            assert epoch == split.epochs[topic], topic


async def test_a_broker_cut_off_from_etcd_stops_writing_in_time_and_resumes_after_heal(
    net: Net, tmp_path: Path, prefix: str
) -> None:
    """Scenario: two brokers, four topics (two partitions each) spread over them, a prober
    per partition; every packet between the owner of ``t0`` and every etcd member is
    dropped, both ways, until etcd has expired its lease; the clients still reach it;
    then healed.
    Expected: it refuses writes (``no-session``, nothing appended) within the TTL of the
    cut and acknowledges nothing sent after that until the heal; reads are served
    throughout, returning exactly what was acknowledged; its lease expires in etcd and the
    other broker reports its topics offline, still owned by it at the same epoch (nobody
    else writes them); after the heal it makes a new session, reclaims them and writes
    again; every partition's log has one writer and every acknowledged record once."""
    await run_split(net, net_root(tmp_path), prefix, cut_both_ways)


READS_REFUSED = pytest.mark.xfail(
    strict=True,
    raises=ReadsRefusedError,
    reason=(
        "issue 36 says a broker that cannot reach etcd keeps serving reads; one that still "
        "hears etcd sees its own lease expire in its watch and refuses reads of its own "
        "topics as 'offline' ('owned by broker b1, which is not running', said by b1): "
        "cluster.routes._why_not checks the owner's liveness before 'owner is me'"
    ),
)


@pytest.mark.parametrize(
    "cut",
    [pytest.param(cut_to_etcd, marks=READS_REFUSED), cut_from_etcd],
    ids=["broker-to-etcd-dropped", "etcd-to-broker-dropped"],
)
async def test_an_asymmetric_split_from_etcd_is_as_safe(
    net: Net, tmp_path: Path, prefix: str, cut: Callable[[Lab, str], None]
) -> None:
    """Scenario: as the two-way split, but only one direction is dropped. Broker to etcd:
    its keepalives never arrive, while etcd's answers and watch events still reach it.
    Etcd to broker: a keepalive or two may arrive, but with no TCP acknowledgement coming
    back the connection's congestion window fills within a few segments and nothing more
    is sent: for TCP a one-way drop soon stops both directions.
    Expected, both ways: it stops writing within the TTL of the cut, acknowledges nothing
    after that until the heal; etcd expires its lease and nobody else claims its topics;
    after the heal it makes a new session, reclaims them and writes again; one writer and
    every acknowledged record once in every log; reads are served throughout (known to
    fail when it still hears etcd: see the mark)."""
    await run_split(net, net_root(tmp_path), prefix, cut)


def net_root(tmp_path: Path) -> Path:
    return tmp_path / "brokers"
