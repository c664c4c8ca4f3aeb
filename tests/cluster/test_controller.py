"""The controller on a real etcd: one at a time, failover when its session ends, and the
fence: a deposed controller's write is refused."""

from __future__ import annotations

import pytest

from cluster.controller import Controller
from cluster.errors import NotControllerError
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
