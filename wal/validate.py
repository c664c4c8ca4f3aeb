"""Validation of untrusted record batches, before they are appended.

Role: the log's gate. :func:`validate_batch` applies the wire format's strict check
(:func:`proto.check.check_batch`: base offset 0, reserved and padding zero, offsets that
never decrease, exact header timestamps, valid UTF-8 header names) and then this log's
size and header limits. Per-record work is limited to C-level passes over the offset
arrays, and skipped where a whole-batch bound already proves the answer.

Single-record batches without headers (the commonest publish) take a fused path,
:func:`_accept_single`, that proves every one of those rules with one ``struct`` unpack
and a few comparisons; anything it cannot prove goes the general way, which also names
what is wrong. It only ever accepts: a batch it returns is the one ``check_batch`` returns.

Every append is validated, whoever makes the batch (a client's Publish, a dead-letter
copy, a replay): all of them are freshly encoded, so the strict rules hold for all. The
one exception is a follower's append of its leader's batches: :func:`check_replicated`
decodes them as a read from disk does (header, CRC and section bounds, the leader's base
offsets kept) and checks that they follow on one from another; it walks no record and
applies no limit (the leader did, at publish).

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from dataclasses import dataclass
from itertools import pairwise
from operator import sub

import crc32c as _crc32c

from proto.batch import (
    CRC_START,
    HEADER_SIZE,
    MAGIC,
    VERSION,
    Layout,
    RecordBatch,
    decode_batch,
)
from proto.check import check_batch
from proto.errors import CorruptBatchError, InvalidBatchError
from wal.errors import (
    BatchRejectedError,
    BatchTooLargeError,
    HeaderLimitError,
    RecordTooLargeError,
    ReplicaOffsetMismatchError,
)


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """Limits applied to a batch before append.

    Attributes:
        max_record_bytes: Largest key + value + headers of one record, in bytes.
        max_batch_bytes: Largest encoded batch, in bytes.
        max_headers_per_record: Most headers of one record; ``None``: no limit.
        max_header_bytes: Most bytes of one record's header names and values together;
            ``None``: no limit.
        max_header_name_bytes: Longest header name, bytes; ``None``: no limit.
    """

    max_record_bytes: int
    max_batch_bytes: int
    max_headers_per_record: int | None = None
    max_header_bytes: int | None = None
    max_header_name_bytes: int | None = None


def validate_batch(data: bytes | bytearray | memoryview, limits: BatchLimits) -> RecordBatch:
    """Check an untrusted batch completely: every rule of the format, then the limits.

    Per-record work is limited to C-level passes over the offset arrays, and skipped when
    the whole body is within ``max_record_bytes``.

    Raises:
        BatchTooLargeError: the batch exceeds ``max_batch_bytes``.
        RecordTooLargeError: a record exceeds ``max_record_bytes``.
        HeaderLimitError: a record's headers break one of the header limits.
        BatchRejectedError: a rule of the format is broken (:func:`proto.check.check_batch`);
            ``field`` and the message name the field.
    """
    if len(data) > limits.max_batch_bytes:
        raise BatchTooLargeError(len(data), limits.max_batch_bytes)
    if type(data) is bytes and len(data) >= _SINGLE_MIN:
        single = _accept_single(data)
        if single is not None:
            if single.size - HEADER_SIZE > limits.max_record_bytes:
                _check_record_sizes(single, limits.max_record_bytes)
            return single
    try:
        batch = check_batch(data)
    except InvalidBatchError as exc:
        raise BatchRejectedError(exc.reason, field=exc.field) from exc
    if batch.has_headers:
        _check_headers(batch, limits)
    if batch.size - HEADER_SIZE > limits.max_record_bytes:
        _check_record_sizes(batch, limits.max_record_bytes)
    return batch


def check_replicated(data: bytes | bytearray | memoryview) -> list[RecordBatch]:
    """Decode a leader's batches laid end to end, as a follower is given them to append.

    Each batch is checked as a read from disk checks it (:func:`proto.batch.decode_batch`:
    magic, version, a length in range, a record count of at least 1, known flags, the CRC,
    and the section bounds, a fixed number of steps whatever the record count), and each
    must start where the one before it ends (its base offset plus its record count). No
    record is walked and no limit of this log applies: the leader checked every record
    against the producer's rules and its limits when it was published, and the CRC, over
    every byte from the magic to the batch's end, proves these are the leader's bytes.
    The bytes outside it are the base offset (it must follow on, and the first must be
    the follower's head, checked when they are written: :meth:`wal.log.Log.append_replicated`),
    the length (in range, and it decides the bytes the CRC covers) and the CRC itself, so a
    flipped bit anywhere is refused. A limit here could only refuse what the leader holds,
    and the follower would stop at that batch for good. Empty ``data`` gives ``[]``.

    Example: batches at offsets 100 (3 records) and 103 pass; 100 (3 records) then 104
    raises ``ReplicaOffsetMismatchError(index=1, expected=103, found=104)``.

    Raises:
        CorruptBatchError: a batch fails a check, or ``data`` ends inside a batch;
            ``position`` is its byte position in ``data``.
        ReplicaOffsetMismatchError: a batch does not start where the one before it ends.
    """
    view = memoryview(data)
    batches: list[RecordBatch] = []
    pos, end, expected = 0, len(view), -1
    while pos < end:  # locals, no properties: this runs for every batch a follower gets
        batch = decode_batch(view, pos)
        if batch is None:
            raise CorruptBatchError(
                pos, f"the data ends inside a batch ({end - pos} bytes left)", field="batch_length"
            )
        base = batch.base_offset
        if base != expected and batches:
            raise ReplicaOffsetMismatchError(len(batches), expected, base)
        batches.append(batch)
        expected = base + batch.record_count
        pos += len(batch.buffer)
    return batches


#: The header, then a single record's timestamp, key validity byte (with the 7 padding
#: bytes after it, as one u64) and its two key offsets: bytes 0..79 of such a batch.
_SINGLE = struct.Struct("<QIIBBHIqqqiIqQii")
_SINGLE_MIN = _SINGLE.size + 8  # then at least the two value offsets
_PAIR = struct.Struct("<ii")
_KEY_DATA = _SINGLE.size  # where a single record's key data starts
#: A single record's layout depends only on where its values start and its size: the
#: layouts seen are shared (immutable tuples), up to this many distinct ones.
_LAYOUTS: dict[tuple[int, int], Layout] = {}
_LAYOUTS_MAX = 4096


def _accept_single(data: bytes) -> RecordBatch | None:
    """The decoded batch if ``data`` is a valid one-record batch without headers, else
    ``None`` (not proven: the general check decides, and says what is wrong).

    Proves what ``decode_batch`` and ``check_batch`` would: magic, version, flags 0,
    ``record_count`` 1, ``batch_length`` the byte count, ``base_offset`` 0, ``producer_id``
    >= -1 (and ``base_sequence`` >= 0 with an id >= 0, -1 with id -1; one record's last
    sequence is its base, an i32), ``reserved`` 0, both header timestamps equal to the
    record's, the validity bits past the record and every padding byte 0, offsets starting
    at 0, sections ending exactly at the batch's end, and the CRC.
    """
    (
        base, length, crc, magic, version, flags, n, first_ts, max_ts, pid, seq, reserved,
        ts, validity, k0, klen,
    ) = _SINGLE.unpack_from(data)  # fmt: skip
    size = len(data)
    if (
        base
        or length != size
        or magic != MAGIC
        or version != VERSION
        or flags
        or n != 1
        or pid < -1
        or (seq < 0 if pid >= 0 else seq != -1)
        or reserved
    ):
        return None
    if ts != first_ts or ts != max_ts or validity >> 1 or k0 or klen < 0:
        return None
    vo = _KEY_DATA + ((klen + 7) & ~7)
    vd = vo + 8
    if vd > size:
        return None
    v0, vlen = _PAIR.unpack_from(data, vo)
    if v0 or vlen < 0 or vd + ((vlen + 7) & ~7) != size:
        return None
    key_end, value_end = _KEY_DATA + klen, vd + vlen
    if (
        data.count(0, key_end, vo) != vo - key_end
        or data.count(0, value_end, size) != size - value_end
        or _crc32c.crc32c(memoryview(data)[CRC_START:]) != crc
    ):
        return None
    layout = _LAYOUTS.get((vo, size))
    if layout is None:
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.clear()
        layout = Layout(HEADER_SIZE, 64, 72, _KEY_DATA, vo, vd, -1, -1, -1, -1, -1, 0, size)
        _LAYOUTS[vo, size] = layout
    # tuple.__new__: the NamedTuple's own __new__ is a Python function, 3x slower.
    fields = (memoryview(data), 0, 1, first_ts, max_ts, pid, seq, 0, crc, layout)
    return tuple.__new__(RecordBatch, fields)


def _sizes(offs: memoryview) -> list[int]:
    seq = offs.tolist()
    return [b - a for a, b in pairwise(seq)]


def _check_record_sizes(batch: RecordBatch, limit: int) -> None:
    sizes = [
        k + v
        for k, v in zip(_sizes(batch.key_offsets()), _sizes(batch.value_offsets()), strict=True)
    ]
    if batch.has_headers:
        lay = batch.layout
        per = batch.int32s(lay.header_offsets, batch.record_count + 1).tolist()
        hk = batch.int32s(lay.header_key_offsets, lay.header_count + 1).tolist()
        hv = batch.int32s(lay.header_value_offsets, lay.header_count + 1).tolist()
        for i in range(batch.record_count):
            a, b = per[i], per[i + 1]
            sizes[i] += hk[b] - hk[a] + hv[b] - hv[a]
    worst = max(range(len(sizes)), key=sizes.__getitem__)
    if sizes[worst] > limit:
        raise RecordTooLargeError(worst, sizes[worst], limit)


def _check_headers(batch: RecordBatch, limits: BatchLimits) -> None:
    """Apply the header limits. Each is checked per record only when the whole batch's
    figure (all headers, all header bytes, all name bytes) is over it, and then with
    C-level passes (``map(sub, ...)``); only a breach pays for finding the record."""
    lay = batch.layout
    per = batch.int32s(lay.header_offsets, batch.record_count + 1).tolist()
    hk = batch.int32s(lay.header_key_offsets, lay.header_count + 1).tolist()
    most = limits.max_headers_per_record
    if most is not None and lay.header_count > most:
        _raise_worst(
            list(map(sub, per[1:], per[:-1])), most, "max_headers_per_record", "{} headers"
        )
    total = limits.max_header_bytes
    if total is not None:
        hv = batch.int32s(lay.header_value_offsets, lay.header_count + 1).tolist()
        if hk[-1] + hv[-1] > total:
            sizes = [hk[b] - hk[a] + hv[b] - hv[a] for a, b in pairwise(per)]
            found = "{} bytes of header names and values"
            _raise_worst(sizes, total, "max_header_bytes", found)
    longest = limits.max_header_name_bytes
    if longest is not None and hk[-1] > longest:
        names = list(map(sub, hk[1:], hk[:-1]))
        if max(names) > longest:
            worst = names.index(max(names))
            record = bisect_right(per, worst) - 1  # the record whose entries hold it
            found = f"a header name of {names[worst]} bytes"
            raise HeaderLimitError(record, "max_header_name_bytes", found, longest)


def _raise_worst(per_record: list[int], limit: int, setting: str, found: str) -> None:
    """Raise :class:`HeaderLimitError` for the first record with the largest figure if it
    is over ``limit`` (``found`` formats the figure)."""
    worst = max(per_record)
    if worst > limit:
        index = per_record.index(worst)
        raise HeaderLimitError(index, setting, found.format(worst), limit)
