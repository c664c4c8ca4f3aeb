"""A leader's hand-overs (:mod:`cluster.replica_handover`), alone: one :class:`HandOver`
with real sessions (b1 the leader, b2 and b3 its followers) and a real view on a real
three-member etcd; no member and no broker, so nobody claims what is handed over."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from cluster.etcd import EtcdStore
from cluster.records import BrokerRecord, Keys, TopicRecord, TopicState, decode, encode
from cluster.replica_handover import HandOver
from cluster.session import Session
from cluster.state import Topic
from cluster.view import View
from tests._helpers import eventually

TOPIC_ID = "00112233aabbccdd"
TTL = 5


@pytest_asyncio.fixture
async def sessions(store: EtcdStore, prefix: str) -> AsyncIterator[dict[str, Session]]:
    """b1, b2 and b3, each with its session (its broker key under its lease)."""
    started: dict[str, Session] = {}
    try:
        for node in ("b1", "b2", "b3"):
            record = BrokerRecord(node, f"127.0.0.1:{7000 + int(node[1:])}", 1, 0, "t")
            started[node] = Session(store, Keys(prefix), record, TTL)
            await started[node].start()
        yield started
    finally:
        for session in started.values():
            await session.aclose()


@pytest_asyncio.fixture
async def view(store: EtcdStore, prefix: str) -> AsyncIterator[View]:
    """The cluster as b1 sees it."""
    watching = View(store, Keys(prefix))
    await watching.start()
    yield watching
    await watching.aclose()


async def _led_by_b1(store: EtcdStore, prefix: str, view: View, isr: tuple[str, ...]) -> None:
    """``t`` led by b1 at epoch 1, replicas (b1, b2, b3), in etcd and in the view."""
    record = TopicRecord(
        "t", TOPIC_ID, 2, 0, "b1", 1, TopicState.READY,
        replicas=("b1", "b2", "b3"), isr=isr, min_insync=1,
    )  # fmt: skip
    await store.put(Keys(prefix).topic("t"), encode(record))

    def seen() -> bool:
        topic = view.state.topics.get("t")
        return topic is not None and topic.record.effective_isr() == isr

    await eventually(seen)


async def _stored(store: EtcdStore, prefix: str) -> Topic:
    key = Keys(prefix).topic("t")
    held = await store.get(key)
    assert held is not None
    return Topic(decode(key, held.value, TopicRecord), held.mod_revision)


def _hand_over(
    store: EtcdStore, prefix: str, view: View, session: Session, stopped: list[str]
) -> HandOver:
    async def stop(name: str) -> None:
        stopped.append(name)

    def latest(name: str) -> Topic | None:
        return view.state.topics.get(name)  # the view's state as it is at each call

    return HandOver(
        store, Keys(prefix), view, session,
        node_id="b1", clock=time.monotonic, latest=latest, stop=stop,
    )  # fmt: skip


@pytest.mark.asyncio
async def test_a_shutdown_hands_to_the_first_fetching_follower_and_waits_only_its_bound(
    store: EtcdStore,
    prefix: str,
    view: View,
    sessions: dict[str, Session],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """b1 leads t, all three in sync; b2 has not fetched lately. ``run(["t"], 1.0)``.
    Expected: t handed to b3 (b2 skipped): etcd holds owner b3 at epoch 2, b1 out of
    the isr; b1's role in t stopped; b1's leaving key present; and, as nobody claims,
    the call returns {t: b3} within its 1 s bound (plus slack), logging that b3 has not
    taken the leadership."""
    await _led_by_b1(store, prefix, view, ("b1", "b2", "b3"))
    await eventually(lambda: len(view.state.brokers) == 3)
    stopped: list[str] = []
    hand_over = _hand_over(store, prefix, view, sessions["b1"], stopped)
    caplog.set_level(logging.INFO, logger="cluster.replica_handover")
    began = time.monotonic()
    moved = await hand_over.run(["t"], 1.0, lambda _topic, node: node != "b2")
    assert moved == {"t": "b3"}
    assert time.monotonic() - began < 3.0
    record = (await _stored(store, prefix)).record
    assert (record.owner, record.epoch, record.effective_isr()) == ("b3", 2, ("b2", "b3"))
    assert stopped == ["t"]
    assert await store.get(f"{prefix}leaving/b1") is not None
    assert "not handed to ['b2']: not fetching from here" in caplog.text
    assert "topic t: b3 has not taken the leadership" in caplog.text


@pytest.mark.asyncio
async def test_a_leader_missing_its_data_hands_to_an_alive_in_sync_follower_or_none(
    store: EtcdStore, prefix: str, view: View, sessions: dict[str, Session]
) -> None:
    """b1 leads t with isr (b1, b3, b2) but its data is missing; b3's session has ended.
    Expected: ``missing("t")`` hands t to b2 (the first alive in-sync follower) and
    returns the record as etcd holds it: owner b2, epoch 2, b1 out of the isr. Then with
    isr (b1,) alone: None, and etcd's record is left as it was."""
    await sessions["b3"].aclose()
    await _led_by_b1(store, prefix, view, ("b1", "b3", "b2"))
    await eventually(lambda: "b3" not in view.state.brokers)
    hand_over = _hand_over(store, prefix, view, sessions["b1"], [])
    handed = await hand_over.missing("t")
    assert handed is not None
    assert (handed.record.owner, handed.record.epoch) == ("b2", 2)
    assert handed.record.effective_isr() == ("b3", "b2")
    assert await _stored(store, prefix) == handed
    await _led_by_b1(store, prefix, view, ("b1",))
    before = await _stored(store, prefix)
    assert await hand_over.missing("t") is None
    assert await _stored(store, prefix) == before
