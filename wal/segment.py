"""One segment: a ``.log`` file of record batches plus its sparse ``.index``.

Role: append batches at the end, read from an offset through the index, seal, recover a
torn tail, cut at a batch boundary (a truncation: index first, then data), and delete.
All I/O goes through :class:`wal.fs.FileSystem`; ``OSError`` passes up to
:class:`wal.log.Log`, which latches and translates it.

Invariants:
- ``size`` counts only bytes whose write completed; ``next_offset`` follows the last batch.
  A write that fails is cut back to ``size`` at once, so no torn bytes stay for a later
  batch to follow (a full disk leaves the segment as it was, ready for the next write).
- An index entry reaches the ``.index`` file only after an ``fdatasync`` of the ``.log``
  that began after the entry's batch was written (:meth:`Segment.flush`, :meth:`Segment.seal`).
  Until then it is *pending*: in the in-memory index, for reads, but not in the file. Since
  ``fdatasync`` covers every byte of the file, every byte before an entry in the file was
  durable before the entry was written, whatever order the disk writes pages back in; that
  is what lets recovery scan only after the newest entry (``wal/__init__``'s recovery rule).
  Entries recovery drops are cut from the file and the cut is synced at once, so a dropped
  entry never returns after a power cut to vouch for bytes written later at its position.
- A sealed segment is never written again. Damage found in it is reported, never cut.

Descriptors: every file is opened through a :class:`wal.fdcache.FileCache`. The active
segment pins its ``.log`` for its whole life (appends use that descriptor with no lookup);
sealing unpins it. Reads, syncs, the ``.index`` file and sealed segments lease a
descriptor for one operation, so a sealed segment costs no descriptor while nobody reads
it, and opening a log opens no sealed segment.

Why deferred entries rather than a checkpointed recovery point (Kafka's
``recovery-point-offset-checkpoint``): the entries already carry exactly the fact recovery
needs, per segment, in a file that is written anyway, so there is no second file to replace
atomically and keep in step with roll and retention. The cost: under the ``interval`` and
``never`` policies entries lag the data by up to one sync, so recovery may scan that much
more (under ``never`` a whole active segment, as no sync happens before a roll or a close).

Not task-safe: owned by one :class:`wal.log.Log`. Reads of bytes below ``size`` may run on
another thread while an append runs, because appended bytes never move and ``size`` is
updated only after they are written (see :class:`wal.writer.LogWriter`). A read leases its
descriptor, so a seal or close on the writer's thread never closes it under the read.

One piece, though past 600 lines (the class about 650), as Kafka's ``LogSegment`` is: the
parts that could stand alone already do (the index's bytes and lookups,
:mod:`wal.index`; the scan, :mod:`wal.recovery`; file names, :mod:`wal.naming`;
descriptors, :mod:`wal.fdcache`). What is left is one invariant and the state it rules:
an index entry reaches the file only after a sync of its data. Appends add pending
entries, flush and seal write them, recovery decides which entries to trust and cuts the
rest, and reads rebuild the index when a header walk does not check out, all on the same
``size``, ``_index``, ``_pending``, ``_index_written`` and damage fields under one lock
discipline. Split into classes, each would hold a piece of the invariant behind the
other's calls, and the proof that it holds would have to be made across them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from proto.batch import HEADER_SIZE, MAGIC, RecordBatch, decode_batch
from wal.errors import (
    DISK_FULL_ERRNOS,
    CorruptBatchError,
    CorruptSegmentError,
    IndexCorruptError,
    NotBatchBoundaryError,
)
from wal.fdcache import PRIVATE_CAPACITY, FileCache, Pin
from wal.fs import FileSystem, WouldBlockError, reading_nonblocking
from wal.index import ENTRY, ENTRY_SIZE, NO_TIMESTAMP, OffsetIndex
from wal.naming import INDEX_SUFFIX, LOG_SUFFIX, broken_name, segment_name
from wal.recovery import BatchPos, ScanResult, scan_file

logger = logging.getLogger(__name__)

#: A write of at most this many bytes is copied into one buffer first: for small batches
#: (a group of single records) that is cheaper than a memoryview and an iovec per piece;
#: bigger writes go out as they are, without the copy.
_JOIN_BYTES = 64 * 1024
_BASE = struct.Struct("<Q")
_PEEK = struct.Struct("<QIIBBHI")  # base, length, crc, magic, version, flags, count
#: One index entry: (offset, position, max_timestamp_before).
Entry = tuple[int, int, int]


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
    """A ``.log`` + ``.index`` pair. Not task-safe: owned by its ``Log``.

    One exception: under the ``interval`` policy :meth:`flush` runs on a second thread
    while :meth:`append` runs; the pending index entries and the ``.index`` descriptor are
    guarded by a lock for that.

    Attributes:
        write_fault: Why the files may no longer match this object (a failed sync, or a
            failed write that could not be cut back), or ``None``. The log latches on it.
    """

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        base_offset: int,
        index_interval: int,
        *,
        files: FileCache,
        pin: Pin | None,
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
        self.files = files
        self._pin = pin  # held while active: the writer's descriptor of the .log
        self._fd = pin.fd if pin is not None else -1
        self._index: OffsetIndex | None = None
        self._interval = index_interval
        self._since_index = 0
        self._max_ts: int | None = None
        # (first offset not readable, byte position, reason) once damage is known.
        self._damage: tuple[int, int, str] | None = None
        # Whether the log itself is known damaged (a scan or a header walk from the start
        # met damage): the bytes they read never change, so another would stop there
        # again (see _locate).
        self._log_damaged = False
        # Damage positions already logged: a failing read is retried by every dispatch
        # pass, and one line per position says all there is.
        self._logged_damage: set[int] = set()
        # Entries in the in-memory index but not yet in the file (their data is not known
        # to be synced), and how many entries the file holds.
        self._pending: list[Entry] = []
        self._index_written = 0
        self._index_lock = threading.Lock()
        # Held while the read path loads or rebuilds the index: reads run on the event
        # loop and on cold-read threads (wal.writer) at once, and two rebuilds of one
        # segment would write its index file together.
        self._load_lock = threading.Lock()
        self.write_fault: str | None = None

    # -- life cycle -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        fs: FileSystem,
        directory: str,
        base_offset: int,
        index_interval: int,
        *,
        files: FileCache | None = None,
    ) -> Segment:
        """Create an empty segment (the caller fsyncs the directory)."""
        seg = cls._open_files(fs, directory, base_offset, index_interval, files, active=True)
        try:
            seg._index = OffsetIndex(base_offset)
            fs.truncate(seg._fd, 0)
            seg._open_index_for_append()
        except BaseException:
            seg.close()
            raise
        return seg

    @classmethod
    def open_sealed(
        cls,
        fs: FileSystem,
        directory: str,
        base_offset: int,
        next_offset: int,
        index_interval: int,
        *,
        files: FileCache | None = None,
    ) -> Segment:
        """Open a sealed segment: no descriptor until a read; its index loads on first read."""
        seg = cls._open_files(fs, directory, base_offset, index_interval, files, active=False)
        seg.next_offset = next_offset
        seg.sealed = True
        return seg

    @classmethod
    def open_active(
        cls,
        fs: FileSystem,
        directory: str,
        base_offset: int,
        index_interval: int,
        *,
        files: FileCache | None = None,
    ) -> tuple[Segment, TailRecovery]:
        """Open the newest segment, checking only its tail and cutting a torn one."""
        seg = cls._open_files(fs, directory, base_offset, index_interval, files, active=True)
        try:
            report = seg._recover_tail()
            seg._open_index_for_append()
        except BaseException:
            seg.close()
            raise
        return seg, report

    @classmethod
    def _open_files(
        cls,
        fs: FileSystem,
        directory: str,
        base: int,
        interval: int,
        files: FileCache | None,
        *,
        active: bool,
    ) -> Segment:
        files = files or FileCache(PRIVATE_CAPACITY)
        path = os.path.join(directory, segment_name(base, LOG_SUFFIX))
        if not active:
            size = fs.file_size(path)
            return cls(
                fs, directory, base, interval, files=files, pin=None, size=size, next_offset=base
            )
        pin = files.acquire(fs, path, create=True)
        try:
            size = fs.size(pin.fd)
        except BaseException:
            files.release(pin)
            raise
        return cls(fs, directory, base, interval, files=files, pin=pin, size=size, next_offset=base)

    def _open_index_for_append(self) -> None:
        """Open the ``.index`` for appending. The file keeps exactly the entries recovery
        trusted (``_index_written``); anything after them is cut and the cut synced, so a
        dropped entry cannot come back after a power cut (see the module docstring)."""
        want = self._index_written * ENTRY_SIZE
        with self._index_file() as fd:
            if self.fs.size(fd) != want:
                self.fs.truncate(fd, want)
                self.fs.fdatasync(fd)

    def _index_file(self) -> contextlib.AbstractContextManager[int]:
        """A leased descriptor of the ``.index`` (created if missing)."""
        return self.files.lease(self.fs, self.index_path, create=True)

    @contextmanager
    def _log_file(self) -> Iterator[int]:
        """A leased descriptor of the ``.log`` (the active one's pin makes it a hit)."""
        with self.files.lease(self.fs, self.path) as fd:
            yield fd

    def _pread(self, size: int, pos: int) -> bytes:
        pin = self.files.acquire(self.fs, self.path)  # on every read: no generator
        try:
            return self.fs.pread(pin.fd, size, pos)
        finally:
            self.files.release(pin)

    def _unpin(self) -> None:
        pin, self._pin, self._fd = self._pin, None, -1
        if pin is not None:
            self.files.release(pin)

    def close(self) -> None:
        """Close the files (no sync; call :meth:`flush` or :meth:`seal` first if needed).

        A read still holding a lease keeps its descriptor until the read ends."""
        self._unpin()
        self.files.forget(self.path)
        self.files.forget(self.index_path)

    # -- writing ----------------------------------------------------------------------

    def append(self, items: list[tuple[int, RecordBatch]], now_ms: int) -> None:
        """Write batches at the end; ``items`` pairs each batch with its base offset.

        Raises:
            OSError: the write failed; ``size`` is unchanged. On a full disk the file was
                cut back to ``size`` too (if even that failed, ``write_fault`` says so).
        """
        index = self._loaded_index()
        buffers: list[bytes | memoryview] = []
        entries: list[Entry] = []
        pos = self.size
        since = self._since_index
        max_ts = self._max_ts
        for base, batch in items:
            if since >= self._interval:
                entries.append((base, pos, NO_TIMESTAMP if max_ts is None else max_ts))
                since = 0
            buffers += (_BASE.pack(base), batch.buffer[8:])
            pos += batch.size
            since += batch.size
            if max_ts is None or batch.max_timestamp_ms > max_ts:
                max_ts = batch.max_timestamp_ms
        if pos - self.size <= _JOIN_BYTES:
            buffers = [b"".join(buffers)]  # one small copy beats two iovecs per batch
        try:
            self.fs.write_all(self._fd, buffers, self.size)
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                self._cut_back()  # the log stays healthy; other errors latch it instead
            raise
        self.size = pos
        self._since_index = since
        self._max_ts = max_ts
        last_base, last_batch = items[-1]
        self.next_offset = last_base + last_batch.record_count
        if self.first_append_ms is None:
            self.first_append_ms = now_ms
        if entries:
            with self._index_lock:
                for offset, position, ts in entries:
                    index.append(offset, position, ts)
                self._pending += entries  # written to the file by the next sync

    def _cut_back(self) -> None:
        """After a failed write: cut whatever part of it landed, back to ``size``."""
        try:
            self.fs.truncate(self._fd, self.size)
        except OSError as exc:
            self.write_fault = f"cutting back a failed write failed: {exc.strerror or exc}"
            logger.error("segment %s: %s", self.path, self.write_fault)

    def flush(self) -> None:
        """fdatasync the log file, then write the index entries of the data it covered.

        Under ``interval`` two flushes may overlap (the periodic one on its own thread, an
        explicit one on the writer's, with appends between them), so what a sync covered is
        counted in entries since the segment began, not as a length of ``_pending``: a flush
        whose sync began first may end last, after the other wrote those entries and appends
        added new ones, and it must then write none of those new ones.
        """
        covered = self._pending_until()
        self._sync_log()
        with self._index_lock:
            self._write_entries(covered)

    def seal(self) -> None:
        """Make the segment read-only: sync the log, write every pending index entry, sync
        and close the index, then give up the pin on the log (a read will lease it again)."""
        if self.sealed:
            return
        covered = self._pending_until()
        self._sync_log()
        with self._index_lock:
            self._write_entries(covered)
            with self._index_file() as index_fd:
                self.fs.fdatasync(index_fd)
        self.files.forget(self.index_path)
        self.sealed = True
        self._unpin()

    def _sync_log(self) -> None:
        """fdatasync the ``.log``. Leases its descriptor rather than using the writer's:
        under ``INTERVAL`` the periodic sync runs on its own thread and may meet a roll that
        just sealed this segment and gave up its pin (see :class:`wal.writer.LogWriter`)."""
        pin = self.files.acquire(self.fs, self.path)
        try:
            self.fs.fdatasync(pin.fd)
        except OSError as exc:  # the kernel may have dropped the dirty pages: trust nothing
            self.write_fault = f"fdatasync failed: {exc.strerror or exc}"
            raise
        finally:
            self.files.release(pin)

    def _pending_until(self) -> int:
        """How many entries the file will hold once every pending one is written: taken
        before a sync, it names the entries whose batches that sync covers (their batches
        were written before the entries were added)."""
        with self._index_lock:
            return self._index_written + len(self._pending)

    def _write_entries(self, until: int) -> None:
        """Write the pending entries up to entry number ``until`` of the segment (counted
        from its first entry, as :meth:`_pending_until` counts) to the ``.index``; none when
        the file already holds that many (the caller holds the lock). A failure is logged,
        not raised: the index is a cache, and the entries stay pending for the next sync to
        write (at the same position)."""
        count = min(until - self._index_written, len(self._pending))
        if count <= 0 or self.sealed:
            return
        entries = self._pending[:count]
        data = b"".join(ENTRY.pack(o - self.base_offset, p, t) for o, p, t in entries)
        try:
            with self._index_file() as index_fd:
                self.fs.write_all(index_fd, [data], self._index_written * ENTRY_SIZE)
        except OSError as exc:
            logger.warning(
                "segment %s: writing %d index entries failed (%s); they stay pending",
                self.path,
                count,
                exc.strerror or exc,
            )
            return
        del self._pending[:count]
        self._index_written += count

    def rename_deleted(self) -> list[str]:
        """Close and rename both files to ``.deleted``; return the new paths."""
        self.close()
        renamed = []
        for path in (self.path, self.index_path):
            if self.fs.exists(path):
                self.fs.rename(path, path + ".deleted")
                renamed.append(path + ".deleted")
        return renamed

    # -- truncation -------------------------------------------------------------------

    def truncation_point(self, offset: int) -> int:
        """The byte position of the batch that starts at ``offset`` (``size`` when
        ``offset`` is the segment's end): where :meth:`truncate_files` cuts. Reads only.

        Raises:
            NotBatchBoundaryError: ``offset`` falls inside a batch.
            CorruptSegmentError: the segment is damaged before ``offset``.
            OSError: a read failed.
        """
        if offset == self.next_offset:
            return self.size
        pos, _length = self._locate(offset)
        base, _len, _crc, _magic, _v, _f, count = _PEEK.unpack(self._pread(_PEEK.size, pos))
        if base != offset:
            directory = os.path.dirname(self.path)
            raise NotBatchBoundaryError(directory, offset, base, base + count)
        return pos

    def truncate_files(self, position: int) -> None:
        """Cut the files at byte ``position``: sync the ``.log`` (so the prefix kept is
        durable whatever crash follows, even under ``interval`` or ``never``), cut the
        ``.index`` to its entries below ``position`` (synced), then cut the ``.log``
        (synced). Index first, so that no entry on disk ever points at or past the cut,
        where later appends write other batches (the invariant of the module docstring).
        Afterwards this object is stale: the caller closes it and opens the segment again
        with :meth:`open_active`.

        Raises:
            OSError: a truncate or sync failed (the caller latches the log).
        """
        index = self._loaded_index()
        with self._log_file() as fd:
            self.fs.fdatasync(fd)
        with self._index_lock, self._index_file() as index_fd:
            kept = sum(1 for _offset, pos in index.entries() if pos < position)
            on_disk = self.fs.size(index_fd) // ENTRY_SIZE
            self.fs.truncate(index_fd, min(kept, on_disk) * ENTRY_SIZE)
            self.fs.fdatasync(index_fd)
        self.fs.crash_point("truncate.after_index")
        with self._log_file() as fd:
            self.fs.truncate(fd, position)
            self.fs.fdatasync(fd)
        logger.info(
            "segment %s truncated to byte %d (%d bytes cut)",
            self.path,
            position,
            self.size - position,
        )

    # -- reading ----------------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int, upper: int, *, min_one: bool = True
    ) -> list[RecordBatch]:
        """Batches from the one holding ``offset``, stopping before any batch at or past
        ``upper``, within ``max_bytes`` (``min_one``: the first batch may exceed it).

        Returns consecutive batches only: a batch whose base offset does not follow on ends
        the reply, and the read that starts there raises.

        Raises:
            CorruptSegmentError: damage where the read starts.
        """
        if offset >= self.next_offset or offset >= upper:
            return []
        pos, first_len = self._locate(offset)
        if not min_one and first_len > max_bytes:
            return []
        data = self._pread(min(max(max_bytes, first_len), self.size - pos), pos)
        batches: list[RecordBatch] = []
        p = 0
        while True:
            try:
                batch = decode_batch(data, p)
            except CorruptBatchError as exc:
                if batches:
                    break
                raise self._damage_error(pos + p, exc.reason) from exc
            if batch is None:
                if not batches:
                    raise self._damage_error(pos, "batch runs past the end of the segment")
                break
            if batch.base_offset >= upper or (
                batches and batch.base_offset != batches[-1].next_offset
            ):
                break
            batches.append(batch)
            p += batch.size
        return batches

    def read_raw(
        self, offset: int, max_bytes: int, upper: int, *, min_one: bool = True
    ) -> tuple[bytes, int]:
        """:meth:`read`'s batches as the bytes they are in the file, and the offset just
        past the last of them: one ``pread`` of the span, the batch headers walked (base
        offset, length, magic and record count), no CRC computed and no record decoded.

        The same batches :meth:`read` returns when the file is sound. A batch whose
        header does not check out, does not follow on, or runs past the bytes read ends
        the answer; at the start of the read it is damage. A flipped bit inside a batch
        is not seen here: the reader checks each CRC (a follower's
        :meth:`wal.LogWriter.append_replicated` decodes every batch before writing).

        Raises:
            CorruptSegmentError: damage where the read starts.
        """
        if offset >= self.next_offset or offset >= upper:
            return b"", offset
        pos, first_len = self._locate(offset)
        if not min_one and first_len > max_bytes:
            return b"", offset
        data = self._pread(min(max(max_bytes, first_len), self.size - pos), pos)
        p, expected, size = 0, -1, len(data)
        while p + HEADER_SIZE <= size:
            base, length, _crc, magic, _v, _f, count = _PEEK.unpack_from(data, p)
            if (
                magic != MAGIC
                or length < HEADER_SIZE
                or count == 0
                or (expected >= 0 and base != expected)
            ):
                if p == 0:
                    raise self._damage_error(pos, "not a batch header where the read starts")
                break
            if base >= upper or p + length > size:
                break
            p += length
            expected = base + count
        if p == 0:
            raise self._damage_error(pos, "batch runs past the end of the segment")
        return (data if p == size else data[:p]), expected

    def _damage_error(self, position: int, reason: str) -> CorruptSegmentError:
        if position not in self._logged_damage:
            self._logged_damage.add(position)
            logger.error("segment %s damaged at byte %d: %s", self.path, position, reason)
        return CorruptSegmentError(self.path, self.base_offset, position, reason)

    def _locate(self, offset: int) -> tuple[int, int]:
        """Position and length of the batch holding ``offset``.

        Walks batch headers from the nearest index entry. If the walk does not check out,
        the index may be wrong rather than the log: rebuild it from the log and walk again;
        a second failure is damage. In the active segment a walk of the headers from the
        segment's start decides first (about a tenth of a scan's cost: no CRC, no
        records; the scan's index would not replace the writer's anyway when the log is
        damaged). Once the log is known damaged, a failed walk is damage at once: the
        bytes below the high-water mark never change, so a new scan would stop at the
        same place and mend nothing. (These run on the caller's thread, the event loop,
        and a failing read is retried by every dispatch pass: a scan per pass cost
        seconds of the loop per append, for a large segment.)

        Raises:
            CorruptSegmentError: the log is damaged at or before ``offset``.
        """
        index = self._loaded_index()
        if self._damage is not None and offset >= self._damage[0]:
            raise self._damage_error(self._damage[1], self._damage[2])
        try:
            return self._walk(index, offset)
        except _WalkFailedError as exc:
            if self._log_damaged or (not self.sealed and self._headers_fail(offset)):
                self._log_damaged = True
                raise self._damage_error(exc.position, exc.reason) from exc
            with self._loading():
                index = self._rebuild_index()
        try:
            return self._walk(index, offset)
        except _WalkFailedError as exc:
            raise self._damage_error(exc.position, exc.reason) from exc

    def _headers_fail(self, offset: int) -> bool:
        """Whether the batch headers from the segment's start fail to reach ``offset``:
        the log is damaged on the way (else an index entry was wrong). A walk of the
        whole segment: never on the event loop (wal.writer)."""
        if reading_nonblocking():
            raise WouldBlockError(f"segment {self.path}: a walk of its headers is due")
        try:
            self._walk(OffsetIndex(self.base_offset), offset)
        except _WalkFailedError:
            return True
        return False

    def _walk(self, index: OffsetIndex, offset: int) -> tuple[int, int]:
        entry = index.lookup(offset)
        if entry is None:
            raise _WalkFailedError(0, f"offset {offset} is below the segment base")
        expected, pos = entry
        chunk, chunk_pos = b"", pos
        while pos + HEADER_SIZE <= self.size:
            if pos + HEADER_SIZE > chunk_pos + len(chunk):
                chunk_pos = pos
                want = min(self._interval + HEADER_SIZE, self.size - pos)
                chunk = self._pread(want, pos)
            base, length, _crc, magic, _v, _f, count = _PEEK.unpack_from(chunk, pos - chunk_pos)
            if magic != MAGIC or length < HEADER_SIZE or count == 0:
                raise _WalkFailedError(pos, "not a batch header (bad magic, length or count)")
            if base != expected:
                raise _WalkFailedError(
                    pos, f"batch base offset {base} does not follow on (expected {expected})"
                )
            if offset < base + count:
                return pos, length
            pos += length
            expected = base + count
        raise _WalkFailedError(
            pos, f"segment ends at offset {expected} but should hold up to {self.next_offset}"
        )

    # -- index ------------------------------------------------------------------------

    def _loaded_index(self) -> OffsetIndex:
        if self._index is None:
            with self._loading():
                if self._index is None:  # not loaded by the thread that held the lock
                    index = self._load_or_rebuild_index()
                    if self.sealed and not self._check_sealed_tail(index, record=False):
                        # Suspect the index before the log: rebuild it, then judge the log.
                        index = self._rebuild_index()
                        self._check_sealed_tail(index, record=True)
                    self._index = index
        return self._index

    @contextmanager
    def _loading(self) -> Iterator[None]:
        """Hold the index load lock. A caller reading without blocking (the event loop)
        that finds it held gets :class:`WouldBlockError` rather than wait for another
        thread's disk work: its read then goes to a thread too."""
        if not self._load_lock.acquire(blocking=not reading_nonblocking()):
            raise WouldBlockError(f"segment {self.path}: its index is being loaded")
        try:
            yield
        finally:
            self._load_lock.release()

    def _load_or_rebuild_index(self) -> OffsetIndex:
        try:
            data = self.fs.read_file(self.index_path) if self.fs.exists(self.index_path) else None
            if data is not None:
                return OffsetIndex.from_bytes(data, self.base_offset, self.size)
            reason = "missing"
        except IndexCorruptError as exc:
            reason = str(exc)
        logger.warning("segment %s: index %s; rebuilding it from the log", self.path, reason)
        return self._rebuild_index()

    def _rebuild_index(self) -> OffsetIndex:
        """A fresh index from a full scan of the log. It is written back only for a sealed
        segment whose log scans clean: the active segment's index file belongs to the writer
        (the next open repairs it), and a damaged segment's files are left as they are.

        It replaces the index in use, except the active segment's when the scan stopped at
        damage: that index was built by the writer as it wrote, and still reaches the
        batches past the damage (a scan's index ends at it, and would make every later
        read of the segment fail, while the writer goes on adding entries)."""
        if reading_nonblocking():  # a full scan: never on the event loop (wal.writer)
            raise WouldBlockError(f"segment {self.path}: its index needs a rebuild (a scan)")
        result = self._scan_from(0, self.base_offset)
        index = OffsetIndex(self.base_offset)
        self._index_from(index, result.batches, 0, NO_TIMESTAMP)
        clean = result.stop.is_clean()
        self._log_damaged = not clean
        if self.sealed and clean:
            self.fs.atomic_write(self.index_path, index.to_bytes())
        if self.sealed or clean or self._index is None:
            self._index = index
        return index

    def _index_from(
        self,
        index: OffsetIndex,
        batches: list[BatchPos],
        since: int,
        running: int,
        added: list[Entry] | None = None,
    ) -> tuple[int, int]:
        """Add entries for ``batches`` (``since`` bytes after the last entry, ``running``
        the largest timestamp before them), also to ``added`` if given; return the updated
        (since, running)."""
        for b in batches:
            if since >= self._interval:
                index.append(b.base_offset, b.position, running)
                if added is not None:
                    added.append((b.base_offset, b.position, running))
                since = 0
            since += b.size
            running = max(running, b.max_timestamp_ms)
        return since, running

    def _check_sealed_tail(self, index: OffsetIndex, *, record: bool) -> bool:
        """A sealed segment must end exactly where the next begins: scan after its newest
        index entry once, learning its largest timestamp and any damage at its end.

        Returns whether the tail checked out; damage is remembered only when ``record``.
        """
        offset, position = index.last() or (self.base_offset, 0)
        result = self._scan_from(position, offset)
        running = index.last_max_timestamp() if index.last() else NO_TIMESTAMP
        for b in result.batches:
            running = max(running, b.max_timestamp_ms)
        self._max_ts = None if running == NO_TIMESTAMP else running
        if not result.stop.is_clean():
            reason = result.detail
        elif result.next_offset != self.next_offset:
            reason = (
                f"segment ends at offset {result.next_offset} but the next segment starts at "
                f"{self.next_offset}"
            )
        else:
            return True
        if not record:
            return False
        valid = result.next_offset if result.batches else offset
        self._damage = (valid, result.end, reason)
        logger.error(
            "sealed segment %s is damaged at byte %d (%s); reads stop at offset %d",
            self.path,
            result.end,
            reason,
            valid,
        )
        return False

    def max_timestamp_ms(self) -> int | None:
        """Largest record timestamp in the segment, or ``None`` when it holds none."""
        self._loaded_index()
        return self._max_ts

    # -- recovery ---------------------------------------------------------------------

    def _scan_from(self, pos: int, expected: int) -> ScanResult:
        """Scan from ``pos`` to the end of the file."""
        with self._log_file() as fd:
            return scan_file(self.fs, fd, pos, self.size, expected)

    def _tail_start(self) -> tuple[OffsetIndex, bool, int, bool]:
        """Choose where to start checking: the newest index entry that points at a batch
        header with the offset it claims. Returns (index, kept an entry, position, rebuilt)."""
        exists = self.fs.exists(self.index_path)
        try:
            data = self.fs.read_file(self.index_path) if exists else b""
            index = OffsetIndex.from_bytes(data, self.base_offset, self.size, strict=False)
        except IndexCorruptError as exc:
            logger.warning(
                "segment %s: index unusable (%s); scanning the whole segment", self.path, exc
            )
            return OffsetIndex(self.base_offset), False, 0, True
        entries = index.entries()
        for i in range(len(entries) - 1, -1, -1):
            offset, pos = entries[i]
            head = self._pread(HEADER_SIZE, pos)
            if len(head) == HEADER_SIZE:
                base, _len, _crc, magic, _v, _f, _n = _PEEK.unpack_from(head)
                if magic == MAGIC and base == offset:
                    index.truncate_entries(i + 1)
                    return index, True, pos, False
        index.truncate_entries(0)
        return index, False, 0, bool(entries) or (not exists and self.size > 0)

    def _recover_tail(self) -> TailRecovery:
        """Check the tail from the newest trustworthy index entry; cut whatever is invalid.

        Data before that entry was durable before the entry was written (entries are
        written only after a sync covering their data), so it is trusted: only the tail is
        scanned, which keeps opening a large log fast. The entry's
        ``max_timestamp_before`` plus the scanned tail give the segment's newest timestamp.
        Entries for the scanned batches stay pending until the next sync.
        """
        index, kept, start, rebuilt = self._tail_start()
        self._index_written = len(index)
        last = index.last()
        expected = last[0] if kept and last is not None else self.base_offset
        result = self._scan_from(start, expected)
        running = index.last_max_timestamp() if kept else NO_TIMESTAMP
        since, batches = 0, result.batches
        if kept and batches:  # the kept entry already indexes the first scanned batch
            since, running = batches[0].size, max(running, batches[0].max_timestamp_ms)
            batches = batches[1:]
        self._pending = []
        self._since_index, running = self._index_from(index, batches, since, running, self._pending)
        self._index = index
        self._max_ts = None if running == NO_TIMESTAMP else running
        self.next_offset = result.next_offset if result.batches else expected
        scanned = self.size - start
        cut = self.size - result.end
        broken = self._cut_tail(result.end, result.detail) if cut else None
        return TailRecovery(scanned, cut, broken, result.detail if cut else "", rebuilt)

    def _cut_tail(self, end: int, reason: str) -> str:
        dropped = self._pread(self.size - end, end)
        directory = os.path.dirname(self.path)
        n = 0
        broken = os.path.join(directory, broken_name(self.base_offset, end))
        while self.fs.exists(broken):  # an earlier recovery cut here too: keep both
            n += 1
            broken = os.path.join(directory, broken_name(self.base_offset, end, n))
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
        index = self._loaded_index()
        index.truncate_to_position(end)
        self._pending = [e for e in self._pending if e[1] < end]
        self._index_written = min(self._index_written, len(index) - len(self._pending))
        return broken


class _WalkFailedError(Exception):
    """Internal: a header walk did not check out at ``position``."""

    def __init__(self, position: int, reason: str) -> None:
        self.position = position
        self.reason = reason
        super().__init__(reason)
