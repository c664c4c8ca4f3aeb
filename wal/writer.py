"""The async writer: the single task that owns a log's files.

Role: coalesce concurrent appends into group commits (one write, one ``fdatasync``), resolve
each appender's future only after its data is durable under the fsync policy, and advance
the high-water mark that later drives the dispatcher's notifier.

Protocol of one group commit::

    appenders --Append(batch, future)--> staged on the loop, in call order
    one callback per loop turn: hand every staged command to the writer thread's queue
    writer thread: take what is queued (up to max_group_bytes)
                   log.append_many + log.flush        # one pwritev, one fdatasync
                   call_soon_threadsafe(completion)   # one loop wake-up per group
                   take the next group at once        # queued during this one's fdatasync
    on the loop:   keep the batches in the tail cache # readers near the head share them
                   advance high-water mark, call listeners  # persist first, then notify
                                                      # (timed: wal.commit_cost)
                   settle appends, resolve futures    # then acknowledge

The thread takes the next group as soon as the last one is synced, while the loop is still
acknowledging that one: the loop's work (answering and re-queuing appenders) and the disk's
(write, fdatasync) overlap, so concurrent appenders share each ``fdatasync`` without either
side waiting for the other.

Commands are handed to the thread once per loop turn, not one by one as they are made. The
appenders a completion wakes all run in one turn. Had the first of them woken the thread,
it would have slept again at once, waiting for the GIL the loop holds until that turn
ends, and that second wake-up costs as much as the first (about 50 us on a VM). Handed
over together, they wake the thread once, when the loop is about to let go of the GIL.

Invariants:
- An append is acknowledged only after ``fdatasync`` under ``ALWAYS``; after the write under
  ``INTERVAL`` and ``NEVER``. See :class:`~wal.config.FsyncPolicy`.
- The high-water mark only moves forward and only over durable data; it is always a batch
  boundary.
- Backpressure is first come, first queued: with ``queue_size`` commands queued, an
  append or command waits behind every earlier waiter, and a freed place is handed to
  the oldest one (counted as taken before it wakes), so nobody is passed or starved.
- After a failed write every pending and later append fails with ``WalFailedError``;
  except on a full disk: the group's appends fail with ``DiskFullError`` (those the log
  wrote whole before the disk filled, a prefix, are acknowledged after the sync as usual),
  nothing of the rest stays on disk, and the next group tries the disk again.

Threading contract: one dedicated thread per writer (``wal-writer:<path>``) is the only
writer: it runs every command (appends, flushes, rolls, close) in the order they were
queued, while reads run on the event loop; that is safe because bytes below the high-water
mark never change and segment bookkeeping is published only after the bytes are written.
The loop's view of the head (:attr:`LogWriter.head`) moves only when a group's completion
reaches the loop, never ahead of what that group's sync covered. Retention runs on the
event loop itself while the thread waits for it (it is queued like any command), so a read
never meets a segment whose file is being closed. Under ``INTERVAL`` a second worker thread
runs the periodic ``fdatasync`` while writes continue; ``pwritev`` and ``fdatasync`` on one
descriptor are safe together, and the mark only claims what was written before the sync.

Where the parts live: the thread's side of the protocol (taking groups, writing, syncing,
posting completions) is :mod:`wal.writer_thread`; the commands and how an append is
settled, :mod:`wal.writer_commands`; the cold-read threads, :mod:`wal.cold_reads`. This
module keeps the loop's side, which is one piece (about 1,110 lines, the class 950): the
queue's accounting and its first-come backpressure, the completions and the high-water
mark are one state (``_queued``, ``_room``, ``_hwm``, ``_written``) that every append,
completion and read touches on the loop, and a split would put the append path behind
another object's calls for no separation a reader could use. Replication added to that
same state, not beside it: the commit gate caps ``_hwm`` below ``_written``
(``hold_commits``/``commit_to``/``release_commits``), the high-watermark checkpoint
saves ``_hwm``, a replicated append and ``truncate_to``/``restart_at`` go through the one
queue, and a leader's written listener is told each group's end between its write and
its sync (``set_written_listener``), so they stay here. The seam, should the module
grow again: the reads (``read``/``read_nowait``/``aread``/``read_cold``/``read_raw``,
about 150 lines), which only read ``_hwm`` and the log and could become a reader object
the writer hands out.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

from proto.batch import RecordBatch
from wal.cold_reads import cold_read_pool
from wal.commit_cost import CommitCost
from wal.config import FsyncPolicy, LogConfig
from wal.errors import (
    OffsetOutOfRangeError,
    WalClosedError,
    WalError,
    WalFailedError,
    WalIOError,
)
from wal.fdcache import FileCache
from wal.fs import FileSystem, WouldBlockError, nonblocking_reads
from wal.log import AppendResult, Clock, Log
from wal.tail import TailCache
from wal.validate import check_replicated
from wal.writer_commands import (
    Append,
    AppendReplicated,
    ApplyRetention,
    Close,
    Command,
    Flush,
    Roll,
    Settled,
    Truncate,
    Written,
    fail,
    resolve,
    settle,
)
from wal.writer_thread import BROKEN, Completions, WriterThread

logger = logging.getLogger(__name__)

T = TypeVar("T")
Listener = Callable[[int], None]
#: Called after each group commit with (seconds writing, seconds in fsync or None when
#: the policy did not sync, batches in the group). For latency metrics.
CommitObserver = Callable[[float, float | None, int], None]
#: How often a log with held commits saves its mark at most (s): each save is a small
#: file replaced (two fsyncs); a lagging checkpoint only delays what a restarted replica
#: shows until the replication confirms it again.
CHECKPOINT_INTERVAL_S = 1.0


async def run_to_end(work: Awaitable[T]) -> T:
    """Await ``work`` and return its result, running it to its end even if the caller is
    cancelled: the caller then waits for it, and re-raises the cancellation after.

    For work that cannot be stopped halfway, such as a thread hop (a thread cannot be
    stopped) followed by the bookkeeping of its result: a lock the caller holds is not
    released, and a temp file it writes is not reused by the next call, while the work
    still runs, and what is on disk and in memory stay in step.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


@dataclass(slots=True)
class _CheckpointWrites:
    """Held commits: the mark's checkpoint write waiting or running (at most one), and
    the loop time the last one began. One attribute of the writer, not two: the writer
    stays under CPython 3.11's 30 inline attributes (``docs/development.md``)."""

    task: asyncio.Task[None] | None = None
    at: float = -math.inf


class LogWriter:
    """Async owner of one :class:`~wal.log.Log`.

    Task-safe for any number of tasks on one event loop: they only queue commands; the
    writer thread alone writes the log's files.
    """

    #: Held commits: the mark is saved (``Log.hw_checkpoint``) at most this often (s),
    #: and when the writer closes; a restarted replica starts its mark there. A class
    #: attribute (tests set it on one writer).
    checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S

    def __init__(self, log: Log, *, queue_size: int = 10_000) -> None:
        self._log = log
        self._policy = log.config.fsync
        self._queue_size = queue_size
        self._jobs: queue.SimpleQueue[Command] = queue.SimpleQueue()
        #: Commands made during this loop turn, in order; :meth:`_hand_over` queues them.
        self._staged: list[Command] = []
        self._queued = 0  # commands queued and not yet completed on the loop
        #: Appenders and commands waiting for room in the queue, oldest first.
        self._room: collections.deque[asyncio.Future[None]] = collections.deque()
        self._hwm = log.head  # committed: what readers see (the commit gate, below)
        self._durable = log.head  # locally durable end
        self._written = log.head
        self._listeners: list[Listener] = []
        #: Told the durable end as it advances, held commits or not (a leader's HW).
        self._durable_listeners: list[Listener] = []
        self._held = False  # commits held: the mark moves only by commit_to
        self._checkpoints = _CheckpointWrites()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed: asyncio.Future[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        #: The periodic sync's thread hop while it runs (a truncation waits it out), and
        #: the truncation running on the loop.
        self._tick_flush: asyncio.Future[None] | None = None
        self._truncation: asyncio.Future[None] | None = None
        self._stop = asyncio.Event()
        self._tail = TailCache(log.config.tail_cache_bytes)
        #: The one thread that writes the log's files; it answers through these.
        self._worker = WriterThread(
            log,
            self._jobs,
            Completions(
                commit_done=self._commit_done,
                replicated_done=self._replicated_done,
                control_done=self._control_done,
                retention=self._retention_on_loop,
                close_done=self._close_done,
                fail_commands=self._fail_commands,
                fail_broken=self._fail_broken,
                high_water_mark=lambda: self._durable,
                written=self._written_ahead,
            ),
        )
        #: Told each group's written end before its sync (see set_written_listener).
        self._ahead: Listener | None = None
        #: Told how long each group commit's write and fsync took (metrics).
        self.on_commit: CommitObserver = _ignore_commit
        #: What synced group commits cost the disk and the listeners (policy ``ALWAYS``
        #: only), and from that the batches a producer should keep in flight.
        self.commit_cost = CommitCost()
        #: Reads that the page cache could not serve, handed to a thread (read_nowait).
        self.cold_reads = 0
        #: read_cold's and read_raw's thread reads not yet done: aclose waits for them.
        self._cold_in_flight: set[asyncio.Future[Any]] = set()

    @classmethod
    async def open(
        cls,
        path: str,
        config: LogConfig | None = None,
        *,
        fs: FileSystem | None = None,
        clock: Clock | None = None,
        queue_size: int = 10_000,
        files: FileCache | None = None,
    ) -> LogWriter:
        """Open (recovering) the log at ``path`` and start its writer thread; ``files`` is
        the descriptor cache its segments share with other logs (default: its own)."""
        log = await asyncio.to_thread(Log.open, path, config, fs=fs, clock=clock, files=files)
        try:
            # Data recovered under a lax policy may still sit in the page cache.
            await asyncio.to_thread(log.flush)
        except WalError:
            await asyncio.to_thread(log.close)
            raise
        writer = cls(log, queue_size=queue_size)
        writer._start()
        if log.hw_checkpoint.exists:
            # Only a log whose commits were held has one: a replica's. Its mark starts
            # at the checkpoint from the first moment, before any role is known: what
            # lies above may never have been committed.
            writer.hold_commits(at=log.hw_checkpoint.offset)
        return writer

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closed = self._loop.create_future()
        self._thread = self._worker.start(self._loop)
        if self._policy is FsyncPolicy.INTERVAL:
            self._ticker = asyncio.create_task(self._tick(), name=f"wal-fsync:{self._log.path}")

    # -- public API -------------------------------------------------------------------

    @property
    def log(self) -> Log:
        """The log (read-only use: reads, state)."""
        return self._log

    @property
    def high_water_mark(self) -> int:
        """Offset just past the last committed record; consumers may read below it.

        Unreplicated (the default), committed means locally durable: the mark is
        :attr:`durable_end`. With commits held (:meth:`hold_commits`, a replicated log)
        it moves only by :meth:`commit_to`, never past :attr:`durable_end`.
        """
        return self._hwm

    @property
    def durable_end(self) -> int:
        """Offset just past the last locally durable record (under the fsync policy);
        :attr:`high_water_mark` unless commits are held."""
        return self._durable

    @property
    def commits_held(self) -> bool:
        """Whether the mark moves only by :meth:`commit_to` (see :meth:`hold_commits`)."""
        return self._held

    def hold_commits(self, at: int | None = None) -> None:
        """The commit gate: from now on :attr:`high_water_mark` moves only by
        :meth:`commit_to` (a replicated log: a leader commits what its in-sync followers
        have, a follower what its leader committed). The durable end goes on advancing
        and telling the durable listeners. Idempotent.

        ``at``: where the mark starts when commits were not held yet (the log's
        high-watermark checkpoint, ``log.hw_checkpoint.offset``, for a replica that
        opened its log): clamped to ``[first_offset, durable_end]``, and it may lower the
        mark, so call it before anything reads the log. ``None``, or commits held
        already (the mark in memory is newer than any checkpoint): the mark stays.
        While commits are held, the mark is saved in the checkpoint as it moves (at most
        every :attr:`checkpoint_interval_s`, and at :meth:`aclose`); a cut below it
        lowers it first (:class:`wal.hw_checkpoint.HighWatermarkCheckpoint`).

        Example: mark 10, durable end 10; held; appends make the durable end 15 while
        readers still see 10; ``commit_to(12)`` moves the mark to 12 and calls the
        listeners with 12; ``commit_to(40)`` moves it to 15 (clamped). Opened with a
        durable end of 15 and a checkpoint of 12: ``hold_commits(at=12)``: readers see
        up to 12 until ``commit_to`` says more.
        """
        if at is not None and not self._held:
            self._hwm = max(self._log.first_offset, min(at, self._durable))
        self._held = True
        if not self._log.hw_checkpoint.exists:
            self._checkpoint_soon()  # marks the log as a replica's for the next open

    def release_commits(self) -> None:
        """Back to unreplicated: the mark moves to the durable end at once (listeners
        told) and follows it from then on; the high-watermark checkpoint is removed
        (a file unlinked and its directory synced, on the loop: a rare change), so the
        next open does not hold commits. Idempotent."""
        self._held = False
        if self._checkpoints.task is not None:
            self._checkpoints.task.cancel()
        try:
            self._log.hw_checkpoint.remove()
        except WalError as exc:
            logger.warning("log %s: %s", self._log.path, exc)
        self.commit_to(self._durable)

    def commit_to(self, offset: int) -> int:
        """Move :attr:`high_water_mark` to ``offset``, clamped to :attr:`durable_end`;
        never back. Calls the listeners when it moved. Returns the mark.

        Meant for held commits; without them the mark already is the durable end."""
        offset = min(offset, self._durable)
        if offset > self._hwm:
            self._hwm = offset
            if self._held:
                self._checkpoint_soon()
            for listener in list(self._listeners):
                try:
                    listener(offset)
                except Exception:
                    logger.exception("log %s: high-water mark listener failed", self._log.path)
        return self._hwm

    def _checkpoint_soon(self) -> None:
        """Save the mark in the checkpoint: now if the last write is
        :attr:`checkpoint_interval_s` old, else when it is (one write pending at most)."""
        if self._checkpoints.task is None and not self._closing and self._loop is not None:
            self._checkpoints.task = self._loop.create_task(
                self._checkpoint_later(), name=f"wal-hw-checkpoint:{self._log.path}"
            )

    async def _checkpoint_later(self) -> None:
        """Write, then again after the interval while the mark moved meanwhile."""
        assert self._loop is not None
        checkpoint = self._log.hw_checkpoint
        try:
            while not self._closing and self._log.failure is None:
                delay = self._checkpoints.at + self.checkpoint_interval_s - self._loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._save_checkpoint()
                if checkpoint.exists and checkpoint.offset == self._hwm:
                    break
        finally:
            self._checkpoints.task = None

    async def _save_checkpoint(self) -> None:
        """Write the mark to the checkpoint, off the loop; a failure is logged (the
        checkpoint lags: the next write tries again)."""
        checkpoint = self._log.hw_checkpoint
        mark, generation = self._hwm, checkpoint.generation
        if self._log.failure is not None or (checkpoint.exists and mark == checkpoint.offset):
            return
        assert self._loop is not None
        self._checkpoints.at = self._loop.time()
        try:
            await run_to_end(asyncio.to_thread(checkpoint.advance, mark, generation))
        except WalError as exc:
            logger.warning("log %s: high-watermark checkpoint not saved: %s", self._log.path, exc)

    @property
    def head(self) -> int:
        """Offset just past the last written record (durable or not)."""
        return self._written

    @property
    def first_offset(self) -> int:
        """The first retained offset."""
        return self._log.first_offset

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(high_water_mark)`` on the loop each time the mark advances."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``."""
        self._listeners.remove(listener)

    def add_durable_listener(self, listener: Listener) -> None:
        """Call ``listener(durable_end)`` on the loop each time the durable end advances,
        before the mark's listeners (a leader recomputes its high watermark, a follower's
        long poll wakes). Held commits or not."""
        self._durable_listeners.append(listener)

    def set_written_listener(self, listener: Listener | None) -> None:
        """Tell ``listener`` the written end of each group commit of :meth:`append`
        under the ``always`` policy, after its write and before its ``fdatasync`` (on
        the loop; one more wake-up per group); under ``interval``, once written, before
        the periodic sync (``never``: the durable listeners are told at once, the
        written end is durable as far as that policy goes); ``None``: no more. One at a
        time: it replaces the one set before (see :meth:`remove_written_listener`).

        For a leader serving its followers bytes it has written while it syncs them:
        bytes below a written end never change (only a follower truncates), so a
        :meth:`read_raw` up to it is safe; they are not durable, which the leader's
        high watermark (at most :attr:`durable_end`) still waits for.
        """
        self._ahead = listener
        self._worker.post_written = listener is not None

    def remove_written_listener(self, listener: Listener) -> None:
        """Stop telling ``listener`` (nothing when another one was set since)."""
        if self._ahead is listener:
            self.set_written_listener(None)

    def _written_ahead(self, head: int) -> None:
        listener = self._ahead
        if listener is not None:
            try:
                listener(head)
            except Exception:
                logger.exception("log %s: written-end listener failed", self._log.path)

    def remove_durable_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``."""
        self._durable_listeners.remove(listener)

    async def append(
        self,
        batch: bytes | bytearray | memoryview | RecordBatch,
        *,
        on_done: Settled | None = None,
        on_queued: Callable[[], None] | None = None,
    ) -> AppendResult:
        """Append one batch; return its offsets once it is acknowledged.

        ``on_done`` is called once, on the loop, with the offsets or the exception, in the
        same callback that acknowledges the batch (after the high-water mark moved): even
        if the caller was cancelled while it waited (the batch is written all the same once
        queued), and before any task woken by the acknowledgement runs. For bookkeeping
        that must follow every append that happened, without a task of its own.

        ``on_queued`` is called once, at once, when the batch has its place in the writer's
        queue (before it is written): batches are written in the order they are queued, so
        a caller that must keep its batches in order may start the next one then. It is
        not called for a batch refused before it was queued.

        Backpressure: with ``queue_size`` commands queued, an append waits for room, behind
        every append or command that was already waiting (first come, first queued).

        Raises:
            InvalidBatchError: the batch is malformed or over a limit; nothing was appended.
            WalFailedError: the log failed; nothing more will be written until reopened.
            WalClosedError: the writer is closing.
        """
        try:
            self._check_open()
            validated = self._log.validate(batch)
            loop = self._loop
            assert loop is not None
            future: asyncio.Future[AppendResult] = loop.create_future()
            if self._room or self._queued >= self._queue_size:
                await self._wait_for_room()  # backpressure: returns holding a place
            else:
                self._queued += 1
        except BaseException as exc:
            if on_done is not None:
                on_done(exc)
            raise
        # tuple.__new__: the NamedTuple's own __new__ is a Python function, 2x slower.
        self._stage(tuple.__new__(Append, (validated, future, on_done)))
        if on_queued is not None:
            on_queued()
        return await future

    async def append_replicated(self, data: bytes | bytearray | memoryview) -> int:
        """Append a leader's batches byte for byte (a follower's append); return the head
        after them, the offset to fetch from next.

        ``data`` is whole batches laid end to end as they are in the leader's log (its
        :meth:`read_raw`), base offsets set; it must not change until this returns. All
        are checked before anything is written: each decodes as a read decodes it (header,
        CRC over every byte past the length, section bounds; no record walked), each starts
        where the one before it ends (:func:`wal.validate.check_replicated`), and the first
        starts at the head (on the writer thread, just before the write). This log's
        limits do not apply: the leader applied its own when the records were published,
        and a follower that refused what its leader holds would stop there for good. The
        segments then hold the leader's bytes.

        Durable under the fsync policy before this returns, as :meth:`append` is: under
        ``always`` synced, so the head returned is the follower's durable end. Under
        ``interval`` and ``never`` it returns once written: the head returned is then the
        written end, durable at the next periodic sync (``interval``; the
        :attr:`high_water_mark` says how far) or whenever the OS writes it back
        (``never``). A follower that reports it as its fetch offset promises only that.

        Producer ids and sequences are not looked at: the leader deduplicated, and a
        producer table is rebuilt from the log. The batches are written after every
        command queued before them, in a write of their own, and wait for room in the
        queue as an append does.

        Cancellation: once called, the append runs to its end (:func:`run_to_end`): a
        cancelled caller waits until the batches are written and synced (or refused), then
        sees the cancellation, so the next fetch never starts while a write is in flight.

        Raises:
            CorruptBatchError: a batch fails its CRC or layout check, or ``data`` ends
                inside a batch; nothing was written.
            ReplicaOffsetMismatchError: a gap or an overlap, or the first batch is not at
                the head; nothing was written.
            DiskFullError: the disk filled: the first ``written`` batches are in the log
                (synced as usual, :attr:`head` moved past them), the rest are not.
            WalFailedError, WalClosedError: as :meth:`append`.
        """
        self._check_open()
        batches = check_replicated(data)
        if not batches:
            return self._written
        return await run_to_end(self._replicate(batches))

    async def _replicate(self, batches: list[RecordBatch]) -> int:
        cmd = AppendReplicated(batches, self._new_future())
        await self._command(cmd)
        return cmd.future.result()

    async def flush(self) -> None:
        """Make everything appended so far durable and advance the high-water mark."""
        await self._command(Flush(self._new_future()))

    async def roll(self) -> None:
        """Seal the active segment now."""
        await self._command(Roll(self._new_future()))

    async def apply_retention(self, floor_offset: int | None = None) -> list[int]:
        """Delete the sealed segments retention allows; return their base offsets."""
        future: asyncio.Future[list[int]] = self._new_future()
        await self._command(ApplyRetention(floor_offset, future))
        return await future

    async def truncate_to(self, offset: int) -> list[int]:
        """Drop every record at or past ``offset`` (a replica cutting back to where its
        log and the leader's diverge); return the base offsets of the segments removed.

        Runs after every command queued before it, on the loop while the writer thread
        waits (as retention does), and to its end even if the caller is cancelled
        (:func:`run_to_end`): the caller then waits for it and sees the cancellation after.
        Before the files change, the high-water mark is lowered to ``offset`` (if above it)
        and the tail cache emptied, and cold reads in flight (and an ``interval`` periodic
        sync) are waited out, so no read returns a dropped record once this returns and
        none meets a file being cut. Afterwards :attr:`head` is ``offset``, reads at
        ``offset`` return nothing and past it raise ``OffsetOutOfRangeError``, and the next
        append is given ``offset``.

        Listeners are not called: they are told when the mark advances, and a truncation
        lowers it. A listener that keeps the largest mark it was told must be reset by the
        caller (the mark is :attr:`high_water_mark` once this returns); the next append
        calls it with marks from ``offset`` on.

        Raises:
            As :meth:`wal.log.Log.truncate_to`: ``OffsetOutOfRangeError``,
            ``NotBatchBoundaryError`` (both change nothing), ``WalFailedError``,
            ``WalClosedError``.
        """
        future: asyncio.Future[list[int]] = self._new_future()
        return await run_to_end(self._truncate(Truncate(offset, future)))

    async def restart_at(self, offset: int) -> list[int]:
        """Empty the log; the next append is given ``offset``, whatever the log held
        (:meth:`wal.log.Log.restart_at`: a replica whose leader's log start passed its
        head, or whose divergence lies below its first offset). Returns the base offsets
        of the segments removed.

        Runs as :meth:`truncate_to` runs: queued, on the loop while the writer thread
        waits, to its end even if the caller is cancelled, with the mark lowered and the
        reads and periodic sync in flight waited out before the files change. Afterwards
        :attr:`first_offset`, :attr:`head`, :attr:`durable_end` and
        :attr:`high_water_mark` are all ``offset`` (the mark moves there even with
        commits held, and even up: nothing lies below it); listeners are not called.

        Raises:
            ValueError: ``offset`` is negative (nothing changed).
            WalFailedError, WalClosedError: as :meth:`truncate_to`.
        """
        future: asyncio.Future[list[int]] = self._new_future()
        return await run_to_end(self._truncate(Truncate(offset, future, restart=True)))

    async def _truncate(self, cmd: Truncate) -> list[int]:
        await self._command(cmd)
        return cmd.future.result()

    async def delete_before(self, offset: int) -> list[int]:
        """Delete every sealed segment wholly below ``offset``; return their base offsets."""
        future: asyncio.Future[list[int]] = self._new_future()
        await self._command(ApplyRetention(None, future, before=offset))
        return await future

    def read(self, offset: int, max_bytes: int = 1 << 20) -> list[RecordBatch]:
        """Durable batches from ``offset``, below the high-water mark. See ``Log.read``.

        Reads near the head are served from memory (the tail cache): the batches returned
        are then shared with every other reader; they are immutable."""
        cached = self._cached(offset, max_bytes)
        if cached is not None:
            return cached
        return self._log.read(offset, max_bytes, upper=self._hwm)

    def _cached(self, offset: int, max_bytes: int) -> list[RecordBatch] | None:
        """What the tail cache holds from ``offset``; None when the files must be read."""
        if offset < self._log.first_offset:  # the log raises OffsetOutOfRangeError
            return None
        return self._tail.read(offset, max_bytes, self._hwm)

    def read_nowait(self, offset: int, max_bytes: int = 1 << 20) -> list[RecordBatch] | None:
        """:meth:`read`, or ``None`` when that would wait for the disk: the page cache does
        not hold the bytes (or another thread is loading the segment's index). Then read
        with :meth:`read_cold`, which waits off the event loop. The event loop's reads use
        this pair, so a cold read never stalls every other client for a disk access."""
        cached = self._cached(offset, max_bytes)  # first: it never blocks
        if cached is not None:
            return cached
        with nonblocking_reads():
            try:
                return self._log.read(offset, max_bytes, upper=self._hwm)
            except WouldBlockError:
                self.cold_reads += 1
                return None

    async def aread(
        self, offset: int, max_bytes: int = 1 << 20, *, deleted_ok: bool = False
    ) -> list[RecordBatch]:
        """:meth:`read` for the event loop: in place when the page cache holds the bytes
        (:meth:`read_nowait`), on a cold-read thread when it does not (:meth:`read_cold`).

        Raises:
            As :meth:`read_cold`.
        """
        batches = self.read_nowait(offset, max_bytes)
        if batches is not None:
            return batches
        return await self.read_cold(offset, max_bytes, deleted_ok=deleted_ok)

    async def read_cold(
        self, offset: int, max_bytes: int = 1 << 20, *, deleted_ok: bool = False
    ) -> list[RecordBatch]:
        """:meth:`read` on a worker thread, for bytes the page cache does not hold. The
        threads are a pool of their own (:func:`cold_read_pool`, shared by the process's
        logs).

        Safe beside the loop and the writer thread: bytes below the high-water mark never
        change, the file cache pins each descriptor while it is read, and index loads take
        the segment's lock. A caller cancelled while the read waits for a thread (a
        ``Fetch`` past its deadline) takes none: the read never starts. One cancelled
        while a thread reads returns at once, and :meth:`aclose` waits for that thread
        before closing the files: a thread never opens a segment by path after its log
        closed (a topic deleted and made again would have put another file there).

        With ``deleted_ok``, a read whose segment retention deleted while the thread read
        it gives nothing instead of raising; ``offset`` is then below :attr:`first_offset`,
        and the caller goes on from there, as a read on the loop would have.

        Raises:
            OffsetOutOfRangeError, CorruptSegmentError, WalIOError: as :meth:`read`; the
                first or the last also when retention deleted the segment while the thread
                read it (then ``offset`` is below :attr:`first_offset`), unless
                ``deleted_ok``.
            WalClosedError: the writer is closing.
        """
        return await self._read_cold(offset, max_bytes, self._hwm, deleted_ok=deleted_ok)

    async def _read_cold(
        self, offset: int, max_bytes: int, upper: int, *, deleted_ok: bool = False
    ) -> list[RecordBatch]:
        """:meth:`read_cold` of the batches below ``upper``."""
        try:
            return await self._on_cold_thread(self._log.read, offset, max_bytes, upper)
        except (OffsetOutOfRangeError, WalIOError):
            if deleted_ok and offset < self.first_offset:
                return []
            raise

    async def _on_cold_thread(
        self, read: Callable[..., T], offset: int, max_bytes: int, upper: int
    ) -> T:
        """``read(offset, max_bytes, upper=upper)`` on a cold-read thread (``Log.read`` or
        ``Log.read_raw``), waited out by :meth:`aclose`."""
        if self._closing or self._thread is None:  # aclose no longer waits for reads
            raise WalClosedError(self._log.path)
        job = cold_read_pool().submit(read, offset, max_bytes, upper=upper)
        future = asyncio.wrap_future(job)
        self._cold_in_flight.add(future)
        future.add_done_callback(self._cold_read_done)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            job.cancel()  # still queued: no thread takes it; else it ends by itself
            raise

    async def read_raw(
        self,
        offset: int,
        max_bytes: int = 1 << 20,
        *,
        durable: bool = False,
        upper: int | None = None,
    ) -> bytes:
        """The bytes of whole batches from the one holding ``offset``, as they are in the
        log (base offsets and CRCs included), up to ``max_bytes``: what a leader sends a
        follower for :meth:`append_replicated`.

        Bounded as :meth:`aread` is: at least one whole batch even past ``max_bytes``,
        none at or past the :attr:`high_water_mark` (``b""`` when ``offset`` is the
        mark); with ``durable``, none at or past the :attr:`durable_end` instead; with
        ``upper``, none at or past it: a written end told by the written listener
        (:meth:`set_written_listener`), so a leader serves its followers what it has
        written, the mark waits for them (and for its own sync). The first batch
        starts before ``offset`` when ``offset`` falls inside it; a follower fetches from
        its head, always a batch boundary.

        Read raw: from the tail cache when it holds ``offset``, else with
        :meth:`wal.log.Log.read_raw` (on the loop when the page cache holds the bytes, on a
        cold-read thread when it does not): one ``pread`` per segment, the batch headers
        walked, no CRC computed and no record decoded. The CRCs travel with the bytes; the
        follower's :meth:`append_replicated` checks each before it writes anything.

        Raises:
            OffsetOutOfRangeError: ``offset`` is below :attr:`first_offset` or past the
                head, also when retention deleted the segment while a thread read it.
            CorruptSegmentError, WalIOError: as :meth:`aread`.
            WalClosedError: the writer is closing.
        """
        if upper is None:
            upper = self._durable if durable else self._hwm
        if offset >= self._log.first_offset:
            cached = self._tail.read(offset, max_bytes, upper)
            if cached is not None:
                if len(cached) == 1:
                    return bytes(cached[0].buffer)
                return b"".join([b.buffer for b in cached])
        with nonblocking_reads():
            try:
                return self._log.read_raw(offset, max_bytes, upper=upper)
            except WouldBlockError:
                self.cold_reads += 1
        try:
            return await self._on_cold_thread(self._log.read_raw, offset, max_bytes, upper)
        except WalIOError as exc:
            first = self.first_offset
            if offset < first:  # retention deleted the segment under the thread
                raise OffsetOutOfRangeError(offset, first, self._log.head) from exc
            raise

    def _cold_read_done(self, read: asyncio.Future[Any]) -> None:
        self._cold_in_flight.discard(read)
        if not read.cancelled():
            read.exception()  # retrieved: its caller may have been cancelled meanwhile

    async def aclose(self) -> None:
        """Finish queued commands, sync, and close the files. Idempotent."""
        if self._thread is None:
            return
        if not self._closing:
            self._closing = True
            self._queued += 1
            self._stage(Close(asyncio.get_running_loop().create_future()))
        thread, self._thread = self._thread, None
        assert self._closed is not None
        # The thread answers the Close; if a bug killed it first, its end is the answer.
        joined = asyncio.ensure_future(asyncio.to_thread(thread.join))
        await asyncio.wait([self._closed, joined], return_when=asyncio.FIRST_COMPLETED)
        await joined
        if self._ticker is not None:
            self._stop.set()  # never cancel it mid-sync: the thread would outlive the files
            await self._ticker
        if self._cold_in_flight:  # a thread reading the files: they stay open until it ends
            await asyncio.wait(self._cold_in_flight)
        if self._checkpoints.task is not None:
            self._checkpoints.task.cancel()  # a write in flight runs to its end (run_to_end)
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpoints.task
        if self._held:
            await self._save_checkpoint()  # the last mark, so a restart starts there
        self._tail.clear()
        await asyncio.to_thread(self._log.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closing or self._thread is None:
            raise WalClosedError(self._log.path)
        if self._log.failure is not None:
            raise WalFailedError(self._log.path, self._log.failure)
        if self._worker.broken:
            raise WalFailedError(self._log.path, BROKEN)

    def _stage(self, cmd: Command) -> None:
        """Queue ``cmd`` for the writer thread behind every command staged before it; the
        thread gets this turn's commands together, when :meth:`_hand_over` runs."""
        staged = self._staged
        staged.append(cmd)
        if len(staged) == 1:
            assert self._loop is not None
            self._loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        """Queue the staged commands for the writer thread, in order (one wake-up); or,
        if the thread died of a bug, fail them: nobody would take them."""
        staged, self._staged = self._staged, []
        if self._worker.broken:
            self._fail_commands(staged, WalFailedError(self._log.path, BROKEN))
            return
        put = self._jobs.put
        for cmd in staged:
            put(cmd)

    def _new_future(self) -> asyncio.Future[Any]:
        self._check_open()
        return asyncio.get_running_loop().create_future()

    async def _command(
        self, cmd: Flush | Roll | ApplyRetention | AppendReplicated | Truncate
    ) -> None:
        """Queue a control command behind every append queued (or waiting for room)
        before it; wait for it."""
        if self._room or self._queued >= self._queue_size:
            await self._wait_for_room()
        else:
            self._queued += 1
        self._stage(cmd)
        assert cmd.future is not None
        await cmd.future

    async def _wait_for_room(self) -> None:
        """Wait for a place in the queue behind every earlier waiter (FIFO); return holding
        it, counted in ``_queued``.

        :meth:`_completed` hands each freed place to the oldest waiter (counting it as
        taken when it wakes the waiter), so no caller arriving before the waiter runs can
        take it. A waiter cancelled after it was handed a place gives it to the next one.

        Raises:
            WalClosedError, WalFailedError: the writer closed or failed meanwhile; the
                caller holds no place.
        """
        loop = self._loop
        assert loop is not None
        room: asyncio.Future[None] = loop.create_future()
        self._room.append(room)
        try:
            await room
        except asyncio.CancelledError:
            if room.cancelled():  # still waiting (or skipped by _completed)
                with contextlib.suppress(ValueError):
                    self._room.remove(room)
            elif room.exception() is None:  # handed a place, cancelled before it woke
                self._completed(1)
            raise
        try:
            self._check_open()
        except WalError:
            self._completed(1)  # give the place back: the next waiter sees the same
            raise

    def _completed(self, count: int) -> None:
        """``count`` places in the queue are free again (commands done, or a place given
        back): hand them to the oldest waiters, counting each as taken."""
        self._queued -= count
        room = self._room
        while room and self._queued < self._queue_size:
            waiter = room.popleft()
            if not waiter.done():  # a cancelled waiter takes nothing
                self._queued += 1
                waiter.set_result(None)

    # -- completions, on the loop ---------------------------------------------------------

    def _fail_broken(self, taken: list[Command], exc: Exception) -> None:
        """The writer thread died of a bug: fail what it had taken, then everything still
        queued. On the loop, the queue's only producer."""
        self._fail_commands(taken, exc)
        rest: list[Command] = []
        while True:
            try:
                rest.append(self._jobs.get_nowait())
            except queue.Empty:
                break
        if rest:
            self._fail_commands(rest, exc)

    def _commit_done(self, group: list[Append], written: Written | BaseException) -> None:
        self._completed(len(group))
        if not isinstance(written, Written):
            for a in group:
                settle(a, written)
            return
        results = written.results
        self._written = written.head
        done, rest = group[: len(results)], group[len(results) :]
        self._tail.add([a.batch for a in done], [r.first_offset for r in results])
        # Notify, then acknowledge. The listeners' work (a dispatcher's pass, which writes
        # to its consumers' streams) then runs before the publishers' answers are sent:
        # measured the other way round, publishes were answered 0.3 ms sooner but records
        # reached their consumers 0.2-0.3 ms later, end to end a loss.
        self._advance_written(written)
        for a, result in zip(done, results, strict=True):
            if a.on_done is None:  # inline settle's common case: once per append
                if not a.future.done():
                    a.future.set_result(result)
            else:
                settle(a, result)
        for a in rest:
            settle(a, written.full or WalFailedError(self._log.path, "commit ended early"))
        self.on_commit(written.write_s, written.sync_s, len(done))

    def _advance_written(self, written: Written) -> None:
        """Advance the mark over what a group commit wrote, as far as the policy says it
        is durable (``interval``: not yet; the periodic sync will, and the written
        listener is told the written end now, as ``always``'s is before its sync)."""
        if written.sync_s is not None:  # ALWAYS: what this commit cost each side
            started = time.perf_counter()
            self._advance(written.head)
            self.commit_cost.observe(
                written.write_s + written.sync_s, time.perf_counter() - started
            )
        elif self._policy is not FsyncPolicy.INTERVAL:
            self._advance(written.head)
        else:
            self._written_ahead(written.head)

    def _replicated_done(self, cmd: AppendReplicated, written: Written | BaseException) -> None:
        """A replicated append was written (and synced), or refused or failed: as
        :meth:`_commit_done`, for its one caller.

        Its batches are not kept in the tail cache: a follower serves no reads, and the
        copy of each batch the cache makes (they are views of one fetched buffer) cost a
        fifth of a replicated append of single-record batches. Reads of them go to the
        files; the cache holds what it held, all still true, and starts afresh with the
        next local append (it empties on a batch that does not follow on)."""
        self._completed(1)
        if not isinstance(written, Written):
            fail(cmd.future, written)
            return
        self._written = written.head
        self._advance_written(written)
        if written.full is not None:
            fail(cmd.future, written.full)
        else:
            resolve(cmd.future, written.head)
        self.on_commit(written.write_s, written.sync_s, len(written.results))

    def _control_done(self, cmd: Flush | Roll, outcome: int | BaseException) -> None:
        self._completed(1)
        if isinstance(outcome, BaseException):
            if cmd.future is not None:
                fail(cmd.future, outcome)
            else:
                logger.error("log %s: periodic fsync failed: %s", self._log.path, outcome)
            return
        self._advance(outcome)
        if cmd.future is not None:
            resolve(cmd.future, None)

    def _retention_on_loop(
        self, cmd: ApplyRetention | Truncate, done: concurrent.futures.Future[None]
    ) -> None:
        if isinstance(cmd, Truncate):
            self._truncation = asyncio.ensure_future(self._truncate_on_loop(cmd, done))
            return
        try:
            self._completed(1)
            if cmd.before is not None:
                resolve(cmd.future, self._log.delete_before(cmd.before))
            else:
                resolve(cmd.future, self._log.apply_retention(cmd.floor_offset))
        except Exception as exc:
            fail(cmd.future, exc)
        finally:
            done.set_result(None)

    async def _truncate_on_loop(self, cmd: Truncate, done: concurrent.futures.Future[None]) -> None:
        """Truncate the log while the writer thread waits (see :meth:`truncate_to`)."""
        hwm, durable = self._hwm, self._durable
        cut = min(cmd.offset, self._log.first_offset) if cmd.restart else cmd.offset
        try:
            self._completed(1)
            self._hwm = min(hwm, cut)  # new reads stop below the cut
            self._durable = min(durable, cut)
            self._tail.clear()
            while busy := self._busy_threads():  # one reading or syncing the files ends
                await asyncio.wait(busy)  # first; none starts from here to the cut
                hwm = max(hwm, self._hwm)  # a periodic sync may have advanced it
                durable = max(durable, self._durable)
                self._hwm = min(hwm, cut)
                self._durable = min(durable, cut)
            if cmd.restart:
                removed = self._log.restart_at(cmd.offset)
                self._hwm = self._durable = self._log.head
            else:
                removed = self._log.truncate_to(cmd.offset)
        except Exception as exc:
            if self._log.head == self._written and self._log.failure is None:
                self._hwm, self._durable = hwm, durable  # refused: nothing changed
            fail(cmd.future, exc)
        else:
            resolve(cmd.future, removed)
        finally:
            self._written = self._log.head
            done.set_result(None)

    def _busy_threads(self) -> set[asyncio.Future[Any]]:
        """The cold reads in flight and the periodic sync, if one runs."""
        busy: set[asyncio.Future[Any]] = set(self._cold_in_flight)
        if self._tick_flush is not None:
            busy.add(self._tick_flush)
        return busy

    def _close_done(self, cmd: Close, head: int) -> None:
        self._completed(1)
        if self._log.failure is None:
            self._advance(head)
        resolve(cmd.future, None)
        assert self._closed is not None
        resolve(self._closed, None)

    def _fail_commands(self, commands: list[Command], exc: Exception) -> None:
        self._completed(len(commands))
        for cmd in commands:
            if isinstance(cmd, Append):
                settle(cmd, exc)
            elif cmd.future is not None:
                fail(cmd.future, exc)
            if isinstance(cmd, Close) and self._closed is not None:
                resolve(self._closed, None)  # the thread is gone: aclose goes on
        error = exc if isinstance(exc, WalError) else WalFailedError(self._log.path, str(exc))
        for room in self._room:  # nothing will make room again: the waiters hold no place
            fail(room, error)
        self._room.clear()

    def _advance(self, offset: int) -> None:
        """The durable end reached ``offset``: tell the durable listeners, and (commits
        not held) move the mark and tell its listeners: persist first, then notify."""
        if offset <= self._durable:
            return
        self._durable = offset
        if self._durable_listeners:
            for listener in list(self._durable_listeners):
                try:
                    listener(offset)
                except Exception:
                    logger.exception("log %s: durable-end listener failed", self._log.path)
        if self._held or offset <= self._hwm:
            return
        self._hwm = offset
        for listener in list(self._listeners):
            try:
                listener(offset)
            except Exception:
                logger.exception("log %s: high-water mark listener failed", self._log.path)

    async def _tick(self) -> None:
        """``INTERVAL`` policy: fdatasync beside the writer, never in its way.

        The sync runs on its own worker thread while group commits go on, so appends never
        wait behind it. The mark advances to the head as it was *before* the sync began:
        everything below it was written to the segment being synced, or to an older one
        that rolling already synced.
        """
        interval = self._log.config.fsync_interval_ms / 1000
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval)
            target = self._written
            if self._stop.is_set() or target <= self._durable or self._log.failure is not None:
                continue
            self._tick_flush = asyncio.ensure_future(asyncio.to_thread(self._log.flush))
            try:
                await self._tick_flush
            except WalError as exc:
                logger.error("log %s: periodic fsync failed: %s", self._log.path, exc)
                continue
            finally:
                self._tick_flush = None
            self._advance(min(target, self._written))  # a truncation may have cut below


def _ignore_commit(_write_s: float, _sync_s: float | None, _batches: int) -> None:
    return None
