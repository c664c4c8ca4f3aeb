"""The subscription-state log's replay rule (:func:`dispatcher.state_log.replay`): pure,
no loop and no disk."""

from __future__ import annotations

import pytest

from dispatcher import cursor_journal, state_file
from dispatcher.state_log import (
    SNAPSHOT_KEY,
    chunk_key,
    only_a_cut_snapshot,
    record_value,
    record_values,
    replay,
    snapshot_keys,
)


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


def _chunk(
    snap: str, index: int, count: int, *states: tuple[str, int | None]
) -> tuple[bytes | None, bytes]:
    return (chunk_key(snap, index, count), _rec(False, *states)[1])


X0, X1, X2 = _chunk("x", 0, 3, ("a", 30)), _chunk("x", 1, 3, ("c", 1)), _chunk("x", 2, 3, ("d", 5))


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        # complete: b (not in it) is gone, the delta after it applies
        ([SNAP, X0, X1, X2, _rec(False, ("c", 2))], {"a": 30, "c": 2, "d": 5}),
        # cut after chunk 1 (crash between chunks): not a snapshot, its chunks are deltas
        ([SNAP, X0, X1], {"a": 30, "b": 4, "c": 1}),
        # cut, then the next leader's deltas and its own complete one-record snapshot
        ([SNAP, X0, X1, C0, _rec(True, ("e", 1))], {"e": 1}),
        # cut, then the next leader's complete chunked snapshot (same count, new id)
        (
            [SNAP, X0, X1, _chunk("y", 0, 2, ("f", 1)), _chunk("y", 1, 2, ("g", 2))],
            {"f": 1, "g": 2},
        ),
        # a last chunk with no chunk 0 before it (another id's run): not complete
        ([SNAP, _chunk("y", 0, 3, ("f", 1)), X1, X2], {"a": 10, "b": 4, "c": 1, "d": 5, "f": 1}),
        # chunks out of order or with a delta between them: not complete
        ([SNAP, X0, A12, X1, X2], {"a": 12, "b": 4, "c": 1, "d": 5}),
        ([SNAP, X0, X2, X1], {"a": 30, "b": 4, "c": 1, "d": 5}),
        # the log starts inside a series (its head trimmed: not possible on a leader, still
        # no snapshot)
        ([X1, X2, C0], {"c": 0, "d": 5}),
    ],
)
def test_a_chunked_snapshot_counts_only_when_every_chunk_is_there_in_order(
    records: list[tuple[bytes | None, bytes]], expected: dict[str, int]
) -> None:
    """Scenario: logs holding snapshot chunks, complete or cut short (a leader crashed
    between chunks), with one-record snapshots and deltas around them. Expected: replay
    starts at the last complete snapshot only (chunks 0..count-1 of one id, consecutive);
    the chunks of a cut series apply as deltas, so a subscription they leave out stays."""
    states = replay(records)
    assert states is not None
    assert {name: doc.partitions[0].cursor for name, doc in states.items()} == expected


@pytest.mark.parametrize(
    ("records", "cut"),
    [
        ([], False),
        # the first snapshot's first chunks and nothing else: a switch killed between them
        ([X0], True),
        ([X0, X1], True),
        # whole: a snapshot
        ([X0, X1, X2], False),
        ([SNAP], False),
        # anything else after the chunks, or the log not starting at chunk 0: not that shape
        ([X0, C0], False),
        ([X0, X2], False),
        ([X1, X2], False),
        ([SNAP, X0, X1], False),
        ([X0, _chunk("y", 1, 3, ("c", 1))], False),
    ],
)
def test_only_a_cut_snapshot_is_the_first_snapshot_cut_short_and_nothing_else(
    records: list[tuple[bytes | None, bytes]], cut: bool
) -> None:
    """Scenario: logs as their first records would be. Expected: only_a_cut_snapshot is
    true exactly when they are chunks 0..k (k < count - 1) of one series and nothing
    more: what a first snapshot cut by a crash leaves (its caller then replays nothing)."""
    assert only_a_cut_snapshot([key for key, _value in records]) is cut


def test_record_values_split_entries_under_the_bound_and_replay_to_the_same_states() -> None:
    """Scenario: 3000 subscriptions' states split with a 64 KiB bound, written as one
    chunked snapshot. Expected: several records, each at most the bound of entries (a
    12-byte frame header over it), every entry in exactly one, in order; the replay of
    the chunks gives all 3000 states; one record only (key SNAPSHOT_KEY) for a small
    snapshot, and one empty record for no entries."""
    entries = [cursor_journal.Entry(i, f"s{i:05}", _doc(f"s{i:05}", i, i)) for i in range(3000)]
    values = record_values(entries, max_bytes=64 * 1024)
    assert len(values) > 3
    assert all(len(v) <= 64 * 1024 + cursor_journal.HEADER.size for v in values)
    parsed = [e.subscription for v in values for e in cursor_journal.parse(v).entries]
    assert parsed == [e.subscription for e in entries]
    keys = snapshot_keys("abc", len(values))
    states = replay([(None, record_value(entries[:5])), *zip(keys, values, strict=True)])
    assert states is not None
    assert {n: d.partitions[0].cursor for n, d in states.items()} == {
        f"s{i:05}": i for i in range(3000)
    }
    assert snapshot_keys("abc", 1) == [SNAPSHOT_KEY]
    assert len(record_values(entries[:3])) == 1
    assert [cursor_journal.parse(v).entries for v in record_values([])] == [[]]


def test_one_entry_over_the_bound_is_alone_in_its_record() -> None:
    """Scenario: three entries, the middle one bigger than the bound. Expected: three
    records, the big one alone (a record cannot split one subscription's state)."""
    big = _doc("big", 1, 1)
    big.partitions[0] = state_file.PartitionDoc(1, [(n * 2, n * 2 + 1) for n in range(2000)])
    entries = [
        cursor_journal.Entry(0, "a", _doc("a", 0, 0)),
        cursor_journal.Entry(1, "big", big),
        cursor_journal.Entry(2, "c", _doc("c", 0, 2)),
    ]
    values = record_values(entries, max_bytes=4096)
    assert [[e.subscription for e in cursor_journal.parse(v).entries] for v in values] == [
        ["a"],
        ["big"],
        ["c"],
    ]
