"""AckRanges against a plain set of acknowledged offsets (hypothesis) and by example."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.acks import AckRanges

_OPS = st.lists(
    st.tuples(st.sampled_from(["ack", "up_to"]), st.integers(0, 60), st.integers(0, 12)),
    max_size=40,
)


def _check(acks: AckRanges, model: set[int], limit: int = 80) -> None:
    cursor = 0
    while cursor in model:
        cursor += 1
    assert acks.cursor == cursor
    assert {o for o in range(limit) if acks.is_acked(o)} == {o for o in range(limit) if o in model}
    ranges = acks.ranges()
    for (b1, e1), (b2, _) in itertools.pairwise(ranges):
        assert b1 < e1 < b2  # sorted, disjoint, not adjacent
    assert all(b > acks.cursor for b, _ in ranges)


@given(_OPS)
def test_matches_a_set_model(ops: list[tuple[str, int, int]]) -> None:
    acks, model = AckRanges(), set[int]()
    for op, start, length in ops:
        if op == "ack":
            before = len(model)
            model |= set(range(start, start + length))
            assert acks.ack(start, start + length) == len(model) - before
        else:
            before = len(model)
            model |= set(range(start))
            assert acks.ack_up_to(start) == len(model) - before
        _check(acks, model)


@given(_OPS, st.integers(0, 70), st.integers(0, 70))
def test_unacked_is_the_complement(ops: list[tuple[str, int, int]], lo: int, span: int) -> None:
    acks = AckRanges()
    for op, start, length in ops:
        if op == "ack":
            acks.ack(start, start + length)
        else:
            acks.ack_up_to(start)
    hi = lo + span
    got = list(acks.unacked(lo, hi))
    flat = [o for b, e in got for o in range(b, e)]
    assert flat == [o for o in range(lo, hi) if not acks.is_acked(o)]
    assert all(e1 < b2 for (_, e1), (b2, _) in itertools.pairwise(got))  # maximal


@given(_OPS, st.integers(0, 70))
def test_acked_count_below(ops: list[tuple[str, int, int]], below: int) -> None:
    acks = AckRanges()
    for _op, start, length in ops:
        acks.ack(start, start + length)
    expected = sum(1 for o in range(acks.cursor, below) if acks.is_acked(o))
    assert acks.acked_count(below) == expected


def test_out_of_order_acks_advance_the_cursor_when_the_hole_fills() -> None:
    acks = AckRanges(10)
    assert acks.ack(12, 15) == 3
    assert acks.cursor == 10
    assert acks.ranges() == [(12, 15)]
    assert acks.ack(10, 12) == 2
    assert acks.cursor == 15
    assert acks.ranges() == []


def test_acks_below_the_cursor_count_nothing() -> None:
    acks = AckRanges(100)
    assert acks.ack(0, 50) == 0
    assert acks.ack_up_to(80) == 0
    assert acks.cursor == 100


def test_restored_ranges_and_reset() -> None:
    acks = AckRanges(5, [(7, 9), (12, 13)])
    assert acks.ranges() == [(7, 9), (12, 13)]
    assert list(acks.unacked(0, 14)) == [(5, 7), (9, 12), (13, 14)]
    acks.reset(3)
    assert (acks.cursor, acks.ranges()) == (3, [])
