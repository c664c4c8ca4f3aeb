"""One owner per data directory: an exclusive lock on the directory itself.

Role: a broker takes :class:`DirectoryLock` on its data directory before it opens
anything under it, and holds it until it has closed everything. A second broker on the
same directory, reached by any path (a symlink, ``..``, a bind mount), is refused, as
etcd, Kafka and PostgreSQL refuse one: two writers on one log overwrite each other's
acknowledged records.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a descriptor of the directory itself, so it
belongs to the inode, not to a path, and the kernel drops it when the process dies (a
SIGKILLed broker leaves no stale lock). The holder's pid is written to ``<dir>/LOCK``
(atomically) after the lock is taken, only so that a refusal can name it; the file is
never the lock, and a stale one is harmless.

Example: broker A (pid 41) holds ``./data``; ``headrace serve --data-dir ./link-to-data``
fails with ``DataDirLockedError``: "data directory /abs/data is in use by another
headrace broker (pid 41)".

Not task-safe; used once at start and once at close by the broker's composition root.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from types import TracebackType
from typing import Self

from wal.errors import DataDirLockedError
from wal.fs import FileSystem

#: The file that names the lock holder's pid (information only; the lock is the flock).
PID_FILE = "LOCK"


def holder_pid(path: str, fs: FileSystem | None = None) -> int | None:
    """The pid written by the last holder of ``path``'s lock, or None if unreadable."""
    fs = fs or FileSystem()
    try:
        return int(fs.read_file(os.path.join(path, PID_FILE)).decode().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


class DirectoryLock:
    """The exclusive lock on one data directory, held until :meth:`release`.

    Args:
        path: The directory; created if missing.
        fs: The file system for the pid file. Default: the real one.

    Raises:
        DataDirLockedError: Another process holds the lock.
        OSError: The directory cannot be created or opened.
    """

    def __init__(self, path: str, fs: FileSystem | None = None) -> None:
        self.path = os.path.realpath(path)
        self._fs = fs or FileSystem()
        self._fs.makedirs(self.path)
        self._fd: int | None = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise DataDirLockedError(self.path, holder_pid(self.path, self._fs)) from None
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        self._fs.atomic_write(os.path.join(self.path, PID_FILE), f"{os.getpid()}\n".encode())

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock (closing the descriptor drops it). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
