"""The recovery rule: how far a segment's bytes are valid.

Role: :func:`scan` walks batches in a buffer and says where valid data ends and why it
stopped. It is pure; :mod:`wal.segment` feeds it the tail of the active segment (from the
last index entry that checks out) and acts on the answer: cut a torn tail, keeping the cut
bytes in a ``.broken`` file, or report damage inside a sealed segment.

A batch is valid when its magic, length, CRC-32C and section layout check out and its base
offset continues the previous batch's (no gaps, no overlaps). Scanning stops at the first
batch that is not valid:

- ``INCOMPLETE``: the buffer ends inside a batch. At end of file this is a torn write.
- ``CORRUPT``: the bytes are not a batch (torn header, flipped bits, garbage).
- ``GAP``: a whole, valid batch whose base offset does not follow on.

Example: batches at positions 0 (offsets 0-9) and 96 (offsets 10-19), then 40 bytes of a
third batch at 192 when the file ends: ``scan(buf, 0, 0)`` returns ``end=192``,
``next_offset=20``, ``stop=INCOMPLETE``.

:func:`scan` is pure; :func:`scan_file` runs it over a file in chunks, through the
:class:`wal.fs.FileSystem` layer (so it imports neither ``asyncio``, ``os`` nor ``time``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from proto.batch import decode_batch, read_length
from wal.errors import CorruptBatchError
from wal.fs import FileSystem

_SCAN_CHUNK = 4 << 20


class StopReason(enum.Enum):
    """Why a scan stopped."""

    END = "end"  # the buffer ended exactly at a batch boundary
    INCOMPLETE = "incomplete"
    CORRUPT = "corrupt"
    GAP = "gap"

    def is_clean(self) -> bool:
        """Whether the scan reached the end without finding anything wrong."""
        return self is StopReason.END


@dataclass(frozen=True, slots=True)
class BatchPos:
    """Where a valid batch was found."""

    position: int
    base_offset: int
    next_offset: int
    size: int
    max_timestamp_ms: int


@dataclass(slots=True)
class ScanResult:
    """The outcome of :func:`scan`.

    Attributes:
        end: Position just past the last valid batch.
        next_offset: Offset just past the last valid batch; when no batch was valid, the
            ``expected_offset`` given, or -1 if that was ``None``.
        stop: Why scanning stopped.
        detail: Human-readable reason (the corruption message, the gap).
        batches: Every valid batch found, in order.
    """

    end: int
    next_offset: int
    stop: StopReason
    detail: str = ""
    batches: list[BatchPos] = field(default_factory=list)


def scan(buf: bytes | bytearray | memoryview, pos: int, expected_offset: int | None) -> ScanResult:
    """Walk valid batches in ``buf`` from ``pos``.

    Args:
        buf: Bytes of (part of) a segment.
        pos: Position of the first batch in ``buf``.
        expected_offset: Base offset the first batch must have, or ``None`` to accept any.

    Returns:
        Where valid data ends, and why.
    """
    result = ScanResult(pos, expected_offset if expected_offset is not None else -1, StopReason.END)
    while pos < len(buf):
        try:
            batch = decode_batch(buf, pos)
        except CorruptBatchError as exc:
            result.stop, result.detail = StopReason.CORRUPT, exc.reason
            return result
        if batch is None:
            result.stop = StopReason.INCOMPLETE
            result.detail = f"{len(buf) - pos} bytes of an incomplete batch"
            return result
        if expected_offset is not None and batch.base_offset != expected_offset:
            result.stop = StopReason.GAP
            result.detail = f"batch base offset {batch.base_offset}, expected {expected_offset}"
            return result
        result.batches.append(
            BatchPos(pos, batch.base_offset, batch.next_offset, batch.size, batch.max_timestamp_ms)
        )
        pos += batch.size
        expected_offset = batch.next_offset
        result.end, result.next_offset = pos, expected_offset
    return result


def scan_file(fs: FileSystem, fd: int, pos: int, size: int, expected: int) -> ScanResult:
    """Run :func:`wal.recovery.scan` over bytes ``[pos, size)`` of a file, in chunks.

    A batch that straddles a chunk boundary is re-read whole, so chunking never changes the
    answer.
    """
    total = ScanResult(pos, expected, StopReason.END)
    while pos < size:
        length = read_length(fs.pread(fd, 12, pos)) or 0
        chunk = fs.pread(fd, min(max(_SCAN_CHUNK, length), size - pos), pos)
        part = scan(chunk, 0, expected)
        total.batches += [
            BatchPos(b.position + pos, b.base_offset, b.next_offset, b.size, b.max_timestamp_ms)
            for b in part.batches
        ]
        if part.batches:
            total.end, total.next_offset = pos + part.end, part.next_offset
        more = pos + len(chunk) < size
        if part.stop is StopReason.INCOMPLETE and more and part.end > 0:
            pos, expected = pos + part.end, part.next_offset
            continue
        if not part.stop.is_clean():
            total.stop, total.detail = part.stop, part.detail
            return total
        pos, expected = pos + part.end, part.next_offset
    return total
