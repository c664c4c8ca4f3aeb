"""Cluster members (in-process, in-memory local topics) on a real three-member etcd, for a
replicated topic (issue 37): every replica creates, the leader claims and leads, the
followers follow, an election after the leader's session lapses, the returning leader
follows, the leader's in-sync set changes, and a delete on every replica."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from cluster.etcd import EtcdStore, Op
from cluster.local import MemoryTopics
from cluster.member import ClusterMember
from cluster.records import DefaultsRecord, Keys, TopicRecord, TopicState, decode, encode
from cluster.replica_member import UNCLEAN_GRACE_S
from cluster.session import EXPIRY_SLACK_S
from tests._helpers import eventually
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.members import TTL, members, start_member, stop_member

TOPIC_ID = "00112233aabbccdd"


async def _put_replicated(store: EtcdStore, prefix: str, name: str = "t") -> TopicRecord:
    """Write ``name`` as the controller would place it: ``creating`` on b1, replicas
    (b1, b2, b3) all in sync, min_insync 2."""
    record = TopicRecord(
        name,
        TOPIC_ID,
        2,
        0,
        "b1",
        0,
        TopicState.CREATING,
        replicas=("b1", "b2", "b3"),
        isr=("b1", "b2", "b3"),
        min_insync=2,
    )
    await store.put(Keys(prefix).topic(name), encode(record))
    return record


def _role(member: ClusterMember, name: str = "t") -> tuple[str, int, str] | None:
    assert isinstance(member.local, MemoryTopics)
    return member.local.roles.get(name)


def _record(member: ClusterMember, name: str = "t") -> TopicRecord:
    return member.view.state.topics[name].record


async def _stored(store: EtcdStore, prefix: str, name: str = "t") -> TopicRecord:
    key = Keys(prefix).topic(name)
    held = await store.get(key)
    assert held is not None
    return decode(key, held.value, TopicRecord)


@pytest.mark.asyncio
async def test_every_replica_creates_the_leader_claims_the_followers_follow(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """Three members; a replicated topic written ``creating`` on b1 with replicas b1, b2,
    b3. Expected: each makes the topic locally with the record's id; b1 claims it at
    epoch 1 and leads (the hook told ``leader`` at 1) and serves writes; b2 and b3 follow
    b1 at its address at epoch 1 and refuse writes as not-owner naming b1; no broker lists
    its copy as a stray."""
    async with members(etcd.endpoints, prefix, 3) as (b1, b2, b3):
        await _put_replicated(store, prefix)
        await eventually(lambda: _role(b1) == ("leader", 1, ""))
        for follower in (b2, b3):
            await eventually(
                functools.partial(lambda m: _role(m) == ("follower", 1, "127.0.0.1:7001"), follower)
            )
        for member in (b1, b2, b3):
            assert isinstance(member.local, MemoryTopics)
            assert member.local.topics["t"] == (TOPIC_ID, 2)
            assert member.strays() == []
        stored = await _stored(store, prefix)
        assert (stored.owner, stored.epoch, stored.state) == ("b1", 1, TopicState.READY)
        await eventually(lambda: b1.refusal("t", write=True) is None)
        refusal = b2.refusal("t", write=True)
        assert refusal is not None
        assert (refusal.reason, refusal.owner_node) == ("not-owner", "b1")


@pytest.mark.asyncio
async def test_a_follower_wins_the_election_and_the_old_leader_follows_it(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads the replicated topic at epoch 1; its member is abandoned (as a SIGKILL:
    its lease runs out on etcd's clock). Expected: within the TTL plus etcd's expiry
    slack and a second, b2 (first in preferred order among the in-sync followers) leads
    at epoch 2 with the isr (b2, b3) and serves writes; b3 follows b2; b1 restarted with
    its local data follows b2 at epoch 2 and does not lead."""
    b1_local = MemoryTopics()
    b1 = await start_member(etcd.endpoints, prefix, "b1", b1_local)
    b2 = await start_member(etcd.endpoints, prefix, "b2")
    b3 = await start_member(etcd.endpoints, prefix, "b3")
    try:
        await _put_replicated(store, prefix)
        await eventually(lambda: _role(b1) == ("leader", 1, ""))
        await eventually(lambda: _role(b3) == ("follower", 1, "127.0.0.1:7001"))
        await b1.abandon()
        killed = time.monotonic()
        within_s = TTL + EXPIRY_SLACK_S + 1.0
        await eventually(lambda: _role(b2) == ("leader", 2, ""), timeout_s=within_s + 2)
        took = time.monotonic() - killed
        assert took < within_s, took
        stored = await _stored(store, prefix)
        assert (stored.owner, stored.epoch, stored.isr) == ("b2", 2, ("b2", "b3"))
        await eventually(lambda: b2.refusal("t", write=True) is None)
        await eventually(lambda: _role(b3) == ("follower", 2, "127.0.0.1:7002"))
        await b1.store.aclose()
        b1 = await start_member(etcd.endpoints, prefix, "b1", b1_local)
        await eventually(lambda: _role(b1) == ("follower", 2, "127.0.0.1:7002"), timeout_s=10)
        assert _record(b1).owner == "b2"
        refusal = b1.refusal("t", write=True)
        assert refusal is not None
        assert refusal.reason == "not-owner"
    finally:
        for member in (b1, b2, b3):
            await stop_member(member)


@pytest.mark.asyncio
async def test_the_leaders_isr_changes_are_fenced_by_its_epoch(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads at epoch 1. Its change_isr callback asks (b1, b2), then (b1, b2, b3).
    Expected: each returns True, etcd holds that isr, and the leader is told the new
    record (the hook's lead at the same epoch). Then b1's lease is revoked (b2 wins an
    election, or b1 claims again in a new session: epoch 2): the epoch-1 callback returns
    False and writes nothing."""
    async with members(etcd.endpoints, prefix, 3) as (b1, _b2, _b3):
        await _put_replicated(store, prefix)
        await eventually(lambda: _role(b1) == ("leader", 1, ""))
        assert isinstance(b1.local, MemoryTopics)
        change = b1.local.change_isr["t"]
        local = b1.local
        assert await change(("b1", "b2"))
        assert (await _stored(store, prefix)).isr == ("b1", "b2")
        await eventually(lambda: local.records["t"].isr == ("b1", "b2"))
        assert await change(("b1", "b2", "b3"))
        assert (await _stored(store, prefix)).isr == ("b1", "b2", "b3")
        await eventually(lambda: local.records["t"].isr == ("b1", "b2", "b3"))
        await store.revoke(b1.session.lease)  # b2 elected, or b1 claims again: epoch 2
        await eventually(lambda: _record(b1).epoch == 2, timeout_s=TTL * 3)
        before = await _stored(store, prefix)
        assert not await change(("b1", "b3"))
        assert await _stored(store, prefix) == before


@pytest.mark.asyncio
async def test_a_delete_removes_every_replica(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """The leader deletes the replicated topic. Expected: the key is gone and no replica
    holds the topic or a role for it any more."""
    async with members(etcd.endpoints, prefix, 3) as group:
        await _put_replicated(store, prefix)
        b1 = group[0]
        await eventually(lambda: _role(b1) == ("leader", 1, ""))
        await eventually(lambda: all(_role(m) is not None for m in group))
        await eventually(lambda: b1.refusal("t", write=True) is None)
        await b1.delete_topic_record("t", timeout_s=10)
        assert await store.get(Keys(prefix).topic("t")) is None
        for member in group:
            assert isinstance(member.local, MemoryTopics)
            await eventually(functools.partial(lambda m: "t" not in m.topics, member.local))
            assert _role(member) is None


@pytest.mark.asyncio
async def test_a_replica_deleted_while_its_broker_was_down_is_not_adopted_back(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b3 follows the replicated topic, then stops; the topic's key is deleted meanwhile
    (the leader deleted it). b3 starts again with its local copy. Expected: the copy is
    not adopted (the key stays absent: a deleted topic does not come back from a
    replica), it is listed as a stray and refused as absent."""
    async with members(etcd.endpoints, prefix, 2) as (b1, _b2):
        b3_local = MemoryTopics()
        b3 = await start_member(etcd.endpoints, prefix, "b3", b3_local)
        try:
            await _put_replicated(store, prefix)
            await eventually(lambda: _role(b1) == ("leader", 1, ""))
            await eventually(lambda: _role(b3) == ("follower", 1, "127.0.0.1:7001"))
        finally:
            await stop_member(b3)
        await store.txn([], [Op.delete(Keys(prefix).topic("t"))])
        b3 = await start_member(etcd.endpoints, prefix, "b3", b3_local)
        try:
            assert await store.get(Keys(prefix).topic("t")) is None
            assert [s.topic for s in b3.strays()] == ["t"]
            refusal = b3.refusal("t", write=True)
            assert refusal is not None
            assert refusal.reason == "absent"
        finally:
            await stop_member(b3)


async def _lead_alone(store: EtcdStore, prefix: str, b1: ClusterMember) -> None:
    """The replicated topic placed and led by b1 at epoch 1, its isr shrunk to b1."""
    await _put_replicated(store, prefix)
    await eventually(lambda: _role(b1) == ("leader", 1, ""))
    assert isinstance(b1.local, MemoryTopics)
    assert await b1.local.change_isr["t"](("b1",))


def _given_marks(b1: ClusterMember, b2: ClusterMember, b3: ClusterMember) -> None:
    """Partition 0 committed to 100 on b1 (b2 holds 60, b3 10); partition 1 to 40 on all."""
    b1.replicas.marks = lambda _name: {0: (100, 100), 1: (40, 40)}
    b2.replicas.marks = lambda _name: {0: (60, 60), 1: (40, 40)}
    b3.replicas.marks = lambda _name: {0: (10, 10), 1: (40, 40)}


async def _turn_unclean_on(store: EtcdStore, prefix: str) -> None:
    """The cluster's defaults document with ``unclean_leader_election`` on: the election
    transaction compares it in etcd (the members' ``unclean_allowed`` is their view of it)."""
    await store.put(
        Keys(prefix).config_defaults, encode(DefaultsRecord(unclean_leader_election=True))
    )


@pytest.mark.asyncio
async def test_an_unclean_election_counts_what_it_gave_up_from_the_leaders_marks(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """Unclean election on for all three; b1 leads at epoch 1 and shrinks the isr to
    itself; its marks say partition 0 is committed to 100 and partition 1 to 40 (b2 holds
    60 and 40, b3 10 and 40). b1 is abandoned (a SIGKILL). Expected: b1 published its
    marks at epoch 1 under ``marks/t``; b2 (rank 0 among the alive out-of-sync replicas)
    wins at epoch 2 with isr (b2,) within TTL + slack + the unclean grace + 3 s, counts one
    election won, unclean, giving up 40 records of topic t (partition 0's 100 committed
    over its 60); b3 follows b2 and counts none."""
    async with members(etcd.endpoints, prefix, 3) as (b1, b2, b3):
        _given_marks(b1, b2, b3)
        for member in (b1, b2, b3):
            member.replicas.unclean_allowed = lambda: True
        await _turn_unclean_on(store, prefix)
        await _lead_alone(store, prefix, b1)
        async with asyncio.timeout(5):  # the next pass after the shrink publishes
            while True:
                held = await store.get(f"{prefix}marks/t")
                if held is not None and b'"epoch":1' in held.value:
                    break
                await asyncio.sleep(0.05)
        assert b'"committed":{"0":100,"1":40}' in held.value
        await b1.abandon()
        within_s = TTL + EXPIRY_SLACK_S + UNCLEAN_GRACE_S + 3
        await eventually(lambda: _role(b2) == ("leader", 2, ""), timeout_s=within_s)
        stored = await _stored(store, prefix)
        assert (stored.owner, stored.epoch, stored.isr) == ("b2", 2, ("b2",))
        assert (b2.replicas.elections_won, b2.replicas.unclean_elections) == (1, 1)
        assert b2.replicas.records_given_up == {"t": 40}
        await eventually(lambda: _role(b3) == ("follower", 2, "127.0.0.1:7002"))
        assert (b3.replicas.unclean_elections, b3.replicas.records_given_up) == (0, {})


async def _marks_held(store: EtcdStore, prefix: str) -> bytes | None:
    held = await store.get(f"{prefix}marks/t")
    return None if held is None else held.value


async def _marks_with(store: EtcdStore, prefix: str, part: bytes) -> bytes:
    """``marks/t`` once it holds ``part`` (within 5 s)."""
    async with asyncio.timeout(5):
        while True:
            held = await _marks_held(store, prefix)
            if held is not None and part in held:
                return held
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_a_deposed_leaders_marks_are_fenced_by_the_record_it_read(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """The fence rule broken on purpose. Unclean election on for all three; b1 leads alone
    in its isr at epoch 1 and publishes its marks. The record then moves on behind b1's
    view: b2 leads with isr (b2,) (written over etcd), and publishes its own marks at its
    epoch. b1 then publishes from the record as it read it at epoch 1 (a deposed leader
    whose view lags). Expected: nothing written: ``marks/t`` still holds b2's marks (b1's
    epoch-1 marks over them would make an unclean election after b2 count nothing). The
    topic's key and marks are then deleted (as its owner's delete does) and b1 publishes
    from its stale record again. Expected: ``marks/t`` stays absent (not a key left for
    good)."""
    async with members(etcd.endpoints, prefix, 3) as (b1, b2, b3):
        _given_marks(b1, b2, b3)
        for member in (b1, b2, b3):
            member.replicas.unclean_allowed = lambda: True
        await _lead_alone(store, prefix, b1)
        await eventually(lambda: _record(b1).isr == ("b1",))
        stale = b1.view.state.topics["t"]
        await _marks_with(store, prefix, b'"epoch":1')
        moved = (await _stored(store, prefix)).replace(owner="b2", epoch=2, isr=("b2",))
        await store.put(Keys(prefix).topic("t"), encode(moved))
        await eventually(lambda: (_role(b2) or ("",))[0] == "leader", timeout_s=5)
        b2_marks = await _marks_with(store, prefix, b'"committed":{"0":60')
        b1.replicas._unclean.forget("t")  # due now
        await b1.replicas._unclean.publish(stale, b1.replicas.marks, b1.replicas.unclean_allowed)
        assert await _marks_held(store, prefix) == b2_marks
        await store.txn([], [Op.delete(Keys(prefix).topic("t")), Op.delete(f"{prefix}marks/t")])
        b1.replicas._unclean.forget("t")
        await b1.replicas._unclean.publish(stale, b1.replicas.marks, b1.replicas.unclean_allowed)
        assert await _marks_held(store, prefix) is None


@pytest.mark.asyncio
async def test_an_unclean_election_waits_for_the_switch_and_says_when_it_cannot_count(
    etcd: EtcdCluster, prefix: str, store: EtcdStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Unclean election off (the default); b1 leads alone in its isr as above, then is
    abandoned. Expected: b1 publishes no marks (nothing under ``marks/t`` 2 s after the
    shrink); nobody leads for TTL + slack + the unclean grace + 2 s (epoch 1, owner b1 in
    etcd; no election counted). Switched on for b2 and b3: b2 wins at epoch 2 with isr
    (b2,), counts one unclean election and 0 records for t, and its WARNING says the
    number given up is not known (no marks at epoch 1)."""
    async with members(etcd.endpoints, prefix, 3) as (b1, b2, b3):
        _given_marks(b1, b2, b3)
        await _lead_alone(store, prefix, b1)
        await asyncio.sleep(2.0)
        assert await store.get(f"{prefix}marks/t") is None
        await b1.abandon()
        await asyncio.sleep(TTL + EXPIRY_SLACK_S + UNCLEAN_GRACE_S + 2)
        stored = await _stored(store, prefix)
        assert (stored.owner, stored.epoch, stored.isr) == ("b1", 1, ("b1",))
        assert b2.replicas.elections_won == b3.replicas.elections_won == 0
        for member in (b2, b3):
            member.replicas.unclean_allowed = lambda: True
        await _turn_unclean_on(store, prefix)
        await eventually(lambda: _role(b2) == ("leader", 2, ""), timeout_s=TTL + 5)
        stored = await _stored(store, prefix)
        assert (stored.owner, stored.epoch, stored.isr) == ("b2", 2, ("b2",))
        assert (b2.replicas.elections_won, b2.replicas.unclean_elections) == (1, 1)
        assert b2.replicas.records_given_up == {"t": 0}
        said = [
            r.getMessage() for r in caplog.records if "UNCLEAN election: broker" in r.getMessage()
        ]
        assert len(said) == 1, said
        assert "is not known" in said[0], said
        assert "no high watermark at epoch 1" in said[0], said


@pytest.mark.asyncio
async def test_a_failed_takeover_hands_the_topic_to_an_in_sync_follower(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads the replicated topic at epoch 1 with b2 and b3 in sync; b2's broker
    cannot take it over (``lead`` raises, as a state-log replay that cannot read its
    disk); b1's session lapses (as a SIGKILL). Expected: b2 wins the election (epoch 2),
    its takeover fails once, and it hands the topic to b3 (the other alive in-sync
    follower) instead of claiming again: the transfer names b3 at epoch 3, b3 claims it
    (epoch 4) and serves writes, b2 follows b3; b2 tried to lead once, and the epoch is
    4, not the thousands a claim retried at once ran up."""
    b2_local = MemoryTopics()
    b1 = await start_member(etcd.endpoints, prefix, "b1")
    b2 = await start_member(etcd.endpoints, prefix, "b2", b2_local)
    b3 = await start_member(etcd.endpoints, prefix, "b3")
    try:
        await _put_replicated(store, prefix)
        await eventually(lambda: _role(b1) == ("leader", 1, ""))
        await eventually(lambda: _role(b3) == ("follower", 1, "127.0.0.1:7001"))
        await eventually(lambda: _role(b2) == ("follower", 1, "127.0.0.1:7001"))
        b2_local.fail_lead = 1000
        await b1.abandon()
        within_s = TTL + EXPIRY_SLACK_S + 5.0
        await eventually(lambda: _role(b3) == ("leader", 4, ""), timeout_s=within_s)
        await eventually(lambda: _role(b2) == ("follower", 4, "127.0.0.1:7003"))
        await eventually(lambda: b3.refusal("t", write=True) is None)
        stored = await _stored(store, prefix)
        assert (stored.owner, stored.epoch) == ("b3", 4)
        assert b2_local.failed_leads == [2]
    finally:
        await b1.store.aclose()
        for member in (b2, b3):
            await stop_member(member)


@pytest.mark.asyncio
async def test_a_failed_takeover_with_no_other_in_sync_replica_is_retried_with_backoff(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 alone in sync (replicas b1, b2, b3; isr b1; min_insync 1) leads; restarted, its
    takeover fails twice, then works. Expected: the topic is refused (no-session) while
    it fails; b1 claims again after 1 s, then after 2 s more (two failed leads at
    successive epochs, about 1 s apart then 2 s), and leads at the third claim, serving
    writes; the epoch went up by three, not thousands."""
    b1_local = MemoryTopics()
    b1 = await start_member(etcd.endpoints, prefix, "b1", b1_local)
    b2 = await start_member(etcd.endpoints, prefix, "b2")
    b3 = await start_member(etcd.endpoints, prefix, "b3")
    try:
        await _put_replicated(store, prefix)
        await eventually(lambda: _role(b1) == ("leader", 1, ""))
        current = await _stored(store, prefix)
        await store.put(Keys(prefix).topic("t"), encode(current.replace(isr=("b1",))))
        await stop_member(b1)
        b1_local.fail_lead = 2
        b1 = await start_member(etcd.endpoints, prefix, "b1", b1_local)
        started = time.monotonic()
        await eventually(lambda: len(b1_local.failed_leads) == 1, timeout_s=10)
        refusal = b1.refusal("t", write=False)
        assert refusal is not None
        assert refusal.reason == "no-session"
        await eventually(lambda: _role(b1) == ("leader", 4, ""), timeout_s=15)
        took = time.monotonic() - started
        assert b1_local.failed_leads == [2, 3]
        assert took >= 3.0, took  # 1 s, then 2 s of backoff
        await eventually(lambda: b1.refusal("t", write=True) is None)
        assert (await _stored(store, prefix)).epoch == 4
    finally:
        for member in (b1, b2, b3):
            await stop_member(member)
