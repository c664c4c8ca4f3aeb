"""Cluster members (in-process, in-memory local topics) on a real three-member etcd: local
topics adopted at join, strays never served, a topic deleted behind the owner's back
answered as absent, and creates their owner can never carry out ending ``failed``."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from cluster.errors import TopicCreateFailedError
from cluster.local import MemoryTopics
from cluster.member import Stray
from cluster.records import CreateFailure, Keys, TopicRecord, TopicState, decode, encode
from tests._helpers import eventually
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.members import members, start_member, stop_member

pytestmark = pytest.mark.asyncio

OTHER_ID = "00000000000000aa"
LOCAL_ID = "11111111111111bb"


async def test_local_topics_are_adopted_at_join_and_served_at_once(
    etcd: EtcdCluster, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: b1 joins an empty cluster with two local topics (one made before topics
    had ids). Expected: before start returns, etcd holds a record for each with the local
    id and partitions, owner b1, epoch 1, ready; b1 serves both for writes at once (no
    re-claim); each adoption is logged at INFO; there are no strays."""
    local = MemoryTopics()
    local.topics = {"orders": (LOCAL_ID, 3), "legacy": ("", 1)}
    caplog.set_level(logging.INFO, logger="cluster.member")
    b1 = await start_member(etcd.endpoints, prefix, "b1", local)
    try:
        for name, (topic_id, partitions) in local.topics.items():
            held = await b1.store.get(Keys(prefix).topic(name))
            assert held is not None
            record = decode(held.key, held.value, TopicRecord)
            assert (record.id, record.partitions) == (topic_id, partitions)
            assert (record.owner, record.epoch, record.state) == ("b1", 1, TopicState.READY)
            assert b1.refusal(name, write=True) is None
        assert b1.claimed == {"orders": 1, "legacy": 1}
        assert b1.strays() == []
        adopted = [r.getMessage() for r in caplog.records if "adopted local topic" in r.message]
        assert len(adopted) == 2, adopted
        assert local.created == []  # adopted as they are: nothing made again
    finally:
        await stop_member(b1)


async def test_a_name_the_cluster_holds_elsewhere_is_a_stray_never_served(
    etcd: EtcdCluster, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: the cluster holds ``orders`` and ``mine``, both owned by b1; b2 joins with
    a local ``orders`` of another id and a local ``mine`` of the cluster's id. Expected:
    b2 does not adopt or touch either local copy (ids and partitions unchanged), refuses
    both as not-owner pointing at b1, logs a WARNING naming the topic, both ids and the
    local path, and lists both as strays."""
    async with members(etcd.endpoints, prefix, 1) as (b1,):
        orders = await b1.create_topic_record("orders", 2, timeout_s=10)
        mine = await b1.create_topic_record("mine", 1, timeout_s=10)
        assert (orders.owner, mine.owner) == ("b1", "b1")
        local = MemoryTopics()
        local.topics = {"orders": (OTHER_ID, 5), "mine": (mine.id, 1)}
        caplog.set_level(logging.INFO, logger="cluster.member")
        b2 = await start_member(etcd.endpoints, prefix, "b2", local)
        try:
            assert local.topics == {"orders": (OTHER_ID, 5), "mine": (mine.id, 1)}
            for name in ("orders", "mine"):
                refusal = b2.refusal(name, write=True)
                assert refusal is not None
                assert (refusal.reason, refusal.owner_node) == ("not-owner", "b1")
                read = b2.refusal(name, write=False)
                assert read is not None
                assert read.reason == "not-owner"
            assert b2.strays() == [
                Stray("mine", mine.id, mine.id, "b1", "memory:mine"),
                Stray("orders", OTHER_ID, orders.id, "b1", "memory:orders"),
            ]
            warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            [about_orders] = [m for m in warned if "'orders'" in m]
            assert OTHER_ID in about_orders
            assert orders.id in about_orders
            assert "memory:orders" in about_orders
            assert "move the directory away" in about_orders
            held = await b2.store.get(Keys(prefix).topic("orders"))
            assert held is not None
            assert decode(held.key, held.value, TopicRecord).id == orders.id  # record wins
        finally:
            await stop_member(b2)


async def test_a_topic_deleted_behind_its_owners_back_is_absent_not_served(
    etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: b1 owns ``t``; its key is deleted in etcd by someone else. Expected: as
    soon as b1's view sees it, b1 refuses ``t`` for writes and reads with reason
    ``absent`` (answered not found), keeps the local copy, and lists it as a stray."""
    local = MemoryTopics()
    b1 = await start_member(etcd.endpoints, prefix, "b1", local)
    try:
        record = await b1.create_topic_record("t", 1, timeout_s=10)
        await eventually(lambda: b1.refusal("t", write=True) is None)
        await b1.store.delete_prefix(Keys(prefix).topic("t"))
        await eventually(lambda: "t" not in b1.view.state.topics)
        for write in (True, False):
            refusal = b1.refusal("t", write=write)
            assert refusal is not None
            assert refusal.reason == "absent"
        assert local.topics["t"] == (record.id, 1)
        assert [s.topic for s in b1.strays()] == ["t"]
        assert b1.refusal("never-made", write=True) is None  # unknown, no local data
    finally:
        await stop_member(b1)


async def test_a_create_its_owner_can_never_make_fails_fast_and_frees_the_name(
    etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: b1 alone, whose local topics take at most 4 partitions for good (as an
    open-files budget does); a 10-partition topic is created through it. Expected: the
    create raises TopicCreateFailedError within a few seconds (not the 20 s timeout) with
    the owner's status name and a message naming b1; the key is gone (the name is free),
    nothing was made locally, and a 2-partition topic of that name is created after."""
    local = MemoryTopics(max_partitions=4)
    b1 = await start_member(etcd.endpoints, prefix, "b1", local)
    try:
        loop_time = asyncio.get_running_loop().time
        began = loop_time()
        with pytest.raises(TopicCreateFailedError) as failed:
            await b1.create_topic_record("big", 10, timeout_s=20)
        assert loop_time() - began < 5
        assert failed.value.code == "RESOURCE_EXHAUSTED"
        assert failed.value.owner_node == "b1"
        assert "broker b1 cannot create topic 'big'" in str(failed.value)
        assert await b1.store.get(Keys(prefix).topic("big")) is None
        assert "big" not in local.topics
        again = await b1.create_topic_record("big", 2, timeout_s=10)
        assert again.state is TopicState.READY
    finally:
        await stop_member(b1)


async def test_a_failed_record_its_creator_left_is_removed_by_the_owner(
    etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: two ``failed`` records whose creators died before removing them: one of
    broker b9 (not running) failed just now, one of b1 failed longer than FAILED_KEEP_S
    ago. Expected: b1's view keeps both out of its topics (Lookup: absent); b1 removes its
    own on its next reconcile pass and leaves b9's alone."""
    b1 = await start_member(etcd.endpoints, prefix, "b1", MemoryTopics())
    try:
        keys = Keys(prefix)
        now_ms = int(time.time() * 1000)
        for name, owner, at_ms in (("fresh", "b9", now_ms), ("old", "b1", 0)):
            failure = CreateFailure("RESOURCE_EXHAUSTED", "test", at_ms)
            record = TopicRecord(name, OTHER_ID, 1, 0, owner, 0, TopicState.FAILED, failure=failure)
            await b1.store.put(keys.topic(name), encode(record))
        await eventually(lambda: "fresh" in b1.view.state.failed)
        assert "fresh" not in b1.view.state.topics
        assert [r.state for r in (await b1.lookup(["fresh", "old"])).routes] == [
            "absent",
            "absent",
        ]
        deadline = time.monotonic() + 5
        while await b1.store.get(keys.topic("old")) is not None:
            assert time.monotonic() < deadline, "b1 did not remove its old failed record"
            await asyncio.sleep(0.05)
        assert await b1.store.get(keys.topic("fresh")) is not None
    finally:
        await stop_member(b1)
