"""RangeMap (dispatcher.ranges) by example and against a plain dict model (hypothesis).

Pure: no event loop, no disk. Claims checked: ranges stay sorted, disjoint and non-empty;
``total`` is the number of offsets held; ``add`` refuses overlaps; ``overlapping`` clips
to the span; ``cut`` removes exactly the intersection (only the pieces carrying one value
when asked), splits ranges that stick out and returns what it removed, in order.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.ranges import RangeMap


def _map(*ranges: tuple[int, int, str]) -> RangeMap[str]:
    out: RangeMap[str] = RangeMap()
    for begin, end, value in ranges:
        out.add(begin, end, value)
    return out


def _check_shape(ranges: RangeMap[str]) -> None:
    held = list(ranges)
    assert all(b < e for b, e, _ in held)
    for (_, e1, _), (b2, _, _) in itertools.pairwise(held):
        assert e1 <= b2
    assert ranges.total == sum(e - b for b, e, _ in held)
    assert len(ranges) == len(held)
    assert bool(ranges) == bool(held)


def test_an_empty_map_holds_nothing() -> None:
    """Scenario: a new RangeMap.
    Expected: empty, falsy, total 0, nothing overlaps or is cut."""
    ranges: RangeMap[str] = RangeMap()
    assert not ranges
    assert len(ranges) == 0
    assert ranges.total == 0
    assert list(ranges.overlapping(0, 100)) == []
    assert ranges.cut(0, 100) == []


def test_add_keeps_ranges_sorted_and_counts_offsets() -> None:
    """Scenario: three ranges added out of order, two of them adjacent.
    Expected: iteration is in offset order, adjacent ranges stay separate (they may carry
    different values), total counts every offset."""
    ranges = _map((10, 20, "b"), (0, 5, "a"), (20, 22, "c"))
    assert list(ranges) == [(0, 5, "a"), (10, 20, "b"), (20, 22, "c")]
    assert ranges.total == 17
    assert repr(ranges) == "RangeMap([(0, 5, 'a'), (10, 20, 'b'), (20, 22, 'c')])"
    _check_shape(ranges)


@pytest.mark.parametrize(("begin", "end"), [(5, 5), (7, 3)])
def test_add_of_an_empty_range_is_ignored(begin: int, end: int) -> None:
    """Scenario: add() with begin >= end.
    Expected: nothing is added, no error."""
    ranges = _map((0, 2, "a"))
    ranges.add(begin, end, "x")
    assert list(ranges) == [(0, 2, "a")]


@pytest.mark.parametrize(
    ("begin", "end"),
    [
        (9, 11),  # sticks into the start
        (19, 21),  # sticks out of the end
        (12, 15),  # inside
        (5, 25),  # covers it
        (10, 20),  # the same range
        (19, 20),  # last offset only
    ],
)
def test_add_refuses_an_overlap(begin: int, end: int) -> None:
    """Scenario: add() of a range that shares an offset with [10, 20).
    Expected: ValueError, and the map is unchanged."""
    ranges = _map((10, 20, "a"))
    with pytest.raises(ValueError, match="overlaps"):
        ranges.add(begin, end, "x")
    assert list(ranges) == [(10, 20, "a")]


@pytest.mark.parametrize(("begin", "end"), [(5, 10), (20, 30)])
def test_add_accepts_a_touching_range(begin: int, end: int) -> None:
    """Scenario: add() of a range that ends where [10, 20) begins, or begins where it ends.
    Expected: accepted; both ranges are held."""
    ranges = _map((10, 20, "a"))
    ranges.add(begin, end, "x")
    assert ranges.total == 10 + (end - begin)
    _check_shape(ranges)


@pytest.mark.parametrize(
    ("begin", "end", "expected"),
    [
        (0, 100, [(0, 5, "a"), (10, 20, "b"), (30, 40, "c")]),
        (5, 10, []),  # the gap exactly
        (4, 11, [(4, 5, "a"), (10, 11, "b")]),  # clipped at both ends
        (12, 15, [(12, 15, "b")]),  # inside one range
        (20, 30, []),  # ends are exclusive
        (19, 31, [(19, 20, "b"), (30, 31, "c")]),
        (40, 50, []),
    ],
)
def test_overlapping_clips_to_the_span(
    begin: int, end: int, expected: list[tuple[int, int, str]]
) -> None:
    """Scenario: overlapping() over spans that hit gaps, edges and insides.
    Expected: the pieces inside the span, clipped, in order; the map is unchanged."""
    ranges = _map((0, 5, "a"), (10, 20, "b"), (30, 40, "c"))
    assert list(ranges.overlapping(begin, end)) == expected
    assert ranges.total == 25


def test_overlapping_is_a_snapshot() -> None:
    """Scenario: the map is changed while the result of overlapping() is iterated.
    Expected: the iteration sees the pieces as they were when it was asked."""
    ranges = _map((0, 5, "a"), (10, 20, "b"))
    seen = []
    for begin, end, value in ranges.overlapping(0, 100):
        ranges.cut(begin, end)
        seen.append((begin, end, value))
    assert seen == [(0, 5, "a"), (10, 20, "b")]
    assert not ranges


@pytest.mark.parametrize(
    ("begin", "end", "removed", "left"),
    [
        (12, 15, [(12, 15, "b")], [(0, 5, "a"), (10, 12, "b"), (15, 20, "b")]),  # split
        (0, 5, [(0, 5, "a")], [(10, 20, "b")]),  # exactly one range
        (3, 12, [(3, 5, "a"), (10, 12, "b")], [(0, 3, "a"), (12, 20, "b")]),
        (5, 10, [], [(0, 5, "a"), (10, 20, "b")]),  # the gap
        (-10, 100, [(0, 5, "a"), (10, 20, "b")], []),
        (19, 20, [(19, 20, "b")], [(0, 5, "a"), (10, 19, "b")]),  # the last offset
        (10, 11, [(10, 11, "b")], [(0, 5, "a"), (11, 20, "b")]),  # the first offset
    ],
)
def test_cut_removes_exactly_the_intersection(
    begin: int,
    end: int,
    removed: list[tuple[int, int, str]],
    left: list[tuple[int, int, str]],
) -> None:
    """Scenario: cut() of spans that split a range, take whole ranges or hit a gap.
    Expected: it returns the removed pieces in order; what sticks out stays, with its value;
    total drops by exactly what was removed."""
    ranges = _map((0, 5, "a"), (10, 20, "b"))
    assert ranges.cut(begin, end) == removed
    assert list(ranges) == left
    assert ranges.total == 15 - sum(e - b for b, e, _ in removed)
    _check_shape(ranges)


def test_cut_only_removes_pieces_carrying_that_value() -> None:
    """Scenario: cut(only=v) over a span holding ranges of two values (compared by
    identity, as leases are).
    Expected: only the ranges whose value *is* v are removed (and split); others stay."""
    first, second = ["lease 1"], ["lease 2"]
    ranges: RangeMap[list[str]] = RangeMap()
    ranges.add(0, 4, first)
    ranges.add(4, 8, second)
    ranges.add(8, 12, first)
    assert ranges.cut(2, 10, only=first) == [(2, 4, first), (8, 10, first)]
    assert list(ranges) == [(0, 2, first), (4, 8, second), (10, 12, first)]
    assert ranges.total == 8
    equal_but_not_same = ["lease 2"]
    assert ranges.cut(0, 12, only=equal_but_not_same) == []
    assert ranges.total == 8


def test_clear_forgets_everything() -> None:
    """Scenario: clear() on a map with ranges.
    Expected: empty, total 0; ranges can be added again."""
    ranges = _map((0, 5, "a"), (10, 20, "b"))
    ranges.clear()
    assert not ranges
    assert ranges.total == 0
    ranges.add(0, 20, "c")
    assert list(ranges) == [(0, 20, "c")]


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "cut", "cut_only"]),
        st.integers(0, 40),
        st.integers(0, 10),
        st.sampled_from("abc"),
    ),
    max_size=40,
)


@given(_OPS)
def test_matches_a_dict_model(ops: list[tuple[str, int, int, str]]) -> None:
    """Scenario: random add / cut / cut(only=) sequences, mirrored in a dict offset -> value.
    Expected: after every step the map holds exactly the model's offsets with their values,
    overlaps are refused exactly when the model has one of the offsets, cut returns
    exactly the removed offsets, and the shape invariants hold."""
    ranges: RangeMap[str] = RangeMap()
    model: dict[int, str] = {}
    values = {v: v for v in "abc"}  # one object per value, so `only` compares by identity
    for op, begin, length, name in ops:
        end = begin + length
        value = values[name]
        span = set(range(begin, end))
        if op == "add":
            if span & model.keys():
                with pytest.raises(ValueError, match="overlaps"):
                    ranges.add(begin, end, value)
            else:
                ranges.add(begin, end, value)
                model.update(dict.fromkeys(span, value))
        else:
            only = value if op == "cut_only" else None
            gone = {o for o in span & model.keys() if only is None or model[o] is only}
            removed = ranges.cut(begin, end, only=only)
            assert {o for b, e, _ in removed for o in range(b, e)} == gone
            assert all(model[o] is v for b, e, v in removed for o in range(b, e))
            assert [b for b, _, _ in removed] == sorted(b for b, _, _ in removed)
            for o in gone:
                del model[o]
        got = {o: v for b, e, v in ranges for o in range(b, e)}
        assert got == model
        _check_shape(ranges)
        probe = list(ranges.overlapping(10, 20))
        assert {o for b, e, _ in probe for o in range(b, e)} == {o for o in model if 10 <= o < 20}
