"""The strict check of a record batch sent by a client: every rule of the format.

Role: :func:`check_batch` is what the broker applies to an untrusted batch before anything
else (the log's size limits come after it, in :mod:`wal.validate`). It enforces what
:func:`proto.batch.decode_batch` leaves alone because reads trust the CRC, and what a
producer written from the spec alone can get wrong:

- exactly one whole batch (``batch_length`` is the byte count sent);
- ``base_offset`` is 0: the broker assigns offsets, a client never does;
- the ``reserved`` field, and every padding byte, is 0;
- key, value and header offsets start at 0 and never decrease;
- the key validity bits past the last record are 0;
- ``first_timestamp_ms`` is the first record's timestamp and ``max_timestamp_ms`` exactly
  the largest one;
- every header name is valid UTF-8.

Each violation raises :class:`~proto.errors.InvalidBatchError` whose ``field`` (and
message) names the field. Example: a batch whose bytes 52..55 hold 7 gets ``reserved must
be 0, got 7`` with ``field == "reserved"``.

Reading stays tolerant on purpose: decoding a batch from disk checks its CRC and layout but
none of the rules above, so data written by an older version, which did not check them,
stays readable.

Per-record work is limited to C-level passes over the offset arrays; single-record batches
without headers skip even those. Pure module: imports nothing but :mod:`proto`, and neither
``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import struct
from itertools import pairwise

from proto.batch import HEADER_SIZE, I32, RecordBatch, decode_batch, read_length
from proto.errors import CorruptBatchError, InvalidBatchError

#: Byte position of the ``reserved`` u32 in the batch header.
RESERVED_AT = 52
_U32 = struct.Struct("<I")
#: The highest record sequence a producer id may reach (docs/protocol.md section 3).
MAX_SEQUENCE = 2**31 - 1


def check_batch(data: bytes | bytearray | memoryview) -> RecordBatch:
    """Decode ``data`` as exactly one batch a client sent, checking every rule of the format.

    Returns:
        The decoded batch (a view over ``data``).

    Raises:
        InvalidBatchError: a rule is broken; ``field`` names the field.
    """
    try:
        batch = decode_batch(data)
    except CorruptBatchError as exc:
        raise InvalidBatchError(exc.reason, field=exc.field) from exc
    if batch is None or batch.size != len(data):
        raise InvalidBatchError(_length_problem(data), field="batch_length")
    if batch.base_offset != 0:
        raise InvalidBatchError(
            f"base_offset must be 0 (the broker assigns offsets), got {batch.base_offset}",
            field="base_offset",
        )
    if batch.producer_id < -1:
        raise InvalidBatchError(
            f"producer_id is {batch.producer_id}; use -1 for a producer that is not "
            "idempotent, or an id >= 0 that the producer chooses (our client picks a random "
            "62-bit one) and keeps across its retries",
            field="producer_id",
        )
    if batch.producer_id == -1 and batch.base_sequence != -1:
        raise InvalidBatchError(
            f"base_sequence is {batch.base_sequence}; it must be -1 when producer_id is -1 "
            "(a producer that is not idempotent): set both to -1, or give the batch a "
            "producer id >= 0 to make it idempotent",
            field="base_sequence",
        )
    if batch.producer_id >= 0:
        last = batch.base_sequence + batch.record_count - 1
        if batch.base_sequence < 0 or last > MAX_SEQUENCE:
            raise InvalidBatchError(
                f"base_sequence is {batch.base_sequence}; an idempotent producer's (id "
                f"{batch.producer_id}) must be >= 0, and its last record's sequence ({last}) "
                f"at most {MAX_SEQUENCE}: past that, take a new producer id",
                field="base_sequence",
            )
    reserved = _U32.unpack_from(batch.buffer, RESERVED_AT)[0]
    if reserved:
        raise InvalidBatchError(f"reserved must be 0, got {reserved}", field="reserved")
    _check_offsets(batch)
    _check_bitmap_tail(batch)
    _check_timestamps(batch)
    _check_padding(batch, data if type(data) is bytes else bytes(data))
    return batch


def _length_problem(data: bytes | bytearray | memoryview) -> str:
    """Why ``data`` is not exactly one whole batch (it is not, and it did not fail to decode)."""
    announced = read_length(data)
    if announced is None or len(data) < HEADER_SIZE:
        return (
            f"got {len(data)} bytes, fewer than the {HEADER_SIZE}-byte batch header; "
            "send exactly one whole batch"
        )
    return (
        f"got {len(data)} bytes but batch_length announces {announced}; "
        "send exactly one whole batch"
    )


def _check_monotonic(offs: memoryview, field: str) -> None:
    seq = offs.tolist()
    if seq[0] != 0 or seq != sorted(seq):
        raise InvalidBatchError(f"{field} must start at 0 and never decrease", field=field)


def _check_offsets(batch: RecordBatch) -> None:
    lay = batch.layout
    if batch.record_count == 1 and not batch.has_headers:
        # Decoding proved each section's length is not negative; with one record the
        # offsets are [0, length], so only the leading zeros remain to check.
        if I32.unpack_from(batch.buffer, lay.key_offsets)[0]:
            raise InvalidBatchError("key_offsets must start at 0", field="key_offsets")
        if I32.unpack_from(batch.buffer, lay.value_offsets)[0]:
            raise InvalidBatchError("value_offsets must start at 0", field="value_offsets")
        return
    _check_monotonic(batch.key_offsets(), "key_offsets")
    _check_monotonic(batch.value_offsets(), "value_offsets")
    if not batch.has_headers:
        return
    n, m = batch.record_count, lay.header_count
    _check_monotonic(batch.int32s(lay.header_offsets, n + 1), "header_offsets")
    _check_monotonic(batch.int32s(lay.header_key_offsets, m + 1), "header_key_offsets")
    _check_monotonic(batch.int32s(lay.header_value_offsets, m + 1), "header_value_offsets")
    offs = batch.int32s(lay.header_key_offsets, m + 1).tolist()
    names = bytes(batch.buffer[lay.header_key_data : lay.header_key_data + offs[-1]])
    try:
        for a, b in pairwise(offs):  # each name on its own: a split code point is invalid
            names[a:b].decode()
    except UnicodeDecodeError as exc:
        raise InvalidBatchError(
            "every header name must be valid UTF-8", field="header_key_data"
        ) from exc


def _check_timestamps(batch: RecordBatch) -> None:
    """The header's first and max timestamps drive retention and seeks: they must not lie."""
    ts = batch.timestamps()
    if batch.first_timestamp_ms != ts[0]:
        raise InvalidBatchError(
            f"first_timestamp_ms must be the first record's timestamp {ts[0]} (not the "
            f"minimum), got {batch.first_timestamp_ms}",
            field="first_timestamp_ms",
        )
    top = max(ts)
    if batch.max_timestamp_ms != top:
        raise InvalidBatchError(
            f"max_timestamp_ms must be exactly the largest record timestamp {top}, "
            f"got {batch.max_timestamp_ms}",
            field="max_timestamp_ms",
        )


def _check_bitmap_tail(batch: RecordBatch) -> None:
    n = batch.record_count
    spare = (-n) % 8
    if spare and batch.buffer[batch.layout.key_validity + (n - 1) // 8] >> (8 - spare):
        raise InvalidBatchError(
            f"key_validity has bits set past the last record (bits {n} and up must be 0)",
            field="key_validity",
        )


def _padding(batch: RecordBatch) -> list[tuple[str, int, int]]:
    """``(section, start, end)`` of every padding run of ``batch``: after each section, up
    to the 8-byte boundary where the next one starts."""
    lay, n = batch.layout, batch.record_count
    buf = batch.buffer
    klen = I32.unpack_from(buf, lay.key_offsets + 4 * n)[0]
    vlen = I32.unpack_from(buf, lay.value_offsets + 4 * n)[0]
    values_end = lay.header_offsets if batch.has_headers else lay.end
    runs = [
        ("key_validity", lay.key_validity + (n + 7) // 8, lay.key_offsets),
        ("key_offsets", lay.key_offsets + 4 * (n + 1), lay.key_data),
        ("key_data", lay.key_data + klen, lay.value_offsets),
        ("value_offsets", lay.value_offsets + 4 * (n + 1), lay.value_data),
        ("value_data", lay.value_data + vlen, values_end),
    ]
    if batch.has_headers:
        m = lay.header_count
        hklen = I32.unpack_from(buf, lay.header_key_offsets + 4 * m)[0]
        hvlen = I32.unpack_from(buf, lay.header_value_offsets + 4 * m)[0]
        runs += [
            ("header_offsets", lay.header_offsets + 4 * (n + 1), lay.header_key_offsets),
            ("header_key_offsets", lay.header_key_offsets + 4 * (m + 1), lay.header_key_data),
            ("header_key_data", lay.header_key_data + hklen, lay.header_value_offsets),
            ("header_value_offsets", lay.header_value_offsets + 4 * (m + 1), lay.header_value_data),
            ("header_value_data", lay.header_value_data + hvlen, lay.end),
        ]
    return runs


def _check_padding(batch: RecordBatch, raw: bytes) -> None:
    """Every padding byte is 0 (``raw`` is the batch's bytes). Straight-line for the common
    case (no headers), counting zeros in place: this runs on every append, and only a batch
    with headers, or one that fails, pays for :func:`_padding`'s named runs."""
    lay, n = batch.layout, batch.record_count
    if not batch.has_headers:
        unpack, zeros = I32.unpack_from, raw.count
        kv = lay.key_validity + (n + 7) // 8
        ko = lay.key_offsets + 4 * (n + 1)
        kd = lay.key_data + unpack(raw, lay.key_offsets + 4 * n)[0]
        vo = lay.value_offsets + 4 * (n + 1)
        vd = lay.value_data + unpack(raw, lay.value_offsets + 4 * n)[0]
        if (
            zeros(0, kv, lay.key_offsets) == lay.key_offsets - kv
            and zeros(0, ko, lay.key_data) == lay.key_data - ko
            and zeros(0, kd, lay.value_offsets) == lay.value_offsets - kd
            and zeros(0, vo, lay.value_data) == lay.value_data - vo
            and zeros(0, vd, lay.end) == lay.end - vd
        ):
            return
    for section, start, end in _padding(batch):
        if raw.count(0, start, end) != end - start:
            raise InvalidBatchError(
                f"the padding after {section} (bytes {start}..{end - 1}) must be 0",
                field="padding",
            )
