"""A bounded cache of open file descriptors: the file descriptor budget of the logs.

Role: hand out descriptors of segment files by path, opening them on demand and closing the
least recently used ones beyond ``capacity``, as RocksDB's table cache (``max_open_files``)
does. Sealed segments and every ``.index`` file are opened through it, so the number of
descriptors the logs hold does not grow with the number of sealed segments; only each
partition's active ``.log`` stays open for the life of its segment (the writer path then
never looks anything up). The broker shares one cache among all its partitions; a log
opened without one makes its own, of ``PRIVATE_CAPACITY``.

Worked example (capacity 2: at most two idle descriptors)::

    lease(a) begins          busy {a}     idle []       a opened; pinned, so never closed
    lease(a) ends            busy {}      idle [a]      a stays open, idle
    lease(b) begins, ends    busy {}      idle [a, b]
    lease(c) begins, ends    busy {}      idle [b, c]   three idle: a, least recent, closed
    lease(b) begins          busy {b}     idle [c]      a hit: nothing opened
    forget(b)                busy {}      idle [c]      b is pinned: it closes when the
    lease(b) ends                                       lease ends, never under its user

Invariants:
- A descriptor is closed only while nobody holds a pin on it, so no thread ever uses a
  number that was closed (and possibly reused by the kernel) under it.
- At most ``capacity`` idle descriptors are open; busy ones are bounded by the active
  segments (one each) plus the reads and writes running at one time.
- Closing a descriptor loses nothing: ``fdatasync`` acts on the file, not on the
  descriptor, and a writeback error nobody has seen yet is reported to the next opener
  (Linux >= 4.16), so a later ``fdatasync`` through a fresh descriptor still reports it.

Task-safe and thread-safe: one lock guards the table; ``open`` and ``close`` run under it,
which serializes them (short system calls, and rare once the working set is open).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from wal.fs import FileSystem

logger = logging.getLogger(__name__)

#: Bounds of :func:`default_capacity`: an eighth of the soft ``RLIMIT_NOFILE``, within these.
MIN_CAPACITY = 64
MAX_CAPACITY = 4096
#: Idle descriptors a log keeps when it is given no cache and makes its own.
PRIVATE_CAPACITY = 8


@dataclass(slots=True, eq=False)
class Pin:
    """A held descriptor: ``fd`` stays open until the matching :meth:`FileCache.release`."""

    fd: int
    fs: FileSystem
    path: str
    pins: int = 1
    forgotten: bool = False


class FileCache:
    """Open descriptors by path; at most ``capacity`` idle ones. Thread-safe (one lock).

    A descriptor is *busy* while someone holds a pin on it (a lease, or a segment that owns
    its active ``.log`` for the segment's life) and *idle* otherwise. Busy ones are never
    closed; idle ones beyond ``capacity`` are closed, least recently used first.

    Args:
        capacity: How many idle descriptors to keep open (count, >= 1).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._idle: OrderedDict[str, Pin] = OrderedDict()  # least recently used first
        self._busy: dict[str, Pin] = {}
        self._lock = threading.Lock()
        #: Descriptors opened and closed over the cache's life (for tests and metrics).
        self.opens = 0
        self.closes = 0

    @property
    def open_count(self) -> int:
        """Descriptors the cache holds open now, busy or idle."""
        return len(self._idle) + len(self._busy)

    @property
    def busy_count(self) -> int:
        """Descriptors pinned now (each active segment holds one)."""
        return len(self._busy)

    @property
    def idle_count(self) -> int:
        """Descriptors open but unused now (closable at any time)."""
        return len(self._idle)

    @contextmanager
    def lease(self, fs: FileSystem, path: str, *, create: bool = False) -> Iterator[int]:
        """Yield an open descriptor of ``path``, pinned (never closed) until the block ends.

        Raises:
            OSError: the file could not be opened.
        """
        pin = self.acquire(fs, path, create=create)
        try:
            yield pin.fd
        finally:
            self.release(pin)

    def acquire(self, fs: FileSystem, path: str, *, create: bool = False) -> Pin:
        """Pin a descriptor of ``path``, opening it if needed; pair with :meth:`release`.

        Raises:
            OSError: the file could not be opened.
        """
        with self._lock:
            pin = self._busy.get(path)
            if pin is not None:
                pin.pins += 1
                return pin
            pin = self._idle.pop(path, None)
            if pin is None:
                pin = Pin(fs.open(path, create=create), fs, path, pins=0)
                self.opens += 1
            pin.pins = 1
            self._busy[path] = pin
            return pin

    def release(self, pin: Pin) -> None:
        """Unpin; at the last release the descriptor becomes idle (or closes, if forgotten)."""
        with self._lock:
            pin.pins -= 1
            if pin.pins:
                return
            if pin.forgotten:  # no longer in the table: its last user closes it
                self._close(pin)
                return
            del self._busy[pin.path]
            self._idle[pin.path] = pin
            while len(self._idle) > self.capacity:
                self._close(self._idle.popitem(last=False)[1])

    def forget(self, path: str) -> None:
        """Close ``path``'s descriptor (at its last release if it is busy): the file is
        being renamed, deleted or closed by its owner. No-op if it is not open."""
        with self._lock:
            pin = self._idle.pop(path, None)
            if pin is not None:
                self._close(pin)
                return
            pin = self._busy.pop(path, None)
            if pin is not None:
                pin.forgotten = True

    def clear(self) -> None:
        """Close every idle descriptor (e.g. at shutdown)."""
        with self._lock:
            while self._idle:
                self._close(self._idle.popitem(last=False)[1])

    def _close(self, pin: Pin) -> None:
        self.closes += 1
        try:
            pin.fs.close(pin.fd)
        except OSError as exc:  # nothing was pending on it that a close could lose
            logger.warning("closing cached descriptor of %s failed: %s", pin.path, exc)


def default_capacity(soft_limit: int) -> int:
    """The cache size for a process whose soft ``RLIMIT_NOFILE`` is ``soft_limit``: an
    eighth of it, within [``MIN_CAPACITY``, ``MAX_CAPACITY``]."""
    return max(MIN_CAPACITY, min(MAX_CAPACITY, soft_limit // 8))
