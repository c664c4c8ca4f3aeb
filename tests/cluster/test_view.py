"""The view: the pure state's rules (no loop, no etcd), then list+watch on a real etcd,
and the relist after a compaction."""

from __future__ import annotations

import pytest

from cluster.etcd import EtcdStore, KeyValue, Listing
from cluster.records import BrokerRecord, Keys, TopicRecord, TopicState, encode
from cluster.state import ClusterState
from cluster.view import View
from tests._helpers import eventually
from tests.cluster.etcd_harness import EtcdCluster

KEYS = Keys("/h/")


def _topic(name: str, owner: str = "", partitions: int = 1) -> TopicRecord:
    state = TopicState.READY if owner else TopicState.PLACING
    return TopicRecord(name, "0" * 16, partitions, 0, owner, 1 if owner else 0, state)


def _kv(key: str, value: bytes, revision: int, lease: int = 0) -> KeyValue:
    return KeyValue(key, value, revision, revision, lease)


def test_state_applies_puts_deletes_and_skips_bad_values() -> None:
    """A listing of a broker and two topics, then events: a bad topic value is left out
    and remembered (not fatal), a delete of the broker removes it, and the revision only
    rises. load() counts partitions and topics per live broker."""
    state = ClusterState(KEYS)
    state.replace(
        Listing(
            [
                _kv(KEYS.broker("b1"), encode(BrokerRecord("b1", "a:1", 1, 0, "v")), 2, lease=7),
                _kv(KEYS.topic("t"), encode(_topic("t", "b1", 3)), 3),
                _kv(KEYS.topic("p"), encode(_topic("p")), 4),
            ],
            revision=5,
        )
    )
    assert state.brokers["b1"].lease == 7
    assert state.load() == {"b1": (3, 1)}
    assert [t.record.name for t in state.placing()] == ["p"]
    state.put(_kv(KEYS.topic("p"), b"{broken", 6))
    assert "p" not in state.topics
    assert KEYS.topic("p") in state.bad
    state.delete(KEYS.broker("b1"), 7)
    assert state.brokers == {}
    assert state.load() == {}
    assert state.revision == 7
    state.delete(KEYS.topic("t"), 3)  # an older revision never lowers it
    assert state.revision == 7


@pytest.mark.asyncio
async def test_view_follows_puts_and_deletes(store: EtcdStore, prefix: str) -> None:
    """A started view sees a topic put, then changed, then deleted, each within moments,
    and its version rises with each change."""
    keys = Keys(prefix)
    view = View(store, keys)
    await view.start()
    try:
        seen = view.version
        await store.put(keys.topic("t"), encode(_topic("t")))
        await eventually(lambda: "t" in view.state.topics)
        assert view.version > seen
        await store.put(keys.topic("t"), encode(_topic("t", "b1")))
        await eventually(lambda: view.state.topics["t"].record.owner == "b1")
        await store.delete_prefix(keys.topic("t"))
        await eventually(lambda: "t" not in view.state.topics)
        assert view.relists == 0
    finally:
        await view.aclose()


@pytest.mark.asyncio
async def test_view_relists_after_a_compaction(own_etcd: EtcdCluster) -> None:
    """A view whose watch position is older than a compaction (as after a long
    disconnection): etcd refuses the watch with the compaction, the view lists again,
    ends up equal to etcd (a topic put and one deleted meanwhile), and goes on watching."""
    keys = Keys("/h/")
    async with await EtcdStore.connect(own_etcd.endpoints) as store:
        await store.put(keys.topic("gone"), encode(_topic("gone")))
        past = await store.get_prefix(keys.prefix)
        await store.put(keys.topic("new"), encode(_topic("new")))
        await store.delete_prefix(keys.topic("gone"))
        own_etcd.compact()
        view = View(store, keys)
        await view.start(past)
        try:
            await eventually(lambda: view.relists == 1)
            assert set(view.state.topics) == {"new"}
            await store.put(keys.topic("later"), encode(_topic("later")))
            await eventually(lambda: "later" in view.state.topics)
        finally:
            await view.aclose()
