"""The idempotent-producer table: pure, no loop, no disk."""

from __future__ import annotations

import pytest

from broker.producers import (
    WINDOW,
    Admit,
    Duplicate,
    InFlight,
    OutOfSequence,
    ProducerTable,
)


def appended(table: ProducerTable, pid: int, seq: int, count: int, first: int) -> None:
    assert table.admit(pid, seq, count) == Admit()
    table.commit(pid, seq, first, first + count - 1)


def test_the_worked_example() -> None:
    """Producer 7 appended 0-9 at 100-109 and 10-19 at 110-119: a retry of 10 is a duplicate
    with its original offsets; 20 is admitted; 30 is a gap (expected 25 after 20-24)."""
    table = ProducerTable()
    appended(table, 7, 0, 10, 100)
    appended(table, 7, 10, 10, 110)
    assert table.admit(7, 10, 10) == Duplicate(110, 119)
    appended(table, 7, 20, 5, 120)
    assert table.admit(7, 30, 5) == OutOfSequence(expected=25, got=30)


def test_batches_without_a_producer_are_always_admitted() -> None:
    """producer_id -1: no state, every batch admitted, commit is a no-op."""
    table = ProducerTable()
    for _ in range(3):
        assert table.admit(-1, -1, 4) == Admit()
        table.commit(-1, -1, 0, 3)
    assert table.snapshot() == {}


def test_a_retry_while_the_first_is_in_flight_waits_for_it() -> None:
    """An admitted batch not yet committed: its twin gets InFlight; after release (the
    append failed) the same batch is admitted again."""
    table = ProducerTable()
    assert table.admit(1, 0, 3) == Admit()
    assert table.admit(1, 0, 3) == InFlight(1, 0)
    table.release(1, 0)
    assert table.admit(1, 0, 3) == Admit()


def test_pipelined_batches_follow_the_in_flight_ones() -> None:
    """Two batches admitted back to back before either commits: the second must continue
    the first's sequence."""
    table = ProducerTable()
    assert table.admit(1, 0, 3) == Admit()
    assert table.admit(1, 3, 2) == Admit()
    assert table.admit(1, 6, 1) == OutOfSequence(expected=5, got=6)
    table.commit(1, 0, 0, 2)
    table.commit(1, 3, 3, 4)
    assert table.admit(1, 0, 3) == Duplicate(0, 2)


def test_only_the_last_window_batches_are_remembered() -> None:
    """After WINDOW + 1 batches the oldest retry is too old: OutOfSequence, never a second
    append."""
    table = ProducerTable()
    for i in range(WINDOW + 1):
        appended(table, 9, i, 1, i)
    assert table.admit(9, 0, 1) == OutOfSequence(expected=WINDOW + 1, got=0)
    assert table.admit(9, 1, 1) == Duplicate(1, 1)


def test_a_new_producer_may_start_at_any_sequence() -> None:
    """Unknown producer (e.g. its state expired with retention): any first sequence."""
    assert ProducerTable().admit(5, 1234, 2) == Admit()


@pytest.mark.parametrize("observed", [False, True])
def test_snapshot_restore_and_observe_rebuild_the_same_answers(observed: bool) -> None:
    """State rebuilt from a snapshot, or by observing the batches in the log, answers
    retries exactly like the original table."""
    table = ProducerTable()
    appended(table, 3, 0, 2, 10)
    appended(table, 3, 2, 4, 12)
    if observed:
        rebuilt = ProducerTable()
        rebuilt.observe(3, 0, 10, 11)
        rebuilt.observe(3, 2, 12, 15)
        rebuilt.observe(-1, -1, 16, 20)  # a batch without a producer is ignored
    else:
        rebuilt = ProducerTable.restore(table.snapshot())
    assert rebuilt.admit(3, 2, 4) == Duplicate(12, 15)
    assert rebuilt.admit(3, 7, 1) == OutOfSequence(expected=6, got=7)


def test_restore_rejects_a_damaged_snapshot() -> None:
    """A row whose offsets disagree with its count: ValueError naming the row."""
    with pytest.raises(ValueError, match="damaged"):
        ProducerTable.restore({"1": [[0, 5, 10, 11]]})
