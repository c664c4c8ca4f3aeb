"""Drain and release in the dispatch state machine (dispatcher.state): pure, no loop.

A consumer that closes cleanly drains (nothing more is sent to it) and releases what it
received but never handed to its application. A release is not a delivery attempt: the
counts the send raised go back, the records are not delayed by backoff and go out again at
once, in order. A consumer that leaves holding records it did hand out (a crash, or an
exception inside ``async with``) still failed them, so a poison record reaches
``max_deliveries``. The :class:`Driver` of ``test_state`` plays the shell and checks the
one-place invariant after every command.
"""

from __future__ import annotations

import pytest

from dispatcher.errors import InvalidAckError, InvalidSubscriptionError
from dispatcher.protocol import (
    Ack,
    Detach,
    DispatchPolicy,
    Drain,
    Grant,
    Nack,
    PartitionSnapshot,
    Release,
    SubscriptionType,
    ToDeadLetter,
)
from tests.dispatcher.test_state import Driver

EXCLUSIVE = SubscriptionType.EXCLUSIVE
SHARED = SubscriptionType.SHARED
KEY_SHARED = SubscriptionType.KEY_SHARED
FAILOVER = SubscriptionType.FAILOVER


def close_cleanly(d: Driver, consumer: str, keep: int, partition: int = 0) -> None:
    """``consumer`` drains, then releases every record it holds from offset ``keep`` on
    (those it never handed out), then leaves."""
    d.do(Drain(consumer))
    held = [o for o in d.sent_to(consumer, partition) if o >= keep]
    if held:
        d.do(Release(consumer, partition, min(held), max(held) + 1))
    d.do(Detach(consumer))


@pytest.mark.parametrize("kind", [EXCLUSIVE, FAILOVER, SHARED, KEY_SHARED])
def test_released_first_deliveries_go_out_again_as_first_deliveries(
    kind: SubscriptionType,
) -> None:
    """Scenario: a consumer with a large prefetch gets records 0..99, hands out and acks
    record 0, closes cleanly (drain, release 1..99, detach), at t=5; another consumer
    attaches at the same instant.
    Expected: it gets 1..99 at once (no backoff), in order, with no redelivery counts;
    nothing was counted as failed (no failure entries saved), and sent_mark went back."""
    d = Driver(DispatchPolicy(type=kind, max_deliveries=3))
    d.logs[0].append_batches(10, size=10)
    d.attach("a")
    d.pump(now=5)
    assert d.sent_to("a") == list(range(100))
    d.do(Ack(0, 0, 1))
    close_cleanly(d, "a", keep=1)
    assert d.state.released_total == 99
    assert d.state.snapshot(10) == [PartitionSnapshot(1, (), 1, ())]
    d.attach("b")
    d.pump()
    assert d.sent_to("b") == list(range(1, 100))
    assert d.redeliveries("b") == {}
    assert d.state.redelivered_total == 0


def test_ten_clean_closes_never_dead_letter_unseen_records() -> None:
    """Scenario: the CLI loop ``consume --count 1`` ten times with the client's default
    prefetch of 1,000, max_deliveries 3: each time a consumer takes 1,000 records, hands
    out one, acks it, releases the rest.
    Expected: ten records acked, nothing dead-lettered, no record ever redelivered."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE, max_deliveries=3))
    d.logs[0].append_batches(100, size=10)
    for i in range(10):
        d.attach(f"c{i}")
        actions = d.pump(now=float(i))
        assert not [a for a in actions if isinstance(a, ToDeadLetter)]
        assert d.sent_to(f"c{i}")[0] == i
        d.do(Ack(0, i, i + 1))
        close_cleanly(d, f"c{i}", keep=i + 1)
    assert d.state.cursor(0) == 10
    assert d.state.redelivered_total == 0
    assert d.redeliveries() == {}


def test_a_released_redelivery_keeps_its_count_and_is_not_delayed() -> None:
    """Scenario: records 0..3 go to a consumer that leaves without acking (a failed
    delivery: count 1), backoff 10 s; the next consumer gets them at once (a departure
    waits no backoff) with redelivery count 1, hands out none and releases them.
    Expected: the third consumer gets them at once, still with redelivery count 1, not 2."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE, backoff_initial_s=10, max_deliveries=5))
    d.logs[0].append(4)
    d.attach("a")
    d.pump(now=1)
    d.do(Detach("a"))
    d.attach("b")
    d.pump()
    assert d.redeliveries("b") == {0: 1, 1: 1, 2: 1, 3: 1}
    close_cleanly(d, "b", keep=0)
    d.take()
    d.attach("c")
    d.pump()
    assert d.sent_to("c") == [0, 1, 2, 3]
    assert d.redeliveries("c") == {0: 1, 1: 1, 2: 1, 3: 1}


def test_a_release_below_another_consumers_records_restores_counts_too() -> None:
    """Scenario: shared; consumer a gets batch 0..4, b gets batch 5..9; a releases its
    batch (not the top of what was sent, so counts go to entries, not sent_mark).
    Expected: b, the one consumer with credit, gets 0..4 at once as first deliveries."""
    d = Driver(DispatchPolicy(type=SHARED))
    d.logs[0].append_batches(2, size=5)
    d.attach("a", credit=5)
    d.attach("b", credit=10)
    d.pump()
    assert (d.sent_to("a"), d.sent_to("b")) == ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9])
    close_cleanly(d, "a", keep=0)
    d.take()
    d.pump()
    assert d.sent_to("b") == [0, 1, 2, 3, 4]
    assert d.redeliveries() == {}


def test_a_partial_batch_releases_only_what_was_not_handed_out() -> None:
    """Scenario: a batch of 10 goes to a consumer that handed out 0..3, acked 0..1 and
    left 2..3 unacked; it releases 4..9 and leaves (records 2..3 were attempted).
    Expected: the next consumer gets 2..9; only 2 and 3 are redeliveries (count 1)."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE, max_deliveries=3))
    d.logs[0].append(10)
    d.attach("a")
    d.pump()
    d.do(Ack(0, 0, 2))
    d.do(Drain("a"))
    d.do(Release("a", 0, 4, 10))
    d.do(Detach("a"))
    d.take()
    d.attach("b")
    d.pump()
    assert d.sent_to("b") == list(range(2, 10))
    assert d.redeliveries("b") == {2: 1, 3: 1}


def test_a_poison_record_that_kills_its_consumer_still_reaches_the_dlq() -> None:
    """Scenario: max_deliveries 3; each consumer hands out record 0 (poison), dies on it
    without acking (detach after releasing what it did not hand out: 1..9).
    Expected: after three such consumers record 0 goes to the dead-letter queue; records
    1..9 are never counted and go to the fourth consumer as first deliveries."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE, max_deliveries=3, backoff_initial_s=0))
    d.logs[0].append(10)
    dead = []
    for i in range(4):
        d.attach(f"c{i}")
        dead += [a for a in d.pump(now=float(i)) if isinstance(a, ToDeadLetter)]
        if i < 3:
            assert d.sent_to(f"c{i}")[0] == 0
            close_cleanly(d, f"c{i}", keep=1)
    assert [(a.begin, a.end, a.failures[0].deliveries) for a in dead] == [(0, 1, 3)]
    assert d.sent_to("c3") == list(range(1, 10))
    assert d.redeliveries("c3") == {}


def test_drain_stops_sending_and_ignores_later_credit() -> None:
    """Scenario: a consumer with credit 2 gets 0..1 and drains; then it is granted more
    credit and more records are written.
    Expected: nothing more is sent to it; its leases stay until it releases or leaves."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE))
    d.logs[0].append_batches(6)
    d.attach("a", credit=2)
    d.pump()
    d.do(Drain("a"))
    d.do(Grant("a", 10))
    d.logs[0].append(3)
    d.pump()
    assert d.sent_to("a") == [0, 1]
    assert d.state.in_flight(0) == 2


def test_invalid_releases_are_rejected_and_change_nothing() -> None:
    """Scenario: releases of an empty range, of offsets never delivered, of a partition
    that does not exist, and of offsets leased to another consumer or acknowledged.
    Expected: the first three raise (INVALID_ARGUMENT at the broker, like a bad ack); the
    last two leave the other consumer's lease and the ack alone."""
    d = Driver(DispatchPolicy(type=SHARED))
    d.logs[0].append_batches(2, size=5)
    d.attach("a", credit=5)
    d.attach("b", credit=5)
    d.pump()
    with pytest.raises(InvalidSubscriptionError, match="not an offset range"):
        d.do(Release("a", 0, 3, 3))
    with pytest.raises(InvalidAckError):
        d.do(Release("a", 0, 0, 11))
    with pytest.raises(InvalidSubscriptionError, match="does not exist"):
        d.do(Release("a", 4, 0, 1))
    d.do(Ack(0, 0, 1))
    d.do(Release("a", 0, 0, 1))  # acked already
    d.do(Release("a", 0, 5, 10))  # b's
    assert d.state.in_flight(0) == 9
    assert d.state.released_total == 0
    assert d.state.cursor(0) == 1


def test_a_nacked_record_then_released_keeps_its_failure() -> None:
    """Scenario: record 0 is nacked (a failure: count 1, reason kept) and redelivered; the
    consumer releases it unseen.
    Expected: the failure entry keeps count 1 and its reason; the next send says 1."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE, max_deliveries=5))
    d.logs[0].append(1)
    d.attach("a")
    d.pump()
    d.do(Nack(0, 0, 1, delay_s=0, reason="bad"))
    d.pump()
    assert d.redeliveries("a") == {0: 1}
    d.do(Release("a", 0, 0, 1))
    (run,) = d.state.snapshot(10)[0].failures
    assert (run.deliveries, run.reason) == (1, "bad")
    d.take()
    d.pump()
    assert d.redeliveries("a") == {0: 1}


@pytest.mark.parametrize("then", ["drain", "detach"])
def test_an_exhausted_record_is_dead_lettered_with_no_consumer_to_send_to(then: str) -> None:
    """Scenario: max_deliveries 2; record 0 is nacked twice (its last try), then the
    consumer drains (no credit) or leaves (no consumer at all).
    Expected: record 0 goes to the dead-letter queue at once, without waiting for a
    consumer with credit (a nack of the last try followed by a close must not leave it
    waiting for the next consumer); record 1 does not."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE, max_deliveries=2, backoff_initial_s=0))
    d.logs[0].append(2)
    d.attach("a")
    d.pump()
    d.do(Nack(0, 0, 1, delay_s=0))
    d.pump()
    assert d.redeliveries("a") == {0: 1}
    d.do(Nack(0, 0, 1, delay_s=0))
    d.do(Drain("a") if then == "drain" else Detach("a"))
    dead = [a for a in d.pump() if isinstance(a, ToDeadLetter)]
    assert [(a.begin, a.end) for a in dead] == [(0, 1)]  # record 1 is not poison
