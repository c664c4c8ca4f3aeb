"""The filesystem layer: the only module of ``wal`` that touches ``os``.

Role: a small set of file operations on raw descriptors (positional vectored writes,
``fdatasync``, directory fsync, atomic replace), and the named crash points. Its
fault-injecting twin, :class:`~wal.faulty_fs.FaultyFs` (short writes, ENOSPC, EIO,
simulated power loss and crashes at those points), is :mod:`wal.faulty_fs`: a test aid
beside the interface it fakes, apart so that this module holds only what production
runs.

Invariants:
- ``write_all`` either writes every byte or raises; a short write from the kernel is retried.
- ``atomic_write`` is temp -> fsync -> rename -> fsync(dir): readers see the old or the new
  file, never a mix. ``atomic_write_many`` does the same for many files with one fsync per
  directory.
- ``makedirs`` fsyncs the parent of every directory it creates.
- Crash points are named strings (``CRASH_POINTS``); production code calls
  :meth:`FileSystem.crash_point` at each, which does nothing outside tests.
- A failed ``atomic_write_many`` leaves no temp file behind (a full disk is not made fuller).
- Inside :func:`nonblocking_reads`, a read on that thread never waits for the disk: what
  the page cache does not hold raises :class:`WouldBlockError` (``preadv2`` with
  ``RWF_NOWAIT``), so the event loop can hand the read to a thread instead (a cold read of
  1 MiB took 1.4 ms here, against 0.08 ms from the page cache). On a filesystem without
  ``RWF_NOWAIT`` every read counts as cached, as before.

Errors are raised as ``OSError``; the segment and log layers translate them.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
import threading
from collections.abc import Sequence

_IOV_MAX = 1024
Buffer = bytes | bytearray | memoryview


class _NoWait:
    """``RWF_NOWAIT`` while the kernel takes it; ``None`` from its first refusal on."""

    flag: int | None = getattr(os, "RWF_NOWAIT", None)


_reads = threading.local()  # .nowait: this thread is inside nonblocking_reads()


class WouldBlockError(Exception):
    """Raised inside :func:`nonblocking_reads` by a read the page cache cannot serve.

    Not an ``OSError``: nothing failed, and the callers that turn ``OSError`` into log
    errors must let it through."""


class nonblocking_reads:  # noqa: N801 - used as a function: ``with nonblocking_reads():``
    """Within the block, reads on the calling thread that would wait for the disk raise
    :class:`WouldBlockError` instead (see the module docstring). It marks the calling
    thread only; blocks nest. A class, not a generator: the loop enters it per read."""

    __slots__ = ("_before",)

    def __enter__(self) -> None:
        self._before = getattr(_reads, "nowait", False)
        _reads.nowait = True

    def __exit__(self, *exc: object) -> None:
        _reads.nowait = self._before


def reading_nonblocking() -> bool:
    """Whether the calling thread is inside :func:`nonblocking_reads`."""
    return bool(getattr(_reads, "nowait", False))


def _pread_nowait(fd: int, size: int, offset: int) -> bytes:
    """``pread`` that raises :class:`WouldBlockError` instead of waiting for the disk."""
    flag = _NoWait.flag
    if flag is None:
        return FileSystem.pread_blocking(fd, size, offset)
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        try:
            n = os.preadv(fd, [view[got:]], offset + got, flag)
        except BlockingIOError:
            raise WouldBlockError(f"{size} bytes at {offset} are not in the page cache") from None
        except OSError as exc:
            if exc.errno not in (_errno.EOPNOTSUPP, _errno.EINVAL):
                raise
            _NoWait.flag = None  # this kernel or filesystem does not take it: read as before
            return FileSystem.pread_blocking(fd, size, offset)
        if n == 0:
            break
        got += n
    return bytes(view[:got])


#: Every named crash point production code declares, in the order a roll, a delete or a
#: truncation meets them.
CRASH_POINTS = (
    "append.after_write",  # batch bytes written, before fdatasync
    "append.after_sync",  # fdatasync done, before acknowledgement
    "roll.after_seal",  # old segment synced, new segment not yet created
    "roll.after_create",  # new segment files created, directory not yet synced
    "retention.after_rename",  # segment renamed to .deleted, not yet unlinked
    "recovery.after_broken",  # torn tail copied to .broken, log not yet truncated
    "index.after_tmp",  # rebuilt index written to .tmp, not yet renamed
    "truncate.after_segment_delete",  # a segment wholly above the offset removed, dir synced
    "truncate.after_index",  # the kept segment's .index cut and synced, its .log not yet
    "truncate.after_data",  # the kept segment's .log cut and synced, leader-epochs not yet
    "leader_epochs.after_tmp",  # leader-epochs.tmp written and synced, not yet renamed
    "leader_epochs.after_rename",  # leader-epochs replaced, directory not yet synced
    "restart.after_create",  # a restart's new empty segment made and synced, old one kept
    "hw_checkpoint.after_tmp",  # high-watermark.tmp written and synced, not yet renamed
    "hw_checkpoint.after_rename",  # high-watermark replaced, directory not yet synced
)


class FileSystem:
    """Real file operations. Task-safe as far as the OS is: it holds no state."""

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> int:
        """Open ``path`` read-write and return the descriptor.

        Args:
            path: The file.
            create: Create it if it is missing.
            exclusive: Create it, failing if it exists (``O_EXCL``).
        """
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create or exclusive else 0)
        return os.open(path, flags | (os.O_EXCL if exclusive else 0), 0o644)

    def open_readonly(self, path: str) -> int:
        """Open ``path`` read-only (inspection tools) and return the descriptor."""
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def close(self, fd: int) -> None:
        """Close a descriptor."""
        os.close(fd)

    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        """One positional vectored write; may be short. Returns the bytes written."""
        return os.pwritev(fd, buffers, offset)

    def write_all(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        """Write every byte of ``buffers`` at ``offset``; retry short writes. Returns the total."""
        views = [memoryview(b).cast("B") for b in buffers if len(b)]
        total = 0
        while views:
            chunk = views[:_IOV_MAX]
            n = self.pwritev(fd, chunk, offset + total)
            if n <= 0:
                raise OSError(_errno.EIO, "pwritev wrote nothing")
            total += n
            if n == sum(map(len, chunk)):  # the common case: all of it
                del views[: len(chunk)]
                continue
            while n and views:
                if n >= len(views[0]):
                    n -= len(views.pop(0))
                else:
                    views[0] = views[0][n:]
                    n = 0
        return total

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        """Read up to ``size`` bytes at ``offset`` (fewer at end of file).

        Raises:
            WouldBlockError: inside :func:`nonblocking_reads`, the bytes are not cached.
        """
        if getattr(_reads, "nowait", False):
            return _pread_nowait(fd, size, offset)
        return self.pread_blocking(fd, size, offset)

    @staticmethod
    def pread_blocking(fd: int, size: int, offset: int) -> bytes:
        """``pread`` that waits for the disk if it must, whatever the thread's mode."""
        chunks: list[bytes] = []
        got = 0
        while got < size:
            data = os.pread(fd, size - got, offset + got)
            if not data:
                break
            chunks.append(data)
            got += len(data)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def fdatasync(self, fd: int) -> None:
        """Force file data (and the size) to stable storage."""
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        """Force file data and all metadata to stable storage."""
        os.fsync(fd)

    def fsync_dir(self, path: str) -> None:
        """Make creations, renames and removals in directory ``path`` durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def truncate(self, fd: int, size: int) -> None:
        """Cut the file to ``size`` bytes."""
        os.ftruncate(fd, size)

    def size(self, fd: int) -> int:
        """Current size of an open file."""
        return os.fstat(fd).st_size

    def listdir(self, path: str) -> list[str]:
        """Names in a directory, sorted."""
        return sorted(os.listdir(path))

    def makedirs(self, path: str) -> None:
        """Create a directory and its parents if missing, durably: the parent of each
        directory created is fsynced, so a power cut cannot take back a directory (and
        the files in it) after a later write in it was reported durable."""
        missing = []
        current = os.path.abspath(path)
        while not os.path.isdir(current):
            missing.append(current)
            current = os.path.dirname(current)
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):  # made meanwhile by someone else
                os.mkdir(directory)
            self.fsync_dir(os.path.dirname(directory))

    def file_size(self, path: str) -> int:
        """Size of the file at ``path``."""
        return os.path.getsize(path)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return os.path.exists(path)

    def rename(self, src: str, dst: str) -> None:
        """Atomically rename ``src`` over ``dst``."""
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        """Remove a file; a missing file is not an error."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def read_file(self, path: str) -> bytes:
        """Whole contents of a file.

        Raises:
            WouldBlockError: inside :func:`nonblocking_reads`, the file is not cached.
        """
        if getattr(_reads, "nowait", False):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                return _pread_nowait(fd, os.fstat(fd).st_size, 0)
            finally:
                os.close(fd)
        with open(path, "rb") as f:
            return f.read()

    def write_new(self, path: str, data: Buffer) -> None:
        """Create ``path`` (it must not exist), write ``data`` and fdatasync it."""
        fd = self.open(path, exclusive=True)
        try:
            self.write_all(fd, [data], 0)
            self.fdatasync(fd)
        finally:
            self.close(fd)

    def atomic_write(self, path: str, data: Buffer) -> None:
        """Replace ``path`` with ``data``: temp, fsync, rename, fsync of the directory."""
        self.atomic_write_many([(path, data)])

    def atomic_write_many(self, files: Sequence[tuple[str, Buffer]]) -> None:
        """Replace several files, each atomically, at the cost of one directory fsync per
        directory: every temp is written and fsynced, then every rename is done, then each
        directory is fsynced once. A crash leaves each file old or new, never a mix (some
        may be new and others old); once this returns, all are new and durable. If writing
        a temp file fails (a full disk), every temp file is removed and nothing is renamed."""
        written: list[str] = []
        try:
            for path, data in files:
                tmp = path + ".tmp"
                self.remove(tmp)
                written.append(tmp)
                self.write_new(tmp, data)
        except OSError:
            for tmp in written:
                with contextlib.suppress(OSError):
                    self.remove(tmp)
            raise
        self.crash_point("index.after_tmp")
        for path, _data in files:
            self.rename(path + ".tmp", path)
        for directory in dict.fromkeys(os.path.dirname(path) or "." for path, _ in files):
            self.fsync_dir(directory)

    def crash_point(self, name: str) -> None:
        """A named point where tests may simulate a crash. Does nothing here."""
