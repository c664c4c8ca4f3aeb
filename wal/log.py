"""The log of one topic partition: an ordered run of segments.

Role: assign offsets, append batches to the active segment (rolling by size and age), read
from any retained offset, apply retention, truncate (a replica's cut back to where it
diverged from its leader), and recover on open. It owns the partition's leader-epoch
history (:mod:`wal.leader_epochs`), kept in step with truncation, retention and recovery.
Synchronous: the async :class:`wal.writer.LogWriter` drives it; tools and tests may use
it directly.

One piece, though past 600 lines: every operation here changes or walks the one list of
segments and its invariants (dense offsets, one active segment, the failure latch), and the
per-segment work already lives in :mod:`wal.segment` (the decoded and the raw read share
one walk over the list, each with its own per-segment step); what is left reads as Kafka's
``LocalLog`` does.

Invariants:
- Offsets are dense: segment ``i+1`` starts where segment ``i`` ends.
- Only the newest segment (the active one) is ever written.
- After an I/O error in an append, flush or roll the log is *failed*: every later write
  raises :class:`~wal.errors.WalFailedError` until the log is reopened, which recovers.
  Nothing half-written is acknowledged, because acknowledgement follows a successful sync.
- One exception: a *write* (not a sync) that finds the disk full is cut back, so the log is
  exactly as before it, and raises :class:`~wal.errors.DiskFullError` without latching; the
  next append tries the disk again, so appends resume by themselves once space is freed.
  A full disk met by a sync still latches: after a failed ``fdatasync`` the kernel may have
  dropped the dirty pages, and only a reopen (which rescans the tail) can be trusted.

Not task-safe: one owner (a ``LogWriter``) issues writes, one at a time. Reads of offsets
below :attr:`Log.head` as observed before a write began are safe from another thread while
that write runs (see :class:`wal.writer.LogWriter`).
"""

from __future__ import annotations

import logging
import os
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple, TypeVar

from proto.batch import RecordBatch
from wal.config import LogConfig
from wal.errors import (
    DISK_FULL_ERRNOS,
    CorruptSegmentError,
    OffsetOutOfRangeError,
    ReplicaOffsetMismatchError,
    WalClosedError,
    WalError,
    WalFailedError,
    io_error,
)
from wal.fdcache import PRIVATE_CAPACITY, FileCache
from wal.fs import FileSystem
from wal.hw_checkpoint import HighWatermarkCheckpoint
from wal.leader_epochs import EpochEntry, LeaderEpochs, load_entries
from wal.naming import INDEX_SUFFIX, LOG_SUFFIX, is_leftover, parse_segment_name, segment_name
from wal.policy import SegmentInfo, segments_to_delete, should_roll
from wal.segment import Segment, TailRecovery
from wal.validate import validate_batch

logger = logging.getLogger(__name__)

Clock = Callable[[], int]
T = TypeVar("T")


def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch: the production clock for rolling and retention."""
    return time.time_ns() // 1_000_000


class AppendResult(NamedTuple):
    """Where an appended batch landed: offsets ``first_offset`` .. ``last_offset``.

    A ``NamedTuple``: one is built per appended batch, on the hot path.
    """

    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :meth:`Log.open` found and repaired.

    Attributes:
        segments: Segments in the log after opening.
        leftovers_removed: Temp and ``.deleted`` files discarded.
        tail: The active segment's tail check (bytes scanned and cut, ``.broken`` file).
    """

    segments: int
    leftovers_removed: list[str]
    tail: TailRecovery

    @property
    def truncated_bytes(self) -> int:
        """Bytes cut from a torn tail (0 when clean)."""
        return self.tail.truncated_bytes


#: What :meth:`Log._walk` asks of each segment: ``(segment, offset, budget, upper,
#: min_one)`` -> what it took, its size in bytes (0: nothing), and the offset just past it.
_Step = Callable[[Segment, int, int, int, bool], tuple[T, int, int]]


def _decoded(
    seg: Segment, offset: int, budget: int, upper: int, min_one: bool
) -> tuple[list[RecordBatch], int, int]:
    """:meth:`Log.read`'s step: the segment's batches, decoded and CRC-checked."""
    got = seg.read(offset, budget, upper, min_one=min_one)
    if not got:
        return got, 0, offset
    return got, sum(b.size for b in got), got[-1].next_offset


def _raw(
    seg: Segment, offset: int, budget: int, upper: int, min_one: bool
) -> tuple[bytes, int, int]:
    """:meth:`Log.read_raw`'s step: the segment's batches as bytes, one ``pread``."""
    got, nxt = seg.read_raw(offset, budget, upper, min_one=min_one)
    return got, len(got), nxt


class Log:
    """All segments of one partition. Not task-safe: owned by one ``LogWriter``."""

    def __init__(
        self,
        path: str,
        config: LogConfig,
        *,
        fs: FileSystem,
        clock: Clock,
        segments: list[Segment],
        recovery: RecoveryReport,
        files: FileCache,
        epochs: list[EpochEntry] | None = None,
    ) -> None:
        self.path = path
        self.config = config
        self._limits = config.limits  # built once: every append is checked against them
        self.recovery = recovery
        self._fs = fs
        self._clock = clock
        self._segments = segments
        self._files = files
        self._failure: str | None = None
        self._closed = False
        #: The partition's leader-epoch history (its ``leader-epochs`` file).
        self.leader_epochs = LeaderEpochs(
            path, fs=fs, log_end=lambda: self.head, entries=epochs or []
        )
        #: The partition's high-watermark checkpoint (its ``high-watermark`` file): a
        #: replicated log's committed end as last saved (:mod:`wal.hw_checkpoint`).
        self.hw_checkpoint = HighWatermarkCheckpoint.open(path, fs=fs)

    # -- opening ----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str,
        config: LogConfig | None = None,
        *,
        fs: FileSystem | None = None,
        clock: Clock | None = None,
        files: FileCache | None = None,
    ) -> Log:
        """Open (or create) the log in directory ``path``, recovering as needed.

        Leftover temp and ``.deleted`` files are discarded; the active segment's tail is
        checked and a torn tail is cut (kept in a ``.broken`` file). Sealed segments are not
        opened: ``files`` (default: a cache of the log's own) opens them when they are read,
        so opening costs two descriptors at most, whatever the number of segments, and the
        open log holds one (its active ``.log``).

        Raises:
            WalIOError: the directory or a file could not be read or repaired.
        """
        config = config or LogConfig()
        fs = fs or FileSystem()
        try:
            return cls._open(
                path, config, fs, clock or wall_clock_ms, files or FileCache(PRIVATE_CAPACITY)
            )
        except OSError as exc:
            raise io_error("open", path, exc) from exc

    @classmethod
    def _open(
        cls, path: str, config: LogConfig, fs: FileSystem, clock: Clock, files: FileCache
    ) -> Log:
        fs.makedirs(path)
        names = fs.listdir(path)
        leftovers = [n for n in names if is_leftover(n)]
        for name in leftovers:
            fs.remove(os.path.join(path, name))
        epochs = load_entries(fs, path)  # a damaged file stops the open before any segment
        bases = sorted({p[0] for n in names if (p := parse_segment_name(n)) and p[1] == LOG_SUFFIX})
        for name in names:
            parsed = parse_segment_name(name)
            if parsed and parsed[1] == INDEX_SUFFIX and parsed[0] not in bases:
                fs.remove(os.path.join(path, name))
                leftovers.append(name)
        if len(bases) > 1 and cls._is_empty(fs, path, bases[-1]):
            # An empty newest segment is what a roll leaves before any append; appending
            # into the previous one again is equivalent and keeps offsets dense.
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX):
                fs.remove(os.path.join(path, segment_name(bases[-1], suffix)))
            bases.pop()
        segments: list[Segment] = []
        interval = config.index_interval_bytes
        try:
            for base, nxt in pairwise(bases):
                segments.append(Segment.open_sealed(fs, path, base, nxt, interval, files=files))
            active, tail = Segment.open_active(
                fs, path, bases[-1] if bases else 0, interval, files=files
            )
        except BaseException:
            for seg in segments:
                seg.close()
            raise
        segments.append(active)
        if leftovers or not bases:
            fs.fsync_dir(path)
        report = RecoveryReport(len(segments), leftovers, tail)
        logger.info(
            "log %s opened: %d segments, offsets [%d, %d), scanned %d tail bytes, cut %d",
            path,
            len(segments),
            segments[0].base_offset,
            active.next_offset,
            tail.scanned_bytes,
            tail.truncated_bytes,
        )
        log = cls(
            path,
            config,
            fs=fs,
            clock=clock,
            segments=segments,
            recovery=report,
            files=files,
            epochs=epochs,
        )
        try:
            # A crash in a truncation, or a power cut that took back appends, may leave
            # epochs that begin past the log's end: they never happened here.
            log.leader_epochs.truncate_from(log.head + 1)
            log.hw_checkpoint.lower_to(log.head)  # a power cut took back what it counted
        except BaseException:
            log.close()
            raise
        return log

    @staticmethod
    def _is_empty(fs: FileSystem, path: str, base: int) -> bool:
        return fs.file_size(os.path.join(path, segment_name(base, LOG_SUFFIX))) == 0

    # -- state ------------------------------------------------------------------------

    @property
    def head(self) -> int:
        """The next offset to be written."""
        return self._segments[-1].next_offset

    @property
    def first_offset(self) -> int:
        """The first retained offset."""
        return self._segments[0].base_offset

    @property
    def active_position(self) -> tuple[int, int]:
        """The active segment's base offset and its size in bytes: where the next append
        goes. O(1), for callers that look after every group commit."""
        active = self._segments[-1]
        return active.base_offset, active.size

    @property
    def size_bytes(self) -> int:
        """Bytes in all segment logs."""
        return sum(s.size for s in self._segments)

    @property
    def failure(self) -> str | None:
        """Why the log latched as failed, or ``None`` while healthy."""
        return self._failure

    @property
    def segment_count(self) -> int:
        """How many segments the log holds (no I/O, unlike :meth:`segment_infos`)."""
        return len(self._segments)

    def segment_infos(self) -> list[SegmentInfo]:
        """Facts about every segment, oldest first (the last is the active one)."""
        return [
            SegmentInfo(s.base_offset, s.next_offset, s.size, s.max_timestamp_ms())
            for s in self._segments
        ]

    # -- writing ----------------------------------------------------------------------

    def validate(self, data: bytes | bytearray | memoryview | RecordBatch) -> RecordBatch:
        """Check a batch against this log's limits. Pure: nothing is written.

        Raises:
            InvalidBatchError: (and subclasses) the batch is malformed or too large.
        """
        if isinstance(data, RecordBatch):
            return data
        return validate_batch(data, self._limits)

    def append(self, data: bytes | bytearray | memoryview | RecordBatch) -> AppendResult:
        """Validate and write one batch (not synced: call :meth:`flush`)."""
        return self.append_many([self.validate(data)])[0]

    def append_many(self, batches: Sequence[RecordBatch]) -> list[AppendResult]:
        """Write validated batches in order, rolling segments as needed (not synced).

        An empty ``batches`` writes nothing and returns ``[]``.

        Raises:
            DiskFullError: the disk is full; ``written`` batches (a prefix, written before
                a roll) are in the log and the rest are not; the log stays healthy.
            WalFailedError: the log is failed, or this write failed and latched it.
            WalClosedError: the log is closed.
        """
        self._check_writable()
        now = self._clock()  # one reading per group: rolling by age needs no finer grain
        results: list[AppendResult] = []
        group: list[tuple[int, RecordBatch]] = []
        group_bytes = 0
        offset = self.head
        written = 0
        active = self._segments[-1]
        # The common case: the whole group fits the active segment, so no batch needs the
        # roll check (_needs_roll would say no to each of them). One loop body serves both
        # cases; the common one pays a single local test per batch for it (about 1-2% of
        # an append's CPU with writes stubbed out, lost in the noise with real writes).
        check_roll = (
            active.sealed
            or self.config.segment_ms is not None
            or active.size + sum(len(b.buffer) for b in batches) > self.config.segment_bytes
        )
        try:
            for batch in batches:
                if check_roll:
                    size = batch.size
                    if self._needs_roll(active, group_bytes, size, now):
                        if group:
                            active.append(group, now)
                            written += len(group)
                            group, group_bytes = [], 0
                        self._roll()
                        active = self._segments[-1]
                    group_bytes += size
                group.append((offset, batch))
                nxt = offset + batch.record_count
                results.append(AppendResult(offset, nxt - 1))
                offset = nxt
            if group:
                active.append(group, now)
                self._fs.crash_point("append.after_write")
        except OSError as exc:
            raise self._write_failed("append", exc, written) from exc
        return results

    def append_replicated(self, batches: Sequence[RecordBatch]) -> list[AppendResult]:
        """Write a leader's batches as they are (not synced: call :meth:`flush`).

        A follower's append: the batches carry the leader's base offsets, the first must be
        the head and each next one must follow on. :meth:`append_many` then writes them: the
        base offset it patches into each is the one the batch carries, so the segments hold
        the leader's bytes unchanged. Its crash points are the append's and the roll's, and
        a crash leaves a prefix of whole batches, as for any append.

        Raises:
            ReplicaOffsetMismatchError: a batch does not start where the log (or the batch
                before it) ends; nothing was written.
            DiskFullError, WalFailedError, WalClosedError: as :meth:`append_many`.
        """
        self._check_writable()
        expected = self.head
        for i, batch in enumerate(batches):
            if batch.base_offset != expected:
                raise ReplicaOffsetMismatchError(i, expected, batch.base_offset)
            expected += batch.record_count
        return self.append_many(batches)

    def _needs_roll(self, active: Segment, unwritten: int, incoming: int, now: int) -> bool:
        """Whether ``incoming`` bytes must go to a new segment; ``unwritten`` bytes of this
        group are already bound for the active one."""
        if active.sealed:
            return True  # a roll sealed it, then failed to create the next (a full disk)
        cfg = self.config
        size = active.size + unwritten
        if size + incoming <= cfg.segment_bytes and cfg.segment_ms is None:
            return False  # the common case, decided without building the policy's inputs
        age = None if active.first_append_ms is None else now - active.first_append_ms
        return should_roll(
            segment_size=size,
            incoming_bytes=incoming,
            segment_age_ms=age,
            segment_bytes=cfg.segment_bytes,
            segment_ms=cfg.segment_ms,
        )

    def flush(self) -> None:
        """fdatasync the active segment: everything appended so far becomes durable."""
        self._check_writable()
        try:
            self._segments[-1].flush()
            self._fs.crash_point("append.after_sync")
        except OSError as exc:
            raise self._latch("fdatasync", exc) from exc

    def roll(self) -> None:
        """Seal the active segment and start a new one (no-op when the active one is empty)."""
        self._check_writable()
        if self._segments[-1].size == 0:
            return
        try:
            self._roll()
        except OSError as exc:
            raise self._write_failed("roll", exc) from exc

    def _roll(self) -> None:
        old = self._segments[-1]
        old.seal()
        self._fs.crash_point("roll.after_seal")
        new = Segment.create(
            self._fs,
            self.path,
            old.next_offset,
            self.config.index_interval_bytes,
            files=self._files,
        )
        self._fs.crash_point("roll.after_create")
        self._fs.fsync_dir(self.path)
        self._segments.append(new)
        logger.info(
            "log %s rolled segment %d at offset %d (%d bytes)",
            self.path,
            old.base_offset,
            new.base_offset,
            old.size,
        )

    def _check_writable(self) -> None:
        if self._closed:
            raise WalClosedError(self.path)
        if self._failure is not None:
            raise WalFailedError(self.path, self._failure)

    def _write_failed(self, op: str, exc: OSError, written: int = 0) -> WalError:
        """The error for a failed write: a full disk that left every segment as it was
        (each failed write cut back, no sync failed) is a :class:`DiskFullError` and the
        log stays healthy; anything else latches the log."""
        touched = self._segments[-2:]  # a roll touches the old and the new active segment
        if exc.errno in DISK_FULL_ERRNOS and not any(s.write_fault for s in touched):
            error = io_error(op, self._segments[-1].path, exc, written=written)
            logger.warning("log %s: %s", self.path, error)
            return error
        return self._latch(op, exc)

    def _latch(self, op: str, exc: OSError) -> WalFailedError:
        self._failure = f"{op} failed: {exc.strerror or exc} (errno {exc.errno})"
        logger.error("log %s latched as failed: %s", self.path, self._failure)
        return WalFailedError(self.path, self._failure)

    # -- retention --------------------------------------------------------------------

    def apply_retention(self, floor_offset: int | None = None) -> list[int]:
        """Delete whole sealed segments that retention allows; return their base offsets.

        Args:
            floor_offset: Never delete a segment holding this offset or later; ``None`` for
                no floor (the broker passes the minimum subscription cursor).

        Raises:
            WalIOError: a rename or unlink failed (the log stays usable).
        """
        cfg = self.config
        if cfg.retention_ms is None and cfg.retention_bytes is None:
            return []
        doomed = segments_to_delete(
            self.segment_infos(),
            now_ms=self._clock(),
            retention_ms=cfg.retention_ms,
            retention_bytes=cfg.retention_bytes,
            floor_offset=floor_offset,
        )
        for base in doomed:
            self._delete_oldest(base)
        if doomed:
            self.leader_epochs.truncate_before(self.first_offset)
        return doomed

    def delete_before(self, offset: int) -> list[int]:
        """Delete every sealed segment whose records all lie below ``offset``, whatever
        retention says; return their base offsets. The active segment always stays.

        For logs whose owner tracks what is consumed (a dead-letter queue acked up to a
        sequence) and for the broker's ``evict_oldest_backlog`` quota policy.

        Raises:
            WalIOError: a rename or unlink failed (the log stays usable).
        """
        doomed = []
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            base = self._segments[0].base_offset
            self._delete_oldest(base)
            doomed.append(base)
        if doomed:
            self.leader_epochs.truncate_before(self.first_offset)
        return doomed

    def _delete_oldest(self, base: int) -> None:
        seg = self._segments[0]
        assert seg.base_offset == base, (seg.base_offset, base)
        assert len(self._segments) > 1, "the active segment is never deleted"
        # Drop it from view first, so that no read can reach a closed file.
        self._segments = self._segments[1:]
        try:
            renamed = seg.rename_deleted()
            self._fs.fsync_dir(self.path)
            self._fs.crash_point("retention.after_rename")
            for path in renamed:
                self._fs.remove(path)
        except OSError as exc:
            raise io_error("delete segment", seg.path, exc) from exc
        logger.info(
            "log %s deleted segment %d (retention); first offset now %d",
            self.path,
            base,
            self.first_offset,
        )

    # -- truncation -------------------------------------------------------------------

    def truncate_to(self, offset: int) -> list[int]:
        """Drop every record at or past ``offset``; the next append is given ``offset``.

        A replica's cut back to where its log and the leader's diverge. In order, each
        step durable before the next (the crash points in brackets):

        0. the high-watermark checkpoint is lowered to ``offset`` if it is above it
           [``hw_checkpoint.after_tmp``, ``hw_checkpoint.after_rename``];
        1. every segment wholly at or past ``offset`` is removed, newest first, the
           directory synced after each [``truncate.after_segment_delete``];
        2. the segment holding ``offset`` has its ``.index`` cut and synced
           [``truncate.after_index``], then its ``.log`` [``truncate.after_data``];
           it becomes the active segment again, even if it was sealed (it is closed and
           opened again as :meth:`open` opens the newest segment);
        3. the leader-epoch history drops the epochs starting at or past ``offset``.

        A crash at any step leaves, after :meth:`open`, a prefix of the old log no
        shorter than ``offset``: a removed segment was the newest, a cut index holds only
        entries below the cut, and the rest is cut again by a second call. Epochs starting
        past the log's end are dropped by :meth:`open`.

        Truncating to the head changes nothing. ``offset`` must be a batch boundary in
        ``[first_offset, head]``: below the first offset is refused (retention deleted
        those records; a replica whose divergence lies there must be emptied and fetch
        again), as is an offset inside a batch; either error changes nothing.

        Args:
            offset: The new head.

        Returns:
            The base offsets of the segments removed whole, newest first.

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the first offset or past the head.
            NotBatchBoundaryError: ``offset`` falls inside a batch.
            CorruptSegmentError: damaged data before ``offset`` (nothing was changed).
            WalFailedError: the log is failed, or a step failed and latched it.
            WalClosedError: the log is closed.
        """
        self._check_writable()
        if offset == self.head:
            return []
        if not self.first_offset <= offset < self.head:
            raise OffsetOutOfRangeError(offset, self.first_offset, self.head)
        keep = max(1, bisect_left([s.base_offset for s in self._segments], offset))
        target = self._segments[keep - 1]
        try:
            position = target.truncation_point(offset)
        except OSError as exc:
            raise io_error("truncate", target.path, exc) from exc
        # A checkpoint above the cut would expose, after a restart, records appended
        # there later that were never committed: lowered first (a refusal raises here,
        # before any file of the log changes).
        self.hw_checkpoint.lower_to(offset)
        removed = []
        try:
            while len(self._segments) > keep:
                removed.append(self._remove_newest())
            target.truncate_files(position)
            self._fs.crash_point("truncate.after_data")
            target.close()
            active, _tail = Segment.open_active(
                self._fs,
                self.path,
                target.base_offset,
                self.config.index_interval_bytes,
                files=self._files,
            )
            self._segments = [*self._segments[:-1], active]
            self.leader_epochs.truncate_from(offset)
        except OSError as exc:
            raise self._latch("truncate", exc) from exc
        except WalError as exc:  # the epochs file: the log is cut, its history is not
            self._failure = f"truncate failed: {exc}"
            logger.error("log %s latched as failed: %s", self.path, self._failure)
            raise WalFailedError(self.path, self._failure) from exc
        logger.info(
            "log %s truncated to offset %d (segments removed: %s)", self.path, offset, removed
        )
        return removed

    def restart_at(self, offset: int) -> list[int]:
        """Empty the log; the next append is given ``offset``, whatever the log held.

        A replica's reset when the leader no longer has what it would fetch next (its
        log start passed this log's head: retention there, a wiped disk here) or when
        the divergence lies below this log's first offset, where :meth:`truncate_to`
        refuses (Kafka's ``truncateFullyAndStartAt``). In order, each step durable before
        the next:

        1. :meth:`truncate_to` the first offset, if the log holds records (its steps and
           crash points);
        2. the leader-epoch history is emptied;
        3. unless ``offset`` is the first offset: an empty segment based at ``offset`` is
           made, the directory synced [``restart.after_create``], then the old (empty)
           segment's files are removed and the directory synced.

        A crash leaves, after :meth:`open`, a prefix of the old log (step 1), or an empty
        log at the old first offset or at ``offset``: after step 3's create the directory
        holds two empty segments, and :meth:`open` drops the newer one. Calling this
        again finishes the job. An epoch entry whose start is the old first offset may
        survive a crash in step 1 (open keeps an entry starting at the head); it dates
        no record, and step 2 of the next call drops it.

        Example: segments 0 and 500, head 800, epochs ``[(3, 0), (5, 600)]``;
        ``restart_at(1000)``: segment 500 removed, segment 0 cut empty, epochs ``[]``,
        segment 1000 made, segment 0 removed; ``head == first_offset == 1000``.

        Args:
            offset: The new first offset and head, >= 0.

        Returns:
            The base offsets of the segments removed, newest first.

        Raises:
            ValueError: ``offset`` is negative (nothing changed).
            WalFailedError: the log is failed, or a step failed and latched it.
            WalClosedError: the log is closed.
        """
        self._check_writable()
        if offset < 0:
            raise ValueError(f"log {self.path}: cannot restart at negative offset {offset}")
        first = self.first_offset
        self.hw_checkpoint.lower_to(min(offset, first))  # as truncate_to does, first
        removed = self.truncate_to(first) if self.head > first else []
        try:
            self.leader_epochs.truncate_from(0)
            if offset != first:
                removed.append(self._replace_active(offset))
        except OSError as exc:
            raise self._latch("restart", exc) from exc
        except WalError as exc:  # the epochs file
            self._failure = f"restart failed: {exc}"
            logger.error("log %s latched as failed: %s", self.path, self._failure)
            raise WalFailedError(self.path, self._failure) from exc
        logger.info(
            "log %s emptied, restarts at offset %d (was [%d, ...))", self.path, offset, first
        )
        return removed

    def _replace_active(self, offset: int) -> int:
        """Swap the one (empty) segment for an empty one based at ``offset``: the new one
        made and synced first (see :meth:`restart_at`); return the old one's base."""
        old = self._segments[-1]
        assert len(self._segments) == 1, "restart_at empties the log first"
        assert old.size == 0, "restart_at empties the log first"
        new = Segment.create(
            self._fs, self.path, offset, self.config.index_interval_bytes, files=self._files
        )
        self._segments = [new]
        old.close()
        self._fs.fsync_dir(self.path)
        self._fs.crash_point("restart.after_create")
        self._fs.remove(old.path)
        self._fs.remove(old.index_path)
        self._fs.fsync_dir(self.path)
        return old.base_offset

    def _remove_newest(self) -> int:
        """Remove the newest segment's files (the ``.log`` first: a stray ``.index`` is
        discarded by :meth:`open`), then sync the directory; return its base offset."""
        seg = self._segments[-1]
        self._segments = self._segments[:-1]  # from view first: no read reaches it
        seg.close()
        self._fs.remove(seg.path)
        self._fs.remove(seg.index_path)
        self._fs.fsync_dir(self.path)
        self._fs.crash_point("truncate.after_segment_delete")
        return seg.base_offset

    # -- reading ----------------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int = 1 << 20, *, upper: int | None = None
    ) -> list[RecordBatch]:
        """Batches from the one holding ``offset`` onwards, up to ``max_bytes``.

        At least one whole batch is returned when ``offset`` is below ``upper``, even if it
        is larger than ``max_bytes``; the first batch may start before ``offset``.

        Args:
            offset: First offset wanted.
            max_bytes: Soft limit on the bytes returned.
            upper: Return no batch starting at or past this offset (default: the head).

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the first retained offset or past
                the head.
            CorruptSegmentError: damaged data where the read starts.
            WalIOError: a file could not be read (as when retention deleted a segment
                after the read began).
            WalClosedError: the log is closed.
        """
        parts = self._walk(offset, max_bytes, upper, _decoded)
        return parts[0] if len(parts) == 1 else [b for part in parts for b in part]

    def read_raw(self, offset: int, max_bytes: int = 1 << 20, *, upper: int | None = None) -> bytes:
        """:meth:`read`'s batches as bytes laid end to end, as they are in the segments:
        the same bounds (at least one whole batch, none at or past ``upper``, the first
        may start before ``offset``), read with :meth:`Segment.read_raw` (one ``pread``
        per segment, headers walked, no CRC computed, no record decoded). What a leader
        sends its followers; each follower checks every batch's CRC before it writes.

        Raises:
            As :meth:`read`.
        """
        parts = self._walk(offset, max_bytes, upper, _raw)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _walk(self, offset: int, max_bytes: int, upper: int | None, step: _Step[T]) -> list[T]:
        """The one walk of :meth:`read` and :meth:`read_raw`: what ``step`` takes from
        each segment, oldest first, from the one holding ``offset``.

        The bounds are checked against a snapshot of the segment list (retention swaps in
        a new one; a segment it deletes under the walk may fail its read: an I/O error).
        Then, segment by segment: the first step may exceed the budget by one whole batch
        (``min_one``), later ones may not; the walk stops at ``upper``, when the budget is
        spent, at a step that takes nothing (never skipping ahead), or in a segment that
        holds more than its step took. Damage where the walk starts raises; damage in a
        later segment ends the answer before it (the intact batches are answered; the
        next read, which starts at the damage, raises).
        """
        if self._closed:
            raise WalClosedError(self.path)
        segments = self._segments  # a snapshot: retention swaps in a new list
        head = segments[-1].next_offset
        upper = head if upper is None else min(upper, head)
        if offset < segments[0].base_offset or offset > head:
            raise OffsetOutOfRangeError(offset, segments[0].base_offset, head)
        i = bisect_right([s.base_offset for s in segments], offset) - 1
        parts: list[T] = []
        budget = max_bytes
        try:
            for seg in segments[i:]:
                if offset >= upper or (parts and budget <= 0):
                    break
                try:
                    got, size, offset = step(seg, offset, budget, upper, not parts)
                except CorruptSegmentError:
                    if not parts:
                        raise  # damaged where the read starts
                    break  # the intact batches before it are answered
                if not size:
                    break  # the budget is spent (or upper reached): never skip ahead
                parts.append(got)
                budget -= size
                if seg.next_offset > offset:
                    break  # this segment has more; the budget ran out
        except OSError as exc:
            raise io_error("read", self.path, exc) from exc
        return parts

    # -- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Sync (unless failed) and close every file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._failure is None:
                self._segments[-1].seal()
        except OSError as exc:
            logger.error("log %s: sync on close failed: %s", self.path, exc)
        finally:
            for seg in self._segments:
                seg.close()
