"""The sender (dispatcher.sending) as the state drives it, pure: what a ``Fetched`` tells
the shell through the state's tally (``changes``, ``set_aside_total``, ``moved``), which
the dispatch loop reads as plain attributes after every read it applies."""

from __future__ import annotations

import zlib

import pytest

from dispatcher.errors import InvalidSubscriptionError
from dispatcher.partition_book import key_slot
from dispatcher.protocol import (
    Attach,
    DispatchPolicy,
    Fetched,
    Nack,
    PartitionSnapshot,
    Send,
    SubscriptionType,
)
from dispatcher.state import SubscriptionState
from wal import RecordBatch, decode_batch, encode_columns


def batch_at(base: int, count: int, keys: list[bytes] | None = None) -> RecordBatch:
    """A real batch of ``count`` records placed at offset ``base``."""
    first = decode_batch(encode_columns([b"v"] * count, keys=keys))
    assert first is not None
    placed = decode_batch(first.with_base_offset(base))
    assert placed is not None
    return placed


def state_of(kind: SubscriptionType = SubscriptionType.EXCLUSIVE) -> SubscriptionState:
    """A state with one partition, nothing acknowledged."""
    return SubscriptionState([PartitionSnapshot(0)], DispatchPolicy(type=kind), random=lambda: 0.5)


def test_a_fetched_that_sends_moves_and_counts_a_change() -> None:
    """Scenario: one consumer with credit; a ``Fetched`` of records 0..2, then the same
    batch again (a stale read: nothing new in it).
    Expected: the first sends 0..2, sets ``moved`` and raises ``changes`` (the sent mark
    is persisted); the second sends nothing, leaves ``changes`` alone and clears
    ``moved``, so the shell does not read again at once for it."""
    state = state_of()
    state.handle(Attach("c", "c", 10), 0.0)
    before = state.changes
    actions = state.handle(Fetched(0, [batch_at(0, 3)]), 1.0)
    sends = [a for a in actions if isinstance(a, Send)]
    assert len(sends) == len(actions)
    assert [(a.delivery.from_offset, a.delivery.to_offset) for a in sends] == [(0, 3)]
    assert state.moved
    assert state.changes > before
    changes = state.changes
    assert state.handle(Fetched(0, [batch_at(0, 3)]), 2.0) == []
    assert not state.moved
    assert state.changes == changes


def test_a_fetched_with_no_credit_does_not_move() -> None:
    """Scenario: one consumer with no credit; a ``Fetched`` of records 0..2.
    Expected: nothing sent, the read position stays at 0, ``moved`` is False."""
    state = state_of()
    state.handle(Attach("c", "c", 0), 0.0)
    assert state.handle(Fetched(0, [batch_at(0, 3)]), 1.0) == []
    assert state.read_position(0) == 0
    assert not state.moved


def key_owned_by_b() -> bytes:
    """A key that consumer ``b`` owns beside ``a`` (rendezvous hashing over slots, the
    rule of :mod:`dispatcher.partition_book`)."""
    for key in (b"k%d" % i for i in range(1_000)):
        slot = key_slot(key)
        if max("ab", key=lambda n: zlib.crc32(b"%s/%d" % (n.encode(), slot))) == "b":
            return key
    raise AssertionError("no key of b's among 1,000")


def test_records_set_aside_count_as_moving() -> None:
    """Scenario: key_shared; ``a`` alone took records 0..1 of a key that moves to ``b``,
    and nacked them (they wait, ready); ``b`` joins with no credit; a ``Fetched`` of the
    batch 0..1 again (the read position is past it already).
    Expected: nothing sent; both records set aside for ``b`` (``set_aside_total`` +2),
    and ``moved`` is True although the read position stayed at 2: setting records aside
    is progress, so the shell reads on."""
    key = key_owned_by_b()
    state = state_of(SubscriptionType.KEY_SHARED)
    state.handle(Attach("a", "a", 10), 0.0)
    assert len(state.handle(Fetched(0, [batch_at(0, 2, keys=[key] * 2)]), 1.0)) == 1
    state.handle(Nack(0, 0, 2, delay_s=0.0), 2.0)
    state.handle(Attach("b", "b", 0), 2.5)
    aside = state.set_aside_total
    assert state.handle(Fetched(0, [batch_at(0, 2, keys=[key] * 2)]), 3.0) == []
    assert state.read_position(0) == 2
    assert state.set_aside_total == aside + 2
    assert state.moved


def test_a_fetched_of_an_unknown_partition_is_refused() -> None:
    """Scenario: a ``Fetched`` of partition 1 on a one-partition subscription.
    Expected: ``InvalidSubscriptionError``, as every command naming a bad partition."""
    state = state_of()
    with pytest.raises(InvalidSubscriptionError):
        state.handle(Fetched(1, []), 0.0)
    with pytest.raises(InvalidSubscriptionError):
        state.handle(Fetched(-1, []), 0.0)
