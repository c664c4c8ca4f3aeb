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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from cluster.session import EXPIRY_SLACK_S, margin_for
from tests.netsplit.brokers import (
    PRODUCER_ID,
    TOPICS,
    TTL_S,
    Attempt,
    Cluster,
    Prober,
    cluster,
    lookup,
    probing,
    read_log,
)
from tests.netsplit.hosts import ETCD_NODES, Net
from tests.netsplit.netns import Lab

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(180)]

MARGIN_S = margin_for(TTL_S)


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
        assert [a for p in others for a in p.refusals()] == [], "the other broker refused"
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


@pytest.mark.parametrize(
    "cut",
    [cut_to_etcd, cut_from_etcd],
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
