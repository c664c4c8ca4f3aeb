"""The dispatch task of one subscription: its turns, its passes, and what they carry out.

Owns :class:`DispatchLoop`, the body of a :class:`~dispatcher.subscription.Subscription`'s
dispatch task: when it wakes, when it passes (reads the log and sends what the state
machine asks for), and how it carries out the state machine's actions (deliveries into
the consumers' outboxes, saves before redeliveries, dead-letter writes, log lines). The
subscription keeps the callers' side: the command queue and applying it, the consumers,
the heartbeat's tick and the status; both work on the one
:class:`~dispatcher.state.SubscriptionState`.

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
common case when a record arrives), the notifier runs the pass's synchronous part itself,
in the log's callback, and each consumer's stream gets its record without a loop turn
and a task step of the dispatch task in between (under fan-out, one of each per
subscription per commit).

One owner, by construction. A pass is :meth:`DispatchLoop._run`, a synchronous function
that decides and carries out everything that needs no await (reads from the page cache,
the state's ``handle``, putting deliveries in outboxes) and stops at the first thing that
does, returning itself as plain data (:class:`_Pass`: what it reads, how far it got,
what it found) with what it awaits (a save before a redelivery, :class:`_Save`; a read
off the loop, :class:`_Read`). Only the dispatch task awaits that, in
:meth:`DispatchLoop._complete`, and then runs the pass on. So the notifier's pass is an
ordinary function call made while the task sleeps between turns (nothing interleaves
with it), and every await of a pass happens in the task: no coroutine runs outside a
task or is stepped by hand. The state enforces it (``SubscriptionState.owner``, set by
:meth:`DispatchLoop.run`): it is changed only by the dispatch task, by the notifier's
synchronous pass while that task sleeps (the task lends it, ``owner_lends``), or by the
subscription when it has no task (before ``start``, after ``aclose``); anything else
raises :class:`~dispatcher.errors.StateOwnerError`.

A command that may let the task send (credit, a nack, an attach, a seek, acks
at the unacked cap or for key_shared) also asks for a pass; other acks are applied on
the task's next turn without reading the log, and add nothing to the delivery path. The
task clears the event *before* it looks at the queue and the state, so a wake-up that
arrives while it works is never lost, and many coalesce into one turn: commands first,
then, if asked, one pass, so a command that frees room is applied in the pass that then
sends. A pass that sent and stopped short of the head (a read capped at
``MAX_BATCHES_PER_READ`` or by bytes) passes again at once; one that reached the head
sleeps, so each group commit costs each subscription one pass.

Invariants:
- A record is sent only below the partition's high-water mark (durable, DESIGN section 2).
- Batches are never split to fit credit: credit and ``max_unacked`` are checked before each
  slice, so a consumer gets at most one batch more than its credit. Splitting would send
  (and make the client decode) the same batch bytes once per slice.
- A redelivery waits for its new delivery count to be saved (``Persist``), so delivery
  counts survive a crash.

This is the hot path: the loop keeps its own references to the state, the partitions,
the consumers' sessions and the command queue (the very objects the subscription holds,
never replaced), so a pass reads them as directly as a method of the subscription would;
it reads them only under the ownership rule above.
Imports ``wal`` and, of ``dispatcher``, the pure ``protocol`` and ``state``, ``session``
and ``dead_letter_writer`` (the dead-letter writes it hands off); never ``subscription``
(what it needs of it is :class:`LoopOwner`).

One piece, though past 600 lines (an eighth of it this docstring): the rest is one
ownership rule and the code it rules. The task's turns (:meth:`DispatchLoop.run`), the
notifier's pass in place (:meth:`DispatchLoop.on_advance`), the resumable pass
(:meth:`DispatchLoop._run`, :meth:`DispatchLoop._complete`) and the carrying out of
actions all decide who may touch the state at this moment (``owner``, ``owner_lends``,
``_parked``, ``_handed_over``, the wake-up event), and the proof that the state has one
owner at a time is read in one file. The decisions themselves are already elsewhere (the
state machine, :mod:`dispatcher.state`; dead-letter writes, :mod:`dispatcher.dead_letter_writer`).
The seam to cut should it grow: carrying out actions (``_do``, ``_carry_out_sends``,
:meth:`DispatchLoop.carry_out_now`, ``_save_now``: sessions' outboxes, releases of a
draining consumer, notes, dead letters), a sync executor that needs the sessions, the
state and the clocks but none of the turn-taking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from dispatcher.dead_letter_writer import DeadLetterWriter
from dispatcher.errors import NotCommittedError
from dispatcher.protocol import (
    TICK,
    Action,
    Command,
    Deleted,
    Fetched,
    Note,
    Persist,
    Release,
    Send,
    ToDeadLetter,
)
from dispatcher.session import ConsumerSession
from dispatcher.state import SubscriptionState
from wal import LogWriter, RecordBatch

logger = logging.getLogger(__name__)

#: The most batches one pass takes from one partition. A pass runs without yielding, so a
#: backlog of many small batches is sent in slices of this many (about a millisecond each),
#: with the event loop free in between: the oldest records reach their consumer first and
#: other subscriptions and streams are not held up.
MAX_BATCHES_PER_READ = 64

#: Reads ``max_bytes`` (at least one batch) of partition ``p`` from ``offset`` without
#: holding the loop; see :class:`~dispatcher.subscription.Subscription`'s ``reader``.
LogReader: TypeAlias = Callable[[int, int, int], Awaitable[list[RecordBatch]]]


class LoopOwner(Protocol):
    """What the loop reads of the subscription it runs for. ``on_dispatch`` is read at
    each first delivery: the registry sets it after the subscription is made."""

    #: The topic and the subscription's name (every log line names them).
    topic: str
    name: str
    #: Called with (seconds from publish to dispatch) for each first delivery.
    on_dispatch: Callable[[float], None]
    #: How often the heartbeat ticks the subscription, seconds (named in error logs).
    heartbeat_interval_s: float


OwnerT = TypeVar("OwnerT", bound=LoopOwner)


class _Pass:
    """A pass stopped at something to await, as plain data: the heads it reads up to,
    the reads the state asked for and how many are done, what it found so far, what it
    awaits, and (once the task read it) the result of that read, to take first."""

    __slots__ = ("batches", "done", "heads", "more", "moved", "pending", "reads", "sent")

    def __init__(
        self,
        heads: list[int],
        reads: list[tuple[int, int]],
        done: int,
        found: tuple[bool, bool, bool],
        pending: _Save | _Read,
    ) -> None:
        self.heads = heads
        #: ``(partition, offset)`` to read, from ``state.reads``; ``done`` of them are.
        self.reads = reads
        self.done = done
        #: Whether something was sent, a read stopped short of the head, a read position
        #: or the key_shared records set aside moved.
        self.sent, self.more, self.moved = found
        self.pending = pending
        #: What the task read for a :class:`_Read`, for the pass to take first.
        self.batches: list[RecordBatch] | None = None


@dataclass(slots=True)
class _Save:
    """A pass stopped to save delivery counts before ``rest`` (sends of ``partition``)
    goes out; ``moved``: the read moved the partition's read position or set records
    aside (the state's ``moved`` after it; carrying out ``rest`` changes neither)."""

    partition: int
    moved: bool
    rest: list[Action]


@dataclass(slots=True)
class _Read:
    """A pass stopped to read ``partition`` from ``offset`` off the loop."""

    partition: int
    offset: int


class DispatchLoop(Generic[OwnerT]):
    """The dispatch task's body for one subscription. Use from one event loop.

    Not task-safe by itself, and needs no lock: the subscription's dispatch task runs
    :meth:`run`, and the notifier's callback (:meth:`on_advance`) runs a pass's
    synchronous part only while that task sleeps between turns, so the state has one
    owner at a time (the state refuses any other caller).

    Args:
        sub: The subscription it dispatches for: what ``on_change``, ``persist`` and
            ``dead_letters`` are called with; its ``on_dispatch`` observer.
        state: The subscription's state machine.
        writers: The subscription's partitions, in order.
        sessions: The subscription's consumers by id (the subscription's own dict).
        commands: The subscription's command queue (its own deque).
        apply_queued: Applies every queued command (the subscription's).
        submit: Queues a command for the task (dead-letter results go back this way).
        clock: Monotonic seconds (deadlines, the timer).
        wall_clock: Wall-clock seconds (dispatch latency, attempt times).
        reader: Reads the log off the loop; ``None``: ``LogWriter.read`` in place.
        max_batch_bytes: Soft limit on the bytes one read takes from a log.
        on_change: Called when persisted state changed and needs saving.
        persist: Saves the state now (before redeliveries); ``None``: nothing to save.
        dead_letters: Writes poison records to the dead-letter queue.
    """

    def __init__(
        self,
        sub: OwnerT,
        *,
        state: SubscriptionState,
        writers: list[LogWriter],
        sessions: dict[str, ConsumerSession],
        commands: deque[Any],
        apply_queued: Callable[[], None],
        submit: Callable[[Command], object],
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        reader: LogReader | None,
        max_batch_bytes: int,
        on_change: Callable[[OwnerT], None],
        persist: Callable[[OwnerT], Awaitable[None]] | None,
        dead_letters: Callable[[OwnerT, ToDeadLetter], Awaitable[None]] | None,
    ) -> None:
        self._sub = sub
        self._topic = sub.topic
        self._name = sub.name
        self._state = state
        self._writers = writers
        self._sessions = sessions
        self._commands = commands
        self._apply_queued = apply_queued
        self._submit = submit
        self._clock = clock
        self._wall_clock = wall_clock
        self._reader = reader
        self._max_batch_bytes = max_batch_bytes
        self._on_change = on_change
        self._persist = persist
        #: Whether the next turn of the task must pass (read and send), not only apply
        #: commands: set by the notifier, timers, the heartbeat and commands that may
        #: let it send.
        self.dispatch = True
        #: Set once the subscription closes: the notifier passes no more.
        self.closed = False
        #: What the task sleeps on between turns; set to wake it.
        self.wake = asyncio.Event()
        #: Whether the task sleeps on ``wake`` (between turns): the notifier may pass.
        self._parked = False
        #: A pass the notifier began and stopped at something to await: the task goes on
        #: with it before anything else.
        self._handed_over: _Pass | None = None
        state.caller = asyncio.current_task  # how the state tells its owner (see run)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        #: The task's loop, kept by :meth:`run`: looking it up costs a ``getpid`` call on
        #: Python 3.11, and the timer is re-armed on most passes.
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._dead_letters = DeadLetterWriter(
            sub, dead_letters, submit, f"dead letters {self._topic}/{self._name}"
        )
        self._heartbeat_poll = False
        #: Why the last pass failed ("" after one that worked).
        self.last_error = ""
        self._changes = self._state.changes
        #: Dispatch passes the notifier (or credit, acks, attach, timers) triggered.
        self.notifier_polls = 0
        #: Dispatch passes the heartbeat triggered.
        self.heartbeat_polls = 0

    @property
    def dead_letter_error(self) -> Exception | None:
        """Why the last dead-letter write failed (None after one that worked)."""
        return self._dead_letters.error

    def on_advance(self, _hwm: int) -> None:
        """The notifier: a partition's high-water mark advanced (after fsync)."""
        # The notifier passes in place when the task sleeps with nothing to do (the
        # common case: new records), else wakes the task directly. No command.
        self.dispatch = True
        if (
            self._parked
            and not self.wake.is_set()
            and self._reader is None
            and not self.closed
            and self._handed_over is None
        ):
            self._pass_in_place()
        else:
            self.wake.set()

    def heartbeat_poll(self) -> None:
        """The heartbeat asks for a pass (counted in :attr:`heartbeat_polls`)."""
        self._heartbeat_poll = True
        self.dispatch = True
        self.wake.set()

    async def stop(self, task: asyncio.Task[None]) -> None:
        """Stop for good: no more passes in place, no timer, ``task`` (the dispatch task)
        and the dead-letter writer cancelled, a pass begun in place and never finished
        dropped (what it sent stays sent; what it still had to read is read by nobody, as
        when the task is cancelled in a pass). The subscription then owns the state."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self._dead_letters.stop()
        self._handed_over = None  # a pass begun in place the task never finished
        self._state.owner = None

    async def run(self) -> None:
        """The dispatch task's body: turns until cancelled (see the module doc)."""
        self._event_loop = asyncio.get_running_loop()
        self._state.owner = asyncio.current_task()  # only this task changes the state
        while True:
            self.wake.clear()  # before looking: a wake-up from now on is never lost
            if self._handed_over is not None:  # a pass the notifier began waits on an await
                stopped, self._handed_over = self._handed_over, None
                if await self._finish_pass(self._complete(stopped)):
                    self.dispatch = True
                    await asyncio.sleep(0)
                else:
                    self._arm_timer()
                continue
            self._apply_as_owner()
            again = passed = False
            if self.dispatch:
                passed = True
                self.dispatch = False
                if self._heartbeat_poll:
                    self._heartbeat_poll = False
                    self.heartbeat_polls += 1
                else:
                    self.notifier_polls += 1
                again = await self._finish_pass(self._pass())
            if again:
                self.dispatch = True
                await asyncio.sleep(0)  # let the consumers' streams and others run
            else:
                if passed:  # commands alone add no deadline: an early timer only passes
                    self._arm_timer()
                self._parked = True
                try:
                    await self.wake.wait()
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
        self.note_changes()
        return again

    def _pass_in_place(self) -> None:
        """The notifier's pass, a plain function call in the notifier's callback while the
        task sleeps with nothing queued: each consumer's stream is woken in this turn of
        the loop, without waking the task first (a loop turn and a task step per
        subscription and record). The task owns nothing meanwhile: it sleeps between
        turns, not inside one, and this returns before anything else runs. A pass that
        has to await (saving delivery counts before a redelivery, a read off the loop)
        stops there and is handed to the task, which does the awaiting and finishes it
        before anything else (:meth:`run`): as if the task had run it from the start."""
        self.dispatch = False
        self.notifier_polls += 1
        self._state.owner_lends = True  # to this call, while the task sleeps
        try:
            result = self._run(None)
        except Exception as exc:
            self._pass_failed(exc)
            again = False
        else:
            if type(result) is _Pass:
                self._handed_over = result
                self.wake.set()
                return
            again = result is True
            self._pass_worked()
        finally:
            self._state.owner_lends = False
        self.note_changes()
        if again:
            self.dispatch = True
            self.wake.set()
        else:
            self._arm_timer()

    def _pass_failed(self, exc: Exception) -> None:
        if not self.last_error and isinstance(exc, NotCommittedError):  # degraded, expected
            logger.warning(
                "%s/%s: dispatch waits for its state to commit (%s); the heartbeat retries "
                "it every %.3f s",
                self._topic,
                self._name,
                exc,
                self._sub.heartbeat_interval_s,
            )
        elif not self.last_error:  # once per failing streak, not once per pass
            logger.error(
                "%s/%s: dispatch failed; the heartbeat retries it every %.3f s",
                self._topic,
                self._name,
                self._sub.heartbeat_interval_s,
                exc_info=exc,
            )
        self.last_error = str(exc) or type(exc).__name__

    def _pass_worked(self) -> None:
        if self.last_error:
            logger.info("%s/%s: dispatch works again", self._topic, self._name)
        self.last_error = ""

    def note_changes(self) -> None:
        """Report new persisted state to ``on_change`` once."""
        if self._state.changes != self._changes:
            self._changes = self._state.changes
            self._on_change(self._sub)

    async def _pass(self) -> bool:
        """The task's pass: :meth:`_run`, and :meth:`_complete` when it stopped."""
        result = self._run_as_owner(None)
        if type(result) is _Pass:
            return await self._complete(result)
        return result is True

    def _run(self, resumed: _Pass | None) -> bool | _Pass:
        """Run a pass (``resumed``: go on with one that stopped) as far as it goes
        without an await: expire leases when due, then read and send what the state asks
        for. Return whether to pass again at once (see :meth:`_complete`), or, stopped at
        the first thing to await, the pass as data (the task awaits, then calls this
        again). Synchronous: the notifier calls it in place."""
        state = self._state
        now, wall = self._clock(), self._wall_clock()
        batches: list[RecordBatch] | None
        if resumed is None:
            if state.tick_due(now):  # usually not: no lease expires at every commit
                # A tick never asks for a save (only a read's result does).
                self._carry_out_sends(state.handle(TICK, now, wall=wall))
            heads = [w.high_water_mark for w in self._writers]
            reads = state.reads(heads, now)
            done, sent, more, moved = 0, False, False, False
            p, batches = -1, None
        else:
            heads, reads, done = resumed.heads, resumed.reads, resumed.done
            sent, more, moved = resumed.sent, resumed.more, resumed.moved
            pending = resumed.pending
            p, batches = pending.partition, resumed.batches
        while True:
            if batches is None:
                if done == len(reads):
                    return more and (sent or moved)
                p, wanted = reads[done]
                done += 1
                if self._commands:  # arrived during an await of this pass
                    self._apply_queued()
                    now, wall = self._clock(), self._wall_clock()
                writer = self._writers[p]
                first = writer.first_offset
                if wanted < first:  # a note, never a save
                    self._carry_out_sends(state.handle(Deleted(p, first), now, wall=wall))
                    if first >= heads[p]:
                        continue
                at = max(wanted, first)
                if self._reader is None:
                    batches = writer.read_nowait(at, self._max_batch_bytes)
                if batches is None:  # not in the page cache (or a test's reader): off the loop
                    return _Pass(heads, reads, done, (sent, more, moved), _Read(p, at))
            del batches[MAX_BATCHES_PER_READ:]  # the rest is read on the next pass
            more |= bool(batches) and batches[-1].next_offset < heads[p]
            actions = state.handle(Fetched(p, batches), now, wall=wall)
            batches = None
            if actions and type(actions[0]) is Persist:  # a save first: the task awaits it
                save = _Save(p, state.moved, actions[1:])
                return _Pass(heads, reads, done, (sent, more, moved), save)
            sent |= self._carry_out_sends(actions)
            moved |= state.moved

    async def _complete(self, stopped: _Pass) -> bool:
        """Finish a pass that stopped, in the dispatch task: await what it stopped at,
        hand over the result, go on (:meth:`_run`), until it is done. Return whether to
        pass again at once: a read stopped short of the head, and the pass sent
        something, moved a read position, or set key_shared records aside (their owner
        has no credit or is fenced, so they wait, and the records after them may go to
        other consumers; this holds for waiting records as much as for new ones).
        Otherwise nothing more can be sent until something wakes the task (new records,
        credit, acks, a timer).

        Commands that arrive while the pass awaits (a save before a redelivery, a read
        in flight) wait in the queue and are applied, in order, before the next result
        the pass applies: a read's result comes after every command that arrived before
        it, as if it were queued too, so a read made stale by a seek sends nothing."""
        while True:
            pending = stopped.pending
            p = pending.partition
            if isinstance(pending, _Save):
                await self._save_now()
                stopped.sent |= self._carry_out_sends(pending.rest)
                stopped.moved |= pending.moved
            else:
                at, writer = pending.offset, self._writers[p]
                if self._reader is None:
                    batches = await writer.read_cold(at, self._max_batch_bytes, deleted_ok=True)
                    if not batches and at < writer.first_offset:
                        stopped.more = stopped.moved = True  # retention took it meanwhile
                else:
                    batches = await self._reader(p, at, self._max_batch_bytes)
                if self._commands:  # they came before the read's result: apply them first
                    self._apply_as_owner()
                stopped.batches = batches
            result = self._run_as_owner(stopped)
            if type(result) is not _Pass:
                return result is True
            stopped = result

    def _apply_as_owner(self) -> None:
        """Apply the queued commands in the dispatch task, the state lent to the call.

        The task is the state's owner, and a synchronous call it makes runs in it to the
        end, so it vouches once for the whole drain (``owner_lends``) instead of the state
        asking who calls at each command: ``asyncio.current_task()`` costs about 0.2 us
        on Python 3.11 (it looks up the running loop, a ``getpid`` call), paid by every
        queued command (acks, credit) and every read a pass of the task applies. A
        caller outside these calls is still checked (``test_dispatch_loop.py``). Never
        nested (the notifier's pass lends already and calls ``_apply_queued`` itself).
        """
        state = self._state
        state.owner_lends = True
        try:
            self._apply_queued()
        finally:
            state.owner_lends = False

    def _run_as_owner(self, resumed: _Pass | None) -> bool | _Pass:
        """:meth:`_run` in the dispatch task, the state lent to the call (see
        :meth:`_apply_as_owner`): one vouching per pass, not one check per read."""
        state = self._state
        state.owner_lends = True
        try:
            return self._run(resumed)
        finally:
            state.owner_lends = False

    def _carry_out_sends(self, actions: list[Action]) -> bool:
        """Do what the state machine asked, in order, none of it a ``Persist`` (a pass
        awaits those itself, :class:`_Save`); return whether anything was sent."""
        sent = False
        for action in actions:
            assert not isinstance(action, Persist), "a Persist must come first"
            sent |= self._do(action)
        return sent

    def carry_out_now(self, actions: list[Action]) -> None:
        """Carry out what applying a queued command asked for: notes, dead letters, sends
        a drain turned into releases; never a ``Persist`` (none comes from a command)."""
        for action in actions:
            if not isinstance(action, Persist):  # queued commands never send or persist
                self._do(action)

    def _do(self, action: Action) -> bool:
        if isinstance(action, Send):
            session = self._sessions.get(action.consumer)
            if session is not None and session.draining:  # it would follow DRAINED
                d = action.delivery
                release = Release(action.consumer, d.partition, d.from_offset, d.to_offset)
                self._state.handle(release, self._clock(), wall=self._wall_clock())
                self.dispatch = True
                self.wake.set()
                return False
            if session is not None:
                session.outbox.put_nowait(action.delivery)
                if not action.delivery.redeliveries:
                    self._sub.on_dispatch(max(0.0, self._wall_clock() - action.timestamp_ms / 1000))
            return True
        if isinstance(action, ToDeadLetter):
            self._dead_letters.add(action)
        elif isinstance(action, Note):
            logger.log(action.level, "%s/%s: %s", self._topic, self._name, action.message)
        return False

    async def _save_now(self) -> None:
        if self._persist is None:
            return
        changes = self._state.changes  # the save holds at least these
        try:
            await self._persist(self._sub)
        except OSError:
            logger.exception(
                "%s/%s: saving delivery counts failed; a crash now may undercount them",
                self._topic,
                self._name,
            )
        else:  # saved: on_change need not report them to the flusher again
            self._changes = max(self._changes, changes)

    def _arm_timer(self) -> None:
        """Wake the task when the next lease expires or a waiting record is due."""
        at = self._state.next_deadline()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None:
            loop = self._event_loop or asyncio.get_running_loop()
            delay = max(0.0, at - self._clock())  # both monotonic
            self._timer = loop.call_later(delay, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._timer_at = None
        self.dispatch = True
        self.wake.set()
