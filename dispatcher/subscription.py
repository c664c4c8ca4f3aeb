"""One subscription of one topic: the async shell around its state machine.

Owns :class:`Subscription` (the dispatch task, the consumers' outboxes, the heartbeat's
view). One attached consumer is a :class:`~dispatcher.session.ConsumerSession`; what
:meth:`Subscription.status` reports is :mod:`dispatcher.subscription_status`. Every
decision, who gets which record, what an ack frees, when a record is sent again, what is
poison, lives in the pure :class:`~dispatcher.state.SubscriptionState`; this module and
:mod:`dispatcher.dispatch_loop` only carry out its actions: reading the log, putting
deliveries in outboxes, writing dead letters, saving state and logging.

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
the state and applies its command itself. The rule is enforced, not only kept: the
dispatch loop names its task the state's owner, and the state raises
:class:`~dispatcher.errors.StateOwnerError` for a change from anywhere else.

The dispatch task's body, what wakes it, how a pass reads the log and sends, and the
notifier's pass in place, is :class:`~dispatcher.dispatch_loop.DispatchLoop`, with the
delivery invariants (only durable records are sent; batches are never split; a
redelivery waits for its delivery count to be saved). This class keeps the callers' side:
the consumers, the command queue and applying it, the lifecycle, the tick and the status;
the heartbeat's judgement (rates, STALLED, each partition's facts for ``lag``) is
:class:`~dispatcher.subscription_health.Health`, and reading a cursor record's age
without waiting for the disk is :class:`~dispatcher.cursor_ages.CursorAges`.

Why the rest is one piece (about 600 lines): every public method is one command on the
one queue, checked against the state first, and the queue, the futures its callers
await, the sessions and the task's lifecycle are one mechanism, the one-owner rule on
the callers' side. Split, each part would reach into the others' queue and sessions;
the dispatch task's side of the same queue is :mod:`dispatcher.dispatch_loop`.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random as _random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeAlias

from dispatcher.cursor_ages import CursorAges
from dispatcher.diagnosis import diagnose
from dispatcher.dispatch_loop import DispatchLoop, LogReader
from dispatcher.errors import (
    DispatchError,
    InvalidSubscriptionError,
    SubscriptionBusyError,
    SubscriptionCommittedError,
    SubscriptionLimitError,
)
from dispatcher.lag import (
    DEFAULT_INTERVAL_S,
    DEFAULT_STALL_TIMEOUT_S,
    Verdict,
)
from dispatcher.protocol import (
    Ack,
    AckUpTo,
    Attach,
    Command,
    Commit,
    Detach,
    DispatchLimits,
    DispatchPolicy,
    Drain,
    Grant,
    Nack,
    PartitionSnapshot,
    Release,
    Seek,
    SubscriptionType,
    ToDeadLetter,
)
from dispatcher.session import DRAINED, ConsumerSession
from dispatcher.state import SubscriptionState
from dispatcher.subscription_health import Health
from dispatcher.subscription_status import PartitionStatus, SubscriptionStatus
from proto.shown import shown_text
from wal import LogWriter

logger = logging.getLogger(__name__)

#: The most ack ranges (holes) saved per partition; acks above them are redelivered instead.
MAX_ACK_RANGES = 10_000
#: Commands waiting for the dispatch task, at most, before a caller that awaits what a
#: command method returns waits for room (the command itself is queued all the same, in
#: order: nothing is dropped). So the queue holds at most this many plus one per caller.
MAX_QUEUED_COMMANDS = 1024

#: One queued command: the command, the future its caller awaits for the result (None:
#: nobody needs one), and whether applying it may let the task send (then a pass runs).
#: A command of None is a barrier: its future says that everything before it is applied.
_Queued: TypeAlias = tuple[Command | None, "asyncio.Future[Any] | None", bool]

#: Writes a dead letter; returns once it is stored (or rejected by the queue's overflow
#: policy); raises when it could not be written (the record then stays unacknowledged).
DeadLetterSink = Callable[["Subscription", ToDeadLetter], Awaitable[None]]

#: The commands that count as activity for inactivity expiry (not credit, not the
#: subscription's own dead-letter results, not barriers).
_ACTIVITY: Final = frozenset({Attach, Detach, Drain, Release, Ack, AckUpTo, Nack, Commit, Seek})


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
        committer: Who commits to it by offset, as saved (see :attr:`committer`).
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
        committer: str = "",
    ) -> None:
        self._limits = limits or DispatchLimits()
        #: Who commits to this subscription by offset (AckUpTo's ``committer``, e.g.
        #: "spark"), "" if nobody said: saved with its state. While set, a consumer
        #: attaches only when forced (:meth:`attach`): two kinds of reader moving one
        #: cursor lose records to each other, as a Kafka group refuses a member of
        #: another protocol type.
        self.committer = committer
        #: A replicated topic's dead-letter queue's first sequence, saved with the
        #: state (``StateDoc.dlq_first``); 0 for a factor-1 topic's.
        self.dlq_first = 0
        if len(writers) != len(partitions):
            raise ValueError(f"{len(writers)} partitions but {len(partitions)} states")
        self.topic = topic
        self.name = name
        self.policy = policy or DispatchPolicy()
        self.state = SubscriptionState(partitions, self.policy, random=random, names=(topic, name))
        self._writers = list(writers)
        self._clock = clock
        self._wall_clock = wall_clock
        self._sessions: dict[str, ConsumerSession] = {}
        #: Commands for the dispatch task, the one owner of ``state`` (see the module doc).
        self._commands: deque[_Queued] = deque()
        self._room_waiters: list[asyncio.Future[None]] = []
        self._room: asyncio.Future[None] | None = None  # a done future: "there was room"
        #: The dispatch task's body: its turns, passes, timer and dead-letter writes.
        self._loop = DispatchLoop(
            self,
            state=self.state,
            writers=self._writers,
            sessions=self._sessions,
            commands=self._commands,
            apply_queued=self._apply_queued,
            submit=self._submit,
            clock=clock,
            wall_clock=wall_clock,
            reader=reader,
            max_batch_bytes=max_batch_bytes,
            on_change=on_change,
            persist=persist,
            dead_letters=dead_letters,
        )
        self._wake = self._loop.wake  # the same event: a command wakes the task
        self._task: asyncio.Task[None] | None = None
        #: How often the heartbeat should tick this subscription, seconds.
        self.heartbeat_interval_s = heartbeat_interval_s
        self._health = Health(
            self.state,
            self._writers,
            clock=clock,
            stall_timeout_s=stall_timeout_s,
            max_unacked=self.policy.max_unacked,
        )
        #: When a pull reader (AckUpTo) last committed, per the clock; None if never.
        self._committed_at: float | None = None
        #: Dispatch tasks the heartbeat found dead and restarted.
        self.task_restarts = 0
        #: Moves on every ack, nack, commit, seek, attach and detach: what inactivity
        #: expiry (:mod:`dispatcher.expiry`) watches.
        self.activity = 0
        #: Called with (seconds from publish to dispatch) for each first delivery.
        self.on_dispatch: Callable[[float], None] = lambda _s: None
        self._ages = CursorAges(self._writers)

    @property
    def notifier_polls(self) -> int:
        """Dispatch passes the notifier (or credit, acks, attach, timers) triggered."""
        return self._loop.notifier_polls

    @property
    def heartbeat_polls(self) -> int:
        """Dispatch passes the heartbeat triggered."""
        return self._loop.heartbeat_polls

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
    def verdict(self) -> Verdict:
        """The last tick's verdict."""
        return self._health.verdict

    @property
    def max_unacked(self) -> int:
        """The most records in flight at once."""
        return self.policy.max_unacked

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the dispatch task and listen to every partition's high-water mark."""
        for writer in self._writers:
            writer.add_listener(self._loop.on_advance)
        self._start_task()

    def _start_task(self) -> None:
        self._task = asyncio.create_task(
            self._loop.run(), name=f"dispatch {self.topic}/{self.name}"
        )

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
        verdict = self._health.judge(now, self._loop.last_error)
        if verdict.repoll:
            self._loop.heartbeat_poll()
        return verdict

    async def aclose(self, reason: Exception | None = None) -> None:
        """Stop dispatching and let every consumer go; ``reason``, when given, is what
        their streams end with (see :attr:`ConsumerSession.ended_by`). Idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        self._ages.cancel()  # a thread's read runs to its end (the writer waits for it)
        self.drop_notifications()
        await self._loop.stop(task)
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
                writer.remove_listener(self._loop.on_advance)

    # -- commands ---------------------------------------------------------------------

    def applied(self) -> asyncio.Future[None]:
        """A future, done once every command queued so far is applied (at once when none
        is): what a caller awaits before saving what it changed. Never await it from the
        dispatch task itself (a save a pass awaits): the task applies nothing meanwhile."""
        if not self._commands:
            return self._done_future()
        return self._submit(None, dispatch=False, result=True)

    def _done_future(self) -> asyncio.Future[None]:
        # The dispatch task's loop is the caller's: asking the task is cheaper than
        # asking asyncio (a ``getpid`` call on Python 3.11), once per ack under fan-out.
        task = self._task
        loop = task.get_loop() if task is not None else asyncio.get_running_loop()
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
            state, loop = self.state, self._loop
            now, wall = self._clock(), self._wall_clock()  # one drain is one instant
            while commands:
                cmd, future, dispatch = commands.popleft()
                if cmd is None:  # a barrier
                    if future is not None and not future.done():
                        future.set_result(None)
                    continue
                try:
                    loop.carry_out_now(state.handle(cmd, now, wall=wall))
                except DispatchError as exc:
                    self._refused(cmd, future, exc)
                    continue
                except Exception as exc:  # a bug: fail this command, keep the owner alive
                    logger.exception(
                        "%s/%s: applying %s failed", self.topic, self.name, shown_text(repr(cmd))
                    )
                    self._refused(cmd, future, exc)
                    continue
                if type(cmd) is Attach or type(cmd) is Grant:
                    self._credit_applied(cmd)
                if dispatch:
                    loop.dispatch = True
                if future is not None and not future.done():
                    future.set_result(
                        state.cursor(cmd.partition) if isinstance(cmd, Commit) else None
                    )
        if self._room_waiters:
            waiters, self._room_waiters = self._room_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self._loop.note_changes()

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
        logger.warning(
            "%s/%s: %s refused when applied: %s",
            self.topic,
            self.name,
            shown_text(repr(cmd)),
            shown_text(str(exc)),
        )

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

    def attach(self, consumer_name: str, credit: int, *, force: bool = False) -> ConsumerSession:
        """Attach a consumer that may receive ``credit`` records now.

        Raises:
            SubscriptionCommittedError: a reader that pulls by offset commits to it
                (:attr:`committer`) and ``force`` is false.
            SubscriptionBusyError: another consumer holds this exclusive subscription.
            SubscriptionLimitError: ``max_consumers_per_subscription`` consumers are
                attached already, or ``credit`` is over ``max_credit_per_consumer``.
        """
        if self.committer and not force:
            age = None if self._committed_at is None else self._clock() - self._committed_at
            raise SubscriptionCommittedError(self.topic, self.name, self.committer, age)
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

    def end_sessions(self, reason: Exception) -> None:
        """End every consumer's stream with ``reason`` (the topic is now served by another
        broker: its consumers look it up again). The subscription goes on; each stream's
        own end detaches its consumer, and what that consumer held goes back."""
        for session in list(self._sessions.values()):
            session.ended_by = reason
            session.outbox.put_nowait(None)

    def detach(self, session: ConsumerSession) -> None:
        """Let ``session`` go; what it did not acknowledge goes to the other consumers."""
        if self._sessions.pop(session.consumer_id, None) is None:
            return
        self._submit(Detach(session.consumer_id))
        logger.info("%s/%s: consumer %s detached", self.topic, self.name, session.name)

    def drain(self, session: ConsumerSession) -> None:
        """``session`` is closing cleanly: send it nothing more, and put :data:`DRAINED`
        in its outbox after the last delivery. A send the state machine decided before
        the drain was applied is released instead of sent (by the dispatch loop), so nothing ever
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
        self,
        partition: int,
        begin: int,
        end: int,
        *,
        delay_s: float | None,
        reason: str,
        dead_letter: bool = False,
    ) -> asyncio.Future[None]:
        """Offsets ``[begin, end)`` failed: send them again after ``delay_s`` (``None``:
        the subscription's backoff), or with ``dead_letter`` apply the poison policy to
        them now. Await the result for room in the command queue.

        Raises:
            InvalidSubscriptionError: no such partition, a bad range or delay.
            InvalidAckError: some of the offsets were never delivered.
        """
        cmd = Nack(partition, begin, end, delay_s, reason, dead_letter)
        self.state.check(cmd)
        return self._submit(cmd)

    def commit(self, partition: int, offset: int, *, committer: str = "") -> asyncio.Future[int]:
        """Acknowledge everything below ``offset``, delivered or not (a reader that pulls
        by offset, like Spark, commits what it processed). Returns a future of the
        cursor once the dispatch task applied it. A ``committer`` is recorded as
        :attr:`committer` (saved with the state; "" leaves it as it is).

        Raises:
            InvalidSubscriptionError: no such partition, or ``offset`` past the head
                (at once, not through the future).
        """
        self.state.check_partition(partition)
        cmd = Commit(partition, offset, self._writers[partition].high_water_mark)
        self.state.check(cmd)
        self._committed_at = self._clock()
        if committer and committer != self.committer:
            if self._sessions:
                logger.warning(
                    "%s/%s: %s commits by offset while consumers are attached (%s); they "
                    "move the same cursor",
                    self.topic,
                    self.name,
                    shown_text(committer),
                    ", ".join(shown_text(s.name) for s in self._sessions.values()),
                )
            logger.info("%s/%s: committer is now %s", self.topic, self.name, shown_text(committer))
            self.committer = committer
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
        self._health.reset_rates()  # the jump is not an ack rate
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

    def cursor_timestamp_ms(self, partition: int) -> float | None:
        """The publish time (ms) of ``partition``'s oldest unacknowledged record (at its
        cursor); now when it cannot be read; ``None`` while it is not in the page cache
        (a read that brings it in is started: see :mod:`dispatcher.cursor_ages`)."""
        return self._ages.timestamp_ms(partition, self.state.cursor(partition))

    async def status(self) -> SubscriptionStatus:
        """Cursor, head, lag, in-flight records, rates, state and reason per partition.

        The age of a lagging partition reads its cursor record; on a worker thread when
        the page cache does not hold it. The rest is one snapshot, taken before that."""
        state = self.state
        consumers = tuple(state.consumers())
        now, wall = self._clock(), self._wall_clock()
        parts = []
        for i, writer in enumerate(self._writers):
            head = writer.high_water_mark
            cursor = state.cursor(i)
            lag = state.lag(i, head)
            rates = self._health.rates[i].rates()
            facts = self._health.facts(
                i,
                head,
                lag,
                len(consumers),
                now,
                rates,
                dead_letter_error=self._loop.dead_letter_error,
                read_error=self._loop.last_error,
                committed_at=self._committed_at,
            )
            verdict = diagnose(facts)
            parts.append(
                PartitionStatus(
                    i,
                    cursor,
                    head,
                    lag,
                    state.in_flight(i),
                    0.0,
                    verdict.state.value,
                    verdict.reason,
                    ingress_rate=rates.ingress,
                    ack_rate=rates.acked,
                    drain_s=rates.drain_s(lag),
                    trend=rates.trend.value,
                )
            )
        for i, part in enumerate(parts):
            if part.lag:
                stamp = await self._ages.timestamp_at(i, part.cursor)
                age = max(0.0, wall - stamp / 1000)
                parts[i] = dataclasses.replace(part, oldest_unacked_age_s=age)
        return SubscriptionStatus(
            self.topic,
            self.name,
            self.type,
            consumers,
            tuple(parts),
            self.policy.mode,
            self.committer,
        )
