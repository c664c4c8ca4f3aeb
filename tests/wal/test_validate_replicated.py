"""Pure tests of :func:`wal.validate.check_replicated`, the check of a leader's batches
before a follower appends them: no event loop, no disk.

Batches are built in memory, given base offsets as a leader's log would hold them, and laid
end to end as a leader's raw read returns them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from proto.batch import CRC_START, crc32c, decode_batch, encode_records
from proto.record import Record
from wal import CorruptBatchError, ReplicaOffsetMismatchError
from wal.validate import check_replicated


def batch_at(base: int, count: int, *, size: int = 10, headers: bool = False) -> bytes:
    """A batch of ``count`` records of ``size``-byte values, at ``base``."""
    records = [
        Record(
            bytes([65 + i % 26]) * size,
            key=b"k%d" % i if i % 2 else None,
            headers={"h": b"x" * i} if headers else {},
            timestamp_ms=1000 + i,
        )
        for i in range(count)
    ]
    batch = decode_batch(encode_records(records))
    assert batch is not None
    return batch.with_base_offset(base)


def chunk(base: int, counts: list[int]) -> list[bytes]:
    """Contiguous batches from ``base`` with these record counts."""
    out = []
    for count in counts:
        out.append(batch_at(base, count))
        base += count
    return out


def test_contiguous_batches_decode_in_order_with_the_leaders_offsets() -> None:
    """Scenario: three batches at 100 (3 records), 103 (1) and 104 (5), end to end.
    Expected: three batches, the leader's base offsets kept, each a view of its bytes."""
    parts = chunk(100, [3, 1, 5])
    batches = check_replicated(b"".join(parts))
    assert [(b.base_offset, b.record_count) for b in batches] == [(100, 3), (103, 1), (104, 5)]
    assert [bytes(b.buffer) for b in batches] == parts


def test_empty_data_is_no_batches() -> None:
    """Scenario: an empty fetch answer. Expected: no batches, no error."""
    assert check_replicated(b"") == []


@pytest.mark.parametrize(
    ("second_base", "what"),
    [(104, "gap"), (108, "gap"), (102, "overlap"), (100, "overlap")],
)
def test_a_batch_that_does_not_follow_on_is_refused(second_base: int, what: str) -> None:
    """Scenario: a batch at 100 with 3 records, then one at ``second_base`` (103 follows
    on). Expected: ReplicaOffsetMismatchError for batch 1, expecting 103, naming the gap or
    overlap and its size."""
    data = batch_at(100, 3) + batch_at(second_base, 2)
    with pytest.raises(ReplicaOffsetMismatchError) as info:
        check_replicated(data)
    err = info.value
    assert (err.index, err.expected, err.found) == (1, 103, second_base)
    assert f"{what} of {abs(second_base - 103)} records" in str(err)
    assert "nothing was appended" in str(err)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_flipped_bit_fails_the_crc_at_its_batch(which: int) -> None:
    """Scenario: three batches; one bit of batch ``which``'s value data flipped. Expected:
    CorruptBatchError at that batch's byte position, the CRC named."""
    parts = chunk(0, [2, 2, 2])
    damaged = bytearray(parts[which])
    damaged[-9] ^= 0x10
    parts[which] = bytes(damaged)
    with pytest.raises(CorruptBatchError) as info:
        check_replicated(b"".join(parts))
    assert info.value.position == sum(len(p) for p in parts[:which])
    assert info.value.field == "crc32c"


def test_data_that_ends_inside_a_batch_is_refused_at_every_cut() -> None:
    """Scenario: two whole batches, then the third cut at every length from 1 byte to one
    byte short. Expected: CorruptBatchError at the third batch's position, every time."""
    parts = chunk(0, [1, 2, 3])
    start = len(parts[0]) + len(parts[1])
    for cut in range(1, len(parts[2])):
        data = parts[0] + parts[1] + parts[2][:cut]
        with pytest.raises(CorruptBatchError) as info:
            check_replicated(data)
        assert info.value.position == start, cut
        assert info.value.field == "batch_length"


def test_no_limit_applies_to_a_leaders_batches() -> None:
    """Scenario: batches over max_batch_bytes, max_record_bytes and a header limit, as
    a leader with larger limits (or an older version) may hold them. Expected: accepted as
    they are: the leader applied its limits at publish, and a follower that refused what
    its leader holds would stop at that batch for good (the check takes no limits)."""
    big = batch_at(0, 4, size=100)
    two = batch_at(0, 1) + batch_at(1, 3, size=200)
    headed = batch_at(0, 2, headers=True)
    for data, counts in ((big, [4]), (two, [1, 3]), (headed, [2])):
        batches = check_replicated(data)
        assert [b.record_count for b in batches] == counts
        assert b"".join(bytes(b.buffer) for b in batches) == data
    assert "limits" not in check_replicated.__code__.co_varnames


def _flips(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, bytes]]:
    """Every one-bit flip of ``data[start:end]``: (byte position, bit, the damaged data)."""
    for at in range(start, end):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[at] ^= 1 << bit
            yield at, bit, bytes(damaged)


def test_a_bit_flipped_anywhere_in_a_batch_is_refused() -> None:
    """Scenario: three batches at 10 (2 records, with keys and headers), 12 (3) and 15 (1);
    every bit of the middle batch flipped in turn (base offset, length, CRC, the other
    header fields, the body, the last byte). Expected: each refused, never accepted:
    ReplicaOffsetMismatchError for a flip in the base offset (the one field outside the
    CRC that is not the CRC or the length), CorruptBatchError at the middle batch's
    position for every other flip."""
    first, middle, last = batch_at(10, 2, headers=True), batch_at(12, 3), batch_at(15, 1)
    data = first + middle + last
    start = len(first)
    for at, bit, damaged in _flips(data, start, start + len(middle)):
        where = (at - start, bit)
        if at - start < 8:
            with pytest.raises(ReplicaOffsetMismatchError):
                check_replicated(damaged)
            continue
        with pytest.raises(CorruptBatchError) as info:
            check_replicated(damaged)
        assert info.value.position == start, where


def test_a_batch_with_a_good_crc_over_sections_a_read_refuses_is_refused() -> None:
    """Scenario: a leader bug: a batch whose last value offset points past its end, its
    CRC computed over those bytes (so the CRC is right). Expected: CorruptBatchError, its
    sections ending past batch_length: the follower refuses what its own reader would
    refuse, in a fixed number of steps (the section bounds), as a read from disk does."""
    raw = bytearray(batch_at(0, 2))
    batch = decode_batch(bytes(raw))
    assert batch is not None
    last = batch.layout.value_offsets + 4 * batch.record_count
    struct.pack_into("<i", raw, last, len(raw))
    struct.pack_into("<I", raw, 12, crc32c(memoryview(raw)[CRC_START:]))
    with pytest.raises(CorruptBatchError) as info:
        check_replicated(bytes(raw))
    assert info.value.field == "batch_length"
    assert "sections end at byte" in str(info.value)


def test_records_malformed_inside_their_sections_under_a_good_crc_are_taken_as_they_are() -> None:
    """Scenario: a leader bug: a batch of 3 records whose middle value offset is past the
    last one (offsets that decrease; the section bounds hold), CRC right. Expected:
    accepted byte for byte: no record is walked (the leader's log holds the same batch,
    so its readers see the same thing; docs/protocol.md section 12)."""
    raw = bytearray(batch_at(0, 3))
    batch = decode_batch(bytes(raw))
    assert batch is not None
    struct.pack_into("<i", raw, batch.layout.value_offsets + 4, 29)  # last entry is 30
    struct.pack_into("<i", raw, batch.layout.value_offsets + 8, 25)
    struct.pack_into("<I", raw, 12, crc32c(memoryview(raw)[CRC_START:]))
    (taken,) = check_replicated(bytes(raw))
    assert bytes(taken.buffer) == bytes(raw)
    assert [len(v) for v in taken.values()] == [29, 0, 5]


def test_a_batch_an_older_version_wrote_is_accepted() -> None:
    """Scenario: a batch whose reserved header field is not 0 (a producer's batch would be
    refused) but whose CRC covers it, as data written before the strict check existed.
    Expected: accepted: a follower takes what its leader's log holds and reads accept."""
    raw = bytearray(batch_at(7, 2))
    struct.pack_into("<I", raw, 52, 9)
    struct.pack_into("<I", raw, 12, crc32c(memoryview(raw)[CRC_START:]))
    (batch,) = check_replicated(bytes(raw))
    assert (batch.base_offset, batch.record_count) == (7, 2)
