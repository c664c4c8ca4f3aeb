"""Pure tests of the recovery scan (:func:`wal.recovery.scan`): no disk, no event loop.

The segment layer feeds ``scan`` the bytes of a segment tail; these tests feed it bytes
built in memory: clean logs, torn tails cut at every position, flipped bits and gaps.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proto.batch import HEADER_SIZE, decode_batch, encode_records
from proto.record import Record
from wal.recovery import BatchPos, StopReason, scan


def _batch(base: int, count: int, *, ts: int = 0, value: bytes = b"v") -> bytes:
    """One batch of ``count`` records at ``base``, timestamps ts..ts+count-1."""
    records = [Record(value * (i + 1), timestamp_ms=ts + i) for i in range(count)]
    batch = decode_batch(encode_records(records))
    assert batch is not None
    return batch.with_base_offset(base)


def _log(base: int, counts: list[int]) -> list[bytes]:
    """Contiguous batches starting at ``base`` with the given record counts."""
    parts = []
    for i, count in enumerate(counts):
        parts.append(_batch(base, count, ts=100 * i, value=bytes([65 + i])))
        base += count
    return parts


def _flip(data: bytes, bit: int) -> bytes:
    buf = bytearray(data)
    buf[bit // 8] ^= 1 << (bit % 8)
    return bytes(buf)


# ---------------------------------------------------------------------------------------
# Clean ends


def test_clean_log_ends_at_end() -> None:
    """Three contiguous batches scan to END at the buffer's end, each batch reported."""
    parts = _log(0, [2, 1, 3])
    buf = b"".join(parts)
    result = scan(buf, 0, 0)
    assert result.stop is StopReason.END
    assert result.stop.is_clean()
    assert result.end == len(buf)
    assert result.next_offset == 6
    assert result.detail == ""
    assert result.batches == [
        BatchPos(0, 0, 2, len(parts[0]), 1),
        BatchPos(len(parts[0]), 2, 3, len(parts[1]), 100),
        BatchPos(len(parts[0]) + len(parts[1]), 3, 6, len(parts[2]), 202),
    ]


@pytest.mark.parametrize(("pos", "expected"), [(0, 0), (0, 1200), (64, 7)])
def test_empty_tail_is_clean(pos: int, expected: int) -> None:
    """Nothing to scan: END at ``pos``, next_offset is the expected offset, no batches."""
    buf = bytes(pos)
    result = scan(buf, pos, expected)
    assert result.stop is StopReason.END
    assert (result.end, result.next_offset, result.batches) == (pos, expected, [])


def test_scan_from_a_position() -> None:
    """Scanning from the second batch (as from an index entry) covers only the tail."""
    parts = _log(1200, [4, 2, 5])
    buf = b"".join(parts)
    result = scan(buf, len(parts[0]), 1204)
    assert result.stop is StopReason.END
    assert result.end == len(buf)
    assert result.next_offset == 1211
    assert [b.position for b in result.batches] == [len(parts[0]), len(parts[0]) + len(parts[1])]


def test_no_expected_offset_accepts_any_first_base() -> None:
    """expected_offset None accepts the first batch's base; later ones must follow it."""
    buf = b"".join(_log(5000, [3, 3]))
    result = scan(buf, 0, None)
    assert result.stop is StopReason.END
    assert result.next_offset == 5006
    assert [b.base_offset for b in result.batches] == [5000, 5003]


def test_docstring_example() -> None:
    """Two whole batches then 40 bytes of a third: end at the third, INCOMPLETE, offset 20."""
    parts = _log(0, [10, 10, 1])
    buf = parts[0] + parts[1] + parts[2][:40]
    result = scan(buf, 0, 0)
    assert result.stop is StopReason.INCOMPLETE
    assert not result.stop.is_clean()
    assert result.end == len(parts[0]) + len(parts[1])
    assert result.next_offset == 20


# ---------------------------------------------------------------------------------------
# INCOMPLETE: torn tails


@pytest.mark.parametrize("counts", [[1], [3, 1], [2, 5, 3]])
def test_incomplete_at_every_cut_of_the_last_batch(counts: list[int]) -> None:
    """Cutting the last batch anywhere (1 .. size-1 bytes kept) stops INCOMPLETE before it."""
    parts = _log(0, counts)
    head = b"".join(parts[:-1])
    last = parts[-1]
    for cut in range(1, len(last)):
        result = scan(head + last[:cut], 0, 0)
        assert result.stop is StopReason.INCOMPLETE, cut
        assert result.end == len(head)
        assert result.next_offset == sum(counts[:-1])
        assert len(result.batches) == len(counts) - 1
        assert str(cut) in result.detail


@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=5),
    st.integers(0, 2**40),
    st.data(),
)
def test_any_cut_ends_at_the_last_whole_batch(
    counts: list[int], base: int, data: st.DataObject
) -> None:
    """For a cut anywhere, end is the last batch boundary at or before it; END iff on one."""
    parts = _log(base, counts)
    buf = b"".join(parts)
    cut = data.draw(st.integers(0, len(buf)))
    boundaries = [0]
    for part in parts:
        boundaries.append(boundaries[-1] + len(part))
    whole = max(i for i, b in enumerate(boundaries) if b <= cut)
    result = scan(buf[:cut], 0, base)
    assert result.end == boundaries[whole]
    assert result.next_offset == base + sum(counts[:whole])
    assert len(result.batches) == whole
    assert result.stop is (StopReason.END if cut == boundaries[whole] else StopReason.INCOMPLETE)


# ---------------------------------------------------------------------------------------
# CORRUPT


@pytest.mark.parametrize("which", [0, 1, 2])
def test_flipped_bit_is_corrupt_and_stops_before_the_batch(which: int) -> None:
    """A flipped bit in any CRC-covered byte of a batch stops CORRUPT at that batch's start."""
    parts = _log(0, [2, 3, 1])
    start = sum(len(p) for p in parts[:which])
    for bit in range(8 * 12, 8 * len(parts[which])):
        damaged = [*parts]
        damaged[which] = _flip(parts[which], bit)
        result = scan(b"".join(damaged), 0, 0)
        assert result.stop is StopReason.CORRUPT, bit
        assert result.end == start
        assert result.next_offset == sum([2, 3, 1][:which])
        assert len(result.batches) == which
        assert result.detail


def test_flipped_length_bit_stops_before_the_batch() -> None:
    """A flipped batch_length bit stops at that batch, CORRUPT or INCOMPLETE, never past it."""
    parts = _log(0, [2, 3])
    for bit in range(8 * 8, 8 * 12):
        result = scan(parts[0] + _flip(parts[1], bit), 0, 0)
        assert result.stop in (StopReason.CORRUPT, StopReason.INCOMPLETE), bit
        assert (result.end, result.next_offset) == (len(parts[0]), 2)


@pytest.mark.parametrize(
    ("tail", "stop"),
    [
        (bytes(HEADER_SIZE), StopReason.CORRUPT),
        (bytes(4096), StopReason.CORRUPT),
        (b"\xff" * 200, StopReason.CORRUPT),
        (bytes(HEADER_SIZE - 1), StopReason.INCOMPLETE),
        (bytes(8), StopReason.INCOMPLETE),
    ],
    ids=["zero-header", "zero-page", "ones", "short-zeros", "eight-zeros"],
)
def test_garbage_tail(tail: bytes, stop: StopReason) -> None:
    """Zero-filled or garbage bytes after the data stop the scan at the last good batch."""
    parts = _log(0, [2])
    result = scan(parts[0] + tail, 0, 0)
    assert result.stop is stop
    assert (result.end, result.next_offset) == (len(parts[0]), 2)


# ---------------------------------------------------------------------------------------
# GAP


@pytest.mark.parametrize(
    ("second_base", "what"),
    [(4, "gap"), (2, "overlap"), (0, "repeat"), (10**9, "far-ahead")],
)
def test_gap_when_base_offset_does_not_follow(second_base: int, what: str) -> None:
    """A whole valid batch whose base offset is not the previous next_offset stops GAP."""
    first = _batch(0, 3)
    second = _batch(second_base, 2)
    third = _batch(second_base + 2, 1)
    result = scan(first + second + third, 0, 0)
    assert result.stop is StopReason.GAP, what
    assert result.end == len(first)
    assert result.next_offset == 3
    assert [b.base_offset for b in result.batches] == [0]
    assert result.detail


@pytest.mark.parametrize("expected", [0, 99, 101])
def test_first_batch_must_have_the_expected_offset(expected: int) -> None:
    """With expected_offset given, a first batch at another base is a GAP at ``pos``."""
    buf = _batch(100, 2)
    result = scan(buf, 0, expected)
    assert result.stop is StopReason.GAP
    assert (result.end, result.next_offset, result.batches) == (0, expected, [])


def test_first_problem_wins() -> None:
    """A gap before a corrupt batch reports the gap; the later damage is never reached."""
    parts = _log(0, [2, 2])
    buf = parts[0] + _batch(9, 1) + _flip(parts[1], 8 * 60)
    result = scan(buf, 0, 0)
    assert result.stop is StopReason.GAP
    assert result.end == len(parts[0])


@pytest.mark.parametrize("stop", list(StopReason))
def test_only_end_is_clean(stop: StopReason) -> None:
    """is_clean() is true for END alone."""
    assert stop.is_clean() is (stop is StopReason.END)
