"""The writer thread of a :class:`~wal.writer.LogWriter`: the only code that writes a log.

Owns :class:`WriterThread`. It takes the commands the writer queued, in order: appends in
groups (up to ``max_group_bytes``; one ``pwritev``, then one ``fdatasync`` under
``always``), a follower's replicated append as a group of its own (written and synced the
same way), and the control commands (flush, roll, retention, close) one at a time, each
between two groups. It changes nothing the event loop reads: each outcome goes back
to the loop as one callback (:class:`Completions`, through ``call_soon_threadsafe``),
where the writer advances its high-water mark and answers the appenders. A leader's log
also gets a group's written head between its write and its ``fdatasync``
(:attr:`WriterThread.post_written`), to serve its followers while it syncs. The group
commit protocol, its invariants and why commands reach this thread once per loop turn
are in :mod:`wal.writer`'s docstring.

Imports ``wal``'s ``log``, ``config``, ``errors`` and ``writer_commands``; never
``wal.writer`` (what it calls there is :class:`Completions`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proto.batch import RecordBatch
from wal.config import FsyncPolicy
from wal.errors import DiskFullError, WalClosedError, WalError, WalFailedError
from wal.log import AppendResult, Log
from wal.writer_commands import (
    Append,
    AppendReplicated,
    ApplyRetention,
    Close,
    Command,
    Flush,
    Roll,
    Truncate,
    Written,
    results_from,
)

logger = logging.getLogger(__name__)

#: Why appends fail once the thread died of a bug.
BROKEN = "the writer thread failed (see the log)"


@dataclass(frozen=True, slots=True)
class Completions:
    """The writer's loop side, as the thread calls it: each callback runs on the loop
    (posted with ``call_soon_threadsafe``), except ``high_water_mark``, which the thread
    reads to skip a flush that has nothing new to sync."""

    #: A group's appends and what writing them did (or the error that stopped it).
    commit_done: Callable[[list[Append], Written | BaseException], None]
    #: A replicated append and what writing it did (or the error that refused or stopped it).
    replicated_done: Callable[[AppendReplicated, Written | BaseException], None]
    #: A flush's or roll's head after it (or its error).
    control_done: Callable[[Flush | Roll, int | BaseException], None]
    #: Apply retention, or a truncation, on the loop; set the future when done (the
    #: thread waits on it).
    retention: Callable[[ApplyRetention | Truncate, concurrent.futures.Future[None]], None]
    #: The close is done: the head it leaves.
    close_done: Callable[[Close, int], None]
    #: Fail commands nobody will run (queued behind a close).
    fail_commands: Callable[[list[Command], Exception], None]
    #: The thread died of a bug: fail what it had taken, then what is queued.
    fail_broken: Callable[[list[Command], Exception], None]
    #: The loop's high-water mark.
    high_water_mark: Callable[[], int]
    #: A group's bytes are written (not yet synced): the log's head after them. Posted
    #: only while :attr:`WriterThread.post_written` is set.
    written: Callable[[int], None]


class WriterThread:
    """One log's writer thread: runs ``jobs`` in order until a ``Close``.

    Not task-safe, and needs no lock: :meth:`start` runs once, on the loop; after it the
    thread alone touches the log's files and this object, and tells the loop through
    ``done``. :attr:`broken`, set here when a bug kills the thread, is read on the loop.

    Args:
        log: The log it writes (appends, flushes, rolls, close).
        jobs: The writer's queue of commands, in the order they were made.
        done: The writer's loop side (:class:`Completions`).
    """

    def __init__(self, log: Log, jobs: queue.SimpleQueue[Command], done: Completions) -> None:
        self._log = log
        self._jobs = jobs
        self._done = done
        self._policy = log.config.fsync
        self._sync_groups = self._policy.is_always()
        self._limit = log.config.max_group_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The thread died of a bug: the writer refuses what comes next.
        self.broken = False
        #: Post each group's written head before its ``fdatasync`` (``Completions.
        #: written``): one more loop wake-up per group, for a leader that serves its
        #: followers what it wrote while it syncs. Set on the loop, read here.
        self.post_written = False

    def start(self, loop: asyncio.AbstractEventLoop) -> threading.Thread:
        """Start the thread (``wal-writer:<path>``); its completions run on ``loop``."""
        self._loop = loop
        thread = threading.Thread(
            target=self._serve, name=f"wal-writer:{self._log.path}", daemon=True
        )
        thread.start()
        return thread

    def _serve(self) -> None:
        """The writer thread: run queued commands in order, appends in groups."""
        jobs = self._jobs
        carried: Command | None = None
        taken: list[Command] = []  # taken from the queue and not yet answered
        try:
            while True:
                cmd = carried if carried is not None else jobs.get()
                carried = None
                taken = [cmd]
                if not isinstance(cmd, Append):
                    if isinstance(cmd, AppendReplicated):
                        self._replicate_on_thread(cmd)
                    elif self._control_on_thread(cmd):
                        return
                    continue
                group = [cmd]
                size = cmd.batch.size
                while size < self._limit:
                    try:
                        nxt = jobs.get_nowait()
                    except queue.Empty:
                        break
                    if not isinstance(nxt, Append):
                        carried = nxt
                        break
                    group.append(nxt)
                    size += nxt.batch.size
                taken = [*group, *([carried] if carried is not None else [])]
                self._commit_on_thread(group)
        except _LoopGoneError:
            return
        except Exception:  # a bug, not an I/O error (those are answered as they happen)
            logger.exception("log %s: the writer thread failed", self._log.path)
            self.broken = True  # refuse what comes next rather than queue it for no one
            error = WalFailedError(self._log.path, BROKEN)
            with contextlib.suppress(_LoopGoneError):
                # The queue is emptied on the loop, not here: a command staged before
                # ``_broken`` was set is then either handed over before this callback
                # drains the queue, or failed by ``_hand_over``, which sees ``_broken``.
                self._post(self._done.fail_broken, taken, error)

    def _post(self, callback: Callable[..., object], *args: object) -> None:
        """Run ``callback(*args)`` on the loop, soon."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError as exc:  # the loop is closed: nobody is left to answer
            raise _LoopGoneError from exc

    def _commit_on_thread(self, group: list[Append]) -> None:
        try:
            written: Written | BaseException = self._write([a.batch for a in group])
        except WalError as exc:
            written = exc
        except Exception as exc:
            logger.exception("log %s: unexpected error in group commit", self._log.path)
            written = exc
        self._post(self._done.commit_done, group, written)

    def _replicate_on_thread(self, cmd: AppendReplicated) -> None:
        try:
            written: Written | BaseException = self._write(cmd.batches, self._log.append_replicated)
        except WalError as exc:  # refused (nothing written), or the write failed
            written = exc
        except Exception as exc:
            logger.exception("log %s: unexpected error in a replicated append", self._log.path)
            written = exc
        self._post(self._done.replicated_done, cmd, written)

    def _write(
        self,
        batches: list[RecordBatch],
        append: Callable[[Sequence[RecordBatch]], list[AppendResult]] | None = None,
    ) -> Written:
        started = time.perf_counter()
        head = self._log.head
        full = None
        try:
            results = (append or self._log.append_many)(batches)
        except DiskFullError as exc:
            if not exc.written:
                raise
            full, results = exc, results_from(head, batches[: exc.written])
        written = time.perf_counter()
        head = self._log.head
        if not self._sync_groups:
            return Written(results, head, written - started, None, full)
        if self.post_written and append is None:
            self._post(self._done.written, head)
        self._log.flush()
        return Written(results, head, written - started, time.perf_counter() - written, full)

    def _control_on_thread(self, cmd: Flush | Roll | ApplyRetention | Truncate | Close) -> bool:
        """Run one control command in the queue's order; return True after ``Close``."""
        if isinstance(cmd, ApplyRetention | Truncate):
            # On the loop, while this thread waits: no read meets a closing segment.
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._post(self._done.retention, cmd, done)
            done.result()
            return False
        if isinstance(cmd, Close):
            head = self._log.head
            if self._log.failure is None:
                with contextlib.suppress(WalError):
                    self._log.flush()
            self._post(self._done.close_done, cmd, head)
            self._fail_queued(WalClosedError(self._log.path))
            return True
        try:
            head = self._log.head
            if isinstance(cmd, Flush):
                if head > self._done.high_water_mark() or self._policy is FsyncPolicy.NEVER:
                    self._log.flush()
            else:
                self._log.roll()  # rolling synced the old segment
            outcome: int | BaseException = head
        except Exception as exc:
            outcome = exc
        self._post(self._done.control_done, cmd, outcome)
        return False

    def _fail_queued(self, exc: Exception) -> None:
        failed: list[Command] = []
        while True:
            try:
                cmd = self._jobs.get_nowait()
            except queue.Empty:
                break
            failed.append(cmd)
        if failed:
            self._post(self._done.fail_commands, failed, exc)


class _LoopGoneError(Exception):
    """The writer's event loop closed: the writer thread stops."""
