"""What an unclean election gives up (:mod:`cluster.replica_marks`), alone: one
:class:`UncleanMarks` with a real session on a real three-member etcd, no member, no
broker, a hand-moved clock for the publication interval."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping

import msgspec
import pytest
import pytest_asyncio

from cluster.etcd import EtcdStore
from cluster.records import BrokerRecord, Keys, TopicRecord, TopicState, encode
from cluster.replica_marks import MARKS_INTERVAL_S, PublishedMarks, UncleanMarks
from cluster.session import Session
from cluster.state import Topic

TOPIC_ID = "00112233aabbccdd"
TTL = 5


class _Clock:
    """Monotonic seconds moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture
async def session(store: EtcdStore, prefix: str) -> AsyncIterator[Session]:
    """b1's session (its broker key under its lease)."""
    started = Session(store, Keys(prefix), BrokerRecord("b1", "127.0.0.1:7001", 1, 0, "t"), TTL)
    await started.start()
    yield started
    await started.aclose()


async def _placed(store: EtcdStore, prefix: str, isr: tuple[str, ...], epoch: int = 3) -> Topic:
    """``t`` led by b1 at ``epoch``, replicas (b1, b2, b3), as etcd holds it."""
    record = TopicRecord(
        "t", TOPIC_ID, 2, 0, "b1", epoch, TopicState.READY,
        replicas=("b1", "b2", "b3"), isr=isr, min_insync=1,
    )  # fmt: skip
    key = Keys(prefix).topic("t")
    await store.put(key, encode(record))
    held = await store.get(key)
    assert held is not None
    return Topic(record, held.mod_revision)


async def _held(store: EtcdStore, prefix: str) -> PublishedMarks | None:
    held = await store.get(f"{prefix}marks/t")
    return None if held is None else msgspec.json.decode(held.value, type=PublishedMarks)


@pytest.mark.asyncio
async def test_marks_are_published_only_while_an_unclean_election_could_follow(
    store: EtcdStore, prefix: str, session: Session
) -> None:
    """b1 leads t at epoch 3, its log marks ``{0: (100, 120)}``. Expected: nothing is
    published while the switch is off, nor while every replica is in sync; with the
    switch on and isr (b1,) the high watermarks ``{0: 100}`` at epoch 3 are; a move to
    110 is published only once ``MARKS_INTERVAL_S`` has passed."""
    clock = _Clock()
    marks = UncleanMarks(store, Keys(prefix), session, node_id="b1", clock=clock)
    ends: dict[int, tuple[int, int]] = {0: (100, 120)}

    def log_marks(_name: str) -> Mapping[int, tuple[int, int]]:
        return ends

    alone = await _placed(store, prefix, ("b1",))
    await marks.publish(alone, log_marks, lambda: False)
    assert await _held(store, prefix) is None
    full = await _placed(store, prefix, ("b1", "b2", "b3"))
    await marks.publish(full, log_marks, lambda: True)
    assert await _held(store, prefix) is None
    alone = await _placed(store, prefix, ("b1",))
    await marks.publish(alone, log_marks, lambda: True)
    assert await _held(store, prefix) == PublishedMarks(TOPIC_ID, 3, {0: 100})
    ends[0] = (110, 120)
    await marks.publish(alone, log_marks, lambda: True)
    assert await _held(store, prefix) == PublishedMarks(TOPIC_ID, 3, {0: 100})
    clock.now += MARKS_INTERVAL_S
    await marks.publish(alone, log_marks, lambda: True)
    assert await _held(store, prefix) == PublishedMarks(TOPIC_ID, 3, {0: 110})
    assert list(marks.dues()) == [clock.now + MARKS_INTERVAL_S]


@pytest.mark.asyncio
async def test_a_winner_counts_from_the_marks_of_the_epoch_it_replaces(
    store: EtcdStore, prefix: str, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    """The old leader published ``{0: 100, 1: 40}`` at epoch 3; this broker's log ends
    at 60 and 40. Expected: ``given_up`` of the epoch-3 record is ``{0: 40}``, and
    ``count`` adds 40 to t and logs "at least 40 records"; for an epoch-4 record (no
    marks of that epoch) ``given_up`` is None, and ``count`` adds nothing and logs that
    the number is not known."""
    marks = UncleanMarks(store, Keys(prefix), session, node_id="b3", clock=_Clock())
    published = PublishedMarks(TOPIC_ID, 3, {0: 100, 1: 40})
    await store.put(f"{prefix}marks/t", msgspec.json.encode(published))
    old = (await _placed(store, prefix, ("b1", "b2"))).record
    won = old.replace(owner="b3", epoch=4, isr=("b3",))

    def log_marks(_name: str) -> Mapping[int, tuple[int, int]]:
        return {0: (60, 60), 1: (40, 40)}

    caplog.set_level(logging.WARNING, logger="cluster.replica_marks")
    lost = await marks.given_up(old, log_marks)
    assert lost == {0: 40}
    assert await marks.given_up(old, None) is None
    marks.count(old, won, lost)
    assert (marks.unclean_elections, marks.records_given_up) == (1, {"t": 40})
    assert "at least 40 records" in caplog.text
    assert await marks.given_up(won, log_marks) is None
    marks.count(won, won.replace(epoch=5), None)
    assert (marks.unclean_elections, marks.records_given_up) == (2, {"t": 40})
    assert "is not known (it published no high watermark at epoch 4" in caplog.text
