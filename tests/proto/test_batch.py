"""Pure tests of the record batch codec (:mod:`proto.batch`): no disk, no event loop.

Covers encode/decode round trips, the three outcomes of ``decode_batch`` (a batch, ``None``
for "need more bytes", ``CorruptBatchError``), the CRC boundary (``base_offset`` is outside
it), 8-byte alignment, ``validate_batch``'s rejections of untrusted input, and
``iter_batches`` over batches laid end to end.

Crafted-but-checksummed inputs are built by editing bytes and then re-sealing the CRC with
:func:`_reseal`, so each test reaches the check it names rather than the CRC check.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from proto.batch import (
    CRC_START,
    FLAG_HAS_HEADERS,
    HEADER_SIZE,
    MAGIC,
    MAX_BATCH_LENGTH,
    VERSION,
    RecordBatch,
    crc32c,
    decode_batch,
    encode_columns,
    encode_records,
    iter_batches,
    read_length,
    restamp,
)
from proto.errors import BatchError
from proto.record import Record
from wal.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    EmptyBatchError,
    InvalidBatchError,
    RecordTooLargeError,
    WalError,
)
from wal.validate import BatchLimits, validate_batch

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_GENEROUS = BatchLimits(max_record_bytes=1 << 20, max_batch_bytes=1 << 24)

# Byte positions of header fields (see the layout table in proto/batch.py).
_LENGTH_AT = 8
_CRC_AT = 12
_MAGIC_AT = 16
_VERSION_AT = 17
_FLAGS_AT = 18
_COUNT_AT = 20
_MAX_TS_AT = 32


# ---------------------------------------------------------------------------------------
# Helpers


def _decode(data: bytes | bytearray, pos: int = 0) -> RecordBatch:
    """Decode a batch that must be whole and valid."""
    batch = decode_batch(data, pos)
    assert batch is not None
    return batch


def _reseal(data: bytes | bytearray) -> bytes:
    """Recompute the CRC-32C over bytes [16, end) and patch it into bytes 12..16."""
    buf = bytearray(data)
    struct.pack_into("<I", buf, _CRC_AT, crc32c(bytes(buf[CRC_START:])))
    return bytes(buf)


def _patch(data: bytes, at: int, fmt: str, value: int) -> bytes:
    """Return ``data`` with ``value`` packed as ``fmt`` at ``at`` (CRC not updated)."""
    buf = bytearray(data)
    struct.pack_into(fmt, buf, at, value)
    return bytes(buf)


def _flip(data: bytes, bit: int) -> bytes:
    """Return ``data`` with one bit flipped."""
    buf = bytearray(data)
    buf[bit // 8] ^= 1 << (bit % 8)
    return bytes(buf)


def _rich_batch() -> bytes:
    """A batch exercising every section: keys (None, empty, set), values, headers."""
    return encode_records(
        [
            Record(b"first", key=None, headers={"trace": b"abc"}, timestamp_ms=10),
            Record(b"", key=b"", headers={}, timestamp_ms=30),
            Record(b"third value", key=b"k3", headers={"a": b"", "é": b"\x00"}, timestamp_ms=20),
        ]
    )


_records = st.builds(
    Record,
    value=st.binary(max_size=48),
    key=st.none() | st.binary(max_size=16),
    headers=st.dictionaries(st.text(max_size=8), st.binary(max_size=8), max_size=3),
    timestamp_ms=st.integers(_I64_MIN, _I64_MAX),
)
_record_lists = st.lists(_records, min_size=1, max_size=12)


# ---------------------------------------------------------------------------------------
# Encode / decode round trips


def test_single_record_without_key_matches_documented_96_bytes() -> None:
    """The module docstring's example: key None, value b"hi", ts 5 encodes to 96 bytes."""
    data = encode_records([Record(b"hi", timestamp_ms=5)])
    assert len(data) == 96
    batch = _decode(data)
    assert batch.records() == [Record(b"hi", key=None, headers={}, timestamp_ms=5)]
    assert batch.base_offset == 0
    assert batch.size == 96


@pytest.mark.parametrize(
    ("key", "expected_bit"),
    [(None, 0), (b"", 1), (b"k", 1), (b"\x00" * 9, 1)],
)
def test_key_none_and_empty_key_are_distinct(key: bytes | None, expected_bit: int) -> None:
    """An empty key is a key: its validity bit is 1 and it decodes as b"", not None."""
    batch = _decode(encode_records([Record(b"v", key=key)]))
    assert batch.keys() == [key]
    assert bytes(batch.key_validity())[0] & 1 == expected_bit


def test_round_trip_mixed_keys_headers_and_timestamps() -> None:
    """Keys (None/empty/set), empty header values and unicode names all survive a round trip."""
    records = [
        Record(b"first", key=None, headers={"trace": b"abc"}, timestamp_ms=10),
        Record(b"", key=b"", headers={}, timestamp_ms=30),
        Record(b"third value", key=b"k3", headers={"a": b"", "é": b"\x00"}, timestamp_ms=20),
    ]
    batch = _decode(encode_records(records))
    assert batch.records() == records
    assert batch.keys() == [None, b"", b"k3"]
    assert batch.values() == [b"first", b"", b"third value"]
    assert batch.headers() == [{"trace": b"abc"}, {}, {"a": b"", "é": b"\x00"}]
    assert batch.timestamps().tolist() == [10, 30, 20]
    assert batch.has_headers


@pytest.mark.parametrize(
    "name",
    ["", "x", "ключ", "名前", "emoji-🦀", "a\x00b", "x" * 300],
)
def test_header_names_round_trip(name: str) -> None:
    """Header names of any UTF-8 text, including empty and multi-byte ones, round-trip."""
    record = Record(b"v", headers={name: b"value", "other": b""})
    assert _decode(encode_records([record])).headers() == [{name: b"value", "other": b""}]


def test_records_without_headers_clear_the_flag() -> None:
    """A batch where no record has headers omits the section: flag clear, empty dicts back."""
    batch = _decode(encode_records([Record(b"a"), Record(b"b")]))
    assert not batch.has_headers
    assert batch.flags & FLAG_HAS_HEADERS == 0
    assert batch.layout.header_offsets == -1
    assert batch.headers() == [{}, {}]


def test_headers_section_present_when_any_record_has_headers() -> None:
    """One record with headers among many sets the flag; the others decode as empty dicts."""
    records = [Record(b"a"), Record(b"b", headers={"h": b"1"}), Record(b"c")]
    batch = _decode(encode_records(records))
    assert batch.has_headers
    assert batch.layout.header_count == 1
    assert batch.headers() == [{}, {"h": b"1"}, {}]


@pytest.mark.parametrize("count", [1, 7, 8, 9, 64, 65, 1000])
def test_many_records_round_trip(count: int) -> None:
    """Record counts around the 8-bit bitmap boundaries round-trip, keys alternating None."""
    records = [
        Record(
            str(i).encode() * (i % 5),
            key=None if i % 2 else str(i).encode(),
            timestamp_ms=1_700_000_000_000 + i,
        )
        for i in range(count)
    ]
    batch = _decode(encode_records(records))
    assert batch.record_count == count
    assert batch.records() == records


@pytest.mark.parametrize(
    "timestamps",
    [[0], [_I64_MIN], [_I64_MAX], [5, 3, 9, 1], [-1, -5], [_I64_MAX, _I64_MIN]],
)
def test_timestamps_and_header_summary(timestamps: list[int]) -> None:
    """Per-record timestamps round-trip; the header holds the first and the maximum."""
    batch = _decode(encode_records([Record(b"v", timestamp_ms=t) for t in timestamps]))
    assert batch.timestamps().tolist() == timestamps
    assert batch.first_timestamp_ms == timestamps[0]
    assert batch.max_timestamp_ms == max(timestamps)


@pytest.mark.parametrize(
    ("producer_id", "base_sequence"),
    [(-1, -1), (0, 0), (_I64_MAX, _I32_MAX), (_I64_MIN, _I32_MIN), (42, 7)],
)
def test_producer_fields_round_trip(producer_id: int, base_sequence: int) -> None:
    """producer_id (i64) and base_sequence (i32) are stored and decoded unchanged."""
    data = encode_records([Record(b"v")], producer_id=producer_id, base_sequence=base_sequence)
    batch = _decode(data)
    assert (batch.producer_id, batch.base_sequence) == (producer_id, base_sequence)


def test_encode_columns_defaults_no_keys_shared_timestamp() -> None:
    """keys=None means every key is None; an int timestamp applies to every record."""
    batch = _decode(encode_columns([b"a", b"bb", b"ccc"], timestamps_ms=77))
    assert batch.keys() == [None, None, None]
    assert batch.timestamps().tolist() == [77, 77, 77]
    assert batch.values() == [b"a", b"bb", b"ccc"]
    assert not batch.has_headers


def test_encode_columns_matches_encode_records() -> None:
    """The columnar fast path and the per-record path produce identical bytes."""
    records = [
        Record(b"v1", key=b"k1", headers={"h": b"x"}, timestamp_ms=1),
        Record(b"v2", key=None, headers={}, timestamp_ms=2),
    ]
    columns = encode_columns(
        [r.value for r in records],
        keys=[r.key for r in records],
        timestamps_ms=[r.timestamp_ms for r in records],
        headers=[r.headers for r in records],
    )
    assert columns == encode_records(records)


def test_batch_accessors_and_offsets() -> None:
    """size, record_count, last/next offset and offsets() follow the patched base offset."""
    data = _decode(encode_records([Record(b"a"), Record(b"b"), Record(b"c")])).with_base_offset(100)
    batch = _decode(data)
    assert batch.base_offset == 100
    assert batch.record_count == 3
    assert batch.last_offset == 102
    assert batch.next_offset == 103
    assert batch.offsets() == range(100, 103)
    assert batch.size == len(data)
    assert batch.crc == struct.unpack_from("<I", data, _CRC_AT)[0]


def test_value_and_key_data_are_the_concatenated_payloads() -> None:
    """value_data() and key_data() are "all values/keys, concatenated", with no padding."""
    batch = _decode(encode_records([Record(b"v1", key=b"ab"), Record(b"v22", key=b"c")]))
    assert bytes(batch.value_data()) == b"v1v22"
    assert bytes(batch.key_data()) == b"abc"


def test_decode_accepts_bytearray_and_memoryview() -> None:
    """decode_batch takes any buffer type and sees the same batch."""
    data = _rich_batch()
    expected = _decode(data).records()
    assert _decode(bytearray(data)).records() == expected
    batch = decode_batch(memoryview(data))
    assert batch is not None
    assert batch.records() == expected


def test_decode_at_position_inside_larger_buffer() -> None:
    """A batch at ``pos`` decodes; its layout is relative to the batch start, not the buffer."""
    data = _rich_batch()
    prefix = bytes(40)
    batch = _decode(prefix + data + bytes(16), len(prefix))
    assert batch.size == len(data)
    assert bytes(batch.buffer) == data
    assert batch.layout == _decode(data).layout


@given(_record_lists)
def test_round_trip_property(records: list[Record]) -> None:
    """Any list of records encodes and decodes back to the same records and timestamps."""
    data = encode_records(records)
    batch = _decode(data)
    assert batch.records() == records
    assert batch.record_count == len(records)
    assert batch.first_timestamp_ms == records[0].timestamp_ms
    assert batch.max_timestamp_ms == max(r.timestamp_ms for r in records)
    assert batch.has_headers == any(r.headers for r in records)


@given(_record_lists)
def test_validate_accepts_every_encoded_batch(records: list[Record]) -> None:
    """Everything the encoder produces passes validate_batch with limits it meets exactly."""
    data = encode_records(records)
    limits = BatchLimits(max(r.size for r in records), len(data))
    assert validate_batch(data, limits).records() == records


# ---------------------------------------------------------------------------------------
# Encoding errors


@pytest.mark.parametrize(
    "encode",
    [lambda: encode_records([]), lambda: encode_columns([])],
    ids=["encode_records", "encode_columns"],
)
def test_empty_batch_is_rejected(encode: Callable[[], bytes]) -> None:
    """Encoding zero records raises EmptyBatchError (an InvalidBatchError)."""
    with pytest.raises(EmptyBatchError) as info:
        encode()
    assert isinstance(info.value, InvalidBatchError)
    assert info.value.reason == "a batch must hold at least one record"


@pytest.mark.parametrize(
    ("column", "kwargs"),
    [
        ("keys", {"keys": [b"k"]}),
        ("timestamps_ms", {"timestamps_ms": [1, 2, 3]}),
        ("headers", {"headers": [{}]}),
    ],
)
def test_column_length_mismatch_is_invalid(column: str, kwargs: dict[str, Any]) -> None:
    """A column whose length disagrees with the values raises InvalidBatchError naming it."""
    with pytest.raises(InvalidBatchError, match=column):
        encode_columns([b"a", b"b"], **kwargs)


@pytest.mark.parametrize(
    ("record", "producer_id", "base_sequence"),
    [
        (Record(b"v", timestamp_ms=_I64_MAX + 1), -1, -1),
        (Record(b"v", timestamp_ms=_I64_MIN - 1), -1, -1),
        (Record(b"v"), _I64_MAX + 1, -1),
        (Record(b"v"), -1, _I32_MAX + 1),
    ],
    ids=["ts-over-i64", "ts-under-i64", "producer-id-over-i64", "base-sequence-over-i32"],
)
def test_out_of_range_field_is_invalid_batch(
    record: Record, producer_id: int, base_sequence: int
) -> None:
    """encode_records documents InvalidBatchError for a field out of range, not a raw error."""
    with pytest.raises(InvalidBatchError):
        encode_records([record], producer_id=producer_id, base_sequence=base_sequence)


# ---------------------------------------------------------------------------------------
# decode_batch outcome 2: None ("need more bytes")


@pytest.mark.parametrize(
    "data",
    [encode_records([Record(b"hi")]), _rich_batch()],
    ids=["minimal", "rich"],
)
def test_every_truncated_prefix_needs_more_bytes(data: bytes) -> None:
    """Every strict prefix of a valid batch (0 bytes up to len-1) decodes to None."""
    for cut in range(len(data)):
        assert decode_batch(data[:cut]) is None, cut


def test_truncated_prefix_at_offset_needs_more_bytes() -> None:
    """With ``pos`` > 0, every cut of the batch after ``pos`` still decodes to None."""
    first = encode_records([Record(b"one")])
    second = _rich_batch()
    data = first + second
    for cut in range(len(first), len(data)):
        assert decode_batch(data[:cut], len(first)) is None, cut


@pytest.mark.parametrize("available", [0, 1, 11, 12, 55])
def test_under_a_header_needs_more_bytes_even_if_garbage(available: int) -> None:
    """Fewer than 56 bytes is always "need more", whatever they hold."""
    assert decode_batch(b"\xff" * available) is None


@pytest.mark.parametrize(
    ("available", "expected"),
    [(0, None), (11, None), (12, 96), (96, 96)],
)
def test_read_length(available: int, expected: int | None) -> None:
    """read_length needs 12 bytes, then returns the announced batch length."""
    data = encode_records([Record(b"hi")])
    assert read_length(data[:available]) == expected


# ---------------------------------------------------------------------------------------
# decode_batch outcome 3: CorruptBatchError


def test_every_flipped_bit_after_the_length_is_detected() -> None:
    """Flipping any single bit in bytes [12, end) raises CorruptBatchError.

    Bits in magic/version fail the magic check (no CRC fields); every other bit (the stored
    CRC itself, the rest of the header, the body) fails the CRC with both CRCs recorded.
    """
    data = _rich_batch()
    stored = struct.unpack_from("<I", data, _CRC_AT)[0]
    for bit in range(8 * _CRC_AT, 8 * len(data)):
        with pytest.raises(CorruptBatchError) as info:
            decode_batch(_flip(data, bit))
        err = info.value
        assert err.position == 0
        if bit // 8 in (_MAGIC_AT, _VERSION_AT):
            assert err.expected_crc is None
            assert err.actual_crc is None
            assert "magic" in err.reason
        else:
            assert err.expected_crc is not None, bit
            assert err.actual_crc is not None
            assert err.expected_crc != err.actual_crc
            if bit // 8 >= CRC_START:
                assert err.expected_crc == stored
                assert err.actual_crc == crc32c(_flip(data, bit)[CRC_START:])


def test_flipped_length_bit_never_yields_a_batch() -> None:
    """Flipping any bit of batch_length gives CorruptBatchError or None, never a batch."""
    data = _rich_batch()
    for bit in range(8 * _LENGTH_AT, 8 * _CRC_AT):
        try:
            result = decode_batch(_flip(data, bit))
        except CorruptBatchError:
            continue
        assert result is None, bit


def test_crc_error_message_carries_both_crcs() -> None:
    """The CRC error's fields hold the stored and computed values, and the message shows them."""
    data = _rich_batch()
    bad = _flip(data, 8 * (len(data) - 1))
    with pytest.raises(CorruptBatchError) as info:
        decode_batch(bad)
    err = info.value
    assert err.expected_crc == struct.unpack_from("<I", data, _CRC_AT)[0]
    assert err.actual_crc == crc32c(bad[CRC_START:])
    assert f"{err.expected_crc:#010x}" in str(err)
    assert f"{err.actual_crc:#010x}" in str(err)
    assert isinstance(err, BatchError)
    assert not isinstance(err, WalError)  # the codec's errors are the wire contract's


def test_corrupt_position_is_the_batch_start() -> None:
    """A corrupt batch at ``pos`` reports ``position == pos``."""
    first = encode_records([Record(b"one")])
    second = _flip(_rich_batch(), 8 * 100)
    with pytest.raises(CorruptBatchError) as info:
        decode_batch(first + second, len(first))
    assert info.value.position == len(first)


@pytest.mark.parametrize(
    ("at", "fmt", "value"),
    [(_MAGIC_AT, "<B", 0x00), (_MAGIC_AT, "<B", MAGIC + 1), (_VERSION_AT, "<B", VERSION + 1)],
    ids=["magic-zero", "magic-next", "version-next"],
)
def test_bad_magic_or_version(at: int, fmt: str, value: int) -> None:
    """A wrong magic or version is corrupt even with a valid CRC."""
    data = _reseal(_patch(_rich_batch(), at, fmt, value))
    with pytest.raises(CorruptBatchError, match="magic") as info:
        decode_batch(data)
    assert info.value.expected_crc is None


def test_zeroed_bytes_are_corrupt() -> None:
    """56 zero bytes (a preallocated or zero-filled tail) are corrupt, not "need more"."""
    with pytest.raises(CorruptBatchError, match="magic"):
        decode_batch(bytes(HEADER_SIZE))


@pytest.mark.parametrize(
    "length",
    [0, 8, HEADER_SIZE - 8, HEADER_SIZE + 1, HEADER_SIZE + 4, 97, MAX_BATCH_LENGTH + 8, 2**32 - 8],
)
def test_impossible_length(length: int) -> None:
    """A length under the header, not a multiple of 8, or over 1 GiB is corrupt."""
    data = _patch(_rich_batch(), _LENGTH_AT, "<I", length)
    with pytest.raises(CorruptBatchError, match="impossible batch length") as info:
        decode_batch(data)
    assert info.value.position == 0


def test_length_at_the_maximum_is_plausible() -> None:
    """Exactly MAX_BATCH_LENGTH is a possible length: a short buffer is "need more"."""
    data = _patch(_rich_batch(), _LENGTH_AT, "<I", MAX_BATCH_LENGTH)
    assert decode_batch(data) is None


def test_verify_crc_false_skips_the_checksum() -> None:
    """With verify_crc=False a flipped value byte decodes (and shows the damage)."""
    data = encode_records([Record(b"hello")])
    batch = _decode(data)
    at = batch.layout.value_data
    damaged = bytearray(data)
    damaged[at] ^= 0x20
    with pytest.raises(CorruptBatchError):
        decode_batch(damaged)
    unchecked = decode_batch(damaged, verify_crc=False)
    assert unchecked is not None
    assert unchecked.values() == [b"Hello"]


@pytest.mark.parametrize(
    ("at", "fmt", "value"),
    [
        (_COUNT_AT, "<I", 0),
        (_FLAGS_AT, "<H", 0x2),
        (_FLAGS_AT, "<H", 0x8000 | FLAG_HAS_HEADERS),
        (_COUNT_AT, "<I", 4),
        (_COUNT_AT, "<I", 2),
        (_COUNT_AT, "<I", 10_000),
        (_FLAGS_AT, "<H", 0),
    ],
    ids=[
        "zero-records",
        "unknown-flag",
        "high-unknown-flag",
        "count-plus-one",
        "count-minus-one",
        "huge-count",
        "headers-flag-cleared",
    ],
)
def test_checksummed_but_inconsistent_header_is_corrupt(at: int, fmt: str, value: int) -> None:
    """A header that passes the CRC but disagrees with the body is CorruptBatchError."""
    data = _reseal(_patch(_rich_batch(), at, fmt, value))
    with pytest.raises(CorruptBatchError) as info:
        decode_batch(data)
    assert info.value.expected_crc is None
    assert info.value.position == 0


def test_extra_padding_inside_the_batch_is_corrupt() -> None:
    """Eight extra zero bytes covered by length and CRC leave the sections short: corrupt."""
    data = _rich_batch()
    longer = _patch(data + bytes(8), _LENGTH_AT, "<I", len(data) + 8)
    with pytest.raises(CorruptBatchError) as info:
        decode_batch(_reseal(longer))
    assert info.value.expected_crc is None


@pytest.mark.parametrize("section", ["key_offsets", "value_offsets"])
@pytest.mark.parametrize("length", [200, 10_000, 2**31 - 1])
def test_data_length_past_the_batch_is_corrupt(section: str, length: int) -> None:
    """A last key/value offset pointing past the batch is corrupt, not an out-of-bounds read."""
    data = encode_records([Record(b"hi", key=b"k")])
    start = getattr(_decode(data).layout, section)
    with pytest.raises(CorruptBatchError):
        decode_batch(_reseal(_patch(data, start + 4, "<i", length)))


@pytest.mark.parametrize("section", ["key_offsets", "value_offsets"])
@pytest.mark.parametrize("length", [-1, -3, -7, -8, -9, -(2**31)])
def test_negative_data_length_is_corrupt(section: str, length: int) -> None:
    """A negative key/value data length (last offset < 0) is corrupt, however small.

    Uses a single record with empty key and value, so a length in -7..-1 rounds (8-byte
    alignment) to the section's true size of 0 and only an explicit sign check catches it.
    """
    data = encode_records([Record(b"", key=b"")])
    start = getattr(_decode(data).layout, section)
    with pytest.raises(CorruptBatchError):
        decode_batch(_reseal(_patch(data, start + 4, "<i", length)))


@pytest.mark.parametrize("section", ["key_offsets", "value_offsets"])
@pytest.mark.parametrize("length", [-1, -3, -7])
def test_validate_rejects_negative_data_length(section: str, length: int) -> None:
    """validate_batch refuses a single-record batch whose key/value offsets are [0, -k]."""
    data = encode_records([Record(b"", key=b"")])
    start = getattr(_decode(data).layout, section)
    with pytest.raises(InvalidBatchError):
        validate_batch(_reseal(_patch(data, start + 4, "<i", length)), _GENEROUS)


@given(
    _record_lists,
    st.lists(st.tuples(st.integers(CRC_START, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
)
@settings(max_examples=200)
def test_resealed_mutations_never_escape_the_error_contract(
    records: list[Record], edits: list[tuple[int, int]]
) -> None:
    """Random byte edits with a re-sealed CRC: validate_batch gives a batch or InvalidBatchError.

    Nothing else escapes (no struct.error or IndexError from decoding), and a batch it accepts
    decodes every record, with key and value offsets starting at 0 and never decreasing.
    """
    buf = bytearray(encode_records(records))
    for at, value in edits:
        buf[CRC_START + (at - CRC_START) % (len(buf) - CRC_START)] = value
    data = _reseal(buf)
    try:
        batch = validate_batch(data, _GENEROUS)
    except InvalidBatchError:
        return
    decoded = batch.records()
    assert len(decoded) == batch.record_count
    for offsets in (batch.key_offsets().tolist(), batch.value_offsets().tolist()):
        assert offsets[0] == 0
        assert all(a <= b for a, b in itertools.pairwise(offsets))


# ---------------------------------------------------------------------------------------
# base_offset is outside the CRC


@pytest.mark.parametrize("base", [0, 1, 1200, 2**32, 2**64 - 1])
def test_with_base_offset_keeps_the_batch_valid(base: int) -> None:
    """Patching base_offset leaves the CRC, the records and everything else unchanged."""
    data = _rich_batch()
    original = _decode(data)
    patched = original.with_base_offset(base)
    batch = _decode(patched)
    assert batch.base_offset == base
    assert batch.crc == original.crc
    assert patched[8:] == data[8:]
    assert batch.records() == original.records()
    if base == 0:
        assert validate_batch(patched, _GENEROUS).base_offset == 0
    else:  # decoding (reads) accepts any base offset; a batch sent for append must carry 0
        with pytest.raises(InvalidBatchError, match="base_offset must be 0") as info:
            validate_batch(patched, _GENEROUS)
        assert info.value.field == "base_offset"


@pytest.mark.parametrize(
    # 2**31 - 3: the rich batch's three records end at the highest sequence, 2**31 - 1.
    ("producer_id", "base_sequence"),
    [(9, 0), (-1, -1), (2**63 - 1, 2**31 - 3), (0, 7)],
)
def test_restamp_changes_the_identity_and_the_crc_only(
    producer_id: int, base_sequence: int
) -> None:
    """Scenario: a batch with keys and headers, encoded under one producer id and
    sequence, re-stamped to another. Expected: it decodes with its CRC checked and passes
    the broker's check, with the new id and sequence and the same records; only the CRC
    and those two fields' bytes differ."""
    data = _rich_batch()
    original = _decode(data)
    stamped = restamp(data, producer_id, base_sequence)
    batch = _decode(stamped)
    assert (batch.producer_id, batch.base_sequence) == (producer_id, base_sequence)
    assert batch.records() == original.records()
    assert batch.crc == crc32c(stamped[CRC_START:])
    assert validate_batch(stamped, _GENEROUS).producer_id == producer_id
    changed = {i for i, (a, b) in enumerate(zip(data, stamped, strict=True)) if a != b}
    assert changed <= set(range(12, 16)) | set(range(40, 52))


def test_flipping_base_offset_bits_keeps_the_crc_valid() -> None:
    """Every bit of bytes 0..8 changes only base_offset: the batch still decodes."""
    data = _rich_batch()
    for bit in range(64):
        batch = _decode(_flip(data, bit))
        assert batch.base_offset == 1 << bit


# ---------------------------------------------------------------------------------------
# Alignment


def _section_starts(batch: RecordBatch) -> list[int]:
    lay = batch.layout
    starts = [
        lay.timestamps,
        lay.key_validity,
        lay.key_offsets,
        lay.key_data,
        lay.value_offsets,
        lay.value_data,
    ]
    if batch.has_headers:
        starts += [
            lay.header_offsets,
            lay.header_key_offsets,
            lay.header_key_data,
            lay.header_value_offsets,
            lay.header_value_data,
        ]
    return [*starts, lay.end]


def test_rich_batch_sections_are_aligned() -> None:
    """Every section of a batch with headers starts on an 8-byte boundary; so does its end."""
    batch = _decode(_rich_batch())
    starts = _section_starts(batch)
    assert len(starts) == 12
    assert [s % 8 for s in starts] == [0] * 12
    assert batch.layout.timestamps == HEADER_SIZE
    assert batch.layout.end == batch.size
    assert batch.size % 8 == 0


@given(_record_lists)
@settings(max_examples=100)
def test_alignment_property(records: list[Record]) -> None:
    """For any records, the batch length and every section start are multiples of 8."""
    data = encode_records(records)
    assert len(data) % 8 == 0
    batch = _decode(data)
    starts = _section_starts(batch)
    assert all(s % 8 == 0 for s in starts), starts
    assert starts == sorted(starts)
    assert starts[-1] == len(data)


@given(st.lists(_record_lists, min_size=1, max_size=4))
@settings(max_examples=50)
def test_concatenated_batches_stay_aligned(groups: list[list[Record]]) -> None:
    """Batches laid end to end each start 8-aligned and iterate back in order."""
    data = b"".join(encode_records(g) for g in groups)
    batches = list(iter_batches(data))
    assert [b.records() for b in batches] == groups
    position = 0
    for batch in batches:
        assert position % 8 == 0
        assert bytes(batch.buffer) == data[position : position + batch.size]
        position += batch.size
    assert position == len(data)


# ---------------------------------------------------------------------------------------
# validate_batch


@pytest.mark.parametrize(
    ("slack", "rejected"),
    [(-1, True), (0, False), (1, False)],
    ids=["one-under", "exact", "one-over"],
)
def test_batch_size_limit_boundary(slack: int, rejected: bool) -> None:
    """max_batch_bytes equal to the batch size passes; one byte less raises with the facts."""
    data = _rich_batch()
    limits = BatchLimits(max_record_bytes=1 << 20, max_batch_bytes=len(data) + slack)
    if not rejected:
        assert validate_batch(data, limits).size == len(data)
        return
    with pytest.raises(BatchTooLargeError) as info:
        validate_batch(data, limits)
    assert (info.value.size, info.value.limit) == (len(data), len(data) - 1)
    assert isinstance(info.value, InvalidBatchError)


@pytest.mark.parametrize(
    ("limit", "rejected"),
    [(99, True), (100, False), (101, False), (1, True)],
)
def test_record_size_limit_boundary(limit: int, rejected: bool) -> None:
    """A 100-byte value passes max_record_bytes=100 and fails 99 with index/size/limit."""
    data = encode_records([Record(b"x" * 100)])
    limits = BatchLimits(max_record_bytes=limit, max_batch_bytes=1 << 20)
    if not rejected:
        assert validate_batch(data, limits).values() == [b"x" * 100]
        return
    with pytest.raises(RecordTooLargeError) as info:
        validate_batch(data, limits)
    assert (info.value.index, info.value.size, info.value.limit) == (0, 100, limit)


@pytest.mark.parametrize(
    ("records", "index", "size"),
    [
        ([Record(b"a" * 50, key=b"k" * 50)], 0, 100),
        ([Record(b"a"), Record(b"b" * 90, headers={"abc": b"1234567"})], 1, 100),
        (
            [
                Record(b"a"),
                Record(b"b"),
                Record(b"c" * 60, key=b"k" * 20, headers={"é": b"x" * 18}),
            ],
            2,
            100,
        ),
        ([Record(b"v" * 99, key=None), Record(b"w" * 95, key=b"12345")], 1, 100),
    ],
    ids=["key-plus-value", "headers-push-over", "utf8-header-name", "largest-wins"],
)
def test_record_too_large_counts_key_value_and_headers(
    records: list[Record], index: int, size: int
) -> None:
    """A record's size is key + value + header names (UTF-8) + header values, as Record.size."""
    assert records[index].size == size
    data = encode_records(records)
    assert validate_batch(data, BatchLimits(size, 1 << 20)).record_count == len(records)
    with pytest.raises(RecordTooLargeError) as info:
        validate_batch(data, BatchLimits(size - 1, 1 << 20))
    assert (info.value.index, info.value.size, info.value.limit) == (index, size, size - 1)


@given(_record_lists)
def test_record_limit_property(records: list[Record]) -> None:
    """With the limit one under the largest record, the first largest record is named."""
    sizes = [r.size for r in records]
    largest = max(sizes)
    assume(largest > 0)
    data = encode_records(records)
    with pytest.raises(RecordTooLargeError) as info:
        validate_batch(data, BatchLimits(largest - 1, len(data)))
    assert info.value.index == sizes.index(largest)
    assert info.value.size == largest


@pytest.mark.parametrize(
    ("section", "position", "value"),
    [
        ("value_offsets", 1, 5),
        ("value_offsets", 0, 1),
        ("key_offsets", 1, 3),
        ("key_offsets", 0, 2),
        ("header_offsets", 1, 3),
        ("header_offsets", 0, 1),
        ("header_key_offsets", 1, 5),
        ("header_value_offsets", 1, 5),
        ("header_value_offsets", 0, 1),
    ],
)
def test_non_monotonic_offsets_with_valid_crc(section: str, position: int, value: int) -> None:
    """Offsets that start above 0 or decrease are rejected even though the CRC is valid."""
    data = encode_records(
        [
            Record(b"ab", key=b"k", headers={"h1": b"abc"}),
            Record(b"cd", key=b"l", headers={"h2": b"d"}),
        ]
    )
    start = getattr(_decode(data).layout, section)
    crafted = _reseal(_patch(data, start + 4 * position, "<i", value))
    assert decode_batch(crafted) is not None  # framing and CRC are fine
    with pytest.raises(InvalidBatchError, match="never decrease"):
        validate_batch(crafted, _GENEROUS)


def test_key_validity_bits_past_the_last_record() -> None:
    """A bitmap bit set for a record that does not exist is rejected."""
    data = encode_records([Record(b"v", key=b"k")])
    at = _decode(data).layout.key_validity
    crafted = bytearray(data)
    crafted[at] |= 0b10
    with pytest.raises(InvalidBatchError, match="key_validity has bits set past"):
        validate_batch(_reseal(crafted), _GENEROUS)


def test_eight_records_use_every_bitmap_bit() -> None:
    """With 8 records all 8 bits of the bitmap byte are real: all keys set is valid."""
    data = encode_records([Record(b"v", key=b"k")] * 8)
    assert bytes(_decode(data).key_validity()) == b"\xff"
    assert validate_batch(data, _GENEROUS).keys() == [b"k"] * 8


def test_header_names_must_be_utf8() -> None:
    """A header name that is not UTF-8 is rejected."""
    data = encode_records([Record(b"v", headers={"ab": b"1"})])
    at = _decode(data).layout.header_key_data
    crafted = bytearray(data)
    crafted[at : at + 2] = b"\xff\xfe"
    with pytest.raises(InvalidBatchError, match="UTF-8"):
        validate_batch(_reseal(crafted), _GENEROUS)


def test_header_names_split_inside_a_code_point_are_rejected() -> None:
    """Names b"\\xc3" and b"\\xa9" are each invalid UTF-8 though their concatenation is "é".

    validate_batch must reject the batch: otherwise it is appended and every later
    ``headers()`` on it raises UnicodeDecodeError.
    """
    data = encode_records([Record(b"v", headers={"a": b"1", "b": b"2"})])
    at = _decode(data).layout.header_key_data
    crafted = bytearray(data)
    crafted[at : at + 2] = b"\xc3\xa9"
    with pytest.raises(InvalidBatchError, match="UTF-8"):
        validate_batch(_reseal(crafted), _GENEROUS)


@pytest.mark.parametrize(
    ("header_max_ts", "column"),
    [(0, [5, 1_700_000_000_000]), (2**62, [5, 6])],
    ids=["header-understates", "header-overstates"],
)
def test_max_timestamp_must_match_the_column(header_max_ts: int, column: list[int]) -> None:
    """A header max_timestamp_ms that disagrees with the timestamps column is rejected.

    Retention decides on the header's max timestamp, so an untrusted batch that lies about it
    would have its records deleted early (or never).
    """
    data = encode_columns([b"a", b"b"], timestamps_ms=column)
    crafted = _reseal(_patch(data, _MAX_TS_AT, "<q", header_max_ts))
    with pytest.raises(InvalidBatchError):
        validate_batch(crafted, _GENEROUS)


@pytest.mark.parametrize("extra", [1, 8, 56, 96])
def test_trailing_bytes_are_rejected(extra: int) -> None:
    """validate_batch wants exactly one batch: any bytes after it are rejected."""
    data = encode_records([Record(b"hi")])
    with pytest.raises(InvalidBatchError, match="exactly one whole batch"):
        validate_batch(data + encode_records([Record(b"hi")])[:extra], _GENEROUS)


@pytest.mark.parametrize("cut", [0, 1, 55, 56, 95])
def test_truncated_batch_is_rejected(cut: int) -> None:
    """A truncated batch is InvalidBatchError (not None): validate wants the whole batch."""
    data = encode_records([Record(b"hi")])
    with pytest.raises(InvalidBatchError, match="exactly one whole batch"):
        validate_batch(data[:cut], _GENEROUS)


def test_corrupt_batch_becomes_invalid_batch_with_cause() -> None:
    """A CRC failure surfaces as InvalidBatchError chained from the CorruptBatchError."""
    data = _flip(_rich_batch(), 8 * 70)
    with pytest.raises(InvalidBatchError) as info:
        validate_batch(data, _GENEROUS)
    cause = info.value.__cause__
    while cause is not None and not isinstance(cause, CorruptBatchError):
        cause = cause.__cause__
    assert isinstance(cause, CorruptBatchError)
    assert cause.expected_crc is not None
    assert info.value.reason == cause.reason


def test_size_limit_is_checked_before_decoding() -> None:
    """An oversize buffer is BatchTooLargeError even if its bytes are garbage."""
    with pytest.raises(BatchTooLargeError) as info:
        validate_batch(bytes(200), BatchLimits(max_record_bytes=10, max_batch_bytes=199))
    assert info.value.size == 200


# ---------------------------------------------------------------------------------------
# iter_batches


def test_iter_batches_over_concatenated_batches() -> None:
    """Three batches end to end yield three batches, each at the right position."""
    parts = [
        _decode(encode_records([Record(b"a"), Record(b"b")])).with_base_offset(0),
        _decode(_rich_batch()).with_base_offset(2),
        _decode(encode_records([Record(b"z", key=b"k")])).with_base_offset(5),
    ]
    data = b"".join(parts)
    batches = list(iter_batches(data))
    assert [b.base_offset for b in batches] == [0, 2, 5]
    assert [b.size for b in batches] == [len(p) for p in parts]
    assert [bytes(b.buffer) for b in batches] == parts


def test_iter_batches_from_position() -> None:
    """Starting at ``pos`` skips the batches before it."""
    first = encode_records([Record(b"a")])
    second = encode_records([Record(b"b")])
    assert [b.values() for b in iter_batches(first + second, len(first))] == [[b"b"]]


@pytest.mark.parametrize("tail", [1, 55, 56, 95])
def test_iter_batches_stops_at_an_incomplete_tail(tail: int) -> None:
    """A torn last batch ends iteration quietly after the whole ones."""
    whole = encode_records([Record(b"a")])
    data = whole + whole + encode_records([Record(b"hi")])[:tail]
    assert len(list(iter_batches(data))) == 2


def test_iter_batches_raises_on_garbage_after_valid_batches() -> None:
    """Garbage after valid batches raises CorruptBatchError at the garbage's position."""
    whole = encode_records([Record(b"a")])
    batches = iter_batches(whole + bytes(HEADER_SIZE))
    assert next(batches).values() == [b"a"]
    with pytest.raises(CorruptBatchError) as info:
        next(batches)
    assert info.value.position == len(whole)


@pytest.mark.parametrize("data", [b"", bytes(10)])
def test_iter_batches_on_too_little_data_yields_nothing(data: bytes) -> None:
    """An empty (or sub-header) buffer yields no batches."""
    assert list(iter_batches(data)) == []
