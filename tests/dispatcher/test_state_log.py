"""The subscription-state log's replay rule (:func:`dispatcher.state_log.replay`): pure,
no loop and no disk."""

from __future__ import annotations

import pytest

from dispatcher import cursor_journal, state_file
from dispatcher.state_log import SNAPSHOT_KEY, record_value, replay


def _doc(name: str, cursor: int, seq: int) -> state_file.StateDoc:
    return state_file.StateDoc(
        version=state_file.VERSION,
        seq=seq,
        topic="orders",
        subscription=name,
        type="exclusive",
        mode="at_least_once",
        partitions=[state_file.PartitionDoc(cursor, [], cursor, [])],
    )


def _rec(snapshot: bool, *states: tuple[str, int | None]) -> tuple[bytes | None, bytes]:
    entries = [
        cursor_journal.Entry(i, name, None if cursor is None else _doc(name, cursor, i))
        for i, (name, cursor) in enumerate(states)
    ]
    return (SNAPSHOT_KEY if snapshot else None, record_value(entries))


SNAP = _rec(True, ("a", 10), ("b", 4))
A12 = _rec(False, ("a", 12))
B_GONE = _rec(False, ("b", None))
C0 = _rec(False, ("c", 0))


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], None),
        ([SNAP], {"a": 10, "b": 4}),
        ([SNAP, A12, B_GONE, C0], {"a": 12, "c": 0}),
        # the snapshot's segment deleted on this replica: the deltas alone say the same
        ([A12, B_GONE, C0], {"a": 12, "c": 0}),
        # a later snapshot replaces everything before it (b was deleted before it)
        ([A12, C0, _rec(True, ("a", 20)), _rec(False, ("d", 1))], {"a": 20, "d": 1}),
        # an empty snapshot: every subscription is gone
        ([SNAP, _rec(True)], {}),
        # a tombstone, then the name made again
        ([SNAP, B_GONE, _rec(False, ("b", 0))], {"a": 10, "b": 0}),
    ],
)
def test_replay_starts_at_the_last_snapshot_and_applies_records_in_log_order(
    records: list[tuple[bytes | None, bytes]], expected: dict[str, int] | None
) -> None:
    """Scenario: state-log records (snapshots and deltas, tombstones among them).
    Expected: each subscription's last state in log order from the last snapshot on, a
    tombstone removing it; ``None`` for a log that never held a save."""
    states = replay(records)
    if expected is None:
        assert states is None
        return
    assert states is not None
    assert {name: doc.partitions[0].cursor for name, doc in states.items()} == expected


def test_a_record_that_is_not_a_whole_frame_is_refused() -> None:
    """Scenario: a record whose value is a frame cut short. Expected: ValueError (a
    replica's batches are CRC-checked, so this is not a torn write to skip)."""
    key, value = A12
    with pytest.raises(ValueError, match="not a whole frame"):
        replay([SNAP, (key, value[:-3])])
