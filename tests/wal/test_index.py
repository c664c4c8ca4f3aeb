"""Pure tests of the sparse offset index (:mod:`wal.index`): no disk, no event loop."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wal.errors import IndexCorruptError
from wal.index import ENTRY_SIZE, NO_TIMESTAMP, OffsetIndex

_U32_MAX = 0xFFFFFFFF


def _index(base: int, entries: list[tuple[int, int]]) -> OffsetIndex:
    """An index at ``base`` holding ``entries`` (absolute offsets)."""
    index = OffsetIndex(base)
    for offset, position in entries:
        index.append(offset, position)
    return index


def _raw(entries: list[tuple[int, int]], max_ts: int = NO_TIMESTAMP) -> bytes:
    """Stored bytes of ``(relative_offset, position)`` entries, each with ``max_ts``."""
    return b"".join(struct.pack("<IIq", rel, pos, max_ts) for rel, pos in entries)


# ---------------------------------------------------------------------------------------
# lookup


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (0, None),
        (99, None),
        (100, (100, 0)),
        (139, (100, 0)),
        (140, (140, 4096)),
        (141, (140, 4096)),
        (199, (140, 4096)),
        (200, (200, 8192)),
        (10**12, (200, 8192)),
    ],
)
def test_lookup_table_from_the_docstring(offset: int, expected: tuple[int, int] | None) -> None:
    """Base 100, entries at relative 0/40/100: below base is None, else the last entry <= offset."""
    index = _index(100, [(100, 0), (140, 4096), (200, 8192)])
    assert index.lookup(offset) == expected


@pytest.mark.parametrize(
    ("offset", "expected"),
    [(49, None), (50, (50, 0)), (59, (50, 0)), (60, (60, 512)), (61, (60, 512))],
)
def test_lookup_before_the_first_entry_falls_back_to_base(
    offset: int, expected: tuple[int, int] | None
) -> None:
    """With a first entry above the base, offsets before it map to (base, 0)."""
    index = _index(50, [(60, 512)])
    assert index.lookup(offset) == expected


@pytest.mark.parametrize(("offset", "expected"), [(6, None), (7, (7, 0)), (10**9, (7, 0))])
def test_lookup_on_an_empty_index(offset: int, expected: tuple[int, int] | None) -> None:
    """An empty index answers (base, 0) at or above its base and None below it."""
    assert OffsetIndex(7).lookup(offset) == expected


@given(
    st.integers(0, 2**40),
    st.lists(st.integers(0, 10_000), min_size=0, max_size=30, unique=True),
    st.integers(-50, 12_000),
)
def test_lookup_property(base: int, rels: list[int], delta: int) -> None:
    """lookup returns the greatest entry at or below the offset, (base, 0), or None below base."""
    entries = [(base + r, 8 * (i + 1)) for i, r in enumerate(sorted(rels))]
    index = _index(base, entries)
    offset = base + delta
    at_or_below = [e for e in entries if e[0] <= offset]
    if offset < base:
        assert index.lookup(offset) is None
    elif at_or_below:
        assert index.lookup(offset) == at_or_below[-1]
    else:
        assert index.lookup(offset) == (base, 0)


# ---------------------------------------------------------------------------------------
# append


@pytest.mark.parametrize(
    ("offset", "position"),
    [(110, 100), (105, 100), (110, 50), (105, 200), (104, 200)],
    ids=["same-both", "same-offset", "lower-position", "lower-offset", "both-lower"],
)
def test_append_rejects_entries_that_do_not_increase(offset: int, position: int) -> None:
    """After (110, 100), an entry not strictly above in both offset and position is refused."""
    index = _index(100, [(105, 50), (110, 100)])
    with pytest.raises(ValueError, match="must increase"):
        index.append(offset, position)
    assert index.entries() == [(105, 50), (110, 100)]


@pytest.mark.parametrize(
    ("offset", "accepted"),
    [(99, False), (100, True), (100 + _U32_MAX, True), (100 + _U32_MAX + 1, False)],
)
def test_append_offset_must_fit_the_segment(offset: int, accepted: bool) -> None:
    """The relative offset must be in [0, 2**32): below the base or past u32 is refused."""
    index = OffsetIndex(100)
    if accepted:
        index.append(offset, 0)
        assert index.entries() == [(offset, 0)]
        return
    with pytest.raises(ValueError, match="does not fit"):
        index.append(offset, 0)
    assert len(index) == 0


def test_append_len_last_and_entries() -> None:
    """Entries accumulate in order; len() counts them and last() is the newest."""
    index = OffsetIndex(0)
    assert index.last() is None
    assert len(index) == 0
    index.append(0, 0)
    index.append(10, 4096)
    assert len(index) == 2
    assert index.last() == (10, 4096)
    assert index.entries() == [(0, 0), (10, 4096)]


# ---------------------------------------------------------------------------------------
# truncation


@pytest.mark.parametrize(
    ("position", "kept"),
    [
        (0, []),
        (1, [(0, 0)]),
        (100, [(0, 0)]),
        (101, [(0, 0), (10, 100)]),
        (200, [(0, 0), (10, 100)]),
        (201, [(0, 0), (10, 100), (20, 200)]),
        (10**9, [(0, 0), (10, 100), (20, 200)]),
    ],
)
def test_truncate_to_position(position: int, kept: list[tuple[int, int]]) -> None:
    """Entries at or beyond the cut position go; entries before it stay."""
    index = _index(0, [(0, 0), (10, 100), (20, 200)])
    index.truncate_to_position(position)
    assert index.entries() == kept


def test_truncate_then_append_again() -> None:
    """After a cut, appending resumes from the kept entries' ordering."""
    index = _index(0, [(0, 0), (10, 100), (20, 200)])
    index.truncate_to_position(150)
    index.append(15, 150)
    assert index.entries() == [(0, 0), (10, 100), (15, 150)]


@pytest.mark.parametrize(("count", "kept"), [(0, 0), (1, 1), (3, 3), (10, 3)])
def test_truncate_entries(count: int, kept: int) -> None:
    """truncate_entries keeps the first ``count`` entries (all, when count exceeds them)."""
    index = _index(0, [(0, 0), (10, 100), (20, 200)])
    index.truncate_entries(count)
    assert len(index) == kept


# ---------------------------------------------------------------------------------------
# to_bytes / from_bytes


def test_to_bytes_layout() -> None:
    """Each entry is 16 bytes: u32 relative offset, u32 position, i64 largest timestamp
    before the entry's batch, little-endian."""
    index = _index(1000, [(1000, 0), (1040, 4096)])
    assert ENTRY_SIZE == 16
    assert index.to_bytes() == _raw([(0, 0), (40, 4096)])
    assert index.encode_entry(1040, 4096, 7) == (
        b"\x28\x00\x00\x00\x00\x10\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00"
    )


def test_max_timestamp_before_survives_a_round_trip() -> None:
    """The newest entry's max_timestamp_before comes back from the stored bytes; an empty
    index reports NO_TIMESTAMP."""
    index = OffsetIndex(0)
    assert index.last_max_timestamp() == NO_TIMESTAMP
    index.append(10, 100, 500)
    index.append(20, 200, 900)
    loaded = OffsetIndex.from_bytes(index.to_bytes(), 0, 1000)
    assert loaded.last_max_timestamp() == 900
    loaded.truncate_entries(1)
    assert loaded.last_max_timestamp() == 500


@given(
    st.integers(0, 2**63),
    st.lists(st.integers(0, _U32_MAX), max_size=40, unique=True),
    st.lists(st.integers(0, 2**31), max_size=40, unique=True),
)
def test_to_bytes_from_bytes_round_trip(base: int, rels: list[int], positions: list[int]) -> None:
    """Any strictly increasing index survives to_bytes/from_bytes, strict and not."""
    count = min(len(rels), len(positions))
    entries = list(
        zip(
            (base + r for r in sorted(rels)[:count]),
            sorted(positions)[:count],
            strict=True,
        )
    )
    index = _index(base, entries)
    data = index.to_bytes()
    assert len(data) == ENTRY_SIZE * count
    log_size = entries[-1][1] + 1 if entries else 0
    for strict in (True, False):
        loaded = OffsetIndex.from_bytes(data, base, log_size, strict=strict)
        assert loaded.entries() == entries
        assert loaded.base_offset == base


def test_from_bytes_empty() -> None:
    """An empty stored index loads as an empty index, even for an empty log."""
    loaded = OffsetIndex.from_bytes(b"", 5, 0)
    assert len(loaded) == 0
    assert loaded.lookup(5) == (5, 0)


@pytest.mark.parametrize("extra", [1, 4, 7])
def test_from_bytes_strict_rejects_torn_size(extra: int) -> None:
    """Strict loading rejects a size that is not a multiple of 8."""
    data = _raw([(0, 0), (10, 100)]) + b"\x01" * extra
    with pytest.raises(IndexCorruptError, match="multiple"):
        OffsetIndex.from_bytes(data, 0, 1000)


@pytest.mark.parametrize(
    "entries",
    [
        [(0, 0), (0, 100)],
        [(10, 0), (5, 100)],
        [(0, 100), (10, 100)],
        [(0, 200), (10, 100)],
        [(0, 0), (10, 100), (5, 200)],
    ],
    ids=["same-offset", "offset-decreases", "same-position", "position-decreases", "later-dip"],
)
@pytest.mark.parametrize("strict", [True, False])
def test_from_bytes_rejects_non_increasing(entries: list[tuple[int, int]], strict: bool) -> None:
    """Entries that do not strictly increase are rejected, strict or not (rebuild the index)."""
    with pytest.raises(IndexCorruptError):
        OffsetIndex.from_bytes(_raw(entries), 0, 1000, strict=strict)


@pytest.mark.parametrize(
    ("log_size", "ok"),
    [(200, False), (201, True), (100, False), (0, False)],
)
def test_from_bytes_strict_position_must_be_inside_the_log(log_size: int, ok: bool) -> None:
    """Strict loading rejects an entry whose position is at or past the log's size."""
    data = _raw([(0, 0), (10, 100), (20, 200)])
    if ok:
        assert len(OffsetIndex.from_bytes(data, 0, log_size)) == 3
        return
    with pytest.raises(IndexCorruptError):
        OffsetIndex.from_bytes(data, 0, log_size)


@pytest.mark.parametrize("extra", [1, 4, 7])
def test_from_bytes_lenient_drops_a_torn_last_entry(extra: int) -> None:
    """Non-strict loading drops the partial trailing entry and keeps the whole ones."""
    data = _raw([(0, 0), (10, 100)]) + _raw([(20, 200)])[:extra]
    loaded = OffsetIndex.from_bytes(data, 50, 1000, strict=False)
    assert loaded.entries() == [(50, 0), (60, 100)]


@pytest.mark.parametrize(
    ("log_size", "kept"),
    [
        (0, []),
        (1, [(0, 0)]),
        (100, [(0, 0)]),
        (101, [(0, 0), (10, 100)]),
        (200, [(0, 0), (10, 100)]),
        (201, [(0, 0), (10, 100), (20, 200)]),
    ],
)
def test_from_bytes_lenient_drops_entries_past_the_log(
    log_size: int, kept: list[tuple[int, int]]
) -> None:
    """Non-strict loading keeps only entries whose position is inside the log."""
    data = _raw([(0, 0), (10, 100), (20, 200)])
    loaded = OffsetIndex.from_bytes(data, 0, log_size, strict=False)
    assert loaded.entries() == kept


def test_from_bytes_lenient_torn_and_past_the_log_together() -> None:
    """A crash can leave both a torn entry and entries ahead of the data: both are dropped."""
    data = _raw([(0, 0), (10, 100), (20, 200)]) + b"\x07\x00"
    loaded = OffsetIndex.from_bytes(data, 10, 150, strict=False)
    assert loaded.entries() == [(10, 0), (20, 100)]


def test_loaded_index_keeps_accepting_appends() -> None:
    """An index loaded from bytes continues: later entries append, earlier ones are refused."""
    loaded = OffsetIndex.from_bytes(_raw([(0, 0), (10, 100)]), 0, 1000)
    loaded.append(20, 200)
    assert loaded.last() == (20, 200)
    with pytest.raises(ValueError, match="must increase"):
        loaded.append(15, 300)
