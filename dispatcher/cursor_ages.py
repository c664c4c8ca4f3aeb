"""How old a subscription's oldest unacknowledged record is: its publish time, read.

The age of a lagging partition is now minus the publish time of the record at its
cursor. :class:`CursorAges` reads that time two ways. The heartbeat's samples, taken
every interval for every subscription, use :meth:`CursorAges.timestamp_ms`, which never
waits for the disk: ``None`` while the record is not in the page cache (a subscription
far behind is exactly the one whose cursor is cold), and one read on a worker thread
per partition is started instead, which brings it in, so a later sample finds it.
``status`` (an operator's call) uses :meth:`CursorAges.timestamp_at`, which waits for
the cold read. A record that cannot be read (a damaged or deleted segment) reports no
age (now) rather than fail.

Example: partition 0's cursor is at offset 7, cold. ``timestamp_ms(0, 7)`` returns
``None`` and starts a read; once it is done, ``timestamp_ms(0, 7)`` returns record 7's
publish time from the cache.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from wal import LogWriter, RecordBatch

logger = logging.getLogger(__name__)


class CursorAges:
    """Publish times of the records at cursors, for one subscription's partitions. Use
    from its event loop (a sample built on another thread starts no read).

    Args:
        writers: The topic's partitions' log writers, by partition.
    """

    def __init__(self, writers: Sequence[LogWriter]) -> None:
        self._writers = writers
        #: Reads on worker threads that bring a cursor's record into the page cache, by
        #: partition: at most one each.
        self._warming: dict[int, asyncio.Task[Any]] = {}

    def timestamp_ms(self, partition: int, offset: int) -> float | None:
        """The publish time (ms) of ``partition``'s record at ``offset``; now when it
        cannot be read; ``None`` while it is not in the page cache (a read that brings
        it in is started). One read: callers cache it per cursor."""
        writer = self._writers[partition]
        try:
            batches = writer.read_nowait(offset, 1)
        except Exception:  # a damaged or deleted segment: report no age rather than fail
            logger.debug("cannot read offset %d for its timestamp", offset, exc_info=True)
            return time.time() * 1000
        if batches is None:
            # Not from the exporter's thread building samples after the loop stopped.
            if partition not in self._warming and running_loop() is not None:
                warming = asyncio.create_task(writer.read_cold(offset, 1))
                self._warming[partition] = warming
                warming.add_done_callback(functools.partial(self._warmed, partition))
            return None
        return _timestamp_in(batches, offset)

    async def timestamp_at(self, partition: int, offset: int) -> float:
        """The publish time (ms) of ``partition``'s record at ``offset``; now when it
        cannot be read. It waits for a cold read: for ``status``, not for every
        heartbeat."""
        try:
            batches = await self._writers[partition].aread(offset, 1)
        except Exception:  # a damaged or deleted segment: report no age rather than fail
            logger.debug("cannot read offset %d for its timestamp", offset, exc_info=True)
            return time.time() * 1000
        return _timestamp_in(batches, offset)

    def cancel(self) -> None:
        """Stop waiting for the reads started (their threads' reads run to their end)."""
        for warming in self._warming.values():
            warming.cancel()

    def _warmed(self, partition: int, task: asyncio.Task[Any]) -> None:
        self._warming.pop(partition, None)
        error = None if task.cancelled() else task.exception()  # retrieved: logged only
        if error is not None:
            logger.debug("reading partition %d's cursor record failed", partition, exc_info=error)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _timestamp_in(batches: list[RecordBatch], offset: int) -> float:
    """The publish time (ms) of the record at ``offset`` in ``batches`` (a read from
    it); now when they do not hold it."""
    if not batches or not batches[0].base_offset <= offset < batches[0].next_offset:
        return time.time() * 1000
    return float(batches[0].timestamps()[offset - batches[0].base_offset])
