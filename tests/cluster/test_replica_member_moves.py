"""Cluster members (in-process, in-memory local topics) on a real three-member etcd, for the
operations on a replicated topic (issue 37): the controlled shutdown's hand-over, a
stopped follower taken out of the in-sync set at once, a broker without a session kept
out of it, and a replica dropped by a reassignment deleting its copy."""

from __future__ import annotations

import asyncio
import functools

import pytest

from cluster.etcd import EtcdStore
from cluster.local import MemoryTopics
from cluster.member import ClusterMember
from cluster.records import Keys, TopicRecord, TopicState, decode, encode
from tests._helpers import eventually
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.members import members, stop_member

TOPIC_ID = "00112233aabbccdd"


async def _put(store: EtcdStore, prefix: str, isr: tuple[str, ...]) -> None:
    """``t`` as the controller places it: ``creating`` on b1, replicas (b1, b2, b3)."""
    record = TopicRecord(
        "t", TOPIC_ID, 2, 0, "b1", 0, TopicState.CREATING,
        replicas=("b1", "b2", "b3"), isr=isr, min_insync=2,
    )  # fmt: skip
    await store.put(Keys(prefix).topic("t"), encode(record))


async def _stored(store: EtcdStore, prefix: str) -> tuple[TopicRecord, int]:
    key = Keys(prefix).topic("t")
    held = await store.get(key)
    assert held is not None
    return decode(key, held.value, TopicRecord), held.mod_revision


def _role(member: ClusterMember) -> tuple[str, int, str] | None:
    assert isinstance(member.local, MemoryTopics)
    return member.local.roles.get("t")


async def _led_by_b1(group: list[ClusterMember]) -> None:
    await eventually(lambda: _role(group[0]) == ("leader", 1, ""))
    for member in group[1:]:
        await eventually(functools.partial(lambda m: _role(m) is not None, member))


@pytest.mark.asyncio
async def test_a_controlled_shutdown_hands_the_topic_to_an_in_sync_follower(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads t at epoch 1, all three in sync. ``b1.hand_over(5)``. Expected: it
    returns {t: b2} (the first in-sync follower in preferred order) once b2 has claimed
    t: etcd holds owner b2 at an epoch above 2 (the transfer's 2, then b2's claim), b1
    out of the isr; b1 no longer has a role for t and takes none in later passes; b2
    leads and b3 follows it."""
    async with members(etcd.endpoints, prefix, 3) as group:
        b1, b2, b3 = group
        await _put(store, prefix, ("b1", "b2", "b3"))
        await _led_by_b1(group)
        moved = await b1.hand_over(5.0)
        assert moved == {"t": "b2"}
        stored, _ = await _stored(store, prefix)
        assert stored.owner == "b2"
        assert stored.epoch > 2
        assert stored.isr == ("b2", "b3")
        assert _role(b1) is None
        await eventually(lambda: _role(b2) == ("leader", stored.epoch, ""))
        await eventually(lambda: _role(b3) == ("follower", stored.epoch, "127.0.0.1:7002"))
        await asyncio.sleep(0.5)
        assert _role(b1) is None, "a role was taken after the hand-over"


@pytest.mark.asyncio
async def test_a_hand_over_without_an_in_sync_follower_moves_nothing(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads t with the isr (b1) alone. Expected: ``hand_over`` returns {} at once
    and etcd's record is unchanged (an election follows once b1's session ends)."""
    async with members(etcd.endpoints, prefix, 3) as group:
        await _put(store, prefix, ("b1",))
        await _led_by_b1(group)
        before = await _stored(store, prefix)
        assert await group[0].hand_over(5.0) == {}
        assert await _stored(store, prefix) == before


@pytest.mark.asyncio
async def test_a_stopped_follower_leaves_the_isr_at_once_and_no_sessionless_one_joins(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads t, all three in sync; b3's member leaves (its lease revoked). Expected:
    b1 takes b3 out of the isr within 3 s (no lag timeout runs in these in-memory
    topics: only the leader's pass does it); b1's change_isr asking b3 back while b3 has
    no session returns False and writes nothing."""
    async with members(etcd.endpoints, prefix, 3) as group:
        b1, _b2, b3 = group
        await _put(store, prefix, ("b1", "b2", "b3"))
        await _led_by_b1(group)
        await stop_member(b3)

        async def isr() -> tuple[str, ...]:
            return (await _stored(store, prefix))[0].isr

        deadline = asyncio.get_running_loop().time() + 3
        while await isr() != ("b1", "b2"):
            assert asyncio.get_running_loop().time() < deadline, await isr()
            await asyncio.sleep(0.05)
        assert isinstance(b1.local, MemoryTopics)
        before = await _stored(store, prefix)
        assert not await b1.local.change_isr["t"](("b1", "b2", "b3"))
        assert await _stored(store, prefix) == before


@pytest.mark.asyncio
async def test_a_replica_dropped_by_a_reassignment_deletes_its_copy(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads t over (b1, b2, b3); the record is rewritten with replicas (b1, b2) (a
    reassignment's drop step). Expected: b3 has no role and no local copy of t any
    more; b1 and b2 keep theirs."""
    async with members(etcd.endpoints, prefix, 3) as group:
        b1, b2, b3 = group
        await _put(store, prefix, ("b1", "b2", "b3"))
        await _led_by_b1(group)
        record, _ = await _stored(store, prefix)
        dropped = record.replace(replicas=("b1", "b2"), isr=("b1", "b2"))
        await store.put(Keys(prefix).topic("t"), encode(dropped))
        local = b3.local
        assert isinstance(local, MemoryTopics)
        await eventually(lambda: "t" not in local.topics and _role(b3) is None)
        for kept in (b1, b2):
            assert isinstance(kept.local, MemoryTopics)
            assert "t" in kept.local.topics
            assert _role(kept) is not None


@pytest.mark.asyncio
async def test_a_hand_over_skips_a_follower_that_is_stopping_too(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads t, all three in sync; b2 is marked stopping (its ``leaving/b2`` key, as
    its own hand-over writes it). Expected: b1 hands t to b3, not to b2 (b2 would never
    claim it)."""
    async with members(etcd.endpoints, prefix, 3) as group:
        b1, b2, _b3 = group
        await _put(store, prefix, ("b1", "b2", "b3"))
        await _led_by_b1(group)
        await store.put(f"{prefix}leaving/b2", b"", lease=b2.session.lease)
        assert await b1.hand_over(5.0) == {"t": "b3"}
        assert (await _stored(store, prefix))[0].owner == "b3"


@pytest.mark.asyncio
async def test_brokers_stopping_at_once_do_not_wait_for_each_other(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads t and b2 leads u (each over all three, in sync); both hand over at once
    with a 10 s bound. Expected: both return within 3 s (a target that is stopping too
    is skipped, or no longer waited for once it says so)."""
    async with members(etcd.endpoints, prefix, 3) as group:
        b1, b2, _b3 = group
        await _put(store, prefix, ("b1", "b2", "b3"))
        other = TopicRecord(
            "u", "8899aabbccddeeff", 1, 0, "b2", 0, TopicState.CREATING,
            replicas=("b2", "b3", "b1"), isr=("b2", "b3", "b1"), min_insync=2,
        )  # fmt: skip
        await store.put(Keys(prefix).topic("u"), encode(other))
        await _led_by_b1(group)
        local = b2.local
        assert isinstance(local, MemoryTopics)
        await eventually(lambda: local.roles.get("u") == ("leader", 1, ""))
        started = asyncio.get_running_loop().time()
        await asyncio.gather(b1.hand_over(10.0), b2.hand_over(10.0))
        took = asyncio.get_running_loop().time() - started
        assert took < 3.0, took


@pytest.mark.asyncio
async def test_a_hand_over_skips_a_follower_that_is_not_fetching(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads t, all three in sync and alive in etcd; b1's leader says b2 has not
    fetched lately (``fetching_lately``: b2 SIGKILLed, its session not yet ended).
    Expected: b1 hands t to b3, not b2. Then, with neither fetching, a new leader of u
    (b1 again) is not handed over at all: ``hand_over`` returns {} within 1 s (a 10 s
    bound), the record still names b1."""
    async with members(etcd.endpoints, prefix, 3) as group:
        b1, _b2, _b3 = group
        await _put(store, prefix, ("b1", "b2", "b3"))
        await _led_by_b1(group)
        b1.replicas.fetching_lately = lambda _topic, node: node != "b2"
        assert await b1.hand_over(5.0) == {"t": "b3"}
        assert (await _stored(store, prefix))[0].owner == "b3"
    async with members(etcd.endpoints, prefix + "again/", 3) as group:
        b1 = group[0]
        await _put(store, prefix + "again/", ("b1", "b2", "b3"))
        await _led_by_b1(group)
        b1.replicas.fetching_lately = lambda _topic, _node: False
        started = asyncio.get_running_loop().time()
        assert await b1.hand_over(10.0) == {}
        assert asyncio.get_running_loop().time() - started < 1.0
        assert (await _stored(store, prefix + "again/"))[0].owner == "b1"


@pytest.mark.asyncio
async def test_a_hand_over_stops_waiting_once_its_targets_session_ends(
    etcd: EtcdCluster, prefix: str, store: EtcdStore
) -> None:
    """b1 leads t, all three in sync; all three stop at once (``cluster local``'s
    Ctrl-C): b2 already says it is stopping (its leaving key) and neither b2 nor b3 runs
    a reconcile pass any more, so b1 hands t to b3, which never claims; 0.5 s into b1's
    wait, b3's session ends (lease revoked: it stopped fast, its leaving key gone with
    its lease; nobody elects, b2 is stopping). Expected: ``hand_over(10)`` returns
    {t: b3} within 3 s, not at its 10 s bound."""
    async with members(etcd.endpoints, prefix, 3) as group:
        b1, b2, b3 = group
        await _put(store, prefix, ("b1", "b2", "b3"))
        await _led_by_b1(group)
        await store.put(f"{prefix}leaving/b2", b"", lease=b2.session.lease)
        await b2.abandon()  # no reconcile pass: neither elects nor claims
        await b3.abandon()
        started = asyncio.get_running_loop().time()
        handing = asyncio.create_task(b1.hand_over(10.0))
        await asyncio.sleep(0.5)
        await store.revoke(b3.session.lease)
        assert await handing == {"t": "b3"}
        took = asyncio.get_running_loop().time() - started
        assert took < 3.0, took
