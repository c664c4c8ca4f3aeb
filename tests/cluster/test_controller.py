"""The controller on a real etcd: one at a time, failover when its session ends, and the
fence: a deposed controller's write is refused; replicated topics placed with their
replicas and preferred leaders spread, and a factor the live brokers cannot hold failed."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cluster.controller import Controller
from cluster.errors import NotControllerError, TopicCreateFailedError
from cluster.etcd import EtcdStore
from cluster.member import ClusterMember
from cluster.records import BrokerRecord, Keys, TopicRecord, TopicState, decode, encode
from cluster.session import Session
from cluster.state import Topic
from cluster.view import View
from tests._helpers import eventually
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.members import TTL, members


def _controllers(group: list[ClusterMember]) -> list[str]:
    return [m.node_id for m in group if m.controller.is_controller]


@pytest.mark.asyncio
async def test_one_controller_and_failover_on_a_crash(etcd: EtcdCluster, prefix: str) -> None:
    """Three members: exactly one believes it is controller, and the controller key names
    it. It crashes (its lease runs out, no clean exit): within the TTL and etcd's expiry
    slack another member is controller, with a higher fencing token."""
    async with members(etcd.endpoints, prefix, 3) as group:
        await eventually(lambda: len(_controllers(group)) == 1)
        first = next(m for m in group if m.controller.is_controller)
        old_token = first.controller.token
        held = group[1].view.state.controller
        assert held is not None
        assert (held.record.node_id, held.token) == (first.node_id, old_token)
        await first.abandon()
        rest = [m for m in group if m is not first]
        await eventually(lambda: len(_controllers(rest)) == 1, timeout_s=TTL + 3)
        second = next(m for m in rest if m.controller.is_controller)
        assert second.controller.token > old_token
        await eventually(lambda: _controllers(rest) == [second.node_id], timeout_s=1)


async def _candidate(store: EtcdStore, keys: Keys, node: str) -> tuple[Session, Controller]:
    session = Session(store, keys, BrokerRecord(node, f"{node}:1", 1, 0, "test"), TTL)
    await session.start()
    view = View(store, keys)
    return session, Controller(store, keys, view, session, f"{node}:1")


@pytest.mark.asyncio
async def test_a_stale_controllers_placement_is_refused(store: EtcdStore, prefix: str) -> None:
    """FENCE: b1 wins the election with token T; b2 loses. b1's session ends behind its
    back (lease revoked); b2 wins with a higher token. b1, still holding T, places a
    waiting topic on itself: NotControllerError naming both tokens, and nothing was
    written. b2's placement of the same topic, as read, goes through."""
    keys = Keys(prefix)
    s1, c1 = await _candidate(store, keys, "b1")
    s2, c2 = await _candidate(store, keys, "b2")
    try:
        assert await c1.campaign()
        assert not await c2.campaign()
        stale_token = c1.token
        await s1.abandon()
        await store.revoke(s1.lease)
        assert await c2.campaign()
        assert c2.token > stale_token
        key = keys.topic("t")
        waiting = TopicRecord("t", "00112233aabbccdd", 1, 0, "", 0, TopicState.PLACING)
        await store.put(key, encode(waiting))
        read = await store.get(key)
        assert read is not None
        assert c1.token == stale_token  # b1 still believes it is controller
        with pytest.raises(NotControllerError) as refused:
            await c1.place(Topic(waiting, read.mod_revision), "b1")
        assert (refused.value.token, refused.value.current) == (stale_token, c2.token)
        assert not c1.is_controller
        after = await store.get(key)
        assert after is not None
        assert after.mod_revision == read.mod_revision  # nothing written
        assert await c2.place(Topic(waiting, read.mod_revision), "b2")
        placed = await store.get(key)
        assert placed is not None
        record = decode(key, placed.value, TopicRecord)
        assert (record.owner, record.state) == ("b2", TopicState.CREATING)
    finally:
        await s2.aclose()


@pytest.mark.asyncio
async def test_the_controller_spreads_replicas_and_preferred_leaders(
    etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three members on a real etcd; three topics of factor 3 (min_insync 2),
    then three of factor 2, created one after another through b1, b2, b3 in turn.
    Expected: each ends ready with as many distinct replicas as asked, the owner (leader)
    first and in the in-sync set, min_insync as asked (2, clamped by nobody), ``factor``
    cleared; the factor-3 topics have three different preferred leaders; over all six
    every broker holds 5 replicas and is preferred leader of 2."""
    async with members(etcd.endpoints, prefix, 3) as group:
        asks = [(f"r{i}", 3) for i in range(3)] + [(f"s{i}", 2) for i in range(3)]
        made = [
            await group[i % 3].create_topic_record(name, 1, timeout_s=10, factor=f, min_insync=2)
            for i, (name, f) in enumerate(asks)
        ]
        for record, (_, factor) in zip(made, asks, strict=True):
            assert record.state is TopicState.READY
            assert len(set(record.replicas)) == len(record.replicas) == factor
            assert record.owner == record.replicas[0]
            assert record.owner in record.isr
            assert set(record.isr) <= set(record.replicas)
            assert (record.min_insync, record.factor) == (2, 0)
        assert sorted(r.replicas[0] for r in made[:3]) == ["b1", "b2", "b3"]
        assert Counter(n for r in made for n in r.replicas) == {"b1": 5, "b2": 5, "b3": 5}
        assert Counter(r.replicas[0] for r in made) == {"b1": 2, "b2": 2, "b3": 2}


@pytest.mark.asyncio
async def test_a_factor_above_the_live_brokers_fails_the_create_and_frees_the_name(
    etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three members; a topic record asking for 4 replicas written through b2
    (no broker-side check at this level: the controller is the last word), then the same
    name with factor 3, and a factor-1 topic. Expected: the first create fails with
    FAILED_PRECONDITION naming 4 and 3, owned by the controller's node, and the key is
    gone afterwards; the second succeeds on all three brokers; the factor-1 record is
    issue 36's byte for byte: no replicas, isr, min_insync or factor key stored."""
    async with members(etcd.endpoints, prefix, 3) as group:
        await eventually(lambda: len(_controllers(group)) == 1)
        (controller,) = _controllers(group)
        with pytest.raises(TopicCreateFailedError) as failed:
            await group[1].create_topic_record("big", 1, timeout_s=10, factor=4)
        assert failed.value.code == "FAILED_PRECONDITION"
        assert failed.value.owner_node == controller
        assert "replication factor 4" in str(failed.value)
        assert "3 are up" in str(failed.value)
        keys = Keys(prefix)
        assert await group[1].store.get(keys.topic("big")) is None
        record = await group[1].create_topic_record("big", 1, timeout_s=10, factor=3)
        assert sorted(record.replicas) == ["b1", "b2", "b3"]
        await group[0].create_topic_record("plain", 2, timeout_s=10)
        stored = await group[0].store.get(keys.topic("plain"))
        assert stored is not None
        fields = set(json.loads(stored.value))
        assert fields == {"name", "id", "partitions", "created_ms", "owner", "epoch", "state"}
