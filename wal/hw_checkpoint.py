"""The high-watermark checkpoint of one partition: the ``high-watermark`` file.

Role: remember how far a replicated log was known to be committed (Kafka's
``replication-offset-checkpoint``), so that a replica that restarts, or is promoted, starts
its mark there (:meth:`wal.writer.LogWriter.hold_commits`) instead of at its head: records
it holds above the checkpoint may never have been committed (an old leader's tail, a
follower's fetch the leader never counted), and no consumer may see them until the
replication says they are.

The rule: the checkpoint may lag the mark, never lead it. A lagging checkpoint only
delays visibility after a restart (the mark rises again as the leader or the in-sync set
confirms); a leading one would expose records that may be truncated later. So:

- the writer writes the mark it holds, at most every ``checkpoint_interval_s`` and when it
  closes (:class:`wal.writer.LogWriter`), off the event loop;
- a truncation or a restart below the checkpoint lowers it first, durably, before a file
  of the log changes (:meth:`lower_to`, called by :class:`wal.log.Log`); a write of an
  older, higher mark that was already on its way is then dropped (a generation count);
- opening lowers a checkpoint past the recovered head (a power cut under a lax fsync
  policy took back records it counted);
- a damaged file reads as 0 (with a warning): lagging is always safe;
- only a log whose commits were held has the file, so a writer opening a log that has
  one holds its commits at it from the start (:meth:`wal.writer.LogWriter.open`), and
  releasing the commits (the log is no longer replicated) removes it.

File format (text, so an operator can read it)::

    headrace high-watermark 1
    1234
    crc32 5f0e1a2b

Durability: every change replaces the file whole: ``high-watermark.tmp`` written and
fdatasynced, renamed over the file, the directory fsynced (crash points
``hw_checkpoint.after_tmp`` and ``hw_checkpoint.after_rename``); a crash leaves the old
file or the new one, and opening the log discards a leftover ``.tmp``.

Thread-safety: :meth:`advance` runs on a worker thread while :meth:`lower_to` runs on the
event loop (inside a truncation); one lock orders them.
"""

from __future__ import annotations

import logging
import os
import threading
import zlib

from wal.errors import io_error
from wal.fs import FileSystem

logger = logging.getLogger(__name__)

#: The file's name in a partition directory.
FILE_NAME = "high-watermark"
_VERSION_LINE = b"headrace high-watermark 1"
_CRC_PREFIX = b"crc32 "


def encode(offset: int) -> bytes:
    """The file's bytes for ``offset``."""
    body = _VERSION_LINE + b"\n%d\n" % offset
    return body + _CRC_PREFIX + b"%08x\n" % zlib.crc32(body)


def decode(data: bytes) -> int | None:
    """The offset the file's bytes hold, or ``None`` when they are damaged."""
    body, sep, crc_line = data.rstrip(b"\n").rpartition(b"\n")
    if not sep or not crc_line.startswith(_CRC_PREFIX) or not data.endswith(b"\n"):
        return None
    body += b"\n"
    try:
        if int(crc_line[len(_CRC_PREFIX) :], 16) != zlib.crc32(body):
            return None
        version, value = body.rstrip(b"\n").split(b"\n")
        offset = int(value)
    except ValueError:
        return None
    return offset if version == _VERSION_LINE and offset >= 0 else None


class HighWatermarkCheckpoint:
    """The ``high-watermark`` file of one partition directory, and its value in memory.

    Args:
        directory: The partition directory.
        fs: The filesystem layer.
    """

    def __init__(self, directory: str, *, fs: FileSystem) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self._directory = directory
        self._fs = fs
        self._lock = threading.Lock()
        self._offset: int | None = None
        #: Raised by every :meth:`lower_to`: a write of a mark read before it is dropped.
        self._generation = 0

    @classmethod
    def open(cls, directory: str, *, fs: FileSystem) -> HighWatermarkCheckpoint:
        """Read the file of ``directory`` (none: no checkpoint; damaged: 0)."""
        checkpoint = cls(directory, fs=fs)
        try:
            data = fs.read_file(checkpoint.path) if fs.exists(checkpoint.path) else None
        except OSError as exc:
            raise io_error("read high-watermark checkpoint", checkpoint.path, exc) from exc
        if data is not None:
            checkpoint._offset = decode(data)
            if checkpoint._offset is None:
                logger.warning(
                    "%s is damaged; reading it as 0 (the mark waits for the replication)",
                    checkpoint.path,
                )
                checkpoint._offset = 0
        return checkpoint

    @property
    def offset(self) -> int:
        """The checkpointed mark; 0 when none was ever written (nothing is known to be
        committed: the caller clamps it to the log's first offset)."""
        return self._offset or 0

    @property
    def exists(self) -> bool:
        """Whether a checkpoint was written (or read at open)."""
        return self._offset is not None

    @property
    def generation(self) -> int:
        """Read with the mark on the event loop, passed to :meth:`advance`."""
        return self._generation

    def advance(self, offset: int, generation: int) -> bool:
        """Write ``offset`` (the writer's mark, read at ``generation``) unless a
        :meth:`lower_to` came since, or it is what the file holds. Durable when it
        returns True. On a worker thread.

        Raises:
            WalIOError: the file could not be replaced (the old one stands).
        """
        with self._lock:
            if generation != self._generation or offset == self._offset:
                return False
            self._replace(offset)
            return True

    def lower_to(self, offset: int) -> None:
        """Make the checkpoint at most ``offset``, durably, before the log is cut there;
        any write of a mark read earlier is dropped.

        Raises:
            WalIOError: the file could not be replaced (the old one stands).
        """
        with self._lock:
            self._generation += 1
            if self._offset is not None and self._offset > offset:
                self._replace(offset)
                logger.info("%s: lowered to %d", self.path, offset)

    def remove(self) -> None:
        """Remove the file (the log is no longer replicated); a write of a mark read
        earlier is dropped.

        Raises:
            WalIOError: the file could not be removed.
        """
        with self._lock:
            self._generation += 1
            if self._offset is None:
                return
            try:
                self._fs.remove(self.path)
                self._fs.fsync_dir(self._directory)
            except OSError as exc:
                raise io_error("remove high-watermark checkpoint", self.path, exc) from exc
            self._offset = None

    def _replace(self, offset: int) -> None:
        fs, tmp = self._fs, self.path + ".tmp"
        try:
            fs.remove(tmp)
            try:
                fs.write_new(tmp, encode(offset))
            except OSError:
                fs.remove(tmp)  # a full disk is not made fuller
                raise
            fs.crash_point("hw_checkpoint.after_tmp")
            fs.rename(tmp, self.path)
            fs.crash_point("hw_checkpoint.after_rename")
            fs.fsync_dir(self._directory)
        except OSError as exc:
            raise io_error("write high-watermark checkpoint", self.path, exc) from exc
        self._offset = offset
