"""Pure tests of the roll and retention rules (:mod:`wal.policy`): no disk, no event loop."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wal.policy import SegmentInfo, segments_to_delete, should_roll

MIB = 1 << 20
NOW = 1_700_000_000_000


def _segments(
    sizes: list[int], timestamps: Sequence[int | None] | None = None
) -> list[SegmentInfo]:
    """Contiguous segments of 100 offsets each; the last is the active one."""
    stamps = timestamps if timestamps is not None else [NOW] * len(sizes)
    return [
        SegmentInfo(100 * i, 100 * (i + 1), size, ts)
        for i, (size, ts) in enumerate(zip(sizes, stamps, strict=True))
    ]


# ---------------------------------------------------------------------------------------
# should_roll


@pytest.mark.parametrize(
    ("segment_size", "incoming", "age", "segment_ms", "expected"),
    [
        # An empty segment never rolls, whatever arrives and however old it is.
        (0, 10 * MIB, None, None, False),
        (0, 10 * MIB, 10**9, 1, False),
        (0, 129, None, None, False),
        # Size boundary at segment_bytes = 128.
        (100, 27, None, None, False),
        (100, 28, None, None, False),
        (100, 29, None, None, True),
        (128, 0, None, None, False),
        (128, 1, None, None, True),
        (1, 128, None, None, True),
        (1, 127, None, None, False),
        # Age boundary at segment_ms = 1000.
        (1, 1, 999, 1000, False),
        (1, 1, 1000, 1000, True),
        (1, 1, 1001, 1000, True),
        (1, 1, None, 1000, False),
        (1, 1, 10**9, None, False),
        # Either reason is enough.
        (100, 29, 0, 1000, True),
    ],
)
def test_should_roll_table(
    segment_size: int, incoming: int, age: int | None, segment_ms: int | None, expected: bool
) -> None:
    """Roll when the segment is non-empty and would exceed 128 B, or is at least segment_ms old."""
    result = should_roll(
        segment_size=segment_size,
        incoming_bytes=incoming,
        segment_age_ms=age,
        segment_bytes=128,
        segment_ms=segment_ms,
    )
    assert result is expected


@given(
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.none() | st.integers(0, 10_000),
    st.integers(1, 10_000),
    st.none() | st.integers(1, 10_000),
)
def test_should_roll_property(
    size: int, incoming: int, age: int | None, segment_bytes: int, segment_ms: int | None
) -> None:
    """An empty segment never rolls; a non-empty one rolls exactly on overflow or old age."""
    result = should_roll(
        segment_size=size,
        incoming_bytes=incoming,
        segment_age_ms=age,
        segment_bytes=segment_bytes,
        segment_ms=segment_ms,
    )
    old = age is not None and segment_ms is not None and age >= segment_ms
    assert result is (size > 0 and (size + incoming > segment_bytes or old))


# ---------------------------------------------------------------------------------------
# segments_to_delete: by bytes


@pytest.mark.parametrize(
    ("sizes", "retention_bytes", "expected"),
    [
        ([10, 10, 10], None, []),
        ([10, 10, 10], 30, []),
        ([10, 10, 10], 20, [0]),
        ([10, 10, 10], 10, [0, 100]),
        ([10, 10, 10], 0, [0, 100]),
        ([5, 10, 3], 18, []),
        ([5, 10, 3], 13, [0]),
        ([5, 10, 3], 3, [0, 100]),
        ([10], 0, []),
        ([], 0, []),
    ],
)
def test_retention_by_bytes(
    sizes: list[int], retention_bytes: int | None, expected: list[int]
) -> None:
    """Oldest sealed segments go while the log is over retention_bytes; the active one stays."""
    result = segments_to_delete(
        _segments(sizes),
        now_ms=NOW,
        retention_ms=None,
        retention_bytes=retention_bytes,
        floor_offset=None,
    )
    assert result == expected


@pytest.mark.parametrize(
    ("sizes", "retention_bytes", "floor", "expected"),
    [
        ([10 * MIB, 10 * MIB, 6 * MIB], 15 * MIB, 250, [0]),
        ([10 * MIB, 10 * MIB, 6 * MIB], 15 * MIB, 150, [0]),
        ([10 * MIB, 10 * MIB, 1 * MIB], 15 * MIB, None, []),
        ([10, 10, 10], 20, None, [0]),
        ([10, 10, 10], 21, None, []),
        ([10, 10, 10], 10, None, [0, 100]),
    ],
    ids=[
        "docstring-example",
        "docstring-example-floor",
        "would-drop-below",
        "exactly-at",
        "one-over",
        "two-go",
    ],
)
def test_retention_by_bytes_never_shrinks_the_log_below_the_limit(
    sizes: list[int], retention_bytes: int, floor: int | None, expected: list[int]
) -> None:
    """Kafka's rule, as documented: a segment goes only if the log without it still holds at
    least retention_bytes. The policy module's worked example: 10 + 10 + 6 MiB with a 15 MiB
    limit deletes the first segment (16 MiB remain) and keeps the second (6 MiB would
    remain); a 1 MiB active segment instead means nothing is deleted (11 MiB would remain).
    """
    result = segments_to_delete(
        _segments(sizes),
        now_ms=NOW,
        retention_ms=None,
        retention_bytes=retention_bytes,
        floor_offset=floor,
    )
    assert result == expected


# ---------------------------------------------------------------------------------------
# segments_to_delete: by age


@pytest.mark.parametrize(
    ("age", "deleted"),
    [(0, False), (99, False), (100, False), (101, True), (10**9, True)],
)
def test_retention_by_age_boundary(age: int, deleted: bool) -> None:
    """A sealed segment goes once its newest record is strictly older than retention_ms."""
    segments = _segments([10, 10], [NOW - age, NOW - 10**9])
    result = segments_to_delete(
        segments, now_ms=NOW, retention_ms=100, retention_bytes=None, floor_offset=None
    )
    assert result == ([0] if deleted else [])


@pytest.mark.parametrize(
    ("timestamps", "expected"),
    [
        ([NOW - 500, NOW - 400, NOW - 300, NOW - 500], [0, 100, 200]),
        ([NOW - 500, NOW - 50, NOW - 500, NOW - 500], [0]),
        ([NOW - 50, NOW - 500, NOW - 500, NOW - 500], []),
        ([None, NOW - 500, NOW - 500, NOW - 500], []),
        ([NOW - 500, None, NOW - 500, NOW - 500], [0]),
        ([NOW + 10**6, NOW - 500, NOW - 500, NOW - 500], []),
    ],
    ids=["all-old", "young-stops", "young-first", "empty-first", "empty-stops", "future-ts"],
)
def test_retention_by_age_deletes_only_a_contiguous_prefix(
    timestamps: list[int | None], expected: list[int]
) -> None:
    """Deletion stops at the first sealed segment that is not expired, even if later ones are."""
    result = segments_to_delete(
        _segments([10, 10, 10, 10], timestamps),
        now_ms=NOW,
        retention_ms=100,
        retention_bytes=None,
        floor_offset=None,
    )
    assert result == expected


@pytest.mark.parametrize(
    ("timestamps", "retention_bytes", "expected"),
    [
        ([NOW - 500, NOW, NOW], 20, [0]),
        ([NOW, NOW - 500, NOW], 10, [0, 100]),
        ([NOW, NOW - 500, NOW], 30, []),
        ([NOW - 500, NOW - 500, NOW], 30, [0, 100]),
    ],
)
def test_retention_age_or_bytes_either_suffices(
    timestamps: list[int], retention_bytes: int, expected: list[int]
) -> None:
    """A segment is deleted when it is too old or the log too big, walking oldest first."""
    result = segments_to_delete(
        _segments([10, 10, 10], timestamps),
        now_ms=NOW,
        retention_ms=100,
        retention_bytes=retention_bytes,
        floor_offset=None,
    )
    assert result == expected


# ---------------------------------------------------------------------------------------
# segments_to_delete: floor and the active segment


@pytest.mark.parametrize(
    ("floor", "expected"),
    [
        (0, []),
        (99, []),
        (100, [0]),
        (199, [0]),
        (200, [0, 100]),
        (299, [0, 100]),
        (300, [0, 100, 200]),
        (10**12, [0, 100, 200]),
        (None, [0, 100, 200]),
    ],
)
def test_floor_offset_stops_deletion(floor: int | None, expected: list[int]) -> None:
    """A segment holding the floor offset or a later one is never deleted, nor anything after."""
    result = segments_to_delete(
        _segments([10, 10, 10, 10], [NOW - 10**6] * 4),
        now_ms=NOW,
        retention_ms=1,
        retention_bytes=0,
        floor_offset=floor,
    )
    assert result == expected


@pytest.mark.parametrize(
    ("retention_ms", "retention_bytes"),
    [(1, None), (None, 0), (1, 0)],
)
def test_never_deletes_the_active_segment(
    retention_ms: int | None, retention_bytes: int | None
) -> None:
    """Even an expired, oversized active segment (the last) is kept; only sealed ones go."""
    for count in (1, 2, 5):
        segments = _segments([MIB] * count, [NOW - 10**6] * count)
        result = segments_to_delete(
            segments,
            now_ms=NOW,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            floor_offset=None,
        )
        assert result == [s.base_offset for s in segments[:-1]]
        assert segments[-1].base_offset not in result


def test_no_retention_deletes_nothing() -> None:
    """With retention_ms and retention_bytes both None, nothing is deleted."""
    result = segments_to_delete(
        _segments([MIB] * 4, [0] * 4),
        now_ms=NOW,
        retention_ms=None,
        retention_bytes=None,
        floor_offset=None,
    )
    assert result == []


_segment_facts = st.lists(
    st.tuples(
        st.integers(0, 50),  # offsets in the segment
        st.integers(0, 1000),  # size in bytes
        st.none() | st.integers(NOW - 10_000, NOW + 1000),
    ),
    max_size=8,
)


@given(
    _segment_facts,
    st.none() | st.integers(0, 10_000),
    st.none() | st.integers(0, 5000),
    st.none() | st.integers(0, 400),
)
def test_retention_property(
    facts: list[tuple[int, int, int | None]],
    retention_ms: int | None,
    retention_bytes: int | None,
    floor: int | None,
) -> None:
    """The result is a prefix of the sealed segments and none of it reaches the floor."""
    segments: list[SegmentInfo] = []
    base = 0
    for count, size, ts in facts:
        segments.append(SegmentInfo(base, base + count, size, ts))
        base += count
    result = segments_to_delete(
        segments,
        now_ms=NOW,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        floor_offset=floor,
    )
    sealed = segments[:-1]
    assert len(result) <= len(sealed)
    assert result == [s.base_offset for s in sealed[: len(result)]]
    for seg in sealed[: len(result)]:
        assert floor is None or seg.next_offset <= floor
    if retention_ms is None and retention_bytes is None:
        assert result == []
