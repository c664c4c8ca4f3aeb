"""Pure tests of :func:`wal.validate.check_replicated`, the check of a leader's batches
before a follower appends them: no event loop, no disk.

Batches are built in memory, given base offsets as a leader's log would hold them, and laid
end to end as a leader's raw read returns them.
"""

from __future__ import annotations

import struct

import pytest

from proto.batch import CRC_START, crc32c, decode_batch, encode_records
from proto.record import Record
from wal import (
    BatchTooLargeError,
    CorruptBatchError,
    HeaderLimitError,
    LogConfig,
    RecordTooLargeError,
    ReplicaOffsetMismatchError,
)
from wal.validate import BatchLimits, check_replicated

LIMITS = LogConfig().limits


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
    batches = check_replicated(b"".join(parts), LIMITS)
    assert [(b.base_offset, b.record_count) for b in batches] == [(100, 3), (103, 1), (104, 5)]
    assert [bytes(b.buffer) for b in batches] == parts


def test_empty_data_is_no_batches() -> None:
    """Scenario: an empty fetch answer. Expected: no batches, no error."""
    assert check_replicated(b"", LIMITS) == []


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
        check_replicated(data, LIMITS)
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
        check_replicated(b"".join(parts), LIMITS)
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
            check_replicated(data, LIMITS)
        assert info.value.position == start, cut
        assert info.value.field == "batch_length"


def test_limits_apply_as_for_any_batch() -> None:
    """Scenario: batches over max_batch_bytes, max_record_bytes and a header limit.
    Expected: BatchTooLargeError, RecordTooLargeError (naming the record) and
    HeaderLimitError, as a producer's append gets."""
    big = batch_at(0, 4, size=100)
    with pytest.raises(BatchTooLargeError):
        check_replicated(big, BatchLimits(max_record_bytes=1000, max_batch_bytes=len(big) - 8))
    with pytest.raises(RecordTooLargeError) as info:
        check_replicated(batch_at(0, 1) + batch_at(1, 3, size=200), BatchLimits(150, 1 << 20))
    assert info.value.size >= 200
    limits = BatchLimits(1000, 1 << 20, max_headers_per_record=0)
    with pytest.raises(HeaderLimitError):
        check_replicated(batch_at(0, 2, headers=True), limits)


def test_a_batch_an_older_version_wrote_is_accepted() -> None:
    """Scenario: a batch whose reserved header field is not 0 (a producer's batch would be
    refused) but whose CRC covers it, as data written before the strict check existed.
    Expected: accepted: a follower takes what its leader's log holds and reads accept."""
    raw = bytearray(batch_at(7, 2))
    struct.pack_into("<I", raw, 52, 9)
    struct.pack_into("<I", raw, 12, crc32c(memoryview(raw)[CRC_START:]))
    (batch,) = check_replicated(bytes(raw), LIMITS)
    assert (batch.base_offset, batch.record_count) == (7, 2)
