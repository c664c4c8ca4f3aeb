"""One topic partition: its log writer and its idempotent-producer state.

Role: the asyncio shell around :class:`broker.producers.ProducerTable`. ``append`` validates
a batch, asks the table, and appends, answers from the table, waits for an in-flight twin,
or rejects. A retry appended before the table's window is answered as a duplicate at
offsets -1 (:data:`UNKNOWN_OFFSETS`): it is in the log, but where is no longer known.

The table survives restarts: ``aclose`` writes a snapshot (atomic) once every append has
settled, and ``open`` restores it and replays the batches after it from the log, so a crash
(no snapshot written) costs a longer scan, never a lost dedup entry. Without a snapshot the
scan starts at the log's first retained offset, so a producer's ``first_sequence`` becomes
its lowest retained sequence.

Snapshot file: ``<topic dir>/<partition>.producers.json`` =
``{"offset": N, "producers": {...}}`` (:meth:`ProducerTable.snapshot`); it reflects every
batch below ``offset``. Snapshots from before ``first_sequence`` or ``last_append_ms``
existed still open.

Expiry: a commit stamps the producer with the partition's clock (wall-clock ms, shared with
the log); :meth:`Partition.expire_producers`, called by the retention pass, forgets the
producers idle longer than ``producer_expiry_ms``. A producer met again only in the log
scan of ``open`` is stamped with the open time, not with its batch's ``max_timestamp_ms``:
record timestamps are the client's (0 by default in ``encode_columns``, event time from the
Spark sink), and trusting them would forget a live producer at the first pass after a crash,
so that its next retry were appended twice. The cost is that state found by a scan lives one
expiry period past the restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from broker.errors import ProducerSequenceError, ShuttingDownError
from broker.producers import (
    Admit,
    AppendedLongAgo,
    Duplicate,
    InFlight,
    OutOfSequence,
    ProducerTable,
)
from wal import AppendResult, FileSystem, Log, LogConfig, LogWriter, RecordBatch
from wal.fdcache import FileCache
from wal.log import Clock, wall_clock_ms

logger = logging.getLogger(__name__)

_SCAN_BYTES = 8 << 20

#: The offsets of a duplicate appended too long ago for the table to remember them.
UNKNOWN_OFFSETS = AppendResult(-1, -1)


class Partition:
    """One partition. Task-safe on one event loop.

    Args:
        index: The partition's number in its topic.
        writer: Its log's writer.
        table: Its producer state.
        snapshot: Where ``aclose`` writes the producer snapshot.
        fs: The file system.
        clock: Wall-clock ms since the epoch, stamping commits and judging expiry. Default:
            the system clock.
    """

    def __init__(
        self,
        index: int,
        writer: LogWriter,
        table: ProducerTable,
        snapshot: str,
        fs: FileSystem,
        *,
        clock: Clock = wall_clock_ms,
    ) -> None:
        self.index = index
        self.writer = writer
        self._table = table
        self._snapshot = snapshot
        self._fs = fs
        self._clock = clock
        self._in_flight: dict[tuple[int, int], asyncio.Future[AppendResult]] = {}
        self._pending = 0
        self._settled = asyncio.Event()
        self._settled.set()
        self._closing = False

    @classmethod
    async def open(
        cls,
        index: int,
        topic_dir: str,
        config: LogConfig,
        fs: FileSystem,
        *,
        clock: Clock | None = None,
        files: FileCache | None = None,
    ) -> Partition:
        """Open the partition's log and rebuild its producer state.

        ``clock`` (wall-clock ms; default the system clock) serves the log (rolling,
        retention) and the producer table (commit stamps, expiry) alike; ``files`` is the
        broker's descriptor cache (default: one of the log's own).
        """
        clock = clock or wall_clock_ms
        path = os.path.join(topic_dir, str(index))
        writer = await LogWriter.open(path, config, fs=fs, clock=clock, files=files)
        snapshot = os.path.join(topic_dir, f"{index}.producers.json")
        try:
            table = await asyncio.to_thread(_rebuild, writer.log, snapshot, fs, clock())
        except BaseException:
            await writer.aclose()
            raise
        return cls(index, writer, table, snapshot, fs, clock=clock)

    @property
    def log(self) -> Log:
        """The partition's log (read-only use)."""
        return self.writer.log

    async def append(self, data: bytes) -> tuple[AppendResult, bool]:
        """Append a batch unless it is a retry; return its offsets and whether it was one.

        A retry of a batch appended before the producer table's window returns
        :data:`UNKNOWN_OFFSETS` (-1, -1) and ``True``.

        Raises:
            InvalidBatchError: the batch is malformed or too large.
            ProducerSequenceError: a sequence gap, a batch straddling the next expected
                sequence, or one below the producer's first appended sequence.
            ShuttingDownError: the partition is closing.
        """
        if self._closing:
            raise ShuttingDownError()
        batch = self.writer.log.validate(data)
        pid, seq = batch.producer_id, batch.base_sequence
        decision = self._table.admit(pid, seq, batch.record_count)
        if isinstance(decision, Duplicate):
            return AppendResult(decision.first_offset, decision.last_offset), True
        if isinstance(decision, AppendedLongAgo):
            return UNKNOWN_OFFSETS, True
        if isinstance(decision, InFlight):
            return await asyncio.shield(self._in_flight[(pid, seq)]), True
        if isinstance(decision, OutOfSequence):
            raise ProducerSequenceError(pid, decision.expected, decision.got)
        assert isinstance(decision, Admit)
        return await self._append_admitted(batch, pid, seq), False

    async def _append_admitted(self, batch: RecordBatch, pid: int, seq: int) -> AppendResult:
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        if pid >= 0:
            self._in_flight[(pid, seq)] = future
        self._pending += 1
        self._settled.clear()
        try:
            result = await self.writer.append(batch)
        except BaseException as exc:
            self._table.release(pid, seq)
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved here, so no "never retrieved" warning
            raise
        else:
            at_ms = self._clock()
            self._table.commit(pid, seq, result.first_offset, result.last_offset, at_ms=at_ms)
            future.set_result(result)
            return result
        finally:
            self._in_flight.pop((pid, seq), None)
            self._pending -= 1
            if not self._pending:
                self._settled.set()

    def expire_producers(self, max_idle_ms: int) -> int:
        """Forget the producers with nothing in flight and no append for over
        ``max_idle_ms`` by the partition's clock (:meth:`ProducerTable.expire`).

        Returns:
            How many were forgotten.
        """
        return self._table.expire(self._clock(), max_idle_ms)

    async def aclose(self) -> None:
        """Refuse new appends, let the others settle, close the log, then snapshot."""
        self._closing = True
        await self._settled.wait()
        await self.writer.aclose()
        if self.writer.log.failure is None:
            doc = {"offset": self.writer.head, "producers": self._table.snapshot()}
            await asyncio.to_thread(self._fs.atomic_write, self._snapshot, json.dumps(doc).encode())


def _rebuild(log: Log, snapshot: str, fs: FileSystem, now_ms: int) -> ProducerTable:
    """The producer table: the snapshot if it is usable, then every batch after it.

    Producers without a saved ``last_append_ms``, and batches found in the log, count as
    appended at ``now_ms`` (see the module docstring: never expire state early).
    """
    table, start = ProducerTable(), log.first_offset
    if fs.exists(snapshot):
        try:
            doc = json.loads(fs.read_file(snapshot))
            offset = int(doc["offset"])
            if log.first_offset <= offset <= log.head:
                table, start = ProducerTable.restore(doc["producers"], now_ms=now_ms), offset
            else:
                logger.warning(
                    "%s covers offset %d outside the log [%d, %d); rescanning",
                    snapshot,
                    offset,
                    log.first_offset,
                    log.head,
                )
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("%s is unusable (%s); rescanning the log", snapshot, exc)
    offset = start  # a batch boundary: the head at the snapshot, or the first offset
    while offset < log.head:
        batches = log.read(offset, _SCAN_BYTES)
        for b in batches:
            table.observe(
                b.producer_id, b.base_sequence, b.base_offset, b.last_offset, at_ms=now_ms
            )
        offset = batches[-1].next_offset
    return table
