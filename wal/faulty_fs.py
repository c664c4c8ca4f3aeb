"""The fault-injecting filesystem: :class:`FaultyFs`, the test twin of :mod:`wal.fs`.

Role: a :class:`~wal.fs.FileSystem` that tests hand to logs, cursor stores and the broker
to produce short writes, ENOSPC, EIO, cold page-cache reads, simulated power loss
(:meth:`FaultyFs.power_cut`) and crashes at the named points (:data:`wal.fs.CRASH_POINTS`,
raised as :class:`SimulatedCrash`). Importable beside the real one (``from wal import
FaultyFs``), never used by production code. Touches ``os`` directly only to model what a
power cut leaves of a file; every other operation goes through :class:`~wal.fs.FileSystem`.

Power-loss model of :class:`FaultyFs` (what :meth:`FaultyFs.power_cut` may do to bytes
written since a file's last ``fdatasync``/``fsync``): the file's size stays or falls back
anywhere between its synced size and its current size, and each unsynced page below the new size
independently reaches the disk or not. A page that does not keeps its content as of the last
sync (zeros where the file had no bytes then). So a power cut can keep a later page and lose
an earlier one, as a real disk that writes back pages in any order can. A sync makes
durable what was written before it began: bytes written while it runs (from another thread)
stay unsynced, their pages' content as of the sync's start. Truncation is taken as durable
at once (every caller syncs after truncating).
"""

from __future__ import annotations

import errno as _errno
import os
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from wal.fs import (
    CRASH_POINTS,
    Buffer,
    FileSystem,
    WouldBlockError,
    reading_nonblocking,
)


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
