"""The file descriptor budget: whether a topic's partitions fit under the open-files limit.

Role: the pure rule behind the up-front refusal in :mod:`broker.topics`. The registry
measures the process (its soft ``RLIMIT_NOFILE``, the descriptors open now, the idle ones in
its :class:`wal.fdcache.FileCache`) and asks :func:`shortfall` before it creates a file.

What a partition costs: one descriptor for as long as it is open, its active segment's
``.log`` (the writer's, pinned so that appends never look anything up). Sealed segments and
``.index`` files cost nothing while idle: they are opened through the file cache, which
keeps at most ``cache_capacity`` idle descriptors. On top of both, ``RESERVE`` descriptors
stay free for client connections, listeners, the thread pool's transient opens (directory
fsyncs, atomic writes, reads through the cache) and subscription files.

Worked example: limit 20,000, 150 open now of which 50 idle in a cache of capacity 2,500,
nothing reserved by other creates. Busy now: 150 - 50 = 100; available:
20,000 - 100 - 2,500 - 256 = 17,144. A topic of 10,000 partitions needs 10,000: it fits.
Under a limit of 2,048 the same process has 2,048 - 100 - 256 - 256 = 1,436 available
(capacity 256 there), so 5,000 partitions are refused before any file is made.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Descriptors an open partition holds: its active segment's ``.log``.
FDS_PER_PARTITION = 1
#: Descriptors kept free for everything that is not a partition (see the module docstring).
RESERVE = 256


@dataclass(frozen=True, slots=True)
class FdUsage:
    """The process's descriptors, as measured now.

    Attributes:
        limit: The soft ``RLIMIT_NOFILE`` (descriptors).
        open_now: Descriptors open in the process.
        idle_cached: Of those, idle ones in the file cache (closable at any time).
        cache_capacity: Idle descriptors the file cache may keep.
        reserved: Descriptors promised to topic creates still running.
    """

    limit: int
    open_now: int
    idle_cached: int
    cache_capacity: int
    reserved: int = 0

    @property
    def available(self) -> int:
        """Descriptors a new partition may still take (never below 0)."""
        busy = self.open_now - self.idle_cached + self.reserved
        return max(0, self.limit - busy - self.cache_capacity - RESERVE)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """A topic that does not fit: it needs ``needed`` descriptors, ``available`` are free
    under the soft limit ``limit``, and at most ``max_partitions`` partitions would fit."""

    needed: int
    available: int
    limit: int
    max_partitions: int


def fds_needed(partitions: int) -> int:
    """Descriptors ``partitions`` open partitions hold."""
    return partitions * FDS_PER_PARTITION


def shortfall(partitions: int, usage: FdUsage) -> Shortfall | None:
    """Whether ``partitions`` new partitions fit ``usage``; ``None`` when they do."""
    needed = fds_needed(partitions)
    if needed <= usage.available:
        return None
    return Shortfall(needed, usage.available, usage.limit, usage.available // FDS_PER_PARTITION)
