"""One subscription of one topic: the async shell around its state machine.

Owns :class:`Subscription` (the dispatch task, the consumers' outboxes, the heartbeat's
view). One attached consumer is a :class:`~dispatcher.session.ConsumerSession`; what
:meth:`Subscription.status` reports is :mod:`dispatcher.status`. Every decision, who gets
which record, what an ack frees, when a record is sent again, what is poison, lives in the
pure :class:`~dispatcher.state.SubscriptionState`; this module only carries out its
actions: reading the log, putting deliveries in outboxes, writing dead letters, saving
state and logging.

One owner per subscription: the dispatch task is the only code that changes the
state. Every command, from consumers (attach, credit, acks, nacks, releases, drains,
detaches), admins (seeks, commits) and the subscription's own helpers (a dead-letter
write's result), goes into one bounded queue (``MAX_QUEUED_COMMANDS``) that the task
drains in order, applying each to the state with the monotonic time. The caller first
runs the state's pure ``check(cmd)`` on the current state, so a bad ack, range, credit
or seek is refused at once, in the caller, and never queued. A command method returns a
future: for acks, nacks, grants and releases it is done at once while the queue has
room, and else once the task has made room (the command itself is queued all the same:
nothing is dropped, and the broker's streams await it, so a flood of acks waits rather
than growing the queue); for ``commit`` and ``seek`` it holds the result once the
command is applied, and :meth:`Subscription.applied` is a barrier for a caller that
saves what it queued. With no task (before ``start``, after ``aclose``) the caller holds
the state and applies its command itself.

Log reads are the task's own; their results are applied as if queued behind whatever
arrived while the read was out: commands that came during any await of a pass (a save
before a redelivery, a read off the loop) are applied before the next result, so a seek
that lands while a read is in flight makes that read stale and nothing of it is sent.
A pass never awaits between taking a result and applying it.

The task sleeps on one wake-up event, set by every queued command and by everything
that can let it send: the high-water mark of a partition advancing (the notifier: the
log calls back only after fsync, so only durable records are ever sent; it wakes the
task directly, with no command), a timer for the next ack timeout or nack delay, and the
heartbeat. When the task sleeps with nothing queued and nothing to wake it for (the
common case when a record arrives), the notifier runs the pass itself, in the log's
callback: the task is between turns, not inside one, so the state still has one owner
at a time, and each consumer's stream gets its record without a loop turn and a task
step of the dispatch task in between (under fan-out, one of each per subscription per
commit). A pass that has to await (a save before a redelivery) stops there
and the task finishes it before doing anything else, as if it had run it from the start.
A command that may let the task send (credit, a nack, an attach, a seek, acks
at the unacked cap or for key_shared) also asks for a pass; other acks are applied on
the task's next turn without reading the log, and add nothing to the delivery path. The
task clears the event *before* it looks at the queue and the state, so a wake-up that
arrives while it works is never lost, and many coalesce into one turn: commands first,
then, if asked, one pass, so a command that frees room is applied in the pass that then
sends. A pass that sent and stopped short of the head (a read capped at
``MAX_BATCHES_PER_READ`` or by bytes) passes again at once; one that reached the head
sleeps, so each group commit costs each subscription one pass.

Clocks: every deadline (ack timeouts, nack delays, backoff, the timer) is on the
monotonic clock (``clock``), so a step of the wall clock moves no redelivery; the wall
clock (``wall_clock``) is used only for what is recorded or compared with publish times
(the time of each failed attempt, record ages, dispatch latency). No deadline is
persisted: the state file holds wall-clock attempt times only.

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
import logging
import random as _random
import time
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Final, TypeAlias

from dispatcher.diagnosis import DlqFull, PartitionFacts, Retry, diagnose
from dispatcher.dlq_config import DlqFullError
from dispatcher.errors import (
    DispatchError,
    InvalidSubscriptionError,
    SubscriptionBusyError,
    SubscriptionLimitError,
)
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
    Command,
    Commit,
    DeadLettered,
    DeadLetterFailed,
    Deleted,
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
from dispatcher.session import DRAINED, ConsumerSession
from dispatcher.state import SubscriptionState
from dispatcher.status import PartitionStatus, SubscriptionStatus
from wal import LogWriter, RecordBatch

logger = logging.getLogger(__name__)

#: The most ack ranges (holes) saved per partition; acks above them are redelivered instead.
MAX_ACK_RANGES = 10_000
#: The most batches one pass takes from one partition. A pass runs without yielding, so a
#: backlog of many small batches is sent in slices of this many (about a millisecond each),
#: with the event loop free in between: the oldest records reach their consumer first and
#: other subscriptions and streams are not held up.
MAX_BATCHES_PER_READ = 64
#: Commands waiting for the dispatch task, at most, before a caller that awaits what a
#: command method returns waits for room (the command itself is queued all the same, in
#: order: nothing is dropped). So the queue holds at most this many plus one per caller.
MAX_QUEUED_COMMANDS = 1024

#: Reads ``max_bytes`` (at least one batch) of partition ``p`` from ``offset`` without
#: holding the loop; see :class:`Subscription`'s ``reader``.
LogReader: TypeAlias = Callable[[int, int, int], Awaitable[list[RecordBatch]]]

#: One queued command: the command, the future its caller awaits for the result (None:
#: nobody needs one), and whether applying it may let the task send (then a pass runs).
#: A command of None is a barrier: its future says that everything before it is applied.
_Queued: TypeAlias = tuple[Command | None, "asyncio.Future[Any] | None", bool]

#: The commands that count as activity for inactivity expiry (not credit, not the
#: subscription's own dead-letter results, not barriers).
_ACTIVITY: Final = frozenset({Attach, Detach, Drain, Release, Ack, AckUpTo, Nack, Commit, Seek})

#: Writes a dead letter; returns once it is stored (or rejected by the queue's overflow
#: policy); raises when it could not be written (the record then stays unacknowledged).
DeadLetterSink = Callable[["Subscription", ToDeadLetter], Awaitable[None]]


#: How long after its last AckUpTo a reader that pulls by offset (the Spark connector)
#: still counts as the subscription's consumer in ``lag``: its behind records are LAGGING,
#: not NO_CONSUMER. Five minutes covers slow Spark triggers; seconds.
PULL_READER_WINDOW_S = 300.0


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
        clock: Monotonic seconds: every deadline (ack timeouts, nack delays, backoff, the
            redelivery timer) and the pull reader's window. Never persisted.
        wall_clock: Wall-clock seconds, for what is recorded or compared with publish
            times only: the time of each failed attempt, record ages, dispatch latency.
        random: Uniform ``[0, 1)`` numbers for backoff jitter.
        heartbeat_interval_s: How often the registry should call :meth:`tick`, seconds.
        stall_timeout_s: A backlog with room and no progress for this long is STALLED.
        limits: Consumers at once and credit per consumer, at most. Default: no limits.
        reader: Reads the log off the dispatch task's critical section (tests pass one that
            blocks on an event). Default: ``LogWriter.read``, called in place: the tail
            is cached, and an await would cost the delivery path a loop turn.
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
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        random: Callable[[], float] = _random.random,
        heartbeat_interval_s: float = DEFAULT_INTERVAL_S,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        limits: DispatchLimits | None = None,
        reader: LogReader | None = None,
    ) -> None:
        self._limits = limits or DispatchLimits()
        self._reader = reader
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
        self._wall_clock = wall_clock
        self._sessions: dict[str, ConsumerSession] = {}
        #: Commands for the dispatch task, the one owner of ``state`` (see the module doc).
        self._commands: deque[_Queued] = deque()
        self._room_waiters: list[asyncio.Future[None]] = []
        self._room: asyncio.Future[None] | None = None  # a done future: "there was room"
        #: Whether the next turn of the task must pass (read and send), not only apply
        #: commands: set by the notifier, timers, the heartbeat and commands that may
        #: let it send.
        self._dispatch = True
        self._closed = False
        self._wake = asyncio.Event()
        #: Whether the task sleeps on ``_wake`` (between turns): the notifier may pass.
        self._parked = False
        #: A pass the notifier began that awaits: the coroutine and what it awaits.
        self._suspended: tuple[Coroutine[Any, Any, bool], Any] | None = None
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

    def consumers(self) -> tuple[str, ...]:
        """The attached consumers' names, in the order they attached, counting attaches
        and detaches still queued for the dispatch task (what a delete or expiry judges)."""
        return tuple(session.name for session in self._sessions.values())

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
            self._dispatch = True
            self._wake.set()
        return self.verdict

    async def aclose(self, reason: Exception | None = None) -> None:
        """Stop dispatching and let every consumer go; ``reason``, when given, is what
        their streams end with (see :attr:`ConsumerSession.ended_by`). Idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        self._closed = True
        self.drop_notifications()
        if self._timer is not None:
            self._timer.cancel()
        for t in (task, self._dead_letter_task):
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        if self._suspended is not None:  # a pass begun in place the task never finished
            self._suspended[0].close()
            self._suspended = None
        # The task is gone: the closer owns the state now. Acks, commits and seeks that
        # were queued count (the state saved after this holds them).
        self._apply_queued()
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
        # The notifier passes in place when the task sleeps with nothing to do (the
        # common case: new records), else wakes the task directly. No command.
        self._dispatch = True
        if (
            self._parked
            and not self._wake.is_set()
            and self._reader is None
            and not self._closed
            and self._suspended is None
        ):
            self._pass_in_place()
        else:
            self._wake.set()

    # -- commands ---------------------------------------------------------------------

    def applied(self) -> asyncio.Future[None]:
        """A future, done once every command queued so far is applied (at once when none
        is): what a caller awaits before saving what it changed. Never await it from the
        dispatch task itself (a save a pass awaits): the task applies nothing meanwhile."""
        if not self._commands:
            return self._done_future()
        return self._submit(None, dispatch=False, result=True)

    def _done_future(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        if self._room is None or self._room.get_loop() is not loop:
            self._room = loop.create_future()
            self._room.set_result(None)
        return self._room

    def _submit(
        self, cmd: Command | None, *, dispatch: bool = True, result: bool = False
    ) -> asyncio.Future[Any]:
        """Queue ``cmd`` for the dispatch task (the caller has checked it) and wake the
        task. Returns a future: with ``result``, resolved once the command is applied
        (with its result, or the error applying it raised); else done at once while the
        queue has room, or once the task has made room (see
        :data:`MAX_QUEUED_COMMANDS`)."""
        future: asyncio.Future[Any] | None = (
            asyncio.get_running_loop().create_future() if result else None
        )
        self._commands.append((cmd, future, dispatch))
        if type(cmd) in _ACTIVITY:
            self.activity += 1
        self._wake.set()
        if self._task is None:
            # No dispatch task (not started yet, or closed): the caller holds the state
            # and applies the command now. Nothing else touches the state meanwhile, so
            # there is still one owner at a time. (A task that died keeps its queue for
            # the one the heartbeat starts.)
            self._apply_queued()
        if future is not None:
            return future
        if len(self._commands) < MAX_QUEUED_COMMANDS:
            return self._done_future()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room_waiters.append(waiter)
        return waiter

    def _apply_queued(self) -> None:
        """Apply every queued command, in order. Only the dispatch task calls this (and
        the closer, once the task is gone): the one place commands change the state."""
        commands = self._commands
        if commands:
            state = self.state
            now, wall = self._clock(), self._wall_clock()  # one drain is one instant
            while commands:
                cmd, future, dispatch = commands.popleft()
                if cmd is None:  # a barrier
                    if future is not None and not future.done():
                        future.set_result(None)
                    continue
                try:
                    self._carry_out_now(state.handle(cmd, now, wall=wall))
                except DispatchError as exc:
                    self._refused(cmd, future, exc)
                    continue
                except Exception as exc:  # a bug: fail this command, keep the owner alive
                    logger.exception("%s/%s: applying %s failed", self.topic, self.name, cmd)
                    self._refused(cmd, future, exc)
                    continue
                if type(cmd) is Attach or type(cmd) is Grant:
                    self._credit_applied(cmd)
                if dispatch:
                    self._dispatch = True
                if future is not None and not future.done():
                    future.set_result(
                        state.cursor(cmd.partition) if isinstance(cmd, Commit) else None
                    )
        if self._room_waiters:
            waiters, self._room_waiters = self._room_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if self.state.changes != self._changes:
            self._changes = self.state.changes
            self._on_change(self)

    def _refused(self, cmd: Command, future: asyncio.Future[Any] | None, exc: Exception) -> None:
        """A command that passed its check but not its application: commands queued
        before it changed the state (e.g. a release lowered what was delivered)."""
        if future is not None:
            if not future.done():
                future.set_exception(exc)
            return
        if isinstance(cmd, Attach):  # its consumer cannot stay: end its stream with why
            session = self._sessions.pop(cmd.consumer, None)
            if session is not None:
                session.ended_by = exc
                session.outbox.put_nowait(None)
        logger.warning("%s/%s: %s refused when applied: %s", self.topic, self.name, cmd, exc)

    def _credit_applied(self, cmd: Command) -> None:
        assert isinstance(cmd, Attach | Grant)
        session = self._sessions.get(cmd.consumer)
        if session is not None:
            session.pending_credit -= cmd.credit

    def _ack_may_free(self) -> bool:
        """Whether an ack may let the task send: only when the unacked cap is reached,
        or for key_shared, where acks release a consumer held back to keep key order.
        Acks arrive thousands of times a second; a pass for each would be wasted (the
        task applies them on its next turn without reading the log)."""
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
        # The sessions, not the state: they already count attaches and detaches still
        # queued, in the order the task will apply them.
        if self.policy.type is SubscriptionType.EXCLUSIVE and self._sessions:
            holder = next(iter(self._sessions.values())).name
            raise SubscriptionBusyError(self.topic, self.name, holder)
        self._check_credit(0, credit)
        session = ConsumerSession(consumer_name)
        session.pending_credit = credit
        self._sessions[session.consumer_id] = session
        self._submit(Attach(session.consumer_id, session.name, credit))
        logger.info("%s/%s: consumer %s attached", self.topic, self.name, session.name)
        return session

    def detach(self, session: ConsumerSession) -> None:
        """Let ``session`` go; what it did not acknowledge goes to the other consumers."""
        if self._sessions.pop(session.consumer_id, None) is None:
            return
        self._submit(Detach(session.consumer_id))
        logger.info("%s/%s: consumer %s detached", self.topic, self.name, session.name)

    def drain(self, session: ConsumerSession) -> None:
        """``session`` is closing cleanly: send it nothing more, and put :data:`DRAINED`
        in its outbox after the last delivery. A send the state machine decided before
        the drain was applied is released instead of sent (:meth:`_do`), so nothing ever
        follows the marker. Idempotent."""
        if session.consumer_id not in self._sessions or session.draining:
            return
        session.draining = True
        session.outbox.put_nowait(DRAINED)
        self._submit(Drain(session.consumer_id), dispatch=False)

    def release(
        self, session: ConsumerSession, partition: int, begin: int, end: int
    ) -> asyncio.Future[None]:
        """``session`` gives back offsets ``[begin, end)`` of ``partition`` that it
        received but never handed to its application: not a delivery attempt; they go
        out again at once (see :mod:`dispatcher.state`). Await the result for room in
        the command queue.

        Raises:
            InvalidSubscriptionError: no such partition, or an empty or negative range.
            InvalidAckError: some of the offsets were never delivered.
        """
        cmd = Release(session.consumer_id, partition, begin, end)
        self.state.check(cmd)
        return self._submit(cmd)

    def grant(self, session: ConsumerSession, credit: int) -> asyncio.Future[None]:
        """``session`` may receive ``credit`` more records. Await the result for room in
        the command queue.

        Raises:
            SubscriptionLimitError: the consumer would hold more than
                ``max_credit_per_consumer`` records of credit.
        """
        cid = session.consumer_id
        if cid in self._sessions:
            held = self.state.credit(cid) if self.state.has_consumer(cid) else 0
            self._check_credit(held + session.pending_credit, credit)
            session.pending_credit += credit
        return self._submit(Grant(cid, credit))

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

    def ack(self, partition: int, begin: int, end: int) -> asyncio.Future[None]:
        """Acknowledge the delivered offsets ``[begin, end)`` of ``partition``. Await the
        result for room in the command queue.

        Raises:
            InvalidSubscriptionError: no such partition, or an empty or negative range.
            InvalidAckError: some of the offsets were never delivered.
        """
        cmd = Ack(partition, begin, end)
        self.state.check(cmd)
        return self._submit(cmd, dispatch=self._ack_may_free())

    def ack_up_to(self, partition: int, offset: int) -> asyncio.Future[None]:
        """Acknowledge every delivered offset of ``partition`` below ``offset``. Await
        the result for room in the command queue.

        Raises:
            InvalidSubscriptionError: no such partition.
            InvalidAckError: ``offset`` is past what was delivered.
        """
        cmd = AckUpTo(partition, offset)
        self.state.check(cmd)
        return self._submit(cmd, dispatch=self._ack_may_free())

    def nack(
        self, partition: int, begin: int, end: int, *, delay_s: float | None, reason: str
    ) -> asyncio.Future[None]:
        """Offsets ``[begin, end)`` failed: send them again after ``delay_s`` (``None``:
        the subscription's backoff). Await the result for room in the command queue.

        Raises:
            InvalidSubscriptionError: no such partition, a bad range or delay.
            InvalidAckError: some of the offsets were never delivered.
        """
        cmd = Nack(partition, begin, end, delay_s, reason)
        self.state.check(cmd)
        return self._submit(cmd)

    def commit(self, partition: int, offset: int) -> asyncio.Future[int]:
        """Acknowledge everything below ``offset``, delivered or not (a reader that pulls
        by offset, like Spark, commits what it processed). Returns a future of the
        cursor once the dispatch task applied it.

        Raises:
            InvalidSubscriptionError: no such partition, or ``offset`` past the head
                (at once, not through the future).
        """
        self.state.check_partition(partition)
        cmd = Commit(partition, offset, self._writers[partition].high_water_mark)
        self.state.check(cmd)
        self._committed_at = self._clock()
        return self._submit(cmd, result=True)

    def seek(self, offsets: Sequence[int]) -> asyncio.Future[None]:
        """Move every partition's cursor to the given offset, forgetting its acks.
        Returns a future, done once the dispatch task applied the seek: from then on,
        nothing is sent from before it (a read in flight then is dropped).

        Offsets are clamped to what the log holds. Attached consumers stay; the next
        records they receive start at the new positions.
        """
        if len(offsets) != len(self._writers):
            raise InvalidSubscriptionError("seek", f"needs {len(self._writers)} offsets")
        clamped = tuple(
            min(max(offset, w.first_offset), w.high_water_mark)
            for w, offset in zip(self._writers, offsets, strict=True)
        )
        cmd = Seek(clamped)
        self.state.check(cmd)
        self._rates = [RateWindow() for _ in self._writers]  # the jump is not an ack rate
        return self._submit(cmd, result=True)

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
        now, wall = self._clock(), self._wall_clock()
        parts = []
        for i, writer in enumerate(self._writers):
            head = writer.high_water_mark
            cursor = state.cursor(i)
            lag = state.lag(i, head)
            rates = self._rates[i].rates()
            verdict = diagnose(self._facts(i, head, lag, len(consumers), now, rates))
            age = 0.0
            if lag:
                age = max(0.0, wall - _timestamp_at(writer, cursor) / 1000)
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
            self._wake.clear()  # before looking: a wake-up from now on is never lost
            if self._suspended is not None:  # a pass the notifier began waits on an await
                coro, waiting = self._suspended
                self._suspended = None
                if await self._finish_pass(_resume(coro, waiting)):
                    self._dispatch = True
                    await asyncio.sleep(0)
                else:
                    self._arm_timer()
                continue
            self._apply_queued()
            again = passed = False
            if self._dispatch:
                passed = True
                self._dispatch = False
                if self._heartbeat_poll:
                    self._heartbeat_poll = False
                    self.heartbeat_polls += 1
                else:
                    self.notifier_polls += 1
                again = await self._finish_pass(self._pass())
            if again:
                self._dispatch = True
                await asyncio.sleep(0)  # let the consumers' streams and others run
            else:
                if passed:  # commands alone add no deadline: an early timer only passes
                    self._arm_timer()
                self._parked = True
                try:
                    await self._wake.wait()
                finally:
                    self._parked = False

    async def _finish_pass(self, pass_: Awaitable[bool]) -> bool:
        """Await a pass; return whether to pass again at once (a failed pass: no)."""
        try:
            again = await pass_
        except Exception as exc:  # e.g. a damaged segment: keep the broker up
            self._pass_failed(exc)
            again = False
        else:
            self._pass_worked()
        self._note_changes()
        return again

    def _pass_in_place(self) -> None:
        """The notifier's pass, run in the notifier's callback while the task sleeps
        with nothing queued: each consumer's stream is woken in this turn of the loop,
        without waking the task first (a loop turn and a task step per subscription and
        record). The task owns nothing else meanwhile: it sleeps between turns, not
        inside one. A pass that has to await (saving delivery counts before a
        redelivery) is handed over to the task at that await, which finishes it
        before anything else (:meth:`_run`): as if the task had run it from the start."""
        self._dispatch = False
        self.notifier_polls += 1
        coro = self._pass()
        try:
            waiting = coro.send(None)
        except StopIteration as stop:
            again: bool = stop.value
            self._pass_worked()
        except Exception as exc:
            self._pass_failed(exc)
            again = False
        else:
            self._suspended = (coro, waiting)
            self._wake.set()
            return
        self._note_changes()
        if again:
            self._dispatch = True
            self._wake.set()
        else:
            self._arm_timer()

    def _pass_failed(self, exc: Exception) -> None:
        if not self._last_error:  # once per failing streak, not once per pass
            logger.error(
                "%s/%s: dispatch failed; the heartbeat retries it every %.3f s",
                self.topic,
                self.name,
                self.heartbeat_interval_s,
                exc_info=exc,
            )
        self._last_error = str(exc) or type(exc).__name__

    def _pass_worked(self) -> None:
        if self._last_error:
            logger.info("%s/%s: dispatch works again", self.topic, self.name)
        self._last_error = ""

    def _note_changes(self) -> None:
        if self.state.changes != self._changes:
            self._changes = self.state.changes
            self._on_change(self)

    async def _pass(self) -> bool:
        """Expire leases, then read and send what the state asks for. Return whether to
        pass again at once: a read stopped short of the head, and the pass sent something,
        moved a read position, or set key_shared records aside (their owner has no credit
        or is fenced, so they wait, and the records after them may go to other consumers;
        this holds for waiting records as much as for new ones).
        Otherwise nothing more can be sent until something wakes the task (new records,
        credit, acks, a timer).

        Commands that arrive while the pass awaits (a save before a redelivery, a read
        in flight) wait in the queue and are applied, in order, before the next result
        the pass applies: a read's result comes after every command that arrived before
        it, as if it were queued too, so a read made stale by a seek sends nothing."""
        state = self.state
        now, wall = self._clock(), self._wall_clock()
        if state.tick_due(now):  # usually not: no lease expires at every commit
            expired = state.handle(TICK, now, wall=wall)
            if expired:
                await self._carry_out(expired)
        heads = [w.high_water_mark for w in self._writers]
        sent = more = moved = False
        for p, wanted in state.reads(heads, now):
            if self._commands:  # arrived during an await of this pass
                self._apply_queued()
                now, wall = self._clock(), self._wall_clock()
            writer = self._writers[p]
            first = writer.first_offset
            if wanted < first:
                await self._carry_out(state.handle(Deleted(p, first), now, wall=wall))
                if first >= heads[p]:
                    continue
            if self._reader is None:
                batches = writer.read(max(wanted, first), self._max_batch_bytes)
            else:
                batches = await self._reader(p, max(wanted, first), self._max_batch_bytes)
                if self._commands:  # they came before the read's result: apply them first
                    self._apply_queued()
                now, wall = self._clock(), self._wall_clock()
            del batches[MAX_BATCHES_PER_READ:]  # the rest is read on the next pass
            more |= bool(batches) and batches[-1].next_offset < heads[p]
            before = state.read_position(p), state.set_aside_total
            actions = state.handle(Fetched(p, batches), now, wall=wall)
            if actions and type(actions[0]) is Persist:  # a save first: the only await
                sent |= await self._carry_out(actions)
            else:
                sent |= self._carry_out_sends(actions)
            moved |= (state.read_position(p), state.set_aside_total) != before
        return more and (sent or moved)

    async def _carry_out(self, actions: list[Action]) -> bool:
        """Do what the state machine asked, in order; return whether anything was sent.
        A ``Persist`` comes first when there is one (the state machine puts it there)."""
        if actions and type(actions[0]) is Persist:
            await self._save_now()
            actions = actions[1:]
        return self._carry_out_sends(actions)

    def _carry_out_sends(self, actions: list[Action]) -> bool:
        """:meth:`_carry_out` without the ``Persist`` (none here): no await, so a pass
        with nothing to save runs without one; return whether anything was sent."""
        sent = False
        for action in actions:
            assert not isinstance(action, Persist), "a Persist must come first"
            sent |= self._do(action)
        return sent

    def _carry_out_now(self, actions: list[Action]) -> None:
        for action in actions:
            if not isinstance(action, Persist):  # queued commands never send or persist
                self._do(action)

    def _do(self, action: Action) -> bool:
        if isinstance(action, Send):
            session = self._sessions.get(action.consumer)
            if session is not None and session.draining:  # it would follow DRAINED
                d = action.delivery
                release = Release(action.consumer, d.partition, d.from_offset, d.to_offset)
                self.state.handle(release, self._clock(), wall=self._wall_clock())
                self._dispatch = True
                self._wake.set()
                return False
            if session is not None:
                session.outbox.put_nowait(action.delivery)
                if not action.delivery.redeliveries:
                    self.on_dispatch(max(0.0, self._wall_clock() - action.timestamp_ms / 1000))
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
        """Write the queued dead letters one at a time; each result goes back to the
        dispatch task as a command (:class:`DeadLettered` or :class:`DeadLetterFailed`):
        this task never touches the state."""
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
            self._submit(done)

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
            delay = max(0.0, at - self._clock())  # both monotonic
            self._timer = loop.call_later(delay, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._timer_at = None
        self._dispatch = True
        self._wake.set()


@types.coroutine
def _resume(coro: Coroutine[Any, Any, bool], waiting: Any) -> Generator[Any, Any, bool]:
    """Go on with ``coro``, begun outside a task and suspended on ``waiting`` (what it
    yielded, e.g. a future): awaited in a task, it yields ``waiting`` to that task and
    passes what the task sends or throws back into ``coro``, like ``await`` would have."""
    while True:
        try:
            sent = yield waiting
        except BaseException as exc:  # every exception goes back into coro
            try:
                waiting = coro.throw(exc)
            except StopIteration as stop:
                result: bool = stop.value
                return result
        else:
            try:
                waiting = coro.send(sent)
            except StopIteration as stop:
                result = stop.value
                return result


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
