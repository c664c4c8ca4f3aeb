"""The filesystem layer: the only module of ``wal`` that touches ``os``.

Role: a small set of file operations on raw descriptors (positional vectored writes,
``fdatasync``, directory fsync, atomic replace), plus :class:`FaultyFs`, the fault-injecting
twin that tests use to produce short writes, ENOSPC, EIO, simulated power loss and crashes
at named points.

Invariants:
- ``write_all`` either writes every byte or raises; a short write from the kernel is retried.
- ``atomic_write`` is temp -> fsync -> rename -> fsync(dir): readers see the old or the new
  file, never a mix. ``atomic_write_many`` does the same for many files with one fsync per
  directory.
- ``makedirs`` fsyncs the parent of every directory it creates.
- Crash points are named strings (``CRASH_POINTS``); production code calls
  :meth:`FileSystem.crash_point` at each, which does nothing outside tests.

Errors are raised as ``OSError``; the segment and log layers translate them.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

_IOV_MAX = 1024
Buffer = bytes | bytearray | memoryview

#: Every named crash point production code declares, in the order a roll or delete meets them.
CRASH_POINTS = (
    "append.after_write",  # batch bytes written, before fdatasync
    "append.after_sync",  # fdatasync done, before acknowledgement
    "roll.after_seal",  # old segment synced, new segment not yet created
    "roll.after_create",  # new segment files created, directory not yet synced
    "retention.after_rename",  # segment renamed to .deleted, not yet unlinked
    "recovery.after_broken",  # torn tail copied to .broken, log not yet truncated
    "index.after_tmp",  # rebuilt index written to .tmp, not yet renamed
)


class FileSystem:
    """Real file operations. Task-safe as far as the OS is: it holds no state."""

    def open(self, path: str, *, create: bool = False) -> int:
        """Open ``path`` read-write and return the descriptor."""
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        return os.open(path, flags, 0o644)

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
            while n and views:
                if n >= len(views[0]):
                    n -= len(views.pop(0))
                else:
                    views[0] = views[0][n:]
                    n = 0
        return total

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        """Read up to ``size`` bytes at ``offset`` (fewer at end of file)."""
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
        """Whole contents of a file."""
        with open(path, "rb") as f:
            return f.read()

    def write_new(self, path: str, data: Buffer) -> None:
        """Create ``path`` (it must not exist), write ``data`` and fdatasync it."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
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
        may be new and others old); once this returns, all are new and durable."""
        for path, data in files:
            tmp = path + ".tmp"
            self.remove(tmp)
            self.write_new(tmp, data)
        self.crash_point("index.after_tmp")
        for path, _data in files:
            self.rename(path + ".tmp", path)
        for directory in dict.fromkeys(os.path.dirname(path) or "." for path, _ in files):
            self.fsync_dir(directory)

    def crash_point(self, name: str) -> None:
        """A named point where tests may simulate a crash. Does nothing here."""


# ---------------------------------------------------------------------------------------
# Fault injection


class SimulatedCrash(BaseException):
    """Raised by :class:`FaultyFs` at a crash point. A BaseException, so that no
    ``except Exception`` in production code can swallow it."""

    def __init__(self, point: str) -> None:
        self.point = point
        super().__init__(f"simulated crash at {point}")


@dataclass
class Fault:
    """One injected failure.

    Attributes:
        op: Operation name: ``pwritev``, ``fdatasync``, ``fsync``, ``open``, ``rename`` ...
        error: errno to raise (``errno.ENOSPC``, ``errno.EIO``).
        after: Let this many matching calls succeed first.
        times: How many calls fail (``None`` = every later call).
        path_contains: Only calls on paths containing this string (``""`` = any).
        partial: For ``pwritev``: write this many bytes before raising (a torn write).
    """

    op: str
    error: int = _errno.EIO
    after: int = 0
    times: int | None = 1
    path_contains: str = ""
    partial: int = 0
    seen: int = field(default=0, init=False)


class FaultyFs(FileSystem):
    """A :class:`FileSystem` that injects faults; a test aid importable beside the real one.

    Features:
        - ``faults``: errno failures of chosen operations (see :class:`Fault`).
        - ``max_write``: cap each ``pwritev`` at this many bytes (short writes).
        - ``crash_at``: raise :class:`SimulatedCrash` at that named crash point (or call
          ``on_crash`` instead, e.g. ``os._exit`` in a child process).
        - ``power_cut(rng)``: drop what was written but never fdatasynced, keeping a random
          prefix of it, as a power loss would.

    Not task-safe; tests use it from one thread at a time.
    """

    def __init__(
        self,
        *,
        faults: Sequence[Fault] = (),
        max_write: int | None = None,
        crash_at: str | None = None,
        on_crash: Callable[[str], None] | None = None,
    ) -> None:
        self.faults = list(faults)
        self.max_write = max_write
        self.crash_at = crash_at
        self.on_crash = on_crash
        self.calls: dict[str, int] = {}
        self._paths: dict[int, str] = {}
        self._synced: dict[str, int] = {}

    def _check(self, op: str, path: str) -> Fault | None:
        self.calls[op] = self.calls.get(op, 0) + 1
        for fault in self.faults:
            if fault.op != op or fault.path_contains not in path:
                continue
            fault.seen += 1
            if fault.seen <= fault.after:
                continue
            if fault.times is not None and fault.seen > fault.after + fault.times:
                continue
            return fault
        return None

    def _raise(self, fault: Fault, path: str) -> None:
        raise OSError(fault.error, os.strerror(fault.error), path)

    def open(self, path: str, *, create: bool = False) -> int:
        """Open, recording the path for later faults and power cuts."""
        fault = self._check("open", path)
        if fault:
            self._raise(fault, path)
        fd = super().open(path, create=create)
        self._paths[fd] = path
        self._synced.setdefault(path, super().size(fd))
        return fd

    def close(self, fd: int) -> None:
        """Close and forget the descriptor."""
        self._paths.pop(fd, None)
        super().close(fd)

    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        """Write, possibly short, possibly failing after a partial write."""
        path = self._paths.get(fd, "")
        fault = self._check("pwritev", path)
        data = b"".join(bytes(b) for b in buffers)
        if fault:
            if fault.partial:
                super().pwritev(fd, [data[: fault.partial]], offset)
            self._raise(fault, path)
        if self.max_write is not None:
            data = data[: self.max_write]
        return super().pwritev(fd, [data], offset)

    def fdatasync(self, fd: int) -> None:
        """fdatasync, or fail; on success remember the durable size."""
        path = self._paths.get(fd, "")
        fault = self._check("fdatasync", path)
        if fault:
            self._raise(fault, path)
        super().fdatasync(fd)
        self._synced[path] = super().size(fd)

    def fsync(self, fd: int) -> None:
        """fsync, or fail; on success remember the durable size."""
        path = self._paths.get(fd, "")
        fault = self._check("fsync", path)
        if fault:
            self._raise(fault, path)
        super().fsync(fd)
        self._synced[path] = super().size(fd)

    def rename(self, src: str, dst: str) -> None:
        """Rename, or fail."""
        fault = self._check("rename", src)
        if fault:
            self._raise(fault, src)
        super().rename(src, dst)
        if src in self._synced:
            self._synced[dst] = self._synced.pop(src)

    def fsync_dir(self, path: str) -> None:
        """Directory fsync, or fail."""
        fault = self._check("fsync_dir", path)
        if fault:
            self._raise(fault, path)
        super().fsync_dir(path)

    def truncate(self, fd: int, size: int) -> None:
        """Truncate, or fail."""
        path = self._paths.get(fd, "")
        fault = self._check("truncate", path)
        if fault:
            self._raise(fault, path)
        super().truncate(fd, size)
        self._synced[path] = min(self._synced.get(path, size), size)

    def crash_point(self, name: str) -> None:
        """Crash here if this is the chosen point."""
        if name not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {name!r}")
        self.calls["crash_point:" + name] = self.calls.get("crash_point:" + name, 0) + 1
        if name == self.crash_at:
            if self.on_crash is not None:
                self.on_crash(name)
            raise SimulatedCrash(name)

    def power_cut(self, rng: random.Random) -> dict[str, int]:
        """Simulate power loss: cut every file written through this fs back towards its
        last synced size, keeping a random part of the unsynced bytes (a torn write).

        Call only after every descriptor is closed (the process "died").

        Returns:
            Path -> new size, for files that lost bytes.
        """
        cut: dict[str, int] = {}
        for path, synced in self._synced.items():
            if not os.path.exists(path):
                continue
            size = os.path.getsize(path)
            if size > synced:
                keep = synced + rng.randint(0, size - synced)
                os.truncate(path, keep)
                cut[path] = keep
        return cut
