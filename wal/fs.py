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
- A failed ``atomic_write_many`` leaves no temp file behind (a full disk is not made fuller).
- Inside :func:`nonblocking_reads`, a read on that thread never waits for the disk: what
  the page cache does not hold raises :class:`WouldBlockError` (``preadv2`` with
  ``RWF_NOWAIT``), so the event loop can hand the read to a thread instead (a cold read of
  1 MiB took 1.4 ms here, against 0.08 ms from the page cache). On a filesystem without
  ``RWF_NOWAIT`` every read counts as cached, as before.

Power-loss model of :class:`FaultyFs` (what :meth:`FaultyFs.power_cut` may do to bytes
written since a file's last ``fdatasync``/``fsync``): the file's size stays or falls back
anywhere between its synced size and its current size, and each unsynced page below the new size
independently reaches the disk or not. A page that does not keeps its content as of the last
sync (zeros where the file had no bytes then). So a power cut can keep a later page and lose
an earlier one, as a real disk that writes back pages in any order can. A sync makes
durable what was written before it began: bytes written while it runs (from another thread)
stay unsynced, their pages' content as of the sync's start. Truncation is taken as durable
at once (every caller syncs after truncating).

Errors are raised as ``OSError``; the segment and log layers translate them.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
        - ``faults``: errno failures of chosen operations (see :class:`Fault`); remove a
          fault from the list (``faults.clear()``) to end it, as freeing disk space does.
        - ``max_write``: cap each ``pwritev`` at this many bytes (short writes).
        - ``crash_at``: raise :class:`SimulatedCrash` at that named crash point (or call
          ``on_crash`` instead, e.g. ``os._exit`` in a child process).
        - ``power_cut(rng)``: lose what was written but never synced, as a power loss would
          (the model is in the module docstring): a random part of each file's unsynced
          tail is kept, and each unsynced page below it independently survives or not.
        - ``page_size``: the unit a power cut keeps or loses, bytes. Default 4096; tests of
          tiny segments pass 64 so that one segment spans many pages.

    Thread-safe for what a log does at once (a writer thread appending while a periodic
    sync runs on another); the fault list and ``calls`` are for one test to read.
    """

    def __init__(
        self,
        *,
        faults: Sequence[Fault] = (),
        max_write: int | None = None,
        crash_at: str | None = None,
        on_crash: Callable[[str], None] | None = None,
        page_size: int = 4096,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, not {page_size}")
        self.faults = list(faults)
        self.max_write = max_write
        self.crash_at = crash_at
        self.on_crash = on_crash
        self.page_size = page_size
        self.calls: dict[str, int] = {}
        #: Path parts whose files are not in the page cache: a non-blocking read of one
        #: raises :class:`WouldBlockError`, a blocking read warms it (takes it out).
        self.cold: set[str] = set()
        self._paths: dict[int, str] = {}
        self._synced: dict[str, int] = {}
        # path -> page number -> the page's bytes as of the file's last sync, for every page
        # written since (shorter than a page where the file ended).
        self._before: dict[str, dict[int, bytes]] = {}
        # Held around every change to ``_synced`` and ``_before`` with the call it records
        # (a write keeps its pages' old content and writes; a sync takes the pages it
        # covers; open, rename, remove, truncate): a write is then wholly before a sync's
        # start or after it, and a renamed file's record moves with the file.
        self._lock = threading.Lock()

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

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> int:
        """Open, recording the path for later faults and power cuts."""
        fault = self._check("open", path)
        if fault:
            self._raise(fault, path)
        fd = super().open(path, create=create, exclusive=exclusive)
        self._paths[fd] = path
        with self._lock:
            if exclusive:  # a new file: nothing of it is durable yet
                self._synced[path] = 0
                self._before[path] = {}
            self._synced.setdefault(path, super().size(fd))
        return fd

    def close(self, fd: int) -> None:
        """Close and forget the descriptor."""
        self._paths.pop(fd, None)
        super().close(fd)

    def path_of(self, fd: int) -> str:
        """The path descriptor ``fd`` was opened with; empty if it is not open here."""
        return self._paths.get(fd, "")

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        """Read; inside :func:`nonblocking_reads`, a file in :attr:`cold` raises
        :class:`WouldBlockError` (a page cache miss), and a blocking read takes it out of
        :attr:`cold` (the read brought it into the cache)."""
        self._cold_check(self.path_of(fd))
        return super().pread(fd, size, offset)

    def read_file(self, path: str) -> bytes:
        """Whole contents of a file, with :attr:`cold` as :meth:`pread` has it."""
        self._cold_check(path)
        return super().read_file(path)

    def _cold_check(self, path: str) -> None:
        if not any(part in path for part in self.cold):
            return
        if reading_nonblocking():
            self.calls["would_block"] = self.calls.get("would_block", 0) + 1
            raise WouldBlockError(f"{path} is cold (FaultyFs.cold)")
        self.cold = {part for part in self.cold if part not in path}

    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        """Write, possibly short, possibly failing after a partial write."""
        path = self.path_of(fd)
        fault = self._check("pwritev", path)
        data = b"".join(bytes(b) for b in buffers)
        if fault:
            if fault.partial:
                self._write(fd, path, data[: fault.partial], offset)
            self._raise(fault, path)
        if self.max_write is not None:
            data = data[: self.max_write]
        return self._write(fd, path, data, offset)

    def _write(self, fd: int, path: str, data: bytes, offset: int) -> int:
        """Write, first keeping the synced content of every page the write touches."""
        with self._lock:
            before = self._before.setdefault(path, {})
            ps = self.page_size
            for page in range(offset // ps, (offset + len(data) + ps - 1) // ps):
                if page not in before:  # untouched since the last sync: it holds synced bytes
                    before[page] = os.pread(fd, ps, page * ps)
            return super().pwritev(fd, [data], offset)

    def _sync(self, fd: int, op: str, sync: Callable[[int], None]) -> None:
        """Run ``sync``, or fail; on success what was written before it began is durable
        (the size then, and the pages written until then)."""
        path = self.path_of(fd)
        fault = self._check(op, path)
        if fault:
            self._raise(fault, path)
        with self._lock:
            covers = super().size(fd)
            dirty = self._before.get(path, {})
            # A page first written from now on keeps its content as of now: what this sync
            # makes durable, if it succeeds.
            self._before[path] = {}
        try:
            sync(fd)
        except BaseException:
            with self._lock:  # nothing became durable: each page's oldest content stands
                later = self._before.get(path, {})
                self._before[path] = {**later, **dirty}
            raise
        with self._lock:  # a later sync that ended first may have covered more already
            self._synced[path] = max(self._synced.get(path, 0), covers)

    def fdatasync(self, fd: int) -> None:
        """fdatasync, or fail; on success remember what became durable."""
        self._sync(fd, "fdatasync", super().fdatasync)

    def fsync(self, fd: int) -> None:
        """fsync, or fail; on success remember what became durable."""
        self._sync(fd, "fsync", super().fsync)

    def rename(self, src: str, dst: str) -> None:
        """Rename, or fail."""
        fault = self._check("rename", src)
        if fault:
            self._raise(fault, src)
        with self._lock:
            super().rename(src, dst)
            if src in self._synced:
                self._synced[dst] = self._synced.pop(src)
                self._before[dst] = self._before.pop(src, {})

    def remove(self, path: str) -> None:
        """Remove, forgetting what was known about the file."""
        with self._lock:
            super().remove(path)
            self._synced.pop(path, None)
            self._before.pop(path, None)

    def fsync_dir(self, path: str) -> None:
        """Directory fsync, or fail."""
        fault = self._check("fsync_dir", path)
        if fault:
            self._raise(fault, path)
        super().fsync_dir(path)

    def truncate(self, fd: int, size: int) -> None:
        """Truncate, or fail. The new size counts as durable at once (see the module
        docstring): pages past it are forgotten, and none comes back in a power cut."""
        path = self.path_of(fd)
        fault = self._check("truncate", path)
        if fault:
            self._raise(fault, path)
        with self._lock:
            super().truncate(fd, size)
            self._synced[path] = min(self._synced.get(path, size), size)
            ps = self.page_size
            before = self._before.get(path, {})
            for page in [p for p in before if p * ps >= size]:
                del before[page]
            last = size // ps
            if last in before:
                before[last] = before[last][: size - last * ps]

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
        """Simulate power loss on every file written through this fs (see the module
        docstring): keep each file's size, or (even odds) cut it back to a random size
        between its synced and its current size; then give each unsynced page below that
        size an even chance of losing its new bytes (it reverts to its content as of the
        last sync, zeros where there was none).

        Call only after every descriptor is closed (the process "died").

        Returns:
            Path -> new size, for files that lost bytes (a cut tail or a lost page).
        """
        cut: dict[str, int] = {}
        for path, synced in self._synced.items():
            if not os.path.exists(path):
                continue
            size = os.path.getsize(path)
            keep = size
            if size > synced and rng.random() < 0.5:  # else the new size reached the disk
                keep = synced + rng.randint(0, size - synced)
            if keep < size:
                os.truncate(path, keep)
                cut[path] = keep
            if self._lose_pages(path, keep, rng):
                cut[path] = keep
        self._before = {}
        self._synced = {p: os.path.getsize(p) for p in self._synced if os.path.exists(p)}
        return cut

    def _lose_pages(self, path: str, size: int, rng: random.Random) -> bool:
        """Revert each unsynced page below ``size`` with probability 1/2; return whether any
        page changed."""
        ps = self.page_size
        lost = False
        with open(path, "r+b") as f:
            for page, old in sorted(self._before.get(path, {}).items()):
                start = page * ps
                if start >= size or rng.random() < 0.5:
                    continue
                length = min(ps, size - start)
                f.seek(start)
                if f.read(length) != old[:length].ljust(length, b"\0"):
                    f.seek(start)
                    f.write(old[:length].ljust(length, b"\0"))
                    lost = True
        return lost
