"""One topic partition: its log writer and its idempotent-producer state.

Role: the asyncio shell around :class:`broker.producers.ProducerTable`. ``append`` validates
a batch, asks the table, and appends, answers from the table, waits for an in-flight twin,
or rejects. A retry appended before the table's window is answered as a duplicate at
offsets -1 (:data:`UNKNOWN_OFFSETS`): it is in the log, but where is no longer known.

Cancellation: an admitted append runs to its end whatever happens to its caller (a Publish
whose deadline expires or whose connection drops while its batch waits in the log writer):
the writer appends the batch anyway and settles it through the append's ``on_done``
callback, in the same loop callback that acknowledges it (no task of its own, so a publish
is answered one loop turn after its ``fdatasync`` completes); a cancelled caller waits
for that, then re-raises its cancellation. Its dedup entry must be committed: the
client's retry of the same bytes is then answered as a duplicate (``InFlight`` while the
first copy is still being written, ``Duplicate`` after), never appended a second time.
A twin waiting on the first copy never sees a cancellation that is not its own: a gRPC
handler that raises ``CancelledError`` sends no status, and its client would wait out
its deadline.

The table survives restarts: a snapshot is written (atomically: temp, fsync, rename, fsync
of the directory) at every segment roll, after every ``snapshot_bytes`` appended, and by
``aclose`` once every append has settled; ``open`` restores it and replays the batches
after it from the log. A crash therefore costs a scan of at most about ``snapshot_bytes``
(or one segment), never a lost dedup entry. Without a usable snapshot the scan starts at
the log's first retained offset, so a producer's ``first_sequence`` becomes its lowest
retained sequence.

A periodic snapshot never blocks appends: it runs as its own task. It is taken at the
high-water mark ``N`` (durable under the ``always`` and ``interval`` policies): it first
waits for the appends that were in flight when ``N`` was read (every batch below ``N`` is
committed to the table or was one of them), then keeps only the table's rows below ``N``
(:meth:`ProducerTable.snapshot`), as batches above ``N`` may be committed meanwhile.

A snapshot is trusted only while it is not ahead of the log. Example: under fsync
``never`` a snapshot says ``offset`` 1,000, then a power cut loses the log's tail and
recovery truncates the log to 800. The rows for 800-999 describe batches that are gone, and
producers will append other batches there: ``open`` deletes that snapshot (and fsyncs the
directory, so a second crash cannot bring it back) and rescans the whole log. A
snapshot below the first retained offset (retention went past it) is discarded the same way.

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
import functools
import json
import logging
import os
from collections.abc import Callable, Iterable
from typing import Protocol

from broker.errors import ProducerSequenceError, ShuttingDownError, TopicRefusedError
from broker.producers import (
    DEFAULT_MAX_PRODUCERS,
    Admit,
    AppendedLongAgo,
    Duplicate,
    InFlight,
    OutOfSequence,
    ProducerTable,
)
from cluster.ownership import Refusal
from wal import AppendResult, FileSystem, Log, LogConfig, LogWriter, run_to_end
from wal.fdcache import FileCache
from wal.log import Clock, wall_clock_ms

logger = logging.getLogger(__name__)

_SCAN_BYTES = 8 << 20
#: Default of ``snapshot_bytes``: a snapshot after every 32 MiB appended to a partition.
DEFAULT_SNAPSHOT_BYTES = 32 << 20

#: The offsets of a duplicate appended too long ago for the table to remember them.
UNKNOWN_OFFSETS = AppendResult(-1, -1)


def _ignore(_result: AppendResult) -> None:
    """The default ``on_appended`` of :meth:`Partition.append`."""


class CommitGate(Protocol):
    """A replicated topic's leader as its partitions see it
    (:class:`broker.replica.leader.LeaderTopic`): whether a publish may be appended at
    all, and when an appended one may be acknowledged."""

    def refusal(self) -> Refusal | None:
        """``None``, or why no publish may be appended now (``not-enough-replicas``)."""
        ...

    async def committed(self, partition: int, last_offset: int) -> None:
        """Return once ``last_offset`` is below the partition's high-water mark.

        Raises:
            ReplicationOutcomeUnknownError: leadership was lost, the in-sync set fell
                below ``min_insync``, or the leader stopped first.
        """
        ...


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
        snapshot_bytes: Snapshot the producer table after this many bytes were appended
            since the last snapshot, and at every segment roll. Default 32 MiB.
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
        snapshot_bytes: int = DEFAULT_SNAPSHOT_BYTES,
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
        self._snapshot_bytes = snapshot_bytes
        self._snapshot_at = writer.log.active_position  # at the last snapshot (or open)
        self._snapshot_task: asyncio.Task[None] | None = None
        self._snapshot_lock = asyncio.Lock()
        #: Snapshots written since the partition opened (the one by ``aclose`` included).
        self.snapshots_written = 0
        #: A replicated topic's leader (set while it leads): it may refuse a publish
        #: before anything is appended, and an appended one is acknowledged only once
        #: committed. ``None`` (factor 1, a single broker): acknowledged once durable.
        self.gate: CommitGate | None = None
        writer.add_listener(self._on_durable)

    @classmethod
    async def open(
        cls,
        index: int,
        topic_dir: str,
        config: LogConfig,
        fs: FileSystem,
        *,
        clock: Clock | None = None,
        snapshot_bytes: int = DEFAULT_SNAPSHOT_BYTES,
        files: FileCache | None = None,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
    ) -> Partition:
        """Open the partition's log and rebuild its producer state.

        ``clock`` (wall-clock ms; default the system clock) serves the log (rolling,
        retention) and the producer table (commit stamps, expiry) alike.
        ``snapshot_bytes``: see the class. ``files`` is the broker's descriptor cache
        (default: one of the log's own). ``max_producers`` caps the producer table
        (:class:`ProducerTable`).
        """
        clock = clock or wall_clock_ms
        path = os.path.join(topic_dir, str(index))
        writer = await LogWriter.open(path, config, fs=fs, clock=clock, files=files)
        snapshot = os.path.join(topic_dir, f"{index}.producers.json")
        try:
            rebuild = asyncio.to_thread(_rebuild, writer.log, snapshot, fs, clock(), max_producers)
            table = await run_to_end(rebuild)
        except BaseException:
            await writer.aclose()
            raise
        return cls(index, writer, table, snapshot, fs, clock=clock, snapshot_bytes=snapshot_bytes)

    @property
    def log(self) -> Log:
        """The partition's log (read-only use)."""
        return self.writer.log

    @property
    def in_flight_hint(self) -> int:
        """Batches a producer should keep in flight here (``PublishResponse.
        in_flight_hint``, before the broker's own load says 1): the log's
        :attr:`wal.commit_cost.CommitCost.in_flight_hint`, but 1 while replicated (a
        :attr:`gate` set). There an answer waits for every in-sync follower, and each
        batch in flight costs every replica a sync of its own: at 1,000 msg/s on three
        brokers, records sharing one batch while one is answered reached their consumer
        sooner (e2e p50 3.4-4.3 ms against 4.4-4.9 ms with 2, and worse with 3 or 4;
        docs/benchmarks.md, Replication)."""
        if self.gate is not None:
            return 1
        return self.writer.commit_cost.in_flight_hint

    async def append(
        self,
        data: bytes,
        on_appended: Callable[[AppendResult], None] = _ignore,
        *,
        on_queued: Callable[[], None] | None = None,
    ) -> tuple[AppendResult, bool]:
        """Append a batch unless it is a retry; return its offsets and whether it was one.

        A retry of a batch appended before the producer table's window returns
        :data:`UNKNOWN_OFFSETS` (-1, -1) and ``True``; a retry of a batch still being
        appended waits for it and returns its offsets and ``True``. Once admitted, the
        append runs to its end even if the caller is cancelled (see the module docstring).

        Args:
            data: The encoded batch (untrusted: validated here).
            on_appended: Called with the offsets once this call appended the batch (never
                for a retry), even if the caller was cancelled meanwhile: for counting.
            on_queued: Called once the batch has its place in the log writer's queue
                (``LogWriter.append``), or, for a retry of a batch still being appended,
                before waiting for that copy (it is queued already): a caller keeping its
                batches in order may go on with the next one. Not called for a batch
                refused, or answered at once as a duplicate.

        Replicated (:attr:`gate` set): refused first, before anything is appended, when
        the gate says so; the answer (an append's, or a retry's) waits until its records
        are committed. A caller cancelled while it waits changes nothing: the batch is
        appended and committed all the same.

        Raises:
            InvalidBatchError: the batch is malformed or too large.
            ProducerSequenceError: a sequence gap, a batch straddling the next expected
                sequence, or one below the producer's first appended sequence.
            ShuttingDownError: the partition is closing.
            TopicRefusedError: (replicated) too few in-sync replicas; nothing appended.
            ReplicationOutcomeUnknownError: (replicated) appended, but leadership was
                lost before it was committed.
        """
        if self._closing:
            raise ShuttingDownError()
        gate = self.gate
        if gate is not None:
            refusal = gate.refusal()
            if refusal is not None:
                raise TopicRefusedError(refusal)
        batch = self.writer.log.validate(data)
        pid, seq = batch.producer_id, batch.base_sequence
        decision = self._table.admit(pid, seq, batch.record_count)
        if isinstance(decision, Duplicate):
            if gate is not None:  # the first copy may still wait for the replicas
                await gate.committed(self.index, decision.last_offset)
            return AppendResult(decision.first_offset, decision.last_offset), True
        if isinstance(decision, AppendedLongAgo):
            return UNKNOWN_OFFSETS, True
        if isinstance(decision, InFlight):
            if on_queued is not None:
                on_queued()
            twin = await asyncio.shield(self._in_flight[(pid, seq)])
            if gate is not None:
                await gate.committed(self.index, twin.last_offset)
            return twin, True
        if isinstance(decision, OutOfSequence):
            raise ProducerSequenceError(pid, decision.expected, decision.got)
        assert isinstance(decision, Admit)
        future = self._track(pid, seq)
        settle = functools.partial(self._settle, pid, seq, future, on_appended)
        try:
            result = await self.writer.append(batch, on_done=settle, on_queued=on_queued)
        except asyncio.CancelledError:
            await asyncio.wait([future])  # settled by the writer: wait for it, then go
            raise
        if gate is not None:
            await gate.committed(self.index, result.last_offset)
        return result, False

    def _track(self, pid: int, seq: int) -> asyncio.Future[AppendResult]:
        """Register an admitted batch as in flight, at once: a twin admitted ``InFlight``
        while it is written must find its future (as ``aclose`` must find it pending)."""
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        if pid >= 0:
            self._in_flight[(pid, seq)] = future
        self._pending += 1
        self._settled.clear()
        return future

    def _settle(
        self,
        pid: int,
        seq: int,
        future: asyncio.Future[AppendResult],
        on_appended: Callable[[AppendResult], None],
        outcome: AppendResult | BaseException,
    ) -> None:
        """How a batch :meth:`_track` registered ended, told by the log writer in the
        callback that acknowledges it (whatever happened to the caller meanwhile): commit
        its reservation (or release it if the append failed), tell ``on_appended`` and
        answer its twins through ``future``."""
        try:
            if isinstance(outcome, BaseException):
                self._table.release(pid, seq)
                _fail_twins(future, outcome)
                return
            at_ms = self._clock()
            self._table.commit(pid, seq, outcome.first_offset, outcome.last_offset, at_ms=at_ms)
            future.set_result(outcome)
            on_appended(outcome)
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

    @property
    def producer_count(self) -> int:
        """Idempotent producers the partition remembers."""
        return len(self._table)

    def take_evicted_producers(self) -> int:
        """How many producers the table's cap forgot since the last call."""
        return self._table.take_evicted()

    # -- a follower's (broker.replica.fetcher) ----------------------------------------

    def note_replicated(self, batches: Iterable[tuple[int, int, int, int]]) -> None:
        """Learn the producers of a leader's batches a follower is about to append,
        ``(producer_id, base_sequence, first_offset, last_offset)`` each, so that the
        table is current when this broker is promoted (no scan then).

        Noted before the append: a snapshot keeps only rows below the high-water mark,
        which the append has not reached yet; if the append fails, the caller calls
        :meth:`reload_producers`.
        """
        at_ms = self._clock()
        for pid, seq, first, last in batches:
            self._table.observe(pid, seq, first, last, at_ms=at_ms)

    async def reload_producers(self) -> None:
        """Rebuild the producer table from the log (and the snapshot if it is not ahead
        of it), after a follower cut its log back or emptied it: the table may hold
        batches that are gone. Then snapshot it at the head, so that no older snapshot
        that covers offsets the log holds again with other batches is ever restored; if
        that write fails (a full disk), the old snapshot is removed instead (the next
        open scans the log)."""
        if self._snapshot_task is not None:
            await asyncio.shield(self._snapshot_task)  # it never raises
        log, limit = self.writer.log, self._table.max_producers
        async with self._snapshot_lock:
            rebuild = asyncio.to_thread(
                _rebuild, log, self._snapshot, self._fs, self._clock(), limit
            )
            self._table = await run_to_end(rebuild)
        try:
            await self._write_snapshot(self.writer.head)
        except OSError as exc:
            logger.warning("%s: producer snapshot failed (%s); removing it", self._snapshot, exc)
            await run_to_end(asyncio.to_thread(_remove_file, self._fs, self._snapshot))

    async def aclose(self) -> None:
        """Refuse new appends, let the others settle (and a periodic snapshot finish),
        close the log, then snapshot."""
        self._closing = True
        await self._settled.wait()
        if self._snapshot_task is not None:
            await asyncio.shield(self._snapshot_task)  # it never raises; one writer at a time
        self.writer.remove_listener(self._on_durable)
        await self.writer.aclose()
        if self.writer.log.failure is None:
            await self._write_snapshot(self.writer.head)

    # -- periodic snapshots (see the module docstring) ----------------------------------

    def _on_durable(self, _high_water_mark: int) -> None:
        """After each group commit: start a snapshot after a roll or ``snapshot_bytes``."""
        if self._snapshot_task is not None or self._closing:
            return
        # The active segment only: a roll changes its base, and retention never touches it,
        # so this is O(1) per commit however many segments the log has.
        now = self.writer.log.active_position
        base, size = now
        last_base, last_size = self._snapshot_at
        if base == last_base and size - last_size < self._snapshot_bytes:
            return
        self._snapshot_at = now
        self._snapshot_task = asyncio.create_task(
            self._snapshot_in_background(), name=f"producer-snapshot:{self._snapshot}"
        )

    async def _snapshot_in_background(self) -> None:
        try:
            await self.save_snapshot()
        except Exception as exc:  # a missed snapshot costs a longer scan, nothing more
            logger.warning("%s: producer snapshot failed: %s", self._snapshot, exc)
        finally:
            self._snapshot_task = None

    async def save_snapshot(self) -> int:
        """Snapshot the producer table at the high-water mark, without stopping appends.

        Returns:
            The snapshot's offset: it reflects every batch below it.
        """
        offset = self.writer.high_water_mark
        settling = list(self._in_flight.values())  # every uncommitted batch below offset
        if settling:
            await asyncio.wait(settling)
        await self._write_snapshot(offset)
        return offset

    async def _write_snapshot(self, offset: int) -> None:
        async with self._snapshot_lock:  # one writer of the file (and of its temp) at a time
            doc = {"offset": offset, "producers": self._table.snapshot(below=offset)}
            await run_to_end(asyncio.to_thread(_write_json, self._fs, self._snapshot, doc))
            self.snapshots_written += 1


def _remove_file(fs: FileSystem, path: str) -> None:
    """Remove ``path`` (if there) and sync its directory."""
    fs.remove(path)
    fs.fsync_dir(os.path.dirname(path))


def _write_json(fs: FileSystem, path: str, doc: object) -> None:
    fs.atomic_write(path, json.dumps(doc, separators=(",", ":")).encode())


def _fail_twins(future: asyncio.Future[AppendResult], exc: BaseException) -> None:
    """Fail the twins of a batch whose append failed with ``exc``.

    Twins get a ``CancelledError`` as :class:`ShuttingDownError`: only the first copy's
    caller being cancelled before its batch was queued (it waited for room in the writer's
    queue; nothing was written) or the loop going away can end an append so, and a twin's
    handler that raised it would send its client no status at all.
    """
    if future.done():
        return
    future.set_exception(exc if isinstance(exc, Exception) else ShuttingDownError())
    future.exception()  # retrieved here, so no "never retrieved" warning


def _rebuild(
    log: Log, snapshot: str, fs: FileSystem, now_ms: int, max_producers: int
) -> ProducerTable:
    """The producer table: the snapshot if it is usable, then every batch after it.

    Producers without a saved ``last_append_ms``, and batches found in the log, count as
    appended at ``now_ms`` (see the module docstring: never expire state early). The
    table is built under its cap, ``max_producers``, as it will run.
    """
    table, start = ProducerTable(max_producers), log.first_offset
    if fs.exists(snapshot):
        restored = _restore(log, snapshot, fs, now_ms, max_producers)
        if restored is None:  # never trust it again, whatever the log becomes
            fs.remove(snapshot)
            fs.fsync_dir(os.path.dirname(snapshot))
        else:
            table, start = restored
    offset = start  # a batch boundary: the head at the snapshot, or the first offset
    while offset < log.head:
        batches = log.read(offset, _SCAN_BYTES)
        for b in batches:
            table.observe(
                b.producer_id, b.base_sequence, b.base_offset, b.last_offset, at_ms=now_ms
            )
        offset = batches[-1].next_offset
    return table


def _restore(
    log: Log, snapshot: str, fs: FileSystem, now_ms: int, max_producers: int
) -> tuple[ProducerTable, int] | None:
    """The snapshot's table and offset, or ``None`` when it is damaged or covers offsets
    outside the log (ahead of a log whose tail recovery cut, or behind retention)."""
    try:
        doc = json.loads(fs.read_file(snapshot))
        offset = int(doc["offset"])
        if not log.first_offset <= offset <= log.head:
            logger.warning(
                "%s covers offset %d outside the log [%d, %d); discarding it, rescanning",
                snapshot,
                offset,
                log.first_offset,
                log.head,
            )
            return None
        table = ProducerTable.restore(doc["producers"], now_ms=now_ms, max_producers=max_producers)
        return table, offset
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("%s is unusable (%s); discarding it, rescanning the log", snapshot, exc)
        return None
