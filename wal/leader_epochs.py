"""The leader-epoch history of one partition: the ``leader-epochs`` file.

Role: remember at which offset each leader epoch began (Kafka's
``leader-epoch-checkpoint``), so that a replica coming back can ask the leader where its
own latest epoch ended and cut its log exactly where the two diverge (KIP-101), never at
its own high-water mark. Entries are ``(epoch, start_offset)``, strictly increasing in
both; an epoch's records are ``[start, next entry's start)``, the latest one's
``[start, log end)``.

Worked example: entries ``[(1, 0), (3, 120), (4, 200)]`` with the log ending at 250:
``end_offset_for(3) == (3, 200)``; ``end_offset_for(2) == (1, 120)`` (the largest epoch
at or below 2 is 1, and it ended where 3 began); ``end_offset_for(9) == (4, 250)``;
``end_offset_for(0) == (-1, -1)`` (no epoch at or below 0). ``truncate_from(150)`` leaves
``[(1, 0), (3, 120)]``; ``truncate_before(130)`` leaves ``[(3, 130), (4, 200)]`` (the entry
covering 130 stays, its start clamped to the new log start).

File format (text, so an operator can read it)::

    headrace leader-epochs 1
    2
    1 0
    3 120
    crc32 9a0c61f2

the version line, the entry count, one ``epoch start`` line per entry, and a CRC-32 of
every byte before the ``crc32`` line. A file that is torn, fails the CRC or holds entries
that do not increase raises :class:`~wal.errors.LeaderEpochsCorruptError` naming the file:
it is never read as empty, since an empty history would let a replica keep a divergent
tail.

Durability: every change replaces the file whole, ``leader-epochs.tmp`` written and
fdatasynced, renamed over the file, then the directory fsynced (crash points
``leader_epochs.after_tmp`` and ``leader_epochs.after_rename``); a crash leaves the old
file or the new one, and opening discards a leftover ``.tmp``. A method returns only
once its change is durable, and the entries in memory change only then.

Invariants held with the log (:class:`wal.log.Log` owns one): no entry starts past the log
end after an open (recovery drops them), and :meth:`wal.log.Log.truncate_to` truncates
the history after the log's files.

The codec and the rules (:func:`encode`, :func:`decode`, :func:`end_offset_for`,
:func:`entries_from`, :func:`entries_before`) are pure; :class:`LeaderEpochs` does the I/O
through :class:`wal.fs.FileSystem` only.
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import NamedTuple

from wal.errors import LeaderEpochsCorruptError, io_error
from wal.fs import FileSystem

logger = logging.getLogger(__name__)

#: The file's name in a partition directory.
FILE_NAME = "leader-epochs"
_VERSION_LINE = b"headrace leader-epochs 1"
_CRC_PREFIX = b"crc32 "
#: ``end_offset_for``'s answer when no epoch is at or below the one asked (Kafka's
#: ``UNDEFINED_EPOCH`` and ``UNDEFINED_EPOCH_OFFSET``).
UNDEFINED = (-1, -1)


class EpochEntry(NamedTuple):
    """One leader epoch and the offset of its first record."""

    epoch: int
    start_offset: int


# -- pure: codec and rules -----------------------------------------------------------------


def encode(entries: Sequence[EpochEntry]) -> bytes:
    """The file's bytes for ``entries``."""
    lines = [_VERSION_LINE, b"%d" % len(entries)]
    lines += [b"%d %d" % (e.epoch, e.start_offset) for e in entries]
    body = b"\n".join(lines) + b"\n"
    return body + _CRC_PREFIX + b"%08x\n" % zlib.crc32(body)


def decode(data: bytes, path: str) -> list[EpochEntry]:
    """Entries from the file's bytes.

    Raises:
        LeaderEpochsCorruptError: torn, wrong version, CRC mismatch, bad count or
            entries that do not strictly increase.
    """
    body, sep, crc_line = data.rstrip(b"\n").rpartition(b"\n")
    if not sep or not crc_line.startswith(_CRC_PREFIX) or not data.endswith(b"\n"):
        raise LeaderEpochsCorruptError(path, f"torn: no checksum line ({len(data)} bytes)")
    body += b"\n"
    try:
        stored = int(crc_line[len(_CRC_PREFIX) :], 16)
    except ValueError:
        raise LeaderEpochsCorruptError(path, "unreadable checksum line") from None
    if stored != zlib.crc32(body):
        raise LeaderEpochsCorruptError(
            path, f"checksum mismatch (stored {stored:08x}, computed {zlib.crc32(body):08x})"
        )
    lines = body.rstrip(b"\n").split(b"\n")
    if lines[0] != _VERSION_LINE:
        raise LeaderEpochsCorruptError(path, f"unknown version line {lines[0][:40]!r}")
    try:
        count = int(lines[1]) if len(lines) > 1 else -1
        entries = [EpochEntry(*map(int, line.split(b" "))) for line in lines[2:]]
    except (TypeError, ValueError):
        raise LeaderEpochsCorruptError(path, "an entry line is not 'epoch start'") from None
    if count != len(entries):
        raise LeaderEpochsCorruptError(path, f"count {count} but {len(entries)} entries")
    check_increasing(entries, path)
    return entries


def check_increasing(entries: Sequence[EpochEntry], path: str) -> None:
    """Raise :class:`LeaderEpochsCorruptError` unless epochs and starts strictly increase
    and none is negative."""
    for i, entry in enumerate(entries):
        if entry.epoch < 0 or entry.start_offset < 0:
            raise LeaderEpochsCorruptError(path, f"negative entry {tuple(entry)}")
        if i and (entry.epoch <= entries[i - 1].epoch or entry.start_offset <= entries[i - 1][1]):
            raise LeaderEpochsCorruptError(
                path, f"entry {tuple(entry)} does not follow {tuple(entries[i - 1])}"
            )


def end_offset_for(entries: Sequence[EpochEntry], epoch: int, log_end: int) -> tuple[int, int]:
    """Kafka's OffsetsForLeaderEpoch answer: the largest known epoch at or below ``epoch``,
    and where it ended (the start of the next entry, or ``log_end`` for the latest).

    Returns:
        ``(epoch_found, end_offset)``, or :data:`UNDEFINED` when no entry is at or below
        ``epoch`` (none at all, or ``epoch`` older than the oldest kept).
    """
    i = bisect_right([e.epoch for e in entries], epoch)
    if i == 0:
        return UNDEFINED
    end = entries[i].start_offset if i < len(entries) else log_end
    return entries[i - 1].epoch, end


def entries_from(entries: Sequence[EpochEntry], offset: int) -> list[EpochEntry]:
    """The entries :meth:`LeaderEpochs.truncate_from` keeps: those starting below ``offset``."""
    return [e for e in entries if e.start_offset < offset]


def entries_before(entries: Sequence[EpochEntry], offset: int) -> list[EpochEntry]:
    """The entries :meth:`LeaderEpochs.truncate_before` keeps: the one covering ``offset``
    (the last starting at or below it), its start raised to ``offset``, and every later
    one."""
    i = bisect_right([e.start_offset for e in entries], offset)
    if i == 0:
        return list(entries)
    covering = entries[i - 1]
    return [EpochEntry(covering.epoch, offset), *entries[i:]]


# -- the file --------------------------------------------------------------------------------


def load_entries(fs: FileSystem, directory: str) -> list[EpochEntry]:
    """The entries of ``directory``'s file (none when it has none), after discarding a
    leftover ``leader-epochs.tmp`` (a crash before its rename: the old file stands).

    Raises:
        LeaderEpochsCorruptError: the file is damaged (see :func:`decode`).
        WalIOError: it could not be read.
    """
    path = os.path.join(directory, FILE_NAME)
    try:
        fs.remove(path + ".tmp")
        data = fs.read_file(path) if fs.exists(path) else None
    except OSError as exc:
        raise io_error("read leader epochs", path, exc) from exc
    return [] if data is None else decode(data, path)


class LeaderEpochs:
    """The ``leader-epochs`` file of one partition directory, and its entries in memory.

    Thread-safe for its changes: :meth:`assign`, :meth:`truncate_from` and
    :meth:`truncate_before` each read the entries and replace the file under one lock, so
    a follower copying its leader's epochs on a worker thread and retention trimming them
    on the event loop (:meth:`wal.log.Log.apply_retention`) never write the temp file at
    once nor lose each other's change (a change waits for the other: a few milliseconds,
    a file of a few lines fsynced). Reads of :meth:`entries`, :meth:`latest` and
    :meth:`end_offset_for` take no lock: they see a list that is replaced, never changed
    in place. The :class:`wal.log.Log` of the directory owns it.

    Args:
        directory: The partition directory.
        fs: The filesystem layer.
        log_end: The log's end (its head), for the latest epoch's end offset.
        entries: What the file holds (see :meth:`open`).
    """

    def __init__(
        self,
        directory: str,
        *,
        fs: FileSystem,
        log_end: Callable[[], int],
        entries: list[EpochEntry],
    ) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self._directory = directory
        self._fs = fs
        self._log_end = log_end
        self._entries = entries
        self._lock = threading.Lock()  # one change at a time (see the class docstring)

    @classmethod
    def open(cls, directory: str, *, fs: FileSystem, log_end: Callable[[], int]) -> LeaderEpochs:
        """Load the file of ``directory`` (none: no entries), discarding a leftover temp.

        Raises:
            LeaderEpochsCorruptError: the file is damaged (see :func:`decode`).
            WalIOError: it could not be read.
        """
        return cls(directory, fs=fs, log_end=log_end, entries=load_entries(fs, directory))

    def entries(self) -> list[EpochEntry]:
        """Every entry, oldest first."""
        return list(self._entries)

    def latest(self) -> EpochEntry | None:
        """The newest entry, or ``None`` when there is none."""
        return self._entries[-1] if self._entries else None

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        """Where ``epoch`` ended here: see :func:`end_offset_for` (the latest epoch ends at
        the log's end)."""
        return end_offset_for(self._entries, epoch, self._log_end())

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` begins at ``start_offset``; durable when it returns.

        A no-op when the latest entry already has ``epoch``. An entry at the same start as
        the latest one replaces it (that epoch wrote nothing).

        Raises:
            ValueError: ``epoch`` is below the latest epoch, or ``start_offset`` below the
                latest entry's start (truncate first).
            WalIOError: the file could not be replaced; the entries are unchanged.
        """
        with self._lock:
            latest = self.latest()
            if latest is not None and latest.epoch == epoch:
                return
            if latest is not None and (epoch < latest.epoch or start_offset < latest.start_offset):
                raise ValueError(
                    f"{self.path}: cannot assign epoch {epoch} at {start_offset} after "
                    f"{tuple(latest)}: epochs and start offsets only increase"
                )
            kept = self._entries
            if latest is not None and latest.start_offset == start_offset:
                kept = kept[:-1]
            self._replace([*kept, EpochEntry(epoch, start_offset)])
        logger.info("%s: epoch %d starts at offset %d", self.path, epoch, start_offset)

    def truncate_from(self, offset: int) -> None:
        """Drop every entry starting at or past ``offset`` (the log was cut to ``offset``;
        the latest kept epoch now ends at the log's end). Durable when it returns.

        Raises:
            WalIOError: the file could not be replaced; the entries are unchanged.
        """
        with self._lock:
            kept = entries_from(self._entries, offset)
            if len(kept) == len(self._entries):
                return
            dropped = self._entries[len(kept) :]
            self._replace(kept)
        logger.info("%s: dropped epochs from offset %d: %s", self.path, offset, dropped)

    def truncate_before(self, offset: int) -> None:
        """Drop the entries wholly below ``offset`` (retention raised the log start to
        ``offset``), keeping the one covering it. Durable when it returns.

        Raises:
            WalIOError: the file could not be replaced; the entries are unchanged.
        """
        with self._lock:
            kept = entries_before(self._entries, offset)
            if kept != self._entries:
                self._replace(kept)

    def _replace(self, entries: list[EpochEntry]) -> None:
        """Write ``entries`` atomically (tmp, fdatasync, rename, directory fsync), then
        take them in memory."""
        fs, tmp = self._fs, self.path + ".tmp"
        try:
            fs.remove(tmp)
            try:
                fs.write_new(tmp, encode(entries))
            except OSError:
                fs.remove(tmp)  # a full disk is not made fuller
                raise
            fs.crash_point("leader_epochs.after_tmp")
            fs.rename(tmp, self.path)
            fs.crash_point("leader_epochs.after_rename")
            fs.fsync_dir(self._directory)
        except OSError as exc:
            raise io_error("write leader epochs", self.path, exc) from exc
        self._entries = entries
