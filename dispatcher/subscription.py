"""One subscription of one topic: the async shell around its state machine.

Owns :class:`Subscription` (the dispatch task, the consumers' outboxes, the heartbeat's
view) and :class:`ConsumerSession` (one attached consumer). Every decision, who gets which
record, what an ack frees, when a record is sent again, what is poison, lives in the pure
:class:`~dispatcher.state.SubscriptionState`; this module only carries out its actions:
reading the log, putting deliveries in outboxes, writing dead letters, saving state and
logging.

Commands from consumers (attach, credit, acks, nacks) are applied synchronously on the
event loop, one at a time, and then wake the dispatch task if they can let it send. The
dispatch task is the only one that reads the log and sends. It sleeps on one wake-up event
that is set by every change that can let it send: the high-water mark of a partition
advancing (the notifier: the log calls back only after fsync, so only durable records are
ever sent), credit granted, acks freeing room (at the unacked cap, or for key_shared, whose
held-back consumers acks release; other acks wake nothing), a nack, a consumer attaching or
leaving, a seek, and a timer for the next ack timeout or nack delay. The task clears the
event *before* it looks at the state, so a wake-up that arrives while it works is never
lost, and many wake-ups coalesce into one pass. A pass that sent and stopped short of the
head (a read capped at ``MAX_BATCHES_PER_READ`` or by bytes) passes again at once; one that
reached the head sleeps, so each group commit costs each subscription one pass.

The heartbeat (:mod:`dispatcher.lag`) is the safety net behind that fast path: the
registry calls :meth:`Subscription.tick` every heartbeat interval. A tick restarts a dispatch
task that died, re-polls when records are ready and a consumer has room (counted apart
from the passes the notifier triggers), and flags the subscription STALLED when such a
backlog makes no progress for the stall timeout.

Invariants:
- A record is sent only below the partition's high-water mark (durable, DESIGN section 2).
- Batches are never split to fit credit: credit and ``max_unacked`` are checked before each
  slice, so a consumer gets at most one batch more than its credit. Splitting would send
  (and make the client decode) the same batch bytes once per slice.
- A redelivery waits for its new delivery count to be saved (``Persist``), so delivery
  counts survive a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import random as _random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from dispatcher.diagnosis import DlqFull, PartitionFacts, Retry, diagnose
from dispatcher.dlq import DlqFullError
from dispatcher.errors import InvalidSubscriptionError, SubscriptionLimitError
from dispatcher.lag import (
    DEFAULT_INTERVAL_S,
    DEFAULT_STALL_TIMEOUT_S,
    IDLE,
    LagMonitor,
    Observation,
    Rates,
    RateWindow,
    Verdict,
)
from dispatcher.protocol import (
    TICK,
    Ack,
    AckUpTo,
    Action,
    Attach,
    Commit,
    DeadLettered,
    DeadLetterFailed,
    Deleted,
    Delivery,
    DeliveryMode,
    Detach,
    DispatchLimits,
    DispatchPolicy,
    Drain,
    Fetched,
    Grant,
    Nack,
    Note,
    PartitionSnapshot,
    Persist,
    Release,
    Seek,
    Send,
    SubscriptionType,
    ToDeadLetter,
)
from dispatcher.state import SubscriptionState
from wal import LogWriter

logger = logging.getLogger(__name__)

#: The most ack ranges (holes) saved per partition; acks above them are redelivered instead.
MAX_ACK_RANGES = 10_000
#: The most batches one pass takes from one partition. A pass runs without yielding, so a
#: backlog of many small batches is sent in slices of this many (about a millisecond each),
#: with the event loop free in between: the oldest records reach their consumer first and
#: other subscriptions and streams are not held up.
MAX_BATCHES_PER_READ = 64
_consumer_ids = itertools.count(1)

#: Writes a dead letter; returns once it is stored (or rejected by the queue's overflow
#: policy); raises when it could not be written (the record then stays unacknowledged).
DeadLetterSink = Callable[["Subscription", ToDeadLetter], Awaitable[None]]


class InitialPosition(enum.Enum):
    """Where a new subscription starts."""

    EARLIEST = "earliest"
    LATEST = "latest"


#: How long after its last AckUpTo a reader that pulls by offset (the Spark connector)
#: still counts as the subscription's consumer in ``lag``: its behind records are LAGGING,
#: not NO_CONSUMER. Five minutes covers slow Spark triggers; seconds.
PULL_READER_WINDOW_S = 300.0


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One partition of a subscription, as ``lag`` reports it."""

    partition: int
    cursor: int  # the first offset not acknowledged
    head: int  # the next offset to be written (durable records lie below it)
    lag: int  # records at or above the cursor not yet acknowledged
    in_flight: int  # sent and not yet acknowledged
    oldest_unacked_age_s: float  # age of the record at the cursor (0 when caught up)
    state: str  # CAUGHT_UP | LAGGING | STALLED | NO_CONSUMER | BLOCKED
    reason: str  # "<cause>: <detail>" (dispatcher.diagnosis), "" when caught up
    ingress_rate: float = 0.0  # records/s appended, over the rate window (dispatcher.lag)
    ack_rate: float = 0.0  # records/s acknowledged by this subscription, same window
    drain_s: float | None = 0.0  # lag / (ack_rate - ingress_rate); None: never drains
    trend: str = "steady"  # growing | shrinking | steady: the lag over the window


@dataclass(frozen=True, slots=True)
class SubscriptionStatus:
    """A subscription's state for admin replies."""

    topic: str
    name: str
    type: SubscriptionType
    consumers: tuple[str, ...]
    partitions: tuple[PartitionStatus, ...]
    mode: DeliveryMode = DeliveryMode.AT_LEAST_ONCE

    @property
    def lag(self) -> int:
        """Records not yet acknowledged, over every partition."""
        return sum(p.lag for p in self.partitions)


#: Put in a draining consumer's outbox after its last delivery (:meth:`Subscription.drain`):
#: a marker, compared by identity, that carries no records and names no partition.
DRAINED: Final = Delivery(-1, b"", 0, 0, {})


class ConsumerSession:
    """One attached consumer and the deliveries waiting for it."""

    __slots__ = ("consumer_id", "draining", "ended_by", "name", "outbox")

    def __init__(self, name: str) -> None:
        self.consumer_id = f"c{next(_consumer_ids)}"
        self.name = name or self.consumer_id
        #: Why the subscription let this consumer go, when not for shutdown (e.g. the
        #: subscription was deleted): what its stream should end with.
        self.ended_by: Exception | None = None
        #: Bounded by the credit: the dispatch task never puts more than was granted.
        self.outbox: asyncio.Queue[Delivery | None] = asyncio.Queue()
        #: Set by :meth:`Subscription.drain`: nothing more goes into the outbox.
        self.draining = False

    async def next(self) -> Delivery | None:
        """The next delivery, :data:`DRAINED` after the last one a draining consumer gets,
        or ``None`` once the subscription has let this consumer go."""
        return await self.outbox.get()


class Subscription:
    """A named subscription of one topic. Use from one event loop.

    Args:
        topic: The topic's name.
        name: The subscription's name.
        writers: The topic's partitions, in order.
        partitions: Persisted state per partition (restored, or new at the start).
        policy: Type, mode, limits and redelivery rules.
        max_batch_bytes: Soft limit on the bytes one read takes from a log (at least one
            batch is read).
        on_change: Called (on the loop) when persisted state changed and needs saving.
        persist: Saves the state now; awaited before a pass's redeliveries go out, once
            their new delivery counts are set.
        dead_letters: Writes poison records to the dead-letter queue.
        clock: Wall-clock seconds: ack timeouts, nack delays, record ages.
        random: Uniform ``[0, 1)`` numbers for backoff jitter.
        heartbeat_interval_s: How often the registry should call :meth:`tick`, seconds.
        stall_timeout_s: A backlog with room and no progress for this long is STALLED.
        limits: Consumers at once and credit per consumer, at most. Default: no limits.
    """

    def __init__(
        self,
        topic: str,
        name: str,
        writers: Sequence[LogWriter],
        partitions: Sequence[PartitionSnapshot],
        *,
        policy: DispatchPolicy | None = None,
        max_batch_bytes: int = 256 << 10,
        on_change: Callable[[Subscription], None] = lambda _s: None,
        persist: Callable[[Subscription], Awaitable[None]] | None = None,
        dead_letters: DeadLetterSink | None = None,
        clock: Callable[[], float] = time.time,
        random: Callable[[], float] = _random.random,
        heartbeat_interval_s: float = DEFAULT_INTERVAL_S,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        limits: DispatchLimits | None = None,
    ) -> None:
        self._limits = limits or DispatchLimits()
        if len(writers) != len(partitions):
            raise ValueError(f"{len(writers)} partitions but {len(partitions)} states")
        self.topic = topic
        self.name = name
        self.policy = policy or DispatchPolicy()
        self.state = SubscriptionState(partitions, self.policy, random=random, names=(topic, name))
        self._writers = list(writers)
        self._max_batch_bytes = max_batch_bytes
        self._on_change = on_change
        self._persist = persist
        self._dead_letters = dead_letters
        self._clock = clock
        self._sessions: dict[str, ConsumerSession] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._dead_letter_queue: list[ToDeadLetter] = []
        self._dead_letter_task: asyncio.Task[None] | None = None
        #: How often the heartbeat should tick this subscription, seconds.
        self.heartbeat_interval_s = heartbeat_interval_s
        self._monitor = LagMonitor(stall_timeout_s)
        #: Ingress and ack rates per partition, sampled on every tick.
        self._rates = [RateWindow() for _ in self._writers]
        #: Why the last dead-letter write failed (None after one that worked).
        self._dead_letter_error: Exception | None = None
        self._heartbeat_poll = False
        #: When a pull reader (AckUpTo) last committed, per the clock; None if never.
        self._committed_at: float | None = None
        self._last_error = ""
        self._changes = self.state.changes
        #: Dispatch passes the notifier (or credit, acks, attach, timers) triggered.
        self.notifier_polls = 0
        #: Dispatch passes the heartbeat triggered.
        self.heartbeat_polls = 0
        #: Dispatch tasks the heartbeat found dead and restarted.
        self.task_restarts = 0
        #: The last tick's verdict.
        self.verdict = IDLE
        #: Moves on every ack, nack, commit, seek, attach and detach: what inactivity
        #: expiry (:mod:`dispatcher.expiry`) watches.
        self.activity = 0
        #: Called with (seconds from publish to dispatch) for each first delivery.
        self.on_dispatch: Callable[[float], None] = lambda _s: None

    @property
    def type(self) -> SubscriptionType:
        """How the subscription shares records among consumers."""
        return self.policy.type

    @property
    def partition_count(self) -> int:
        """How many partitions the subscription's topic has."""
        return self.state.partition_count

    @property
    def max_unacked(self) -> int:
        """The most records in flight at once."""
        return self.policy.max_unacked

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
        heads = [w.high_water_mark for w in self._writers]
        if self._rates and self._rates[0].wants(now):  # the windows are sampled together
            for i, (window, head) in enumerate(zip(self._rates, heads, strict=True)):
                window.observe(now, head, head - self.state.lag(i, head))
        if self._monitor.idle and self.state.caught_up(heads):
            self.verdict = IDLE  # the common case, kept cheap: 1,000 idle subscriptions
            return IDLE
        ready = self.state.ready(heads, self._clock())
        seen = Observation(
            ready=ready,
            has_room=self.state.has_room(),
            progress=self.state.sent_total + self.state.acked_total,
            last_error=self._last_error,
        )
        self.verdict = self._monitor.tick(seen, now)
        if self.verdict.repoll:
            self._heartbeat_poll = True
            self._wake.set()
        return self.verdict

    async def aclose(self, reason: Exception | None = None) -> None:
        """Stop dispatching and let every consumer go; ``reason``, when given, is what
        their streams end with (see :attr:`ConsumerSession.ended_by`). Idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        self.drop_notifications()
        if self._timer is not None:
            self._timer.cancel()
        for t in (task, self._dead_letter_task):
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        for session in self._sessions.values():
            session.ended_by = reason
            session.outbox.put_nowait(None)
        self._sessions.clear()

    def drop_notifications(self) -> None:
        """Stop listening to the partitions' high-water marks, as if every notification
        from now on were lost: new records are then found by the heartbeat alone (or by
        credit, acks and other commands that wake the task). Fault injection for benches
        and tests; the subscription keeps working. Idempotent."""
        for writer in self._writers:
            with contextlib.suppress(ValueError):
                writer.remove_listener(self._on_advance)

    def _on_advance(self, _hwm: int) -> None:
        self._wake.set()

    # -- commands ---------------------------------------------------------------------

    def _apply(
        self,
        cmd: Attach | Detach | Drain | Release | Grant | Ack | AckUpTo | Nack | Commit | Seek,
        *,
        wake: bool = True,
    ) -> None:
        """Apply a command from outside the dispatch task, then wake the task (unless the
        command cannot let it send anything)."""
        actions = self.state.handle(cmd, self._clock())
        if not isinstance(cmd, Grant):
            self.activity += 1
        self._carry_out_now(actions)
        if self.state.changes != self._changes:
            self._changes = self.state.changes
            self._on_change(self)
        if wake:
            self._wake.set()

    def _ack_may_free(self) -> bool:
        """Whether an ack may let the task send: only when the unacked cap is reached,
        or for key_shared, where acks release a consumer held back to keep key order.
        Acks arrive thousands of times a second; a pass for each would be wasted."""
        return (
            self.state.held >= self.policy.max_unacked
            or self.policy.type is SubscriptionType.KEY_SHARED
        )

    def attach(self, consumer_name: str, credit: int) -> ConsumerSession:
        """Attach a consumer that may receive ``credit`` records now.

        Raises:
            SubscriptionBusyError: another consumer holds this exclusive subscription.
            SubscriptionLimitError: ``max_consumers_per_subscription`` consumers are
                attached already, or ``credit`` is over ``max_credit_per_consumer``.
        """
        most = self._limits.max_consumers_per_subscription
        if most is not None and len(self._sessions) >= most:
            raise SubscriptionLimitError(
                "max_consumers_per_subscription",
                most,
                f"subscription {self.name!r} on topic {self.topic!r} has "
                f"{len(self._sessions)} consumers",
                "stop a consumer or use another subscription",
            )
        self._check_credit(0, credit)
        session = ConsumerSession(consumer_name)
        self._apply(Attach(session.consumer_id, session.name, credit))
        self._sessions[session.consumer_id] = session
        logger.info("%s/%s: consumer %s attached", self.topic, self.name, session.name)
        return session

    def detach(self, session: ConsumerSession) -> None:
        """Let ``session`` go; what it did not acknowledge goes to the other consumers."""
        if self._sessions.pop(session.consumer_id, None) is None:
            return
        self._apply(Detach(session.consumer_id))
        logger.info("%s/%s: consumer %s detached", self.topic, self.name, session.name)

    def drain(self, session: ConsumerSession) -> None:
        """``session`` is closing cleanly: send it nothing more, and put :data:`DRAINED`
        in its outbox after the last delivery. A send the state machine decided before
        the drain and the shell carries out after it (a pass awaiting a save) is released
        instead of sent (:meth:`_do`), so nothing ever follows the marker. Idempotent."""
        if session.consumer_id not in self._sessions or session.draining:
            return
        self._apply(Drain(session.consumer_id), wake=False)
        session.draining = True
        session.outbox.put_nowait(DRAINED)

    def release(self, session: ConsumerSession, partition: int, begin: int, end: int) -> None:
        """``session`` gives back offsets ``[begin, end)`` of ``partition`` that it
        received but never handed to its application: not a delivery attempt; they go
        out again at once (see :mod:`dispatcher.state`).

        Raises:
            InvalidSubscriptionError: no such partition, or an empty or negative range.
            InvalidAckError: some of the offsets were never delivered.
        """
        self._apply(Release(session.consumer_id, partition, begin, end))

    def grant(self, session: ConsumerSession, credit: int) -> None:
        """``session`` may receive ``credit`` more records.

        Raises:
            SubscriptionLimitError: the consumer would hold more than
                ``max_credit_per_consumer`` records of credit.
        """
        if session.consumer_id in self._sessions:
            self._check_credit(self.state.credit(session.consumer_id), credit)
        self._apply(Grant(session.consumer_id, credit))

    def _check_credit(self, held: int, more: int) -> None:
        most = self._limits.max_credit_per_consumer
        if most is not None and held + more > most:
            raise SubscriptionLimitError(
                "max_credit_per_consumer",
                most,
                f"a consumer of {self.topic}/{self.name} holding {held} records of credit "
                f"asked for {more} more",
                "grant credit as messages are taken, not ahead of them",
            )

    def ack(self, partition: int, begin: int, end: int) -> None:
        """Acknowledge the delivered offsets ``[begin, end)`` of ``partition``.

        Raises:
            InvalidSubscriptionError: no such partition, or an empty or negative range.
            InvalidAckError: some of the offsets were never delivered.
        """
        self._apply(Ack(partition, begin, end), wake=self._ack_may_free())

    def ack_up_to(self, partition: int, offset: int) -> None:
        """Acknowledge every delivered offset of ``partition`` below ``offset``.

        Raises:
            InvalidSubscriptionError: no such partition.
            InvalidAckError: ``offset`` is past what was delivered.
        """
        self._apply(AckUpTo(partition, offset), wake=self._ack_may_free())

    def nack(
        self, partition: int, begin: int, end: int, *, delay_s: float | None, reason: str
    ) -> None:
        """Offsets ``[begin, end)`` failed: send them again after ``delay_s`` (``None``:
        the subscription's backoff).

        Raises:
            InvalidSubscriptionError: no such partition, a bad range or delay.
            InvalidAckError: some of the offsets were never delivered.
        """
        self._apply(Nack(partition, begin, end, delay_s, reason))

    def commit(self, partition: int, offset: int) -> int:
        """Acknowledge everything below ``offset``, delivered or not (a reader that pulls
        by offset, like Spark, commits what it processed). Returns the cursor.

        Raises:
            InvalidSubscriptionError: no such partition, or ``offset`` past the head.
        """
        self.state.check_partition(partition)
        head = self._writers[partition].high_water_mark
        self._apply(Commit(partition, offset, head))
        self._committed_at = self._clock()
        return self.state.cursor(partition)

    def seek(self, offsets: Sequence[int]) -> None:
        """Move every partition's cursor to the given offset, forgetting its acks.

        Offsets are clamped to what the log holds. Attached consumers stay; the next
        records they receive start at the new positions.
        """
        if len(offsets) != len(self._writers):
            raise InvalidSubscriptionError("seek", f"needs {len(self._writers)} offsets")
        clamped = tuple(
            min(max(offset, w.first_offset), w.high_water_mark)
            for w, offset in zip(self._writers, offsets, strict=True)
        )
        self._apply(Seek(clamped))
        self._rates = [RateWindow() for _ in self._writers]  # the jump is not an ack rate

    # -- state ------------------------------------------------------------------------

    def snapshot(self) -> list[PartitionSnapshot]:
        """What is persisted, per partition."""
        return self.state.snapshot(MAX_ACK_RANGES)

    def sample_key(self) -> tuple[int, ...]:
        """Changes whenever anything :meth:`lag` or the counters report may have changed."""
        state = self.state
        return (
            self.notifier_polls,
            self.heartbeat_polls,
            self.task_restarts,
            self.verdict.stalled,
            state.sent_total,
            state.acked_total,
            state.changes,
            *(w.high_water_mark for w in self._writers),
            *(state.cursor(i) for i in range(len(self._writers))),
            *(bool(state.blocked(i)) for i in range(len(self._writers))),
        )

    def lag(self) -> list[tuple[int, int, int]]:
        """``(partition, lag, in_flight)`` per partition: the cheap part of :meth:`status`."""
        state = self.state
        return [
            (i, state.lag(i, w.high_water_mark), state.in_flight(i))
            for i, w in enumerate(self._writers)
        ]

    def blocked(self) -> list[bool]:
        """Whether each partition is BLOCKED (sends nothing until an operator acts)."""
        return [bool(self.state.blocked(i)) for i in range(len(self._writers))]

    def cursor_timestamp_ms(self, partition: int) -> float:
        """The publish time (ms) of ``partition``'s oldest unacknowledged record (at its
        cursor); now when it cannot be read. One read: callers cache it per cursor."""
        return _timestamp_at(self._writers[partition], self.state.cursor(partition))

    def status(self) -> SubscriptionStatus:
        """Cursor, head, lag, in-flight records, rates, state and reason per partition."""
        state = self.state
        consumers = tuple(state.consumers())
        now = self._clock()
        parts = []
        for i, writer in enumerate(self._writers):
            head = writer.high_water_mark
            cursor = state.cursor(i)
            lag = state.lag(i, head)
            rates = self._rates[i].rates()
            verdict = diagnose(self._facts(i, head, lag, len(consumers), now, rates))
            age = 0.0
            if lag:
                age = max(0.0, now - _timestamp_at(writer, cursor) / 1000)
            parts.append(
                PartitionStatus(
                    i,
                    cursor,
                    head,
                    lag,
                    state.in_flight(i),
                    age,
                    verdict.state.value,
                    verdict.reason,
                    ingress_rate=rates.ingress,
                    ack_rate=rates.acked,
                    drain_s=rates.drain_s(lag),
                    trend=rates.trend.value,
                )
            )
        return SubscriptionStatus(
            self.topic, self.name, self.type, consumers, tuple(parts), self.policy.mode
        )

    def _facts(  # noqa: PLR0917 - one private caller
        self, i: int, head: int, lag: int, consumers: int, now: float, rates: Rates
    ) -> PartitionFacts:
        """What :func:`~dispatcher.diagnosis.diagnose` judges partition ``i`` on."""
        state = self.state
        if lag == 0:
            return PartitionFacts(lag=0)
        unread = max(0, head - state.read_position(i))
        retry = None
        waiting = state.waiting_at_cursor(i)
        if waiting is not None and waiting[0] > now:
            retry = Retry(state.cursor(i), waiting[0] - now, waiting[1], waiting[2])
        full = self._dead_letter_error
        pull = None
        if self._pull_reader_active(now):
            assert self._committed_at is not None
            pull = now - self._committed_at
        return PartitionFacts(
            lag=lag,
            unread=unread,
            in_flight=state.in_flight(i),
            consumers=consumers,
            has_room=state.has_room(),
            held=state.held,
            max_unacked=self.policy.max_unacked,
            blocked=state.blocked(i),
            on_dead_letters=state.blocked_on_dead_letters(i),
            dlq_full=(
                DlqFull(full.entries, full.max_entries) if isinstance(full, DlqFullError) else None
            ),
            read_error=self._last_error if unread else "",
            stalled=self.verdict.stalled,
            stuck_s=self.verdict.stuck_s,
            retry=retry,
            pull_commit_age_s=pull,
            rates=rates,
        )

    def _pull_reader_active(self, now: float) -> bool:
        """Whether a reader that pulls by offset (Fetch + AckUpTo) committed within
        :data:`PULL_READER_WINDOW_S`: it counts as the subscription's consumer in ``lag``."""
        return self._committed_at is not None and now - self._committed_at <= PULL_READER_WINDOW_S

    # -- the dispatch task --------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            if self._heartbeat_poll:
                self._heartbeat_poll = False
                self.heartbeat_polls += 1
            else:
                self.notifier_polls += 1
            try:
                again = await self._pass()
            except Exception as exc:  # e.g. a damaged segment: keep the broker up
                if not self._last_error:  # once per failing streak, not once per pass
                    logger.exception(
                        "%s/%s: dispatch failed; the heartbeat retries it every %.3f s",
                        self.topic,
                        self.name,
                        self.heartbeat_interval_s,
                    )
                self._last_error = str(exc) or type(exc).__name__
                again = False
            else:
                if self._last_error:
                    logger.info("%s/%s: dispatch works again", self.topic, self.name)
                self._last_error = ""
            if self.state.changes != self._changes:
                self._changes = self.state.changes
                self._on_change(self)
            if again:
                await asyncio.sleep(0)  # let the consumers' streams and others run
            else:
                self._arm_timer()
                await self._wake.wait()

    async def _pass(self) -> bool:
        """Expire leases, then read and send what the state asks for. Return whether to
        pass again at once: a read stopped short of the head, and the pass sent something,
        moved a read position, or set key_shared records aside (their owner has no credit
        or is fenced, so they wait, and the records after them may go to other consumers;
        this holds for waiting records as much as for new ones).
        Otherwise nothing more can be sent until something wakes the task (new records,
        credit, acks, a timer)."""
        state = self.state
        now = self._clock()
        await self._carry_out(state.handle(TICK, now))
        heads = [w.high_water_mark for w in self._writers]
        sent = more = moved = False
        for p, wanted in state.reads(heads, now):
            writer = self._writers[p]
            first = writer.first_offset
            if wanted < first:
                await self._carry_out(state.handle(Deleted(p, first), now))
                if first >= heads[p]:
                    continue
            batches = writer.read(max(wanted, first), self._max_batch_bytes)
            del batches[MAX_BATCHES_PER_READ:]  # the rest is read on the next pass
            more |= bool(batches) and batches[-1].next_offset < heads[p]
            before = state.read_position(p), state.set_aside_total
            sent |= await self._carry_out(state.handle(Fetched(p, batches), now))
            moved |= (state.read_position(p), state.set_aside_total) != before
        return more and (sent or moved)

    async def _carry_out(self, actions: list[Action]) -> bool:
        """Do what the state machine asked, in order; return whether anything was sent."""
        sent = False
        for action in actions:
            if isinstance(action, Persist):
                await self._save_now()
            else:
                sent |= self._do(action)
        return sent

    def _carry_out_now(self, actions: list[Action]) -> None:
        for action in actions:
            if not isinstance(action, Persist):  # commands from outside never send
                self._do(action)

    def _do(self, action: Action) -> bool:
        if isinstance(action, Send):
            session = self._sessions.get(action.consumer)
            if session is not None and session.draining:  # it would follow DRAINED
                d = action.delivery
                release = Release(action.consumer, d.partition, d.from_offset, d.to_offset)
                self.state.handle(release, self._clock())
                self._wake.set()
                return False
            if session is not None:
                session.outbox.put_nowait(action.delivery)
                if not action.delivery.redeliveries:
                    self.on_dispatch(max(0.0, self._clock() - action.timestamp_ms / 1000))
            return True
        if isinstance(action, ToDeadLetter):
            self._dead_letter_queue.append(action)
            if self._dead_letter_task is None or self._dead_letter_task.done():
                self._dead_letter_task = asyncio.create_task(
                    self._write_dead_letters(), name=f"dead letters {self.topic}/{self.name}"
                )
        elif isinstance(action, Note):
            logger.log(action.level, "%s/%s: %s", self.topic, self.name, action.message)
        return False

    async def _save_now(self) -> None:
        if self._persist is None:
            return
        changes = self.state.changes  # the save holds at least these
        try:
            await self._persist(self)
        except OSError:
            logger.exception(
                "%s/%s: saving delivery counts failed; a crash now may undercount them",
                self.topic,
                self.name,
            )
        else:  # saved: on_change need not report them to the flusher again
            self._changes = max(self._changes, changes)

    async def _write_dead_letters(self) -> None:
        while self._dead_letter_queue:
            action = self._dead_letter_queue.pop(0)
            done: DeadLettered | DeadLetterFailed
            try:
                if self._dead_letters is None:
                    raise RuntimeError("this subscription has no dead-letter queue")
                await self._dead_letters(self, action)
            except Exception as exc:
                self._dead_letter_error = exc
                done = DeadLetterFailed(
                    action.partition, action.begin, action.end, str(exc) or type(exc).__name__
                )
            else:
                self._dead_letter_error = None
                done = DeadLettered(action.partition, action.begin, action.end)
            await self._carry_out(self.state.handle(done, self._clock()))
            if self.state.changes != self._changes:
                self._changes = self.state.changes
                self._on_change(self)
            self._wake.set()

    def _arm_timer(self) -> None:
        """Wake the task when the next lease expires or a waiting record is due."""
        at = self.state.next_deadline()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None:
            loop = asyncio.get_running_loop()
            delay = max(0.0, at - self._clock())
            self._timer = loop.call_later(delay, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._timer_at = None
        self._wake.set()


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
