"""One subscription of one topic: its cursors, its consumer and the task that feeds it.

Owns :class:`Subscription` (per-partition acknowledged state, read positions and the
dispatch task) and :class:`ConsumerSession` (one attached consumer: its credit and its
outbox of :class:`Delivery` items).

The dispatch task is the only writer of read positions. It sleeps on one wake-up event that
is set by every change that can let it send: the high-water mark of a partition advancing
(the notifier: the log calls back only after fsync, so only durable records are ever sent),
credit granted, acks freeing room under ``max_unacked``, a consumer attaching, a seek. The
task clears the event *before* it looks at the state, so a wake-up that arrives while it
works is never lost, and many wake-ups coalesce into one pass.

The heartbeat (:mod:`dispatcher.lag`) is the safety net behind that fast path: the
registry calls :meth:`Subscription.tick` every heartbeat interval. A tick restarts a dispatch
task that died, re-polls when records are ready and the consumer has room (counted apart
from the passes the notifier triggers), and flags the subscription STALLED when such a
backlog makes no progress for the stall timeout.

Invariants:
- A record is sent only below the partition's high-water mark (durable, DESIGN section 2).
- Batches are never split to fit: credit and the ``max_unacked`` cap are checked before each
  batch, and the rest of that batch goes whole. So a consumer gets at most one batch more
  than its credit, and at most one batch more than the cap is in flight. Splitting would
  send (and make the client decode) the same batch bytes once per slice.
- The cursor of a partition is its first unacknowledged offset; records at or above it
  that were not acknowledged are sent again to the next consumer, flagged as redeliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dispatcher.acks import AckRanges, Range
from dispatcher.errors import InvalidAckError, InvalidSubscriptionError, SubscriptionBusyError
from dispatcher.lag import (
    DEFAULT_INTERVAL_S,
    DEFAULT_STALL_TIMEOUT_S,
    IDLE,
    LagMonitor,
    Observation,
    Verdict,
)
from wal import LogWriter

logger = logging.getLogger(__name__)

#: The most ack ranges (holes) kept per partition; acks above them are redelivered instead.
MAX_ACK_RANGES = 10_000
_consumer_ids = itertools.count(1)


class SubscriptionType(enum.Enum):
    """How a subscription shares its records among consumers."""

    EXCLUSIVE = "exclusive"


class InitialPosition(enum.Enum):
    """Where a new subscription starts."""

    EARLIEST = "earliest"
    LATEST = "latest"


@dataclass(frozen=True, slots=True)
class Delivery:
    """Records ``[from_offset, to_offset)`` of one partition, inside one encoded batch.

    ``redeliveries`` maps an offset that was sent before to how often it was sent before.
    """

    partition: int
    batch: bytes
    from_offset: int
    to_offset: int
    redeliveries: dict[int, int]

    @property
    def count(self) -> int:
        """How many records this delivery carries."""
        return self.to_offset - self.from_offset


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One partition of a subscription, as ``lag`` reports it."""

    partition: int
    cursor: int  # the first offset not acknowledged
    head: int  # the next offset to be written (durable records lie below it)
    lag: int  # records at or above the cursor not yet acknowledged
    in_flight: int  # sent and not yet acknowledged
    oldest_unacked_age_s: float  # age of the record at the cursor (0 when caught up)
    state: str  # CAUGHT_UP | LAGGING | STALLED | NO_CONSUMER
    reason: str  # why, in words


@dataclass(frozen=True, slots=True)
class SubscriptionStatus:
    """A subscription's state for admin replies."""

    topic: str
    name: str
    type: SubscriptionType
    consumers: tuple[str, ...]
    partitions: tuple[PartitionStatus, ...]

    @property
    def lag(self) -> int:
        """Records not yet acknowledged, over every partition."""
        return sum(p.lag for p in self.partitions)


class ConsumerSession:
    """One attached consumer: the credit it granted and the deliveries waiting for it."""

    __slots__ = ("consumer_id", "credit", "name", "outbox")

    def __init__(self, name: str, credit: int) -> None:
        self.consumer_id = f"c{next(_consumer_ids)}"
        self.name = name or self.consumer_id
        self.credit = credit
        #: Bounded by the credit: the dispatch task never puts more than was granted.
        self.outbox: asyncio.Queue[Delivery | None] = asyncio.Queue()

    async def next(self) -> Delivery | None:
        """The next delivery, or ``None`` once the subscription has let this consumer go."""
        return await self.outbox.get()


class _Partition:
    """Dispatch state of one partition."""

    __slots__ = ("acks", "attempts", "in_flight", "read_pos", "sent_mark")

    def __init__(self, acks: AckRanges) -> None:
        self.acks = acks
        self.read_pos = acks.cursor  # next offset to send
        self.sent_mark = acks.cursor  # every offset below it was sent at least once
        self.in_flight = 0
        self.attempts: dict[int, int] = {}  # offset -> times sent, for resent offsets only

    def lag(self, head: int) -> int:
        """Records below ``head`` at or above the cursor not yet acknowledged."""
        return max(0, head - self.acks.cursor - self.acks.acked_count(head))

    def recount(self) -> int:
        """Recompute ``in_flight``; return the change."""
        self.read_pos = max(self.read_pos, self.acks.cursor)
        before = self.in_flight
        self.in_flight = self.read_pos - self.acks.cursor - self.acks.acked_count(self.read_pos)
        if self.attempts and min(self.attempts) < self.acks.cursor:
            self.attempts = {o: n for o, n in self.attempts.items() if o >= self.acks.cursor}
        return self.in_flight - before


class Subscription:
    """A named subscription of one topic. Use from one event loop.

    Args:
        topic: The topic's name.
        name: The subscription's name.
        writers: The topic's partitions, in order.
        acks: Acknowledged state per partition (restored, or new at the initial position).
        max_unacked: The most records in flight at once.
        max_batch_bytes: Soft limit on the bytes one read takes from a log (at least one
            batch is read).
        on_change: Called (on the loop) when acknowledged state changed and needs saving.
        clock: Wall-clock seconds, for the age of the oldest unacknowledged record.
        heartbeat_interval_s: How often the registry should call :meth:`tick`, seconds.
        stall_timeout_s: A backlog with room and no progress for this long is STALLED.
    """

    def __init__(
        self,
        topic: str,
        name: str,
        writers: Sequence[LogWriter],
        acks: Sequence[AckRanges],
        *,
        type_: SubscriptionType = SubscriptionType.EXCLUSIVE,
        max_unacked: int = 1_000,
        max_batch_bytes: int = 256 << 10,
        on_change: Callable[[Subscription], None] = lambda _s: None,
        clock: Callable[[], float] = time.time,
        heartbeat_interval_s: float = DEFAULT_INTERVAL_S,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    ) -> None:
        if len(writers) != len(acks):
            raise ValueError(f"{len(writers)} partitions but {len(acks)} cursors")
        self.topic = topic
        self.name = name
        self.type = type_
        self._writers = list(writers)
        self._parts = [_Partition(a) for a in acks]
        self._max_unacked = max_unacked
        self._max_batch_bytes = max_batch_bytes
        self._on_change = on_change
        self._clock = clock
        self._in_flight = 0
        self._session: ConsumerSession | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_partition = 0
        #: How often the heartbeat should tick this subscription, seconds.
        self.heartbeat_interval_s = heartbeat_interval_s
        self._monitor = LagMonitor(stall_timeout_s)
        self._heartbeat_poll = False
        self._last_error = ""
        self._sent_total = 0
        self._acked_total = 0
        #: Dispatch passes the notifier (or credit, acks, attach) triggered.
        self.notifier_polls = 0
        #: Dispatch passes the heartbeat triggered.
        self.heartbeat_polls = 0
        #: Dispatch tasks the heartbeat found dead and restarted.
        self.task_restarts = 0
        #: The last tick's verdict.
        self.verdict = IDLE

    @property
    def partition_count(self) -> int:
        """How many partitions the subscription's topic has."""
        return len(self._parts)

    @property
    def max_unacked(self) -> int:
        """The most records in flight at once."""
        return self._max_unacked

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the dispatch task and listen to every partition's high-water mark."""
        for writer in self._writers:
            writer.add_listener(self._on_advance)
        self._start_task()

    def _start_task(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"dispatch {self.topic}/{self.name}")

    def tick(self, now: float) -> Verdict:
        """The heartbeat: restart a dead dispatch task, re-poll a backlog that has room,
        judge whether the subscription is STALLED. ``now`` is monotonic seconds."""
        task = self._task
        if task is not None and task.done():
            died = "was cancelled" if task.cancelled() else f"failed: {task.exception()!r}"
            logger.error(
                "%s/%s: the dispatch task %s; the heartbeat restarts it",
                self.topic,
                self.name,
                died,
            )
            self.task_restarts += 1
            self._start_task()
        ready = 0
        for part, writer in zip(self._parts, self._writers, strict=True):
            ready += max(0, writer.high_water_mark - part.read_pos)
        if not ready and self._monitor.idle:
            self.verdict = IDLE  # the common case, kept cheap: 1,000 idle subscriptions
            return IDLE
        session = self._session
        seen = Observation(
            ready=ready,
            has_room=session is not None and self._room(session) > 0,
            progress=self._sent_total + self._acked_total,
            last_error=self._last_error,
        )
        self.verdict = self._monitor.tick(seen, now)
        if self.verdict.repoll:
            self._heartbeat_poll = True
            self._wake.set()
        return self.verdict

    async def aclose(self) -> None:
        """Stop dispatching and let the consumer go. Idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        for writer in self._writers:
            with contextlib.suppress(ValueError):
                writer.remove_listener(self._on_advance)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self._session is not None:
            self._session.outbox.put_nowait(None)
            self._session = None

    def _on_advance(self, _hwm: int) -> None:
        self._wake.set()

    # -- consumers --------------------------------------------------------------------

    def attach(self, consumer_name: str, credit: int) -> ConsumerSession:
        """Attach a consumer that may receive ``credit`` records now.

        Raises:
            SubscriptionBusyError: another consumer holds this exclusive subscription.
        """
        if self._session is not None:
            raise SubscriptionBusyError(self.topic, self.name, self._session.name)
        session = ConsumerSession(consumer_name, credit)
        self._session = session
        self._wake.set()
        logger.info("%s/%s: consumer %s attached", self.topic, self.name, session.name)
        return session

    def detach(self, session: ConsumerSession) -> None:
        """Let ``session`` go; what it did not acknowledge goes to the next consumer."""
        if self._session is not session:
            return
        self._session = None
        for part in self._parts:
            part.read_pos = part.acks.cursor
            part.recount()
        self._in_flight = 0
        logger.info("%s/%s: consumer %s detached", self.topic, self.name, session.name)

    def grant(self, session: ConsumerSession, credit: int) -> None:
        """``session`` may receive ``credit`` more records."""
        session.credit += credit
        if session is self._session:
            self._wake.set()

    # -- acknowledgements -------------------------------------------------------------

    def ack(self, partition: int, begin: int, end: int) -> None:
        """Acknowledge the delivered offsets ``[begin, end)`` of ``partition``.

        Raises:
            InvalidSubscriptionError: no such partition, or an empty or negative range.
            InvalidAckError: some of the offsets were never delivered.
        """
        part = self._part(partition)
        if not 0 <= begin < end:
            raise InvalidSubscriptionError("ack", f"[{begin}, {end}) is not an offset range")
        if end > part.sent_mark:
            raise InvalidAckError(partition, end - 1, part.sent_mark)
        self._acked(part, part.acks.ack(begin, end))

    def ack_up_to(self, partition: int, offset: int) -> None:
        """Acknowledge every delivered offset of ``partition`` below ``offset``.

        Raises:
            InvalidSubscriptionError: no such partition.
            InvalidAckError: ``offset`` is past what was delivered.
        """
        part = self._part(partition)
        if offset > part.sent_mark:
            raise InvalidAckError(partition, offset - 1, part.sent_mark)
        self._acked(part, part.acks.ack_up_to(offset))

    def commit(self, partition: int, offset: int) -> int:
        """Acknowledge everything below ``offset``, delivered or not (a reader that pulls
        by offset, like Spark, commits what it processed). Returns the cursor.

        Raises:
            InvalidSubscriptionError: no such partition, or ``offset`` past the head.
        """
        part = self._part(partition)
        head = self._writers[partition].high_water_mark
        if not 0 <= offset <= head:
            raise InvalidSubscriptionError(
                "offset", f"{offset} is outside [0, {head}] on partition {partition}"
            )
        part.sent_mark = max(part.sent_mark, offset)
        self._acked(part, part.acks.ack_up_to(offset))
        return part.acks.cursor

    def _acked(self, part: _Partition, newly: int) -> None:
        if not newly:
            return
        self._acked_total += newly
        self._in_flight += part.recount()
        self._on_change(self)
        self._wake.set()

    def seek(self, offsets: Sequence[int]) -> None:
        """Move every partition's cursor to the given offset, forgetting its acks.

        Offsets are clamped to what the log holds. The attached consumer stays; the next
        records it receives start at the new positions.
        """
        if len(offsets) != len(self._parts):
            raise InvalidSubscriptionError("seek", f"needs {len(self._parts)} offsets")
        for part, writer, offset in zip(self._parts, self._writers, offsets, strict=True):
            target = min(max(offset, writer.first_offset), writer.high_water_mark)
            part.acks.reset(target)
            part.read_pos = target
            part.sent_mark = max(part.sent_mark, target)
            part.attempts.clear()
            self._in_flight += part.recount()
        self._on_change(self)
        self._wake.set()

    def _part(self, partition: int) -> _Partition:
        if not 0 <= partition < len(self._parts):
            raise InvalidSubscriptionError(
                "partition",
                f"{partition} does not exist; topic {self.topic!r} has partitions "
                f"0..{len(self._parts) - 1}",
            )
        return self._parts[partition]

    # -- state ------------------------------------------------------------------------

    def acked_state(self) -> list[tuple[int, list[Range]]]:
        """Per partition: the cursor and the ack ranges above it (what is persisted)."""
        out = []
        for part in self._parts:
            part.acks.trim(MAX_ACK_RANGES)
            out.append((part.acks.cursor, part.acks.ranges()))
        return out

    def sample_key(self) -> tuple[int, ...]:
        """Changes whenever anything :meth:`lag` or the counters report may have changed."""
        return (
            self.notifier_polls,
            self.heartbeat_polls,
            self.task_restarts,
            self.verdict.stalled,
            self._sent_total,
            self._acked_total,
            self._in_flight,
            *(w.high_water_mark for w in self._writers),
        )

    def lag(self) -> list[tuple[int, int, int]]:
        """``(partition, lag, in_flight)`` per partition: the cheap part of :meth:`status`."""
        out = []
        for i, (part, writer) in enumerate(zip(self._parts, self._writers, strict=True)):
            out.append((i, part.lag(writer.high_water_mark), part.in_flight))
        return out

    def status(self) -> SubscriptionStatus:
        """Cursor, head, lag, in-flight records and state per partition."""
        consumers = (self._session.name,) if self._session is not None else ()
        now_ms = self._clock() * 1000
        parts = []
        for i, (part, writer) in enumerate(zip(self._parts, self._writers, strict=True)):
            head = writer.high_water_mark
            cursor = part.acks.cursor
            lag = part.lag(head)
            age = 0.0
            if lag == 0:
                state, reason = "CAUGHT_UP", ""
            else:
                age = max(0.0, (now_ms - _timestamp_at(writer, cursor)) / 1000)
                if self.verdict.stalled and part.read_pos < head:
                    state, reason = "STALLED", self.verdict.reason
                elif consumers:
                    state, reason = "LAGGING", f"{lag} records not yet acknowledged"
                else:
                    state, reason = "NO_CONSUMER", f"{lag} records wait for a consumer"
            parts.append(PartitionStatus(i, cursor, head, lag, part.in_flight, age, state, reason))
        return SubscriptionStatus(self.topic, self.name, self.type, consumers, tuple(parts))

    # -- dispatch ---------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            if self._heartbeat_poll:
                self._heartbeat_poll = False
                self.heartbeat_polls += 1
            else:
                self.notifier_polls += 1
            try:
                sent = self._pump()
            except Exception as exc:  # e.g. a damaged segment: keep the broker up
                if not self._last_error:  # once per failing streak, not once per pass
                    logger.exception(
                        "%s/%s: dispatch failed; the heartbeat retries it every %.3f s",
                        self.topic,
                        self.name,
                        self.heartbeat_interval_s,
                    )
                self._last_error = str(exc) or type(exc).__name__
                sent = False
            else:
                if self._last_error:
                    logger.info("%s/%s: dispatch works again", self.topic, self.name)
                self._last_error = ""
            if sent:
                await asyncio.sleep(0)  # let the consumer's stream and others run
            else:
                await self._wake.wait()

    def _room(self, session: ConsumerSession) -> int:
        return min(session.credit, self._max_unacked - self._in_flight)

    def _pump(self) -> bool:
        """Send what the credit and the unacked cap allow; return whether anything went."""
        session = self._session
        if session is None:
            return False
        count = len(self._parts)
        sent = False
        for i in range(count):
            if self._room(session) <= 0:
                break
            p = (self._next_partition + i) % count
            sent |= self._pump_partition(p, session)
        self._next_partition = (self._next_partition + 1) % count
        return sent

    def _pump_partition(self, p: int, session: ConsumerSession) -> bool:
        part, writer = self._parts[p], self._writers[p]
        if part.read_pos >= writer.high_water_mark:
            return False
        if part.read_pos < writer.first_offset:
            self._skip_deleted(p, part, writer.first_offset)
        sent = False
        for batch in writer.read(part.read_pos, self._max_batch_bytes):
            if self._room(session) <= 0:
                break
            data = b""
            start = max(part.read_pos, batch.base_offset)
            for lo, hi in list(part.acks.unacked(start, batch.next_offset)):
                data = data or bytes(batch.buffer)
                self._send(session, p, data, lo, hi)
                sent = True
            part.read_pos = batch.next_offset
        return sent

    def _send(self, session: ConsumerSession, p: int, data: bytes, lo: int, hi: int) -> None:
        part = self._parts[p]
        redeliveries: dict[int, int] = {}
        for offset in range(lo, min(hi, part.sent_mark)):
            redeliveries[offset] = part.attempts.get(offset, 1)
            part.attempts[offset] = redeliveries[offset] + 1
        session.outbox.put_nowait(Delivery(p, data, lo, hi, redeliveries))
        count = hi - lo
        session.credit -= count
        part.in_flight += count
        self._in_flight += count
        self._sent_total += count
        part.sent_mark = max(part.sent_mark, hi)

    def _skip_deleted(self, p: int, part: _Partition, first: int) -> None:
        logger.warning(
            "%s/%s partition %d: offsets %d..%d were deleted by retention before they were "
            "acknowledged; continuing at %d",
            self.topic,
            self.name,
            p,
            part.read_pos,
            first - 1,
            first,
        )
        part.acks.ack_up_to(first)
        part.read_pos = first
        part.sent_mark = max(part.sent_mark, first)
        self._in_flight += part.recount()
        self._on_change(self)


def _timestamp_at(writer: LogWriter, offset: int) -> float:
    """The publish time (ms) of the record at ``offset``; now when it cannot be read."""
    try:
        batches = writer.read(offset, 1)
    except Exception:  # a damaged or deleted segment: report no age rather than fail
        logger.debug("cannot read offset %d for its timestamp", offset, exc_info=True)
        return time.time() * 1000
    if not batches or not batches[0].base_offset <= offset < batches[0].next_offset:
        return time.time() * 1000
    return float(batches[0].timestamps()[offset - batches[0].base_offset])
