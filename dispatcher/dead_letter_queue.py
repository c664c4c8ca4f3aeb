"""The dead-letter queue of one subscription: records that kept failing, kept for people.

Owns :class:`DeadLetterQueue` (one per subscription, stored in Headrace's own WAL) and its
state file. Its settings and put outcomes
(:class:`~dispatcher.dead_letter_config.DlqConfig`,
:class:`~dispatcher.dead_letter_config.OverflowPolicy`) are
:mod:`dispatcher.dead_letter_config`; every subscription's queue, their max_age expiry and
the sink the dispatch tasks hand poison records to are :mod:`dispatcher.dead_letter_queues`.
What goes in and comes out, and how an entry is encoded as a record, is
:mod:`dispatcher.dead_letter_records`. DESIGN section 3.

On disk, one directory per subscription::

    <directory>/log/          a wal log; an entry's ``sequence`` is its offset in it
    <directory>/state.json    {"version": 1, "first_sequence": 1200}

Invariants:
- The queue holds sequences ``[first_sequence, next_sequence)``. Entries below
  ``first_sequence`` are gone (acked, evicted, expired or purged), even while their bytes
  still sit in a segment that is not wholly below it: only whole segments are deleted.
- ``put`` returns only once its entries are durable (fsync ``ALWAYS`` by default).
- A removal saves ``first_sequence`` (temp, fsync, rename, fsync of the directory) *before*
  any segment is deleted. Example: entries 0..9 over segments 0 and 6; ``ack_up_to(6)``
  saves ``first_sequence=7``, then deletes segment 0. A crash between the two leaves
  segment 0 on disk and reopening starts at 7; a crash before the save finished leaves
  the old file, so reopening starts at 0 and the unfinished ack never happened.
- ``open`` clamps ``first_sequence`` into ``[first offset of the log, head]`` and saves the
  clamped value, so a log tail cut by recovery never hides entries appended later.

Counters (``events_total``, ``evicted_total``, ``expired_total``, ``rejected_total``) count
since open; :meth:`DeadLetterQueue.count` comes from the log and the state file. Imports
``wal`` and the pure ``dispatcher.dead_letter_records`` and ``dispatcher.dead_letter_config`` only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self

import msgspec

from dispatcher.dead_letter_config import DlqConfig, OverflowPolicy, PutOutcome
from dispatcher.dead_letter_records import (
    DeadLetter,
    DlqEntry,
    decode_entries,
    encode_letters,
    replay_refusal,
)
from dispatcher.errors import DlqFullError
from wal import (
    FileSystem,
    LogConfig,
    LogWriter,
    RecordBatch,
    WalClosedError,
    WalError,
    WalIOError,
    run_to_end,
)

logger = logging.getLogger(__name__)

_MIB = 1 << 20
_STATE_FILE = "state.json"
_STATE_VERSION = 1
_SCAN_BYTES = 1 << 20  # read size of peek and expire scans


class _State(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    first_sequence: int


_state_decoder = msgspec.json.Decoder(_State)
_state_encoder = msgspec.json.Encoder()


def default_log_config() -> LogConfig:
    """The queue log's default: ``LogConfig()`` (fsync ``ALWAYS``, 128 MiB segments) with the
    record and batch limits at the WAL's maximum (256 MiB), so that a value of
    ``max_event_bytes`` plus the original key and headers always fits, and no tail cache:
    a queue is read rarely, by one admin call at a time, and every subscription has one."""
    return LogConfig(max_record_bytes=256 * _MIB, max_batch_bytes=256 * _MIB, tail_cache_bytes=0)


class DeadLetterQueue:
    """One subscription's dead-letter queue. Use from one event loop.

    Task-safe on that loop: an ``asyncio.Lock`` serialises ``put``, ``ack_up_to``,
    ``purge``, ``expire`` and ``aclose``, so the overflow check, the append and the state
    file always agree. ``peek`` and ``count`` are synchronous and see only durable entries.
    The :class:`~wal.LogWriter` task owns the log's files.
    """

    def __init__(
        self,
        writer: LogWriter,
        config: DlqConfig,
        *,
        directory: str,
        first_sequence: int,
        fs: FileSystem,
        clock: Callable[[], float],
        name: str,
    ) -> None:
        self._writer = writer
        self._config = config
        self._state_path = os.path.join(directory, _STATE_FILE)
        self._first = first_sequence
        self._fs = fs
        self._clock = clock
        self._name = name
        self._lock = asyncio.Lock()
        self._closed = False
        self.events_total = 0  # letters stored
        self.evicted_total = 0  # entries removed by policy: overflow and max_age
        self.expired_total = 0  # the max_age share of evicted_total
        self.rejected_total = 0  # letters refused under OverflowPolicy.REJECT
        self._committed: Callable[[int], Awaitable[None]] | None = None
        self._saved: Callable[[int], Awaitable[None]] | None = None

    @classmethod
    async def open(
        cls,
        directory: str,
        config: DlqConfig,
        *,
        fs: FileSystem | None = None,
        clock: Callable[[], float] = time.time,
        log_config: LogConfig | None = None,
        name: str | None = None,
    ) -> DeadLetterQueue:
        """Open (or create) the queue in ``directory``, recovering its log.

        Args:
            directory: The queue's directory (created if missing).
            config: The queue's settings.
            fs: File operations (tests pass a faulty one).
            clock: Wall-clock seconds since the epoch (dead-letter times, expiry).
            log_config: Settings of the queue's log; default :func:`default_log_config`.
            name: How log lines name the queue (e.g. ``"orders/billing"``); default the
                directory.

        Raises:
            WalError: the log or the state file could not be read or repaired.
        """
        fs = fs or FileSystem()
        name = name or directory
        saved = await asyncio.to_thread(_load_state, fs, directory, name)
        writer = await LogWriter.open(
            os.path.join(directory, "log"),
            log_config or default_log_config(),
            fs=fs,
            clock=lambda: int(clock() * 1000),
        )
        dlq = cls(
            writer, config, directory=directory, first_sequence=0, fs=fs, clock=clock, name=name
        )
        try:
            await dlq._settle(saved)
        except BaseException:
            await writer.aclose()
            raise
        return dlq

    async def _settle(self, saved: int | None) -> None:
        """Fit the saved ``first_sequence`` to the log and save it if that changed it."""
        low, head = self._writer.first_offset, self._writer.high_water_mark
        first = min(max(low if saved is None else saved, low), head)
        if saved is not None and first != saved:
            logger.warning(
                "dlq %s: saved first sequence %d is outside the log [%d, %d]; using %d",
                self._name,
                saved,
                low,
                head,
                first,
            )
        if first != saved:
            await self._save(first)
        self._first = first
        logger.info("dlq %s opened: entries [%d, %d)", self._name, first, head)

    # -- state --------------------------------------------------------------------------

    @property
    def config(self) -> DlqConfig:
        """The queue's settings."""
        return self._config

    @property
    def writer(self) -> LogWriter:
        """The queue's log (a replicated topic's leader serves it to the followers)."""
        return self._writer

    def replicate(
        self,
        committed: Callable[[int], Awaitable[None]] | None,
        saved: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        """Make :meth:`put` return only once its entries are committed by the topic's
        replicas: ``committed(last_offset)`` returns then, and raises when they may never
        be (the broker stopped leading); and a removal (ack, purge, expiry, eviction)
        only once ``saved(first_sequence)`` returned (the new first sequence committed
        with the subscription's replicated state), before any segment is deleted.
        ``None``: durable here is enough (factor 1)."""
        self._committed = committed
        self._saved = saved

    async def restore_first(self, first_sequence: int) -> int:
        """Raise ``first_sequence`` to the one saved with the replicated subscription
        state (a promoted replica's queue, whose own ``state.json`` may lag), clamped to
        the queue's end; return how many entries that removed. Before :meth:`replicate`.

        Raises:
            WalIOError: the state file could not be saved; nothing was removed.
        """
        async with self._lock:
            self._check_open()
            removed = await self._remove_below(min(first_sequence, self.next_sequence))
            if removed:
                logger.info(
                    "dlq %s: %d entries removed before the failover stay removed (first %d)",
                    self._name,
                    removed,
                    self._first,
                )
            return removed

    @property
    def first_sequence(self) -> int:
        """The sequence of the oldest entry held (``next_sequence`` when empty)."""
        return self._first

    @property
    def next_sequence(self) -> int:
        """The sequence the next stored entry gets."""
        return self._writer.high_water_mark

    @property
    def entries(self) -> int:
        """How many entries the queue holds."""
        return self.next_sequence - self._first

    def count(self) -> int:
        """How many entries the queue holds."""
        return self.entries

    def replayable(self, entry: DlqEntry) -> str | None:
        """``None`` when ``entry`` may be replayed, else why not; see :func:`replay_refusal`."""
        return replay_refusal(entry, self._config.max_replays)

    # -- writing ------------------------------------------------------------------------

    async def put(self, letters: Sequence[DeadLetter]) -> PutOutcome:
        """Store ``letters``; return once they are durable, or refused by the overflow policy.

        When they would take the queue past ``max_entries``, expired entries go first; then
        the overflow policy applies (see :class:`OverflowPolicy`). Under ``DROP_OLDEST`` the
        oldest entries are evicted *after* the new ones are durable, so a failed put never
        costs an entry.

        Raises:
            DlqFullError: the queue is full and its policy is ``BLOCK``; nothing was stored.
            Exception: what ``committed`` raises (see :meth:`replicate`): the letters are
                durable here but may never be committed; keep the originals unacked.
            WalError: the disk failed (nothing acknowledged; keep the originals unacked), or
                a letter does not fit the log's record limits.
        """
        if not letters:
            return PutOutcome.STORED
        async with self._lock:
            self._check_open()
            if self._overflows(len(letters)):
                await self._expire()
            if self._overflows(len(letters)) and not self._admit(letters):
                return PutOutcome.REJECTED
            data = encode_letters(letters, self._now_ms(), self._config.max_event_bytes)
            appended = await self._writer.append(data)
            if self._committed is not None:  # replicated: on the in-sync replicas too
                await self._committed(appended.last_offset)
            self.events_total += len(letters)
            excess = self.entries - self._config.max_entries
            if excess > 0 and self._config.overflow is OverflowPolicy.DROP_OLDEST:
                await self._evict(excess)
            return PutOutcome.STORED

    def _overflows(self, incoming: int) -> bool:
        return self.entries + incoming > self._config.max_entries

    def _admit(self, letters: Sequence[DeadLetter]) -> bool:
        """Apply REJECT or BLOCK to letters that do not fit; True under DROP_OLDEST."""
        policy = self._config.overflow
        if policy is OverflowPolicy.DROP_OLDEST:
            return True
        if policy is OverflowPolicy.REJECT:
            self.rejected_total += len(letters)
            logger.warning(
                "dlq %s: full at %d entries; rejected %d dead letters (overflow=reject)",
                self._name,
                self.entries,
                len(letters),
            )
            return False
        first = letters[0]
        raise DlqFullError(first.topic, first.subscription, self.entries, self._config.max_entries)

    async def _evict(self, excess: int) -> None:
        """Drop the ``excess`` oldest entries. The new letters are already durable, so a
        failure here is logged, not raised: the next put evicts again."""
        try:
            await self._remove_below(self._first + excess)
        except Exception as exc:  # WalError; replicated, the save's error too
            logger.error(
                "dlq %s: evicting %d entries failed (%s); the queue stays over "
                "max_entries=%d until the next put",
                self._name,
                excess,
                exc,
                self._config.max_entries,
            )
            return
        self.evicted_total += excess
        logger.warning(
            "dlq %s: full; evicted the %d oldest entries (overflow=drop_oldest)",
            self._name,
            excess,
        )

    # -- removing -----------------------------------------------------------------------

    async def ack_up_to(self, sequence: int) -> int:
        """Remove every entry with a sequence at or below ``sequence``; return how many.

        Raises:
            WalIOError: the state file could not be saved; nothing was removed.
            Exception: replicated, what ``saved`` raises (see :meth:`replicate`): removed
                here, maybe not on the replicas (outcome unknown).
        """
        async with self._lock:
            self._check_open()
            removed = await self._remove_below(min(sequence + 1, self.next_sequence))
            if removed:
                logger.info("dlq %s: acked %d entries up to %d", self._name, removed, sequence)
            return removed

    async def purge(self) -> int:
        """Remove every entry; return how many. Also seals the active segment, so that the
        disk is reclaimed now rather than when the segment fills.

        Raises:
            WalIOError: the state file could not be saved; nothing was removed.
        """
        async with self._lock:
            self._check_open()
            removed = await self._remove_below(self.next_sequence)
            if self._writer.first_offset < self.next_sequence:
                await self._reclaim(roll=True)
            logger.info("dlq %s: purged %d entries", self._name, removed)
            return removed

    async def expire(self) -> int:
        """Remove the entries dead-lettered more than ``max_age_s`` ago; return how many.

        Counted in ``expired_total`` and in ``evicted_total``. An entry exactly
        ``max_age_s`` old stays. Entries are in dead-letter time order, so the scan stops at
        the first one that is young enough.

        Raises:
            WalIOError: the state file could not be saved; nothing was removed.
        """
        async with self._lock:
            self._check_open()
            return await self._expire()

    async def _expire(self) -> int:
        if self._config.max_age_s is None:
            return 0
        cutoff = self._now_ms() - round(self._config.max_age_s * 1000)
        removed = await self._remove_below(await self._first_not_before(cutoff))
        if removed:
            self.expired_total += removed
            self.evicted_total += removed
            logger.info("dlq %s: expired %d entries", self._name, removed)
        return removed

    async def _first_not_before(self, cutoff_ms: int) -> int:
        """The sequence of the oldest entry dead-lettered at or after ``cutoff_ms``."""
        async for batch in self._batches(self._first):
            for seq, ts in zip(batch.offsets(), batch.timestamps().tolist(), strict=True):
                if seq >= self._first and ts >= cutoff_ms:
                    return seq
        return self.next_sequence

    async def _remove_below(self, target: int) -> int:
        """Save ``first_sequence = target``, then delete whole segments below it."""
        removed = target - self._first
        if removed <= 0:
            return 0
        # Cancelled, it still finishes the save and moves first_sequence with it: the
        # lock stays held meanwhile (the next save would race it on the temp file), and
        # memory keeps step with the disk.
        await run_to_end(self._advance_first(target))
        if self._saved is not None:  # replicated: committed before the segments go
            await self._saved(target)
        await self._reclaim()
        return removed

    async def _advance_first(self, target: int) -> None:
        await self._save(target)
        self._first = target

    async def _reclaim(self, *, roll: bool = False) -> None:
        """Delete segments wholly below ``first_sequence``. The removal is already saved, so
        a failure only delays the reclaim to the next removal: logged, not raised."""
        try:
            if roll:
                await self._writer.roll()
            deleted = await self._writer.delete_before(self._first)
        except WalError as exc:
            logger.error(
                "dlq %s: deleting segments below %d failed (%s); retried at the next removal",
                self._name,
                self._first,
                exc,
            )
            return
        if deleted:
            logger.info("dlq %s: deleted segments %s", self._name, deleted)

    async def _save(self, first_sequence: int) -> None:
        data = _state_encoder.encode(_State(_STATE_VERSION, first_sequence))
        try:
            await asyncio.to_thread(self._fs.atomic_write, self._state_path, data)
        except OSError as exc:
            raise WalIOError("save DLQ state", self._state_path, exc.errno, str(exc)) from exc

    # -- reading ------------------------------------------------------------------------

    async def peek(
        self, *, from_sequence: int | None = None, limit: int = 100, reason: str | None = None
    ) -> list[DlqEntry]:
        """Entries, oldest first. Waits for a running put or removal (they may delete the
        segments it would read); what the page cache does not hold is read on a worker
        thread.

        Args:
            from_sequence: Start here (never below ``first_sequence``); default the oldest.
            limit: Most entries returned.
            reason: Keep only entries whose reason contains this text.

        Raises:
            DlqCorruptError: a stored entry is damaged.
            WalError: the log could not be read.
        """
        out: list[DlqEntry] = []
        if limit <= 0:
            return out
        async with self._lock:
            start = self._first if from_sequence is None else max(from_sequence, self._first)
            async for batch in self._batches(start):
                for entry in decode_entries(batch):
                    if entry.sequence >= start and (reason is None or reason in entry.reason):
                        out.append(entry)
                        if len(out) >= limit:
                            return out
        return out

    async def _batches(self, start: int) -> AsyncIterator[RecordBatch]:
        """Durable batches from the one holding ``start`` on (the first may begin before).
        The caller holds the lock: no segment is deleted meanwhile."""
        offset = start
        while offset < self.next_sequence:
            batches = await self._writer.aread(offset, _SCAN_BYTES)
            if not batches:
                return
            for batch in batches:
                yield batch
            offset = batches[-1].next_offset

    # -- closing ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Wait for the running operation, then close the log. Idempotent."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            await self._writer.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise WalClosedError(self._writer.log.path)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _load_state(fs: FileSystem, directory: str, name: str) -> int | None:
    """The saved ``first_sequence``, or ``None`` for a new queue or a damaged state file.

    A damaged file is kept as ``.corrupt`` and the queue starts at the log's first offset:
    acked entries may show again, none is lost.
    """
    path = os.path.join(directory, _STATE_FILE)
    try:
        fs.makedirs(directory)  # with every directory it creates fsynced in its parent
        fs.remove(path + ".tmp")  # an atomic write the last process did not finish
        if not fs.exists(path):
            return None
        first = _decode_state(fs.read_file(path))
        if first is None:
            logger.error(
                "dlq %s: %s is damaged; kept as %s.corrupt, the queue restarts at the oldest "
                "entry its log holds",
                name,
                path,
                path,
            )
            fs.rename(path, path + ".corrupt")
    except OSError as exc:
        raise WalIOError("load DLQ state", path, exc.errno, str(exc)) from exc
    return first


def _decode_state(data: bytes) -> int | None:
    """``first_sequence`` from a state file's bytes; ``None`` when they are damaged."""
    try:
        state = _state_decoder.decode(data)
    except msgspec.DecodeError:
        return None
    if state.version != _STATE_VERSION or state.first_sequence < 0:
        return None
    return state.first_sequence
