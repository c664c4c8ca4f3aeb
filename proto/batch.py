"""Record batch codec: the unit of storage, transport and checksumming.

Role: pure functions between records and the bytes of one batch, the one codec of the wire
contract. Producers (``client``), the broker and its log (``wal``) and the Spark connector
all import it from here; it is never copied. ``encode_*`` build a batch;
:func:`decode_batch` has exactly three outcomes (a :class:`RecordBatch`, ``None`` for "need
more bytes", or :class:`~proto.errors.CorruptBatchError`). Decoding is tolerant of what
does not affect the meaning (reserved bits, padding), so data written by any older version
stays readable; the strict check of a batch a client sends is :func:`proto.check.check_batch`.

Layout (all integers little-endian; every section starts 8-byte aligned and the batch length
is a multiple of 8, so batches laid end to end stay aligned)::

    offset size field
    0      8    base_offset        u64  assigned by the log on append; NOT covered by the CRC
    8      4    batch_length       u32  bytes of the whole batch, header included
    12     4    crc32c             u32  CRC-32C (Castagnoli) of bytes [16, batch_length)
    16     1    magic              u8   0x48 ('H')
    17     1    version            u8   1
    18     2    flags              u16  bit 0: the headers section is present; others 0
    20     4    record_count       u32  n >= 1
    24     8    first_timestamp_ms i64  the first record's timestamp (not the minimum)
    32     8    max_timestamp_ms   i64  exactly the largest record timestamp
    40     8    producer_id        i64  -1 when the producer is not idempotent
    48     4    base_sequence      i32  -1 when the producer is not idempotent
    52     4    reserved           u32  0
    56          body:
                timestamps         i64[n]       per-record, ms since the epoch
                key_validity       u8[(n+7)/8]  Arrow bitmap, LSB first: 1 = key present
                key_offsets        i32[n+1]     Arrow binary offsets into key_data
                key_data
                value_offsets      i32[n+1]
                value_data
                if flags & HAS_HEADERS (an Arrow map<string, binary>):
                header_offsets     i32[n+1]     record i owns entries [h[i], h[i+1])
                header_key_offsets i32[m+1]     m = header_offsets[n]
                header_key_data                 UTF-8 names
                header_value_offsets i32[m+1]
                header_value_data

Every padding byte is 0, and so are the key validity bits past the last record. Header
names may repeat within a record; the entries keep their order (:meth:`RecordBatch.header_lists`
keeps every one, :meth:`RecordBatch.headers` is a dict view in which the last one wins).

The columnar body means a reader can wrap keys, values and timestamps as Arrow arrays with
no per-record Python work, and the broker can append a batch after checking it as a whole.
Because ``base_offset`` sits outside the CRC, the log assigns offsets by patching 8 bytes,
without re-checksumming.

Example: one record (key None, value b"hi", ts 5) encodes to 56 + 8 (ts) + 8 (bitmap,
padded) + 8 (key offsets, 2 x i32) + 8 (value offsets) + 8 (value "hi", padded) = 96 bytes.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from itertools import accumulate, pairwise
from typing import NamedTuple

import crc32c as _crc32c

from proto.errors import (
    CorruptBatchError,
    EmptyBatchError,
    InvalidBatchError,
)
from proto.record import Record

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("proto.batch reads i32/i64 columns in place and needs a little-endian CPU")

MAGIC = 0x48
VERSION = 1
FLAG_HAS_HEADERS = 0x1
_KNOWN_FLAGS = FLAG_HAS_HEADERS

HEADER = struct.Struct("<QIIBBHIqqqiI")
HEADER_SIZE = HEADER.size  # 56
CRC_START = 16
_PREFIX = struct.Struct("<QII")  # base_offset, batch_length, crc32c
_BASE_OFFSET = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_CRC_AT = struct.calcsize("<QI")  # after base_offset and batch_length
#: producer_id and base_sequence, after the header's fields up to max_timestamp_ms
_IDENTITY = struct.Struct("<qi")
_IDENTITY_AT = struct.calcsize("<QIIBBHIqq")
I32 = struct.Struct("<i")
_I32_MAX = 2**31 - 1

#: Largest batch the decoder will consider before calling the length field corrupt.
MAX_BATCH_LENGTH = 1 << 30


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """Return the CRC-32C (Castagnoli) of ``data``; any buffer, never copied."""
    return int(_crc32c.crc32c(data))


def _pad(n: int) -> int:
    return (-n) & 7


_ZEROS = bytes(8)

#: One record's headers, as the encoder takes them: a mapping, or ``(name, value)`` pairs
#: (which may repeat a name).
Headers = Mapping[str, bytes] | Sequence[tuple[str, bytes]]


class Layout(NamedTuple):
    """Byte positions of a batch's sections, relative to the batch start.

    A ``NamedTuple`` rather than a frozen dataclass: it is built once per decoded batch,
    and tuple construction is several times cheaper.
    """

    timestamps: int
    key_validity: int
    key_offsets: int
    key_data: int
    value_offsets: int
    value_data: int
    header_offsets: int  # -1 without headers
    header_key_offsets: int
    header_key_data: int
    header_value_offsets: int
    header_value_data: int
    header_count: int
    end: int


class RecordBatch(NamedTuple):
    """A decoded view over one batch's bytes; the bytes are not copied.

    Task-safe: immutable. (A ``NamedTuple`` for construction speed; see :class:`Layout`.)
    """

    buffer: memoryview
    base_offset: int
    record_count: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    base_sequence: int
    flags: int
    crc: int
    layout: Layout

    @property
    def size(self) -> int:
        """Bytes of the batch, header included."""
        return len(self.buffer)

    @property
    def last_offset(self) -> int:
        """Offset of the batch's last record."""
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        """Offset just past the batch."""
        return self.base_offset + self.record_count

    @property
    def has_headers(self) -> bool:
        """Whether the headers section is present."""
        return bool(self.flags & FLAG_HAS_HEADERS)

    def int32s(self, start: int, count: int) -> memoryview:
        """``count`` little-endian i32 values starting at byte ``start`` of the batch."""
        return self.buffer[start : start + 4 * count].cast("i")

    def timestamps(self) -> memoryview:
        """Per-record timestamps, an ``i64`` memoryview."""
        start = self.layout.timestamps
        return self.buffer[start : start + 8 * self.record_count].cast("q")

    def key_validity(self) -> memoryview:
        """The key validity bitmap (Arrow layout, LSB first, 1 = key present)."""
        start = self.layout.key_validity
        return self.buffer[start : start + (self.record_count + 7) // 8]

    def key_offsets(self) -> memoryview:
        """``i32[n+1]`` offsets into :meth:`key_data`."""
        return self.int32s(self.layout.key_offsets, self.record_count + 1)

    def key_data(self) -> memoryview:
        """All keys, concatenated."""
        start = self.layout.key_data
        return self.buffer[start : start + self.key_offsets()[-1]]

    def value_offsets(self) -> memoryview:
        """``i32[n+1]`` offsets into :meth:`value_data`."""
        return self.int32s(self.layout.value_offsets, self.record_count + 1)

    def value_data(self) -> memoryview:
        """All values, concatenated."""
        offs = self.value_offsets()
        start = self.layout.value_data
        return self.buffer[start : start + offs[-1]]

    def values(self) -> list[bytes]:
        """Every record's value, as ``bytes``."""
        offs = self.value_offsets().tolist()
        data = bytes(self.value_data())
        return [data[a:b] for a, b in pairwise(offs)]

    def keys(self) -> list[bytes | None]:
        """Every record's key, or ``None`` where the record has none."""
        offs = self.key_offsets().tolist()
        data = bytes(self.key_data())
        bits = bytes(self.key_validity())
        return [
            data[offs[i] : offs[i + 1]] if bits[i >> 3] >> (i & 7) & 1 else None
            for i in range(self.record_count)
        ]

    def headers(self) -> list[dict[str, bytes]]:
        """Every record's headers as a dict (empty when the batch has none).

        Header names may repeat within a record; in this view the last entry of a name
        wins. :meth:`header_lists` keeps every entry.
        """
        return [dict(pairs) for pairs in self.header_lists()]

    def header_lists(self) -> list[list[tuple[str, bytes]]]:
        """Every record's headers as ``(name, value)`` pairs in batch order, duplicates kept."""
        n = self.record_count
        if not self.has_headers:
            return [[] for _ in range(n)]
        lay = self.layout
        m = lay.header_count
        per = self.int32s(lay.header_offsets, n + 1).tolist()
        ko = self.int32s(lay.header_key_offsets, m + 1).tolist()
        vo = self.int32s(lay.header_value_offsets, m + 1).tolist()
        kd = bytes(self.buffer[lay.header_key_data : lay.header_key_data + ko[-1]])
        vd = bytes(self.buffer[lay.header_value_data : lay.header_value_data + vo[-1]])
        pairs = [(kd[ko[j] : ko[j + 1]].decode(), vd[vo[j] : vo[j + 1]]) for j in range(m)]
        return [pairs[per[i] : per[i + 1]] for i in range(n)]

    def records(self) -> list[Record]:
        """Decode every record. This is the per-record path; prefer the columns where you can."""
        return [
            Record(value=v, key=k, headers=h, timestamp_ms=t)
            for v, k, h, t in zip(
                self.values(),
                self.keys(),
                self.headers(),
                self.timestamps().tolist(),
                strict=True,
            )
        ]

    def offsets(self) -> range:
        """The offsets of the batch's records."""
        return range(self.base_offset, self.next_offset)

    def with_base_offset(self, base_offset: int) -> bytes:
        """A copy of the batch bytes with ``base_offset`` patched in (the CRC is unaffected)."""
        return _BASE_OFFSET.pack(base_offset) + bytes(self.buffer[8:])


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of a keyed record, ``crc32c(key) % partitions``: the same in every
    client and the broker, and across restarts (docs/protocol.md section 4)."""
    return crc32c(key) % partitions


def producer_id_of(data: bytes | bytearray | memoryview) -> int | None:
    """The ``producer_id`` the header of the encoded batch ``data`` announces, unchecked
    (the rest of the batch may be anything); ``None`` when ``data`` is too short to hold
    it and the base sequence after it."""
    if len(data) < _IDENTITY_AT + _IDENTITY.size:
        return None
    producer_id: int = _IDENTITY.unpack_from(data, _IDENTITY_AT)[0]
    return producer_id


def restamp(data: bytes, producer_id: int, base_sequence: int) -> bytes:
    """A copy of the encoded batch ``data`` under another ``producer_id`` and
    ``base_sequence`` (header bytes 40..52, see the layout above), its CRC recomputed; the
    records are not encoded again (a producer re-sends a batch under a new id this way)."""
    out = bytearray(data)
    _IDENTITY.pack_into(out, _IDENTITY_AT, producer_id, base_sequence)
    _CRC.pack_into(out, _CRC_AT, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


# ---------------------------------------------------------------------------------------
# Encoding


def encode_records(
    records: Sequence[Record], *, producer_id: int = -1, base_sequence: int = -1
) -> bytes:
    """Encode records into one batch with ``base_offset`` 0 (the log assigns the real one).

    Raises:
        EmptyBatchError: ``records`` is empty.
        InvalidBatchError: a field is out of range (see :func:`encode_columns`).
    """
    has_headers = any(r.headers for r in records)
    return encode_columns(
        [r.value for r in records],
        keys=[r.key for r in records],
        timestamps_ms=[r.timestamp_ms for r in records],
        headers=[r.headers for r in records] if has_headers else None,
        producer_id=producer_id,
        base_sequence=base_sequence,
    )


def encode_columns(
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamps_ms: Sequence[int] | int = 0,
    headers: Sequence[Headers] | None = None,
    producer_id: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """Encode columns of records into one batch; the fast path for producers.

    Args:
        values: One value per record.
        keys: One key (or ``None``) per record, or ``None`` for no keys at all.
        timestamps_ms: One timestamp per record, or one for all of them.
        headers: Per record, a mapping or a sequence of ``(name, value)`` pairs (which
            may repeat a name; order and duplicates are kept), or ``None`` for no headers.
        producer_id: Idempotent producer id, or -1.
        base_sequence: Sequence number of the first record for ``producer_id``, or -1.

    Returns:
        The batch bytes, ``base_offset`` 0.

    Raises:
        EmptyBatchError: ``values`` is empty.
        InvalidBatchError: lengths disagree, a section exceeds 2 GiB, or a field is out of
            range for its column (timestamps i64, producer_id i64, base_sequence i32).
    """
    n = len(values)
    if n == 0:
        raise EmptyBatchError()
    try:
        ts = array("q", [timestamps_ms] * n if isinstance(timestamps_ms, int) else timestamps_ms)
    except OverflowError as exc:
        raise InvalidBatchError("timestamps must fit in a signed 64-bit integer (ms)") from exc
    _check_len("timestamps_ms", len(ts), n)
    parts: list[bytes | memoryview] = [b"", ts.tobytes()]
    parts += _encode_keys(keys, n)
    parts += _encode_binary(values)
    flags = 0
    if headers is not None:
        _check_len("headers", len(headers), n)
        flags |= FLAG_HAS_HEADERS
        parts += _encode_headers(headers)
    body_len = sum(len(p) for p in parts)
    total = HEADER_SIZE + body_len
    try:
        head_rest = HEADER.pack(
            0, total, 0, MAGIC, VERSION, flags, n, ts[0], max(ts), producer_id, base_sequence, 0
        )
    except struct.error as exc:
        raise InvalidBatchError(
            f"producer_id must fit in i64 and base_sequence in i32 "
            f"(got {producer_id}, {base_sequence})"
        ) from exc
    parts[0] = head_rest
    out = bytearray().join(parts)
    crc = crc32c(memoryview(out)[CRC_START:])
    _PREFIX.pack_into(out, 0, 0, total, crc)
    return bytes(out)


def _check_len(name: str, got: int, want: int) -> None:
    if got != want:
        raise InvalidBatchError(f"{name} has {got} entries but there are {want} values")


def _offsets(lengths: Iterator[int] | list[int]) -> array[int]:
    offs = array("q", accumulate(lengths, initial=0))
    if offs[-1] > _I32_MAX:
        raise InvalidBatchError("a section of the batch exceeds 2 GiB; send smaller batches")
    return array("i", offs)


def _encode_binary(items: Sequence[bytes]) -> list[bytes]:
    offs = _offsets(list(map(len, items)))
    data = b"".join(items)
    return [offs.tobytes(), _ZEROS[: _pad(4 * len(offs))], data, _ZEROS[: _pad(len(data))]]


def _encode_keys(keys: Sequence[bytes | None] | None, n: int) -> list[bytes]:
    nbm = (n + 7) // 8
    if keys is None:
        bitmap = bytes(nbm)
        present: Sequence[bytes] = [b""] * n
    else:
        _check_len("keys", len(keys), n)
        bits = bytearray(nbm)
        for i, k in enumerate(keys):
            if k is not None:
                bits[i >> 3] |= 1 << (i & 7)
        bitmap = bytes(bits)
        present = [b"" if k is None else k for k in keys]
    return [bitmap, _ZEROS[: _pad(nbm)], *_encode_binary(present)]


def _encode_headers(headers: Sequence[Headers]) -> list[bytes]:
    per = _offsets(list(map(len, headers)))
    pairs = [pair for h in headers for pair in (h.items() if isinstance(h, Mapping) else h)]
    names = [name.encode() for name, _ in pairs]
    vals = [v for _, v in pairs]
    return [
        per.tobytes(),
        _ZEROS[: _pad(4 * len(per))],
        *_encode_binary(names),
        *_encode_binary(vals),
    ]


# ---------------------------------------------------------------------------------------
# Decoding


def read_length(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """Return the ``batch_length`` of the batch at ``pos``, or ``None`` if under 12 bytes remain."""
    if len(buf) - pos < 12:
        return None
    return int(struct.unpack_from("<I", buf, pos + 8)[0])


def decode_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, verify_crc: bool = True
) -> RecordBatch | None:
    """Decode the batch that starts at ``pos`` in ``buf``.

    Args:
        buf: Bytes holding zero or more batches.
        pos: Where the batch starts.
        verify_crc: Check the CRC (leave on for anything read from disk or the network).

    Returns:
        The batch, or ``None`` when ``buf`` ends before the batch does ("need more bytes").

    Raises:
        CorruptBatchError: bad magic, version, length, CRC, or section layout.
    """
    if len(buf) - pos < HEADER_SIZE:
        return None
    (base, length, crc, magic, version, flags, n, first_ts, max_ts, pid, seq, _reserved) = (
        HEADER.unpack_from(buf, pos)
    )
    if magic != MAGIC or version != VERSION:
        raise CorruptBatchError(
            pos,
            f"bad magic/version {magic:#04x}/{version} (magic must be {MAGIC:#04x}, "
            f"version {VERSION})",
            field="magic" if magic != MAGIC else "version",
        )
    if length < HEADER_SIZE or length > MAX_BATCH_LENGTH or length & 7:
        raise CorruptBatchError(
            pos,
            f"impossible batch length {length} (batch_length must be a multiple of 8 from "
            f"{HEADER_SIZE} to {MAX_BATCH_LENGTH})",
            field="batch_length",
        )
    if len(buf) - pos < length:
        return None
    view = memoryview(buf)[pos : pos + length]
    if verify_crc:
        actual = crc32c(view[CRC_START:])
        if actual != crc:
            raise CorruptBatchError(
                pos, "checksum mismatch", expected_crc=crc, actual_crc=actual, field="crc32c"
            )
    if n == 0:
        raise CorruptBatchError(pos, "record_count must be at least 1", field="record_count")
    if flags & ~_KNOWN_FLAGS:
        raise CorruptBatchError(
            pos,
            f"flags has reserved bits {flags & ~_KNOWN_FLAGS:#x} set (only bit 0, "
            "headers present, is defined; the others must be 0)",
            field="flags",
        )
    layout = _layout(view, n, flags, pos)
    return RecordBatch(view, base, n, first_ts, max_ts, pid, seq, flags, crc, layout)


def _align(n: int) -> int:
    return (n + 7) & ~7


def _layout(view: memoryview, n: int, flags: int, pos: int) -> Layout:
    """Compute section positions, checking every section lies inside the batch.

    Straight-line arithmetic on purpose: this runs once per appended batch, and for
    single-record batches its cost is a visible share of the append path.
    """
    length = len(view)
    unpack = I32.unpack_from
    ko = HEADER_SIZE + 8 * n + _align((n + 7) // 8)
    kd = ko + _align(4 * (n + 1))
    if kd > length:
        raise CorruptBatchError(
            pos, "key_offsets run past the end of the batch", field="key_offsets"
        )
    klen = unpack(view, ko + 4 * n)[0]
    if klen < 0:
        raise CorruptBatchError(
            pos,
            f"key data has a negative length {klen} (last key_offsets entry)",
            field="key_offsets",
        )
    vo = kd + _align(klen)
    vd = vo + _align(4 * (n + 1))
    if vd > length:
        raise CorruptBatchError(
            pos, "value_offsets run past the end of the batch", field="value_offsets"
        )
    vlen = unpack(view, vo + 4 * n)[0]
    if vlen < 0:
        raise CorruptBatchError(
            pos,
            f"value data has a negative length {vlen} (last value_offsets entry)",
            field="value_offsets",
        )
    end = vd + _align(vlen)
    ho = hko = hkd = hvo = hvd = -1
    m = 0
    if flags & FLAG_HAS_HEADERS:
        ho, hko, hkd, hvo, hvd, m, end = _header_layout(view, n, end, pos)
    if end != length:
        raise CorruptBatchError(
            pos,
            f"sections end at byte {end}, batch_length is {length}",
            field="batch_length",
        )
    return Layout(HEADER_SIZE, HEADER_SIZE + 8 * n, ko, kd, vo, vd, ho, hko, hkd, hvo, hvd, m, end)


def _header_layout(
    view: memoryview, n: int, start: int, pos: int
) -> tuple[int, int, int, int, int, int, int]:
    """Positions of the header sections that begin at ``start``."""
    length = len(view)
    unpack = I32.unpack_from

    def offsets(at: int, count: int, what: str) -> tuple[int, int]:
        end = at + _align(4 * (count + 1))
        if end > length or count < 0:
            raise CorruptBatchError(pos, f"{what} run past the end of the batch", field=what)
        last = unpack(view, at + 4 * count)[0]
        if last < 0 or end + last > length:
            raise CorruptBatchError(pos, f"{what} point past the end of the batch", field=what)
        return end, last

    hko, m = offsets(start, n, "header_offsets")
    hkd, klen = offsets(hko, m, "header_key_offsets")
    hvo = hkd + _align(klen)
    hvd, vlen = offsets(hvo, m, "header_value_offsets")
    return start, hko, hkd, hvo, hvd, m, hvd + _align(vlen)


def iter_batches(buf: bytes | bytearray | memoryview, pos: int = 0) -> Iterator[RecordBatch]:
    """Yield each whole batch in ``buf`` from ``pos``; stop at the first incomplete one.

    Raises:
        CorruptBatchError: from :func:`decode_batch`.
    """
    while True:
        batch = decode_batch(buf, pos)
        if batch is None:
            return
        yield batch
        pos += batch.size
