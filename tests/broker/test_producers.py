"""The idempotent-producer table: pure, no loop, no disk."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker.producers import (
    WINDOW,
    Admit,
    AppendedLongAgo,
    Decision,
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


def test_only_the_last_window_batches_keep_their_offsets() -> None:
    """After WINDOW + 1 batches the oldest retry has left the window: answered as appended
    long ago (no offsets), never appended a second time; the others keep their offsets."""
    table = ProducerTable()
    for i in range(WINDOW + 1):
        appended(table, 9, i, 1, i)
    assert table.admit(9, 0, 1) == AppendedLongAgo()
    assert table.admit(9, 1, 1) == Duplicate(1, 1)
    assert table.admit(9, WINDOW + 1, 1) == Admit()


def eight_batches(first_sequence: int = 0) -> ProducerTable:
    """Producer 4 appended 8 batches of 10 from ``first_sequence`` at offsets 100-179;
    the window holds the last WINDOW of them."""
    table = ProducerTable()
    for i in range(8):
        appended(table, 4, first_sequence + 10 * i, 10, 100 + 10 * i)
    return table


@pytest.mark.parametrize(
    ("case", "producer", "seq", "count", "decision"),
    [
        ("exact window hit", 4, 70, 10, Duplicate(170, 179)),
        ("oldest in the window", 4, 30, 10, Duplicate(130, 139)),
        ("old retry: the first batch", 4, 0, 10, AppendedLongAgo()),
        ("old retry: just before the window", 4, 20, 10, AppendedLongAgo()),
        ("old retry, other boundaries", 4, 5, 20, AppendedLongAgo()),
        ("ends exactly at the next sequence", 4, 75, 5, AppendedLongAgo()),
        ("straddles the next sequence", 4, 75, 10, OutOfSequence(expected=80, got=75)),
        ("the next batch", 4, 80, 3, Admit()),
        ("a gap after the next sequence", 4, 81, 1, OutOfSequence(expected=80, got=81)),
        ("unknown producer", 5, 0, 10, Admit()),
        ("unknown producer, any sequence", 5, 1234, 1, Admit()),
    ],
)
def test_admit_boundaries(
    case: str, producer: int, seq: int, count: int, decision: Decision
) -> None:
    """Producer 4 appended sequences 0-79 in batches of 10 (window: 30-79). A batch inside
    [0, 80) is a duplicate: with offsets in the window, without them before it; a batch
    running past 80 or after it is out of sequence; another producer starts anywhere."""
    assert eight_batches().admit(producer, seq, count) == decision, case


@pytest.mark.parametrize(
    ("seq", "count", "decision"),
    [
        (40, 10, AppendedLongAgo()),  # first_sequence itself
        (39, 1, OutOfSequence(expected=120, got=39)),  # just below first_sequence
        (35, 10, OutOfSequence(expected=120, got=35)),  # starts below, ends inside
        (0, 10, OutOfSequence(expected=120, got=0)),  # far below
    ],
)
def test_a_retry_below_the_first_sequence_is_out_of_sequence(
    seq: int, count: int, decision: Decision
) -> None:
    """Producer 4 started at sequence 40 (40-119 appended): a batch starting below 40 was
    never appended by it, so it is OutOfSequence, not a duplicate; 40 itself is one."""
    assert eight_batches(first_sequence=40).admit(4, seq, count) == decision


def test_a_replay_from_zero_is_answered_without_moving_anything() -> None:
    """Scenario: a producer re-sends all 8 of its batches from sequence 0 (a replayed Spark
    task). Expected: every one is a duplicate (the oldest without offsets), and the next
    new batch is still admitted at sequence 80."""
    table = eight_batches()
    answers = [table.admit(4, 10 * i, 10) for i in range(8)]
    assert answers[:3] == [AppendedLongAgo()] * 3
    assert answers[3:] == [Duplicate(100 + 10 * i, 109 + 10 * i) for i in range(3, 8)]
    assert table.admit(4, 80, 10) == Admit()


def test_an_old_retry_is_not_answered_from_in_flight_sequences() -> None:
    """Sequences 0-79 appended, 80-89 admitted but not appended: a retry covering 80-89 is
    its in-flight twin, one running into it is out of sequence, and after the append fails
    (release) nothing at or past 80 is taken for a duplicate."""
    table = eight_batches()
    assert table.admit(4, 80, 10) == Admit()
    assert table.admit(4, 80, 10) == InFlight(4, 80)
    assert table.admit(4, 75, 10) == OutOfSequence(expected=90, got=75)
    table.release(4, 80)
    assert table.admit(4, 80, 5) == Admit()


def test_a_broken_run_moves_the_first_sequence_up() -> None:
    """Batches 0-9 and 10-19 appended; 20-29 and 30-39 admitted back to back; the first
    append fails (release) and the second succeeds. Sequences 20-29 are a hole, so a retry
    of anything before 30 that is not in the window is out of sequence, never a duplicate;
    the window still answers its own batches."""
    table = ProducerTable()
    appended(table, 2, 0, 10, 0)
    appended(table, 2, 10, 10, 10)
    assert table.admit(2, 20, 10) == Admit()
    assert table.admit(2, 30, 10) == Admit()
    table.release(2, 20)
    table.commit(2, 30, 20, 29)
    assert table.admit(2, 20, 10) == OutOfSequence(expected=40, got=20)
    assert table.admit(2, 0, 5) == OutOfSequence(expected=40, got=0)
    assert table.admit(2, 10, 10) == Duplicate(10, 19)
    assert table.admit(2, 30, 10) == Duplicate(20, 29)


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


@pytest.mark.parametrize("how", ["snapshot", "observed"])
def test_the_first_sequence_survives_a_restart(how: str) -> None:
    """Eight batches from sequence 40, rebuilt from a JSON round trip of the snapshot or by
    observing the whole log: a retry of the first batch (out of the window) is still a
    duplicate, one below 40 still out of sequence, and the next batch admitted."""
    table = eight_batches(first_sequence=40)
    if how == "snapshot":
        doc = json.loads(json.dumps(table.snapshot()))
        assert doc["4"]["first_sequence"] == 40
        rebuilt = ProducerTable.restore(doc)
    else:
        rebuilt = ProducerTable()
        for i in range(8):
            rebuilt.observe(4, 40 + 10 * i, 100 + 10 * i, 109 + 10 * i)
    assert rebuilt.snapshot() == table.snapshot()
    assert rebuilt.admit(4, 40, 10) == AppendedLongAgo()
    assert rebuilt.admit(4, 30, 10) == OutOfSequence(expected=120, got=30)
    assert rebuilt.admit(4, 110, 10) == Duplicate(170, 179)
    assert rebuilt.admit(4, 120, 1) == Admit()


def test_a_snapshot_continued_by_observe_keeps_the_first_sequence() -> None:
    """A snapshot after 8 batches, then 3 more batches found in the log after it: the run
    still starts at 0, so the very first batch is a duplicate."""
    table = eight_batches()
    rebuilt = ProducerTable.restore(table.snapshot())
    for i in range(8, 11):
        rebuilt.observe(4, 10 * i, 100 + 10 * i, 109 + 10 * i)
    assert rebuilt.admit(4, 0, 10) == AppendedLongAgo()
    assert rebuilt.admit(4, 110, 10) == Admit()


def test_restore_reads_the_old_format() -> None:
    """A snapshot from before first_sequence (a bare list of rows per producer) opens; the
    run starts at its oldest row: retries of the rows are duplicates with offsets, older
    ones stay out of sequence as they were, and the next batch is admitted."""
    old = {"4": [[30 + 10 * i, 10, 130 + 10 * i, 139 + 10 * i] for i in range(5)]}
    rebuilt = ProducerTable.restore(old)
    assert rebuilt.admit(4, 30, 10) == Duplicate(130, 139)
    assert rebuilt.admit(4, 20, 10) == OutOfSequence(expected=80, got=20)
    assert rebuilt.admit(4, 80, 10) == Admit()
    assert rebuilt.snapshot()["4"]["first_sequence"] == 30


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"1": [[0, 5, 10, 11]]}, "damaged"),  # old format: offsets disagree with count
        ({"1": {"first_sequence": 0, "appended": [[0, 5, 10, 11]]}}, "damaged"),
        ({"1": 7}, "damaged"),  # neither rows nor an object
        (  # the run cannot start after its oldest row
            {"1": {"first_sequence": 5, "appended": [[0, 5, 10, 14]]}},
            "contradicts",
        ),
        (  # a hole inside the rows: the run cannot reach back past it
            {"1": {"first_sequence": 0, "appended": [[0, 5, 10, 14], [9, 1, 15, 15]]}},
            "contradicts",
        ),
    ],
)
def test_restore_rejects_a_damaged_snapshot(doc: dict[str, Any], message: str) -> None:
    """A row whose offsets disagree with its count, an entry of the wrong shape, or a
    first_sequence the rows contradict: ValueError (the partition then rescans the log)."""
    with pytest.raises(ValueError, match=message):
        ProducerTable.restore(doc)
