"""The async writer: the single task that owns a log's files.

Role: coalesce concurrent appends into group commits (one write, one ``fdatasync``), resolve
each appender's future only after its data is durable under the fsync policy, and advance
the high-water mark that later drives the dispatcher's notifier.

Protocol of one group commit::

    appenders --Append(batch, future)--> bounded queue --> writer task
    writer task: drain queue (up to max_group_bytes)
                 to_thread(log.append_many + log.flush)   # one pwritev, one fdatasync
                 keep the batches in the tail cache       # readers near the head share them
                 advance high-water mark, call listeners  # persist first, then notify
                 resolve futures                          # then acknowledge

Invariants:
- An append is acknowledged only after ``fdatasync`` under ``ALWAYS``; after the write under
  ``INTERVAL`` and ``NEVER``. See :class:`~wal.config.FsyncPolicy`.
- The high-water mark only moves forward and only over durable data; it is always a batch
  boundary.
- After a failed write every pending and later append fails with ``WalFailedError``;
  except on a full disk: the group's appends fail with ``DiskFullError`` (those the log
  wrote whole before the disk filled, a prefix, are acknowledged after the sync as usual),
  nothing of the rest stays on disk, and the next group tries the disk again.

Threading contract: the writer task is the only writer. It runs writes and syncs on a worker
thread while reads run on the event loop; that is safe because bytes below the high-water
mark never change and segment bookkeeping is published only after the bytes are written.
Retention runs on the event loop itself (between group commits), so a read never meets a
segment whose file is being closed. Under ``INTERVAL`` a second worker thread runs the
periodic ``fdatasync`` while writes continue; ``pwritev`` and ``fdatasync`` on one
descriptor are safe together, and the mark only claims what was written before the sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple, Self, TypeVar

from proto.batch import RecordBatch
from wal.config import FsyncPolicy, LogConfig
from wal.errors import DiskFullError, WalClosedError, WalError, WalFailedError
from wal.fdcache import FileCache
from wal.fs import FileSystem
from wal.log import AppendResult, Clock, Log
from wal.tail import TailCache

logger = logging.getLogger(__name__)

T = TypeVar("T")
Listener = Callable[[int], None]
#: Called after each group commit with (seconds writing, seconds in fsync or None when
#: the policy did not sync, batches in the group). For latency metrics.
CommitObserver = Callable[[float, float | None, int], None]


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


class Append(NamedTuple):
    """Command: append a validated batch; resolve ``future`` when acknowledged.

    A ``NamedTuple`` rather than a frozen dataclass like the other commands: one is built
    per append, and that construction cost is on every producer's path.
    """

    batch: RecordBatch
    future: asyncio.Future[AppendResult]


@dataclass(frozen=True, slots=True)
class Flush:
    """Command: make everything written durable; ``future`` is ``None`` for timer ticks."""

    future: asyncio.Future[None] | None


@dataclass(frozen=True, slots=True)
class Roll:
    """Command: seal the active segment."""

    future: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class ApplyRetention:
    """Command: delete what retention allows, never at or past ``floor_offset``; or, with
    ``before`` set, every sealed segment wholly below ``before`` (see ``Log.delete_before``).
    """

    floor_offset: int | None
    future: asyncio.Future[list[int]]
    before: int | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """Command: finish everything queued before it, then stop."""

    future: asyncio.Future[None]


Command = Append | Flush | Roll | ApplyRetention | Close


class _Written(NamedTuple):
    """What one group commit's thread hop did: the results of the batches written (a
    prefix of the group when the disk filled, then ``full`` says why the rest were not),
    and the seconds spent writing and syncing (``None``: no sync)."""

    results: list[AppendResult]
    write_s: float
    sync_s: float | None
    full: DiskFullError | None


class LogWriter:
    """Async owner of one :class:`~wal.log.Log`.

    Task-safe for any number of tasks on one event loop: they only enqueue commands; the
    writer task alone touches the log's files.
    """

    def __init__(self, log: Log, *, queue_size: int = 10_000) -> None:
        self._log = log
        self._policy = log.config.fsync
        self._queue: asyncio.Queue[Command] = asyncio.Queue(queue_size)
        self._hwm = log.head
        self._written = log.head
        self._listeners: list[Listener] = []
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._tail = TailCache(log.config.tail_cache_bytes)
        #: Told how long each group commit's write and fsync took (metrics).
        self.on_commit: CommitObserver = _ignore_commit

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
        """Open (recovering) the log at ``path`` and start its writer task; ``files`` is the
        descriptor cache its segments share with other logs (default: its own)."""
        log = await asyncio.to_thread(Log.open, path, config, fs=fs, clock=clock, files=files)
        try:
            # Data recovered under a lax policy may still sit in the page cache.
            await asyncio.to_thread(log.flush)
        except WalError:
            await asyncio.to_thread(log.close)
            raise
        writer = cls(log, queue_size=queue_size)
        writer._start()
        return writer

    def _start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"wal-writer:{self._log.path}")
        if self._policy is FsyncPolicy.INTERVAL:
            self._ticker = asyncio.create_task(self._tick(), name=f"wal-fsync:{self._log.path}")

    # -- public API -------------------------------------------------------------------

    @property
    def log(self) -> Log:
        """The log (read-only use: reads, state)."""
        return self._log

    @property
    def high_water_mark(self) -> int:
        """Offset just past the last durable record; consumers may read below it."""
        return self._hwm

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

    async def append(self, batch: bytes | bytearray | memoryview | RecordBatch) -> AppendResult:
        """Append one batch; return its offsets once it is acknowledged.

        Raises:
            InvalidBatchError: the batch is malformed or over a limit; nothing was appended.
            WalFailedError: the log failed; nothing more will be written until reopened.
            WalClosedError: the writer is closing.
        """
        self._check_open()
        validated = self._log.validate(batch)
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(Append(validated, future))
        except asyncio.QueueFull:
            await self._queue.put(Append(validated, future))  # backpressure
        return await future

    async def flush(self) -> None:
        """Make everything appended so far durable and advance the high-water mark."""
        self._check_open()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put(Flush(future))
        await future

    async def roll(self) -> None:
        """Seal the active segment now."""
        self._check_open()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put(Roll(future))
        await future

    async def apply_retention(self, floor_offset: int | None = None) -> list[int]:
        """Delete the sealed segments retention allows; return their base offsets."""
        self._check_open()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        await self._queue.put(ApplyRetention(floor_offset, future))
        return await future

    async def delete_before(self, offset: int) -> list[int]:
        """Delete every sealed segment wholly below ``offset``; return their base offsets."""
        self._check_open()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        await self._queue.put(ApplyRetention(None, future, before=offset))
        return await future

    def read(self, offset: int, max_bytes: int = 1 << 20) -> list[RecordBatch]:
        """Durable batches from ``offset``, below the high-water mark. See ``Log.read``.

        Reads near the head are served from memory (the tail cache): the batches returned
        are then shared with every other reader; they are immutable."""
        if offset >= self._log.first_offset:  # else the log raises OffsetOutOfRangeError
            cached = self._tail.read(offset, max_bytes, self._hwm)
            if cached is not None:
                return cached
        return self._log.read(offset, max_bytes, upper=self._hwm)

    async def aclose(self) -> None:
        """Finish queued commands, sync, and close the files. Idempotent."""
        if self._task is None:
            return
        if not self._closing:
            self._closing = True
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            await self._queue.put(Close(future))
        task, self._task = self._task, None
        await task
        if self._ticker is not None:
            self._stop.set()  # never cancel it mid-sync: the thread would outlive the files
            await self._ticker
        self._tail.clear()
        await asyncio.to_thread(self._log.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closing or self._task is None:
            raise WalClosedError(self._log.path)
        if self._log.failure is not None:
            raise WalFailedError(self._log.path, self._log.failure)

    # -- the writer task --------------------------------------------------------------

    async def _run(self) -> None:
        limit = self._log.config.max_group_bytes
        while True:
            commands = [await self._queue.get()]
            size = _size(commands[0])
            while size < limit:
                try:
                    cmd = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                commands.append(cmd)
                size += _size(cmd)
            if await self._execute(commands):
                return

    async def _execute(self, commands: list[Command]) -> bool:
        """Run commands in order, appends in groups; return True after ``Close``."""
        group: list[Append] = []
        for cmd in commands:
            if isinstance(cmd, Append):
                group.append(cmd)
                continue
            if group:
                await self._commit(group)
                group = []
            if isinstance(cmd, Close):
                await self._sync_quietly()
                _resolve(cmd.future, None)
                self._fail_queued(WalClosedError(self._log.path))
                return True
            await self._control(cmd)
        if group:
            await self._commit(group)
        return False

    async def _commit(self, group: list[Append]) -> None:
        sync = self._policy.is_always()
        try:
            results, write_s, sync_s, full = await asyncio.to_thread(
                self._write, [a.batch for a in group], sync
            )
        except WalError as exc:
            for a in group:
                _fail(a.future, exc)
            return
        except Exception as exc:
            logger.exception("log %s: unexpected error in group commit", self._log.path)
            for a in group:
                _fail(a.future, exc)
            return
        self._written = self._log.head
        done, rest = group[: len(results)], group[len(results) :]
        self._tail.add([a.batch for a in done], [r.first_offset for r in results])
        if self._policy is not FsyncPolicy.INTERVAL:
            self._advance(self._written)
        for a, result in zip(done, results, strict=True):
            _resolve(a.future, result)
        for a in rest:
            _fail(a.future, full or WalFailedError(self._log.path, "group commit ended early"))
        self.on_commit(write_s, sync_s, len(done))

    def _write(self, batches: list[RecordBatch], sync: bool) -> _Written:
        started = time.perf_counter()
        head = self._log.head
        full = None
        try:
            results = self._log.append_many(batches)
        except DiskFullError as exc:
            if not exc.written:
                raise
            full, results = exc, _results(head, batches[: exc.written])
        written = time.perf_counter()
        if not sync:
            return _Written(results, written - started, None, full)
        self._log.flush()
        return _Written(results, written - started, time.perf_counter() - written, full)

    async def _control(self, cmd: Flush | Roll | ApplyRetention) -> None:
        try:
            if isinstance(cmd, Flush):
                await self._sync()
                if cmd.future is not None:
                    _resolve(cmd.future, None)
            elif isinstance(cmd, Roll):
                await asyncio.to_thread(self._log.roll)
                self._advance(self._written)  # rolling synced the old segment
                _resolve(cmd.future, None)
            elif cmd.before is not None:
                _resolve(cmd.future, self._log.delete_before(cmd.before))
            else:
                _resolve(cmd.future, self._log.apply_retention(cmd.floor_offset))
        except Exception as exc:
            if cmd.future is not None:
                _fail(cmd.future, exc)
            else:
                logger.error("log %s: periodic fsync failed: %s", self._log.path, exc)

    async def _sync(self) -> None:
        if self._hwm < self._written or self._policy is FsyncPolicy.NEVER:
            await asyncio.to_thread(self._log.flush)
        self._advance(self._written)

    async def _sync_quietly(self) -> None:
        if self._log.failure is None:
            with contextlib.suppress(WalError):
                await self._sync()

    def _advance(self, offset: int) -> None:
        if offset <= self._hwm:
            return
        self._hwm = offset
        for listener in list(self._listeners):
            try:
                listener(offset)
            except Exception:
                logger.exception("log %s: high-water mark listener failed", self._log.path)

    def _fail_queued(self, exc: Exception) -> None:
        while True:
            try:
                cmd = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if cmd.future is not None:
                _fail(cmd.future, exc)

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
            if self._stop.is_set() or target <= self._hwm or self._log.failure is not None:
                continue
            try:
                await asyncio.to_thread(self._log.flush)
            except WalError as exc:
                logger.error("log %s: periodic fsync failed: %s", self._log.path, exc)
                continue
            self._advance(target)


def _results(first_offset: int, batches: list[RecordBatch]) -> list[AppendResult]:
    """Where ``batches`` landed, appended in order from ``first_offset``."""
    results = []
    for batch in batches:
        results.append(AppendResult(first_offset, first_offset + batch.record_count - 1))
        first_offset += batch.record_count
    return results


def _ignore_commit(_write_s: float, _sync_s: float | None, _batches: int) -> None:
    return None


def _size(cmd: Command) -> int:
    return cmd.batch.size if isinstance(cmd, Append) else 0


def _resolve(future: asyncio.Future[Any], value: object) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
