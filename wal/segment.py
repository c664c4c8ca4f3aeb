"""One segment: a ``.log`` file of record batches plus its sparse ``.index``.

Role: append batches at the end, read from an offset through the index, seal, recover a
torn tail, and delete. All I/O goes through :class:`wal.fs.FileSystem`; ``OSError`` passes
up to :class:`wal.log.Log`, which latches and translates it.

Invariants:
- ``size`` counts only bytes whose write completed; ``next_offset`` follows the last batch.
- The log data is written before the index entries that point into it, so an index can be
  ahead of the data only after a crash, and recovery drops such entries.
- A sealed segment is never written again. Damage found in it is reported, never cut.

Not task-safe: owned by one :class:`wal.log.Log`. Reads of bytes below ``size`` may run on
another thread while an append runs, because appended bytes never move and ``size`` is
updated only after they are written (see :class:`wal.writer.LogWriter`).
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass

from wal.batch import HEADER_SIZE, MAGIC, RecordBatch, decode_batch, read_length
from wal.errors import CorruptBatchError, CorruptSegmentError
from wal.fs import FileSystem
from wal.index import ENTRY_SIZE, IndexCorruptError, OffsetIndex
from wal.naming import INDEX_SUFFIX, LOG_SUFFIX, broken_name, segment_name
from wal.recovery import BatchPos, ScanResult, StopReason, scan

logger = logging.getLogger(__name__)

_BASE = struct.Struct("<Q")
_PEEK = struct.Struct("<QIIBBHI")  # base, length, crc, magic, version, flags, count
_SCAN_CHUNK = 4 << 20


@dataclass(frozen=True, slots=True)
class TailRecovery:
    """What opening the active segment found and did.

    Attributes:
        scanned_bytes: Bytes read and checked at the tail.
        truncated_bytes: Bytes cut from the tail (0 when the tail was clean).
        broken_path: File keeping the cut bytes, or ``None``.
        reason: Why the tail was cut (empty when it was not).
        index_rebuilt: Whether the index was missing or implausible and rebuilt from the log.
    """

    scanned_bytes: int
    truncated_bytes: int
    broken_path: str | None
    reason: str
    index_rebuilt: bool


class Segment:
    """A ``.log`` + ``.index`` pair. Not task-safe: owned by its ``Log``."""

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        base_offset: int,
        index_interval: int,
        *,
        log_fd: int,
        size: int,
        next_offset: int,
    ) -> None:
        self.fs = fs
        self.base_offset = base_offset
        self.path = os.path.join(directory, segment_name(base_offset, LOG_SUFFIX))
        self.index_path = os.path.join(directory, segment_name(base_offset, INDEX_SUFFIX))
        self.size = size
        self.next_offset = next_offset
        self.sealed = False
        self.first_append_ms: int | None = None
        self._fd = log_fd
        self._index_fd: int | None = None
        self._index: OffsetIndex | None = None
        self._interval = index_interval
        self._since_index = 0
        self._max_ts: int | None = None

    # -- life cycle -------------------------------------------------------------------

    @classmethod
    def create(
        cls, fs: FileSystem, directory: str, base_offset: int, index_interval: int
    ) -> Segment:
        """Create an empty segment (the caller fsyncs the directory)."""
        seg = cls._open_files(fs, directory, base_offset, index_interval, create=True)
        seg._index = OffsetIndex(base_offset)
        fs.truncate(seg._fd, 0)
        seg._open_index_for_append(truncate=True)
        return seg

    @classmethod
    def open_sealed(
        cls,
        fs: FileSystem,
        directory: str,
        base_offset: int,
        next_offset: int,
        index_interval: int,
    ) -> Segment:
        """Open a sealed segment; its index is loaded on first read."""
        seg = cls._open_files(fs, directory, base_offset, index_interval, create=False)
        seg.next_offset = next_offset
        seg.sealed = True
        return seg

    @classmethod
    def open_active(
        cls, fs: FileSystem, directory: str, base_offset: int, index_interval: int
    ) -> tuple[Segment, TailRecovery]:
        """Open the newest segment, checking only its tail and cutting a torn one."""
        seg = cls._open_files(fs, directory, base_offset, index_interval, create=True)
        report = seg._recover_tail()
        seg._open_index_for_append(truncate=False)
        return seg, report

    @classmethod
    def _open_files(
        cls, fs: FileSystem, directory: str, base: int, interval: int, *, create: bool
    ) -> Segment:
        path = os.path.join(directory, segment_name(base, LOG_SUFFIX))
        fd = fs.open(path, create=create)
        try:
            size = fs.size(fd)
        except BaseException:
            fs.close(fd)
            raise
        return cls(fs, directory, base, interval, log_fd=fd, size=size, next_offset=base)

    def _open_index_for_append(self, *, truncate: bool) -> None:
        assert self._index is not None
        self._index_fd = self.fs.open(self.index_path, create=True)
        want = len(self._index) * ENTRY_SIZE
        if truncate or self.fs.size(self._index_fd) != want:
            self.fs.truncate(self._index_fd, 0)
            if want:
                self.fs.write_all(self._index_fd, [self._index.to_bytes()], 0)

    def close(self) -> None:
        """Close the files (no sync; call :meth:`flush` or :meth:`seal` first if needed)."""
        fds, self._index_fd = [self._fd, self._index_fd], None
        self._fd = -1
        for fd in fds:
            if fd is not None and fd >= 0:
                self.fs.close(fd)

    # -- writing ----------------------------------------------------------------------

    def append(self, items: list[tuple[int, RecordBatch]], now_ms: int) -> None:
        """Write batches at the end; ``items`` pairs each batch with its base offset.

        Raises:
            OSError: the write failed; ``size`` is unchanged and the log must latch.
        """
        index = self._loaded_index()
        buffers: list[bytes | memoryview] = []
        entries: list[tuple[int, int]] = []
        pos = self.size
        since = self._since_index
        max_ts = self._max_ts
        for base, batch in items:
            if since >= self._interval:
                entries.append((base, pos))
                since = 0
            buffers += (_BASE.pack(base), batch.buffer[8:])
            pos += batch.size
            since += batch.size
            if max_ts is None or batch.max_timestamp_ms > max_ts:
                max_ts = batch.max_timestamp_ms
        self.fs.write_all(self._fd, buffers, self.size)
        self.size = pos
        self._since_index = since
        self._max_ts = max_ts
        last_base, last_batch = items[-1]
        self.next_offset = last_base + last_batch.record_count
        if self.first_append_ms is None:
            self.first_append_ms = now_ms
        if entries:
            assert self._index_fd is not None
            at = len(index) * ENTRY_SIZE
            for offset, position in entries:
                index.append(offset, position)
            self.fs.write_all(
                self._index_fd, [b"".join(index.encode_entry(o, p) for o, p in entries)], at
            )

    def flush(self) -> None:
        """fdatasync the log file."""
        self.fs.fdatasync(self._fd)

    def seal(self) -> None:
        """Make the segment read-only: sync the log and its index."""
        self.fs.fdatasync(self._fd)
        if self._index_fd is not None:
            self.fs.fdatasync(self._index_fd)
            self.fs.close(self._index_fd)
            self._index_fd = None
        self.sealed = True

    def rename_deleted(self) -> list[str]:
        """Close and rename both files to ``.deleted``; return the new paths."""
        self.close()
        renamed = []
        for path in (self.path, self.index_path):
            if self.fs.exists(path):
                self.fs.rename(path, path + ".deleted")
                renamed.append(path + ".deleted")
        return renamed

    # -- reading ----------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, upper: int) -> list[RecordBatch]:
        """Batches from the one holding ``offset``, up to ``max_bytes`` (at least one batch),
        stopping before any batch at or past ``upper``.

        Raises:
            CorruptSegmentError: damage at the first batch to return (batches before damage
                are returned; the next read starting at the damage raises).
        """
        if offset >= self.next_offset or offset >= upper:
            return []
        pos = self._locate(offset)
        if pos is None:
            return []
        first_len = read_length(self.fs.pread(self._fd, 12, pos)) or 0
        data = self.fs.pread(self._fd, min(max(max_bytes, first_len), self.size - pos), pos)
        batches: list[RecordBatch] = []
        p = 0
        while True:
            try:
                batch = decode_batch(data, p)
            except CorruptBatchError as exc:
                if batches:
                    break
                raise self._damage(pos + p, exc.reason) from exc
            if batch is None or batch.base_offset >= upper:
                if batch is None and not batches and pos + p < self.size:
                    raise self._damage(pos + p, "batch runs past the end of the segment")
                break
            batches.append(batch)
            p += batch.size
        return batches

    def _damage(self, position: int, reason: str) -> CorruptSegmentError:
        logger.error("segment %s damaged at byte %d: %s", self.path, position, reason)
        return CorruptSegmentError(self.path, self.base_offset, position, reason)

    def _locate(self, offset: int) -> int | None:
        """Position of the batch holding ``offset``, walking headers from the index entry."""
        entry = self._loaded_index().lookup(offset)
        if entry is None:
            return None
        expected, pos = entry
        chunk, chunk_pos = b"", pos
        while pos + HEADER_SIZE <= self.size:
            if pos + HEADER_SIZE > chunk_pos + len(chunk):
                chunk_pos = pos
                chunk = self.fs.pread(self._fd, self._interval + HEADER_SIZE, pos)
            base, length, _crc, magic, _v, _f, count = _PEEK.unpack_from(chunk, pos - chunk_pos)
            if magic != MAGIC or base != expected or length < HEADER_SIZE or count == 0:
                raise self._damage(
                    pos,
                    f"batch header does not follow on (expected offset {expected}, found {base})",
                )
            if offset < base + count:
                return pos
            pos += length
            expected = base + count
        return None

    # -- index ------------------------------------------------------------------------

    def _loaded_index(self) -> OffsetIndex:
        if self._index is None:
            self._index = self._load_or_rebuild_index()
        return self._index

    def _load_or_rebuild_index(self) -> OffsetIndex:
        try:
            data = self.fs.read_file(self.index_path) if self.fs.exists(self.index_path) else None
            if data is not None:
                return OffsetIndex.from_bytes(data, self.base_offset, self.size)
            reason = "missing"
        except IndexCorruptError as exc:
            reason = str(exc)
        logger.warning("segment %s: index %s; rebuilding it from the log", self.path, reason)
        result = self._scan_from(0, self.base_offset)
        index = self._index_from(OffsetIndex(self.base_offset), result.batches, 0)
        if not result.stop.is_clean():
            logger.error(
                "sealed segment %s is damaged at byte %d (%s); reads stop there",
                self.path,
                result.end,
                result.detail,
            )
        self.fs.atomic_write(self.index_path, index.to_bytes())
        return index

    def _index_from(self, index: OffsetIndex, batches: list[BatchPos], since: int) -> OffsetIndex:
        for b in batches:
            if since >= self._interval:
                index.append(b.base_offset, b.position)
                since = 0
            since += b.size
        self._since_index = since
        return index

    def max_timestamp_ms(self) -> int | None:
        """Largest record timestamp in the segment (scans the tail once when sealed)."""
        if self._max_ts is None and self.size:
            start = self._loaded_index().last() or (self.base_offset, 0)
            result = self._scan_from(start[1], start[0])
            if result.batches:
                self._max_ts = max(b.max_timestamp_ms for b in result.batches)
        return self._max_ts

    # -- recovery ---------------------------------------------------------------------

    def _scan_from(self, pos: int, expected: int) -> ScanResult:
        """Scan from ``pos`` to the end of the file."""
        return scan_file(self.fs, self._fd, pos, self.size, expected)

    def _tail_start(self) -> tuple[OffsetIndex, int, int, bool]:
        """Choose where to start checking: the newest index entry that points at a valid
        batch with the offset it claims. Returns (index, entry count kept, position, rebuilt)."""
        try:
            data = self.fs.read_file(self.index_path) if self.fs.exists(self.index_path) else b""
            index = OffsetIndex.from_bytes(data, self.base_offset, self.size, strict=False)
        except IndexCorruptError as exc:
            logger.warning(
                "segment %s: index unusable (%s); scanning the whole segment", self.path, exc
            )
            return OffsetIndex(self.base_offset), 0, 0, True
        entries = index.entries()
        for i in range(len(entries) - 1, -1, -1):
            offset, pos = entries[i]
            head = self.fs.pread(self._fd, HEADER_SIZE, pos)
            if len(head) == HEADER_SIZE:
                base, _len, _crc, magic, _v, _f, _n = _PEEK.unpack_from(head)
                if magic == MAGIC and base == offset:
                    index.truncate_entries(i + 1)
                    return index, i + 1, pos, False
        index.truncate_entries(0)
        return index, 0, 0, bool(entries)

    def _recover_tail(self) -> TailRecovery:
        """Check the tail from the newest trustworthy index entry; cut whatever is invalid.

        Data before that entry was durable before the entry was written, so it is trusted:
        only the tail is scanned, which keeps opening a large log fast.
        """
        index, kept, start, rebuilt = self._tail_start()
        last = index.last()
        expected = last[0] if kept and last is not None else self.base_offset
        result = self._scan_from(start, expected)
        if kept and result.batches:
            # The kept entry already indexes the first scanned batch.
            self._index_from(index, result.batches[1:], result.batches[0].size)
        else:
            self._index_from(index, result.batches, 0)
        self._index = index
        self.next_offset = result.next_offset if result.batches else expected
        if result.batches:
            self._max_ts = max(b.max_timestamp_ms for b in result.batches)
        scanned = self.size - start
        cut = self.size - result.end
        broken = self._cut_tail(result.end, result.detail) if cut else None
        return TailRecovery(scanned, cut, broken, result.detail if cut else "", rebuilt)

    def _cut_tail(self, end: int, reason: str) -> str:
        dropped = self.fs.pread(self._fd, self.size - end, end)
        broken = os.path.join(os.path.dirname(self.path), broken_name(self.base_offset, end))
        n = 0
        while self.fs.exists(broken):
            n += 1
            broken = os.path.join(
                os.path.dirname(self.path), f"{broken_name(self.base_offset, end)}.{n}"
            )
        self.fs.write_new(broken, dropped)
        self.fs.crash_point("recovery.after_broken")
        self.fs.truncate(self._fd, end)
        self.fs.fdatasync(self._fd)
        logger.warning(
            "segment %s: torn tail, dropped %d bytes after byte %d (%s); kept them in %s",
            self.path,
            len(dropped),
            end,
            reason,
            broken,
        )
        self.size = end
        self._loaded_index().truncate_to_position(end)
        return broken


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
