"""The fused single-record path of :func:`wal.validate.validate_batch`: it accepts exactly
the batches the strict check accepts, and nothing the strict check rejects.

Pure: no loop, no disk.
"""

from __future__ import annotations

import random
import struct

import pytest

from proto.batch import CRC_START, crc32c
from proto.check import check_batch
from proto.errors import InvalidBatchError
from tests.proto.violations import VIOLATIONS, Violation
from wal import BatchRejectedError, RecordTooLargeError, encode_columns
from wal.validate import BatchLimits, _accept_single, validate_batch

LIMITS = BatchLimits(max_record_bytes=1 << 20, max_batch_bytes=16 << 20)
TS = 1_700_000_000_000


def singles() -> list[bytes]:
    """One-record batches without headers: key absent, empty or present; values of every
    padding remainder, empty included."""
    out = []
    for key in (None, b"", b"k", b"key-1234", b"k" * 13):
        for size in (0, 1, 7, 8, 9, 100):
            out.append(encode_columns([bytes(range(size))], keys=[key], timestamps_ms=TS))
    return out


def reseal(data: bytearray) -> bytes:
    """``data`` with its CRC recomputed, so only the edit is wrong."""
    struct.pack_into("<I", data, 12, crc32c(memoryview(data)[CRC_START:]))
    return bytes(data)


@pytest.mark.parametrize("data", singles())
def test_valid_single_is_accepted_as_the_strict_check_decodes_it(data: bytes) -> None:
    """Scenario: a valid one-record batch without headers.
    Expected: the fused path accepts it, with the very batch ``check_batch`` returns."""
    fused = _accept_single(data)
    assert fused is not None
    assert fused == check_batch(data)
    assert validate_batch(data, LIMITS) == fused


def strict_outcome(data: bytes) -> str | None:
    try:
        check_batch(data)
    except InvalidBatchError as exc:
        return exc.field
    return None


def test_every_one_byte_edit_is_accepted_only_if_the_strict_check_accepts_it() -> None:
    """Scenario: every byte of several one-record batches set to other values, with the
    CRC left stale and with it recomputed (so only the edit is wrong).
    Expected: the fused path accepts an edit only when the strict check does too, and then
    returns the same batch; for the rest ``validate_batch`` raises what the strict check
    raises, naming the same field."""
    rng = random.Random(17)
    checked = 0
    for data in singles()[::5]:
        for at in range(len(data)):
            for value in {0, 1, 0x80, 0xFF, rng.randrange(256)} - {data[at]}:
                edited = bytearray(data)
                edited[at] = value
                for candidate in (bytes(edited), reseal(edited)):
                    field = strict_outcome(candidate)
                    fused = _accept_single(candidate) if len(candidate) >= 88 else None
                    if field is None:
                        assert fused is None or fused == check_batch(candidate)
                        continue
                    assert fused is None, (at, value, field)
                    with pytest.raises(BatchRejectedError) as info:
                        validate_batch(candidate, LIMITS)
                    assert info.value.field == field
                    checked += 1
    assert checked > 1000


@pytest.mark.parametrize("violation", VIOLATIONS, ids=lambda v: v.id)
def test_format_violations_are_rejected_naming_the_field(violation: Violation) -> None:
    """Scenario: each broken rule of the shared list (one record or many).
    Expected: ``validate_batch`` rejects it naming the field the strict check names."""
    data = violation.make()
    with pytest.raises(BatchRejectedError) as info:
        validate_batch(data, LIMITS)
    assert info.value.field == violation.field


def test_truncated_and_extended_single_batches_are_rejected() -> None:
    """Scenario: a valid one-record batch cut short by 8 bytes, or with 8 zero bytes
    appended.
    Expected: both are rejected as not exactly one whole batch (``batch_length``)."""
    data = encode_columns([b"x" * 100], timestamps_ms=TS)
    for candidate in (data[:-8], data + bytes(8)):
        assert _accept_single(candidate) is None
        with pytest.raises(BatchRejectedError) as info:
            validate_batch(candidate, LIMITS)
        assert info.value.field == "batch_length"


def test_single_record_over_the_record_limit_is_refused() -> None:
    """Scenario: a valid one-record batch whose key + value is one byte over
    ``max_record_bytes``.
    Expected: RecordTooLargeError for record 0; at the limit it is accepted."""
    limits = BatchLimits(max_record_bytes=64, max_batch_bytes=1 << 20)
    validate_batch(encode_columns([b"v" * 60], keys=[b"kkkk"], timestamps_ms=TS), limits)
    with pytest.raises(RecordTooLargeError):
        validate_batch(encode_columns([b"v" * 61], keys=[b"kkkk"], timestamps_ms=TS), limits)
