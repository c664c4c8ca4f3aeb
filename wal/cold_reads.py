"""The cold-read threads: reads the page cache cannot serve, off the event loop.

Owns :data:`COLD_READ_THREADS` and :func:`cold_read_pool`, the one thread pool a process
reads cold log bytes on (:meth:`~wal.writer.LogWriter.read_cold`). Task-safe: the pool is
made once, under a lock, and made anew in a child made by ``fork()``. Imports nothing of
``wal``: it knows threads, not logs.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading

#: Threads that read what the page cache does not hold, shared by every log of the
#: process (:func:`cold_read_pool`). A pool of their own: a flood of cold reads (many
#: consumers catching up at once) queues here, never in asyncio's default pool, where
#: state saves, topic creates and deletes and a log's open run; and it bounds the disk
#: reads in flight.
COLD_READ_THREADS = 4
_cold_pool: concurrent.futures.ThreadPoolExecutor | None = None
_cold_pool_lock = threading.Lock()


def cold_read_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process's cold-read threads, made by the first cold read. A child made by
    ``fork()`` makes its own: the parent's threads are not in it, and a pool that counts
    them as idle would never start one for the child's reads."""
    global _cold_pool  # noqa: PLW0603 - one pool a process, reset at fork
    with _cold_pool_lock:
        if _cold_pool is None:
            _cold_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=COLD_READ_THREADS, thread_name_prefix="headrace-cold-read"
            )
        return _cold_pool


def _forget_cold_pool() -> None:
    global _cold_pool, _cold_pool_lock
    _cold_pool, _cold_pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_cold_pool)
