"""The strict check of a client's batch (:mod:`proto.check`), the tolerant read beside it,
and duplicate header names: pure, no loop, no disk."""

from __future__ import annotations

import pytest

from proto.batch import decode_batch, encode_columns, encode_records
from proto.check import check_batch
from proto.errors import BatchError, InvalidBatchError
from proto.record import Record
from tests.proto.violations import TS, VIOLATIONS, Violation, many, one
from wal import BatchLimits, BatchRejectedError, WalError, validate_batch

_LIMITS = BatchLimits(max_record_bytes=1 << 20, max_batch_bytes=1 << 24)


@pytest.mark.parametrize("make", [one, many], ids=["one", "many"])
def test_what_the_encoder_writes_passes(make: object) -> None:
    """Scenario: batches our encoder wrote. Expected: the strict check accepts them."""
    assert callable(make)
    assert check_batch(make()).record_count >= 1


@pytest.mark.parametrize("v", VIOLATIONS, ids=[v.id for v in VIOLATIONS])
def test_each_violation_is_refused_naming_its_field(v: Violation) -> None:
    """Scenario: a batch (CRC valid) that breaks one rule. Expected: InvalidBatchError with
    ``field`` set to the field, and the message names it too."""
    with pytest.raises(InvalidBatchError) as info:
        check_batch(v.make())
    assert info.value.field == v.field
    assert v.words in str(info.value)
    assert v.field in str(info.value)


@pytest.mark.parametrize("v", VIOLATIONS, ids=[v.id for v in VIOLATIONS])
def test_the_log_refuses_each_violation(v: Violation) -> None:
    """Scenario: the same batches offered to the log's gate. Expected: BatchRejectedError
    (a WalError and the codec's error), same field, "nothing was appended"."""
    with pytest.raises(BatchRejectedError) as info:
        validate_batch(v.make(), _LIMITS)
    assert isinstance(info.value, WalError)
    assert isinstance(info.value, InvalidBatchError)
    assert info.value.field == v.field
    assert "nothing was appended" in str(info.value)


#: The rules that reads do not check: none changes what the bytes mean.
_NOT_ON_READ = {
    "base_offset",
    "reserved",
    "padding",
    "key_validity",
    "first_timestamp_ms",
    "max_timestamp_ms",
}


@pytest.mark.parametrize(
    "v", [v for v in VIOLATIONS if v.field in _NOT_ON_READ], ids=lambda v: v.id
)
def test_reads_stay_tolerant(v: Violation) -> None:
    """Scenario: the same batches decoded as a read from disk does. Expected: every one
    decodes (older versions did not enforce these rules, and their data must stay
    readable); values read back. (Unknown flag bits and bad offsets change what the bytes
    mean, so reads refuse them as they always did.)"""
    batch = decode_batch(v.make())
    assert batch is not None
    assert batch.values()[0] in (b"hi", b"a")


@pytest.mark.parametrize("size", [0, 1, 7, 11, 12, 55])
def test_a_short_batch_says_how_short(size: int) -> None:
    """Scenario: fewer bytes than a batch header (the issue: under 12 bytes the message
    showed Python's ``None``). Expected: the message gives the byte count and the header
    size, names batch_length, and shows no ``None``."""
    with pytest.raises(InvalidBatchError) as info:
        check_batch(one()[:size])
    message = str(info.value)
    assert "None" not in message
    assert f"got {size} bytes, fewer than the 56-byte batch header" in message
    assert info.value.field == "batch_length"


def test_a_truncated_batch_names_the_announced_length() -> None:
    """Scenario: a whole header but a cut body. Expected: both lengths in the message."""
    data = one()
    with pytest.raises(
        InvalidBatchError, match=f"got 60 bytes but batch_length announces {len(data)}"
    ):
        check_batch(data[:60])


def test_codec_errors_are_value_errors_of_their_own_root() -> None:
    """Scenario: an encoder error. Expected: a BatchError (a ValueError), not a WalError,
    and no WAL advice in the message."""
    with pytest.raises(BatchError) as info:
        encode_columns([])
    assert isinstance(info.value, ValueError)
    assert not isinstance(info.value, WalError)
    assert "appended" not in str(info.value)


def test_duplicate_header_names_are_kept_in_order() -> None:
    """Scenario: headers as (name, value) pairs with a repeated name. Expected:
    header_lists() keeps every entry in order; the dict view keeps the last value; the
    batch passes the strict check."""
    data = encode_columns(
        [b"a", b"b"],
        timestamps_ms=TS,
        headers=[[("x", b"1"), ("y", b"2"), ("x", b"3")], {"z": b"4"}],
    )
    batch = check_batch(data)
    assert batch.header_lists() == [[("x", b"1"), ("y", b"2"), ("x", b"3")], [("z", b"4")]]
    assert batch.headers() == [{"x": b"3", "y": b"2"}, {"z": b"4"}]


def test_header_lists_without_headers_are_empty() -> None:
    """Scenario: a batch with no headers section. Expected: one empty list per record,
    and mappings encode exactly as before (the same bytes as pairs in the same order)."""
    assert check_batch(one()).header_lists() == [[]]
    as_dict = encode_records([Record(b"v", headers={"a": b"1", "b": b"2"})])
    as_pairs = encode_columns([b"v"], keys=[None], headers=[[("a", b"1"), ("b", b"2")]])
    assert as_dict == as_pairs
