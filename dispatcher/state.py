"""The dispatch state machine of one subscription. Pure: no I/O, no asyncio, no clock.

Owns :class:`SubscriptionState`: the rules, and the one door to them (:meth:`handle`).
It keeps the transitions by which records come back (acks, nacks, releases, expired
leases, seeks, deletions, dead-letter outcomes) and hands each job beside them to a room
of its own, chosen once when it is built: sending a fetched batch
(:mod:`dispatcher.sending`), to whom by subscription type (:mod:`dispatcher.routing`, one
``route_*`` module a type), the consumers and their credit
(:mod:`dispatcher.consumer_set`), the poison policy and dead letters
(:mod:`dispatcher.poison`), lease deadlines (:mod:`dispatcher.leases`), what to read next
(:mod:`dispatcher.read_plan`) and refusing a bad command (:mod:`dispatcher.command_checks`).
The transitions left here stay in one class and one file (STYLE rule 22): each moves
offsets between the places below, and the invariant is kept by all of them together
(this docstring, which states it, is 79 of the module's lines). The records it keeps per
partition and per consumer (leases, failure entries, the key_shared slot hash) are in
:mod:`dispatcher.partition_book`. Its commands (``Attach`` .. ``DeadLetterFailed``), its
actions (``Send``, ``ToDeadLetter``, ``Persist``, ``Note``) and the settings that shape it
(:class:`DispatchPolicy`) are in :mod:`dispatcher.protocol`. The async shell
(:mod:`dispatcher.subscription`) feeds it one command at a time from its dispatch task,
``state.handle(cmd, now, wall=...)`` (``now`` monotonic, for every deadline; ``wall`` for
the attempt times it records), and carries out the actions it returns: it reads the log
when asked, puts deliveries in consumers' outboxes, writes dead letters and saves state.
Callers of the shell get a bad command refused at once by :meth:`SubscriptionState.check`,
which raises what ``handle`` would and changes nothing. The shell names the state's one
owner (:attr:`SubscriptionState.owner`, its dispatch task) and how to tell who calls;
``handle`` refuses a command from anyone else (see :mod:`dispatcher.dispatch_loop`).

Per partition every offset in ``[cursor, read_pos)`` is in exactly one place:

- **acknowledged** (:class:`~dispatcher.acks.AckRanges`, persisted: the cursor plus the
  ranges above it, so a restart does not resend what was acked out of order);
- **leased**: sent to one consumer, unacknowledged, with a deadline (the ack timeout);
- **waiting**: to be sent again once its ``ready_at`` has passed (a nack with a delay, an
  ack timeout with exponential backoff and jitter, a consumer that left, a release, or a
  key_shared record whose consumer has no room);
- **parked**: handed to the dead-letter queue, acknowledged once it is written there.

Offsets at or above ``read_pos`` have not been read yet. Leased, waiting and parked records
together count against ``max_unacked``: a slow consumer never makes the broker hold more
(plus at most one batch: the cap is checked before each slice, and slices are not split).

Each offset's delivery count is implicit (1 below ``sent_mark``, the highest offset ever
sent, 0 above) until a delivery of it fails; then it gets a failure entry: count, last
reason, the time of each failed attempt (persisted as
:class:`~dispatcher.protocol.FailureRun`, handed to the dead-letter queue as
:class:`~dispatcher.protocol.Failure`). A record that waits unsent while ``sent_mark``
passes it (key_shared) gets an entry with count 0. Both are persisted, so max-deliveries
survives a restart (DESIGN section 2, invariant 4). A pass that redelivers anything begins
with a ``Persist`` action, taken after the new counts are set: a redelivery's count is on
disk before it goes out, whether a failure or a restart (a lease lost with the process)
sent it back. A crash can then only overcount a record, by the one send that the save
preceded, and a record whose delivery keeps crashing the broker still reaches
max-deliveries. First deliveries are not saved first (``sent_mark`` is saved with the
cursor, by the shell's flusher): a crash within that interval resends them as first
deliveries.

A failed delivery and a release are told apart. A consumer whose stream breaks, or that
leaves holding records it handed to its application unacknowledged, failed them: each
gets a failure entry (the next send is a redelivery, and a consumer that crashes on a
poison record still drives it to max-deliveries). A consumer that closes cleanly first
drains (:class:`~dispatcher.protocol.Drain`: it gets nothing more) and then releases what
it received but never handed out (:class:`~dispatcher.protocol.Release`): those records
were not attempted. Their counts go back to what they were before the send, and they wait
with ``ready_at = now``, so they go out again at once, in order. Example: records 0..999
are sent to consumer A (one lease, ``sent_mark`` 1000); A hands 0 to its application,
acks it and releases 1..999: ``sent_mark`` goes back to 1 (the released run was the top
of what was ever sent), 1..999 wait, and the next consumer gets them with redelivery
count 0. Released offsets below others still sent get a count-0 failure entry instead
(as :func:`~dispatcher.partition_book.pass_over` gives), and a redelivery that is
released gets its entry's count lowered by one.

A record whose failures reached max-deliveries while it waits goes to the poison policy
even when no consumer has credit (see :mod:`dispatcher.poison`).

Example: exclusive, ack timeout 30 s. Records 0..9 are read and sent at t=0 (one lease).
The consumer acks 0..4 and nacks 5 with a 2 s delay at t=1: 5 waits until t=3, 6..9 stay
leased. At t=3 a read is asked from offset 5; 5 goes out again with redelivery count 1. At
t=30 the lease of 6..9 expires; they wait ``backoff(1)`` (1 s +- 20 %) and go out again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from dispatcher import read_plan
from dispatcher.command_checks import (
    check_commit,
    check_nack,
    check_range,
    check_seek,
    check_up_to,
    part_of,
)
from dispatcher.consumer_set import ConsumerSet
from dispatcher.errors import StateOwnerError
from dispatcher.leases import LeaseDeadlines, is_live, take_back
from dispatcher.partition_book import (
    Consumer,
    Lease,
    PartitionBook,
    failure_runs,
    record_failures,
    unblock,
    unsend,
)
from dispatcher.poison import PoisonRules
from dispatcher.protocol import (
    MAX_REASON_CHARS,
    Ack,
    AckUpTo,
    Action,
    Attach,
    Command,
    Commit,
    DeadLettered,
    DeadLetterFailed,
    Deleted,
    DeliveryMode,
    Detach,
    DispatchPolicy,
    Drain,
    Fetched,
    Grant,
    Nack,
    Note,
    PartitionSnapshot,
    Release,
    Seek,
    SubscriptionType,
    Tick,
)
from dispatcher.route_exclusive import ExclusiveRouter
from dispatcher.route_failover import FailoverRouter
from dispatcher.route_key_shared import KeySharedRouter
from dispatcher.route_shared import SharedRouter
from dispatcher.routing import Router
from dispatcher.sending import Sender


class SubscriptionState:
    """Everything one subscription knows, changed only through :meth:`handle`.

    Args:
        partitions: The persisted state of each partition.
        policy: Type, mode, limits and the redelivery rules.
        random: Uniform ``[0, 1)`` numbers for backoff jitter (tests pass a fixed one).
    """

    def __init__(
        self,
        partitions: Sequence[PartitionSnapshot],
        policy: DispatchPolicy,
        *,
        random: Callable[[], float],
        names: tuple[str, str] = ("", ""),
    ) -> None:
        self.policy = policy
        self._names = names
        self._random = random
        self._parts = [PartitionBook(i, snap) for i, snap in enumerate(partitions)]
        router = router_for(policy.type, names)
        self._members = ConsumerSet(router)
        self._consumers = self._members.by_id
        self._credit = self._members.any_credit
        self._poison = PoisonRules(policy.poison, len(self._parts), self._apply_ack)
        self._exhausted = self._poison.exhausted  # per partition (see dispatcher.poison)
        self._deadlines = LeaseDeadlines()
        self._deadline_heap = self._deadlines.heap  # read in place by tick_due
        self._sender = Sender(
            policy,
            router,
            parts=self._parts,
            tally=self,
            poison=self._poison,
            deadlines=self._deadlines,
            credit=self._credit,
            has_room=self.has_room,
            ack=self._apply_ack,
        )
        self._next_partition = 0
        #: The one caller :meth:`handle` accepts (the shell's dispatch task), as told by
        #: ``caller()`` (the shell passes ``asyncio.current_task``); ``None``: anyone (no
        #: task runs, or pure use). ``owner_lends``: the owner lends the state to the code
        #: running now (the notifier's synchronous pass, while the task sleeps).
        self.owner: object | None = None
        self.owner_lends = False
        self.caller: Callable[[], object] = _nobody
        # Plain attributes, not properties: the shell reads these after every read it
        # applies (``changes`` after every pass too), and a property is a Python call.
        # The sender counts into the first three (it is given this state as its
        # :class:`~dispatcher.sending.Tally`).
        #: Bumped whenever something that is persisted changed (a counter).
        self.changes = 0
        #: key_shared records newly set aside for a consumer that cannot take them yet
        #: (no credit, or a fence). Setting some aside is progress: the reads after them
        #: may find records for other consumers, so the shell reads again at once.
        self.set_aside_total = 0
        #: Whether the last ``Fetched`` moved its partition's read position or set
        #: records aside (progress: the shell reads again at once).
        self.moved = False
        # counters, read by the shell for metrics (more are properties)
        self.acked_total = 0
        self.ack_timeouts_total = 0
        self.nacked_total = 0
        #: Records consumers gave back unseen (a clean close): not delivery attempts.
        self.released_total = 0
        self._handlers: dict[type, Callable[[Command, float], list[Action]]] = {
            Attach: self._attach,
            Detach: self._detach,
            Drain: self._drain,
            Release: self._release,
            Grant: self._grant,
            Ack: self._ack,
            AckUpTo: self._ack_up_to,
            Nack: self._nack,
            Commit: self._commit,
            Seek: self._seek,
            Tick: self._tick,
            Fetched: self._sender.fetched,  # bound once: no call of the state's own
            Deleted: self._deleted,
            DeadLettered: self._dead_lettered,
            DeadLetterFailed: self._dead_letter_failed,
        }

    def handle(self, cmd: Command, now: float, *, wall: float | None = None) -> list[Action]:
        """Apply ``cmd`` at time ``now``; return what the shell must do, in order.

        ``now`` is the clock every deadline is on (ack timeouts, nack delays, backoff):
        the shell passes monotonic seconds, so a step of the wall clock moves no
        deadline. ``wall`` is wall-clock seconds, used only for what is recorded (the
        time of each failed attempt, persisted and handed to the dead-letter queue);
        ``None``: ``now`` is both.

        Raises:
            InvalidSubscriptionError: a bad partition, range, delay or offset.
            InvalidAckError: an ack of offsets that were never delivered.
            SubscriptionBusyError: a second consumer on an exclusive subscription.
            StateOwnerError: the caller is not the state's owner (:attr:`owner`).
        """
        owner = self.owner
        if owner is not None and not self.owner_lends and self.caller() is not owner:
            raise StateOwnerError(*self._names, owner, self.caller())
        sender = self._sender
        sender.wall = now if wall is None else wall
        if sender.stuck and type(cmd) not in (Fetched, Tick):
            # Credit, acks (fences), consumers coming and going: what was stuck may go now.
            for part in self._parts:
                part.stuck.clear()
            sender.stuck = False
        return self._handlers[type(cmd)](cmd, now)

    def check(self, cmd: Command) -> None:
        """Raise what :meth:`handle` would raise for ``cmd`` now, changing nothing: the
        shell calls it in the caller's task, so a bad ack, credit or seek is refused at
        once, before the command is queued for the dispatch task.

        A command that passes may still be refused when it is applied, if commands
        queued before it change the state (e.g. a release lowers what was delivered);
        the shell logs that.

        Raises:
            InvalidSubscriptionError: a bad partition, range, delay or offset.
            InvalidAckError: an ack of offsets that were never delivered.
            SubscriptionBusyError: a second consumer on an exclusive subscription.
        """
        kind = type(cmd)
        parts = self._parts
        if kind is Ack or kind is Release:
            assert isinstance(cmd, Ack | Release)
            what = "ack" if kind is Ack else "release"
            check_range(parts, what, cmd.partition, cmd.begin, cmd.end)
        elif isinstance(cmd, Nack):
            check_nack(parts, cmd)
        elif isinstance(cmd, AckUpTo):
            check_up_to(parts, cmd.partition, cmd.offset)
        elif isinstance(cmd, Commit):
            check_commit(parts, cmd)
        elif isinstance(cmd, Seek):
            check_seek(parts, cmd)
        elif isinstance(cmd, Attach):
            self._members.check_attach()

    def has_consumer(self, consumer: str) -> bool:
        """Whether ``consumer`` is attached."""
        return consumer in self._consumers

    # -- queries ----------------------------------------------------------------------

    @property
    def sent_total(self) -> int:
        """Records sent, redeliveries included (a counter)."""
        return self._sender.sent_total

    @property
    def redelivered_total(self) -> int:
        """Records sent again (a counter)."""
        return self._sender.redelivered_total

    @property
    def dead_lettered_total(self) -> int:
        """Records written to the dead-letter queue (a counter)."""
        return self._poison.dead_lettered_total

    @property
    def dropped_total(self) -> int:
        """Poison records dropped by policy ``drop`` (a counter)."""
        return self._poison.dropped_total

    @property
    def partition_count(self) -> int:
        """How many partitions."""
        return len(self._parts)

    @property
    def held(self) -> int:
        """Records leased, waiting and parked: what counts against ``max_unacked``."""
        total = 0
        for p in self._parts:  # a loop, not sum() over a generator: several calls a pass
            total += p.held()
        return total

    def consumers(self) -> list[str]:
        """The attached consumers' names, in the order they attached."""
        return self._members.names()

    def credit(self, consumer: str) -> int:
        """What ``consumer`` may still receive (negative after a batch larger than it)."""
        return self._consumers[consumer].credit

    def cursor(self, partition: int) -> int:
        """The first offset of ``partition`` not acknowledged."""
        return self._parts[partition].acks.cursor

    def read_position(self, partition: int) -> int:
        """The next offset of ``partition`` to read for the first time."""
        return self._parts[partition].read_pos

    def in_flight(self, partition: int) -> int:
        """Records of ``partition`` sent and not yet acknowledged."""
        return self._parts[partition].leases.total

    def lag(self, partition: int, head: int) -> int:
        """Records of ``partition`` below ``head`` not acknowledged."""
        part = self._parts[partition]
        return max(0, head - part.acks.cursor - part.acks.acked_count(head))

    def blocked(self, partition: int) -> str:
        """Why ``partition`` sends nothing (BLOCKED), or ``""``."""
        return self._parts[partition].blocked

    def blocked_on_dead_letters(self, partition: int) -> bool:
        """Whether ``partition`` is blocked by a dead-letter write that failed (retried),
        rather than by a poison record under policy ``block``."""
        return self._parts[partition].retry_dead_letters

    def waiting_at_cursor(self, partition: int) -> tuple[float, int, str] | None:
        """When the record at ``partition``'s cursor may go out again, how often it was
        sent and why its last delivery failed; ``None`` when it does not wait."""
        part = self._parts[partition]
        cursor = part.acks.cursor
        for _lo, _hi, at in part.waiting.overlapping(cursor, cursor + 1):
            tries = part.tries.get(cursor)
            return at, part.deliveries(cursor), tries.reason if tries else ""
        return None

    def ready(self, heads: Sequence[int], now: float) -> int:
        """Records that could be sent now if a consumer had room."""
        return read_plan.ready(self._parts, heads, now)

    def caught_up(self, heads: Sequence[int]) -> bool:
        """Whether nothing is left to send (see :func:`~dispatcher.read_plan.caught_up`)."""
        return read_plan.caught_up(self._parts, heads)

    def has_room(self) -> bool:
        """Whether some consumer may receive a record now."""
        return self._credit() and self.held < self.policy.max_unacked

    def next_deadline(self) -> float | None:
        """When the next lease expires or the next waiting record becomes ready (see
        :func:`~dispatcher.read_plan.next_wake`)."""
        lease_deadline = self._deadlines.next()
        return read_plan.next_wake(self._parts, self._poison, self._credit, lease_deadline)

    def reads(self, heads: Sequence[int], now: float) -> list[tuple[int, int]]:
        """``(partition, offset)`` to read from, each partition first in turn (see
        :func:`~dispatcher.read_plan.plan_reads`)."""
        if (
            not self._consumers
            and not any(self._exhausted)
            and not any(p.retry_dead_letters for p in self._parts)
        ):
            return []  # nothing can go: dead letters and poison need no consumer
        start = self._next_partition
        self._next_partition = (start + 1) % len(self._parts)
        credit = self._credit()
        room = credit and self.held < self.policy.max_unacked
        return read_plan.plan_reads(
            self._parts, heads, now, start=start, credit=credit, room=room, poison=self._poison
        )

    def _first_exhausted(self, part: PartitionBook, now: float) -> int | None:
        return self._poison.first_exhausted(part, now)

    def snapshot(self, max_ranges: int) -> list[PartitionSnapshot]:
        """What to persist: per partition the cursor, at most ``max_ranges`` ack ranges
        (those above are sent again after a restart), the delivered mark and failures."""
        out = []
        for part in self._parts:
            # Only the snapshot is trimmed: records of ranges left out are sent again after a
            # restart, but the running state keeps them acknowledged (else nothing would
            # ever resend or acknowledge them, and the cursor would stop there).
            ranges = tuple(part.acks.ranges()[:max_ranges])
            out.append(
                PartitionSnapshot(part.acks.cursor, ranges, part.sent_mark, failure_runs(part))
            )
        self._sender.unsaved_counts = False
        return out

    # -- consumers --------------------------------------------------------------------

    def _eligible(self) -> list[Consumer]:
        """Consumers that may receive records at all (failover: only the active one)."""
        return self._members.eligible

    def _attach(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Attach)
        self._members.attach(cmd.consumer, cmd.name, cmd.credit, self._parts)
        return []

    def _detach(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Detach)
        consumer = self._members.detach(cmd.consumer)
        if consumer is None:
            return []
        reason = f"consumer {consumer.name} left before acknowledging"
        for lease in list(consumer.leases):
            self._return_lease(lease, lease.begin, lease.end, now, reason=reason, delay=0.0)
        return []

    def _grant(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Grant)
        self._members.grant(cmd.consumer, cmd.credit)
        return []

    def _drain(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Drain)
        self._members.drain(cmd.consumer)
        return []

    def _release(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Release)
        part = check_range(self._parts, "release", cmd.partition, cmd.begin, cmd.end)
        consumer = self._consumers.get(cmd.consumer)
        if consumer is None or self.policy.mode is DeliveryMode.AT_MOST_ONCE:
            return []
        # Highest first: a released run at the top of what was sent lowers sent_mark,
        # and then the run below it is at the top in turn (see the module doc).
        for lo, hi, lease in reversed(list(part.leases.overlapping(cmd.begin, cmd.end))):
            if lease.consumer is consumer:
                self._release_lease(part, lease, lo, hi, now)
        return []

    def _release_lease(
        self, part: PartitionBook, lease: Lease, begin: int, end: int, now: float
    ) -> None:
        """Take ``[begin, end)`` of ``lease`` back unattempted: restore the counts the
        send raised, and make it wait with no delay."""
        for lo, hi in reversed(take_back(part, lease, begin, end)):
            unsend(part, lo, hi)
            part.waiting.add(lo, hi, now)
            self.released_total += hi - lo
            self.changes += 1

    # -- acknowledgements -------------------------------------------------------------

    def check_partition(self, partition: int) -> None:
        """Raise ``InvalidSubscriptionError`` unless ``partition`` exists."""
        self._part(partition)

    def _part(self, partition: int) -> PartitionBook:
        return part_of(self._parts, partition)

    def _ack(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Ack)
        part = check_range(self._parts, "ack", cmd.partition, cmd.begin, cmd.end)
        self._apply_ack(part, cmd.begin, cmd.end)
        return []

    def _ack_up_to(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, AckUpTo)
        part = check_up_to(self._parts, cmd.partition, cmd.offset)
        self._apply_ack(part, part.acks.cursor, cmd.offset)
        return []

    def _commit(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Commit)
        part = check_commit(self._parts, cmd)
        part.sent_mark = max(part.sent_mark, cmd.offset)
        self._apply_ack(part, part.acks.cursor, cmd.offset)
        return []

    def _apply_ack(self, part: PartitionBook, begin: int, end: int) -> None:
        if begin >= end:
            return
        for lo, hi, lease in part.leases.cut(begin, end):
            lease.remaining -= hi - lo
            lease.consumer.in_flight -= hi - lo
            if lease.remaining <= 0:
                lease.consumer.leases.discard(lease)
        part.waiting.cut(begin, end)
        part.parked.cut(begin, end)
        newly = part.acks.ack(begin, end)
        if newly:
            self.acked_total += newly
            self.changes += 1
            part.read_pos = max(part.read_pos, part.acks.cursor)
            if part.blocked and part.acks.is_acked(part.blocked_offset):
                unblock(part)

    def _nack(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Nack)
        part = check_nack(self._parts, cmd)
        if self.policy.mode is DeliveryMode.AT_MOST_ONCE:
            return []  # already consumed when it was sent
        default = "rejected by the consumer" if cmd.dead_letter else "nacked by the consumer"
        reason = (cmd.reason or default)[:MAX_REASON_CHARS]
        # A reject waits with no delay and is marked exhausted: the next pass hands it to
        # the poison policy, with or without a consumer that has credit.
        delay = 0.0 if cmd.dead_letter else cmd.delay_s
        for lo, hi, lease in part.leases.overlapping(cmd.begin, cmd.end):
            self.nacked_total += hi - lo
            self._return_lease(
                lease, lo, hi, now, reason=reason, delay=delay, reject=cmd.dead_letter
            )
        return []

    def _return_lease(
        self,
        lease: Lease,
        begin: int,
        end: int,
        now: float,
        *,
        reason: str,
        delay: float | None,
        reject: bool = False,
    ) -> None:
        """Take ``[begin, end)`` of ``lease`` back: record the failure, make it wait;
        ``reject``: mark it for the poison policy (its entry is kept past MAX_FAILURES,
        since the mark is what sends it there, after a restart too)."""
        part = self._parts[lease.partition]
        sent_ms = int(lease.sent_at * 1000)
        limit = self.policy.max_deliveries
        for lo, hi in take_back(part, lease, begin, end):
            failures, poison = record_failures(
                part, lo, hi, reason, sent_ms=sent_ms, reject=reject, max_deliveries=limit
            )
            self._exhausted[part.index].update(poison)
            wait = delay if delay is not None else self.policy.backoff_s(failures, self._random())
            part.waiting.add(lo, hi, now + wait)
            self.changes += 1

    def tick_due(self, now: float) -> bool:
        """Whether a ``Tick`` at ``now`` may change anything: a lease expired, a key_shared
        fence may lift, or failure entries may be pruned. When not, the shell skips it
        (it comes before every pass)."""
        heap = self._deadline_heap  # LeaseDeadlines.due, in place: every pass asks
        if heap and heap[0][0] <= now:
            return True
        for consumer in self._consumers.values():
            if consumer.fences:
                return True
        for part in self._parts:  # noqa: SIM110 - any() over a generator costs more
            if part.tries:
                return True
        return False

    def _tick(self, cmd: Command, now: float) -> list[Action]:
        for lease in self._deadlines.expired(now):
            timeout = self.policy.ack_timeout_s
            self.ack_timeouts_total += lease.remaining
            reason = f"not acknowledged within the ack timeout ({timeout:g} s)"
            self._return_lease(lease, lease.begin, lease.end, now, reason=reason, delay=None)
        for consumer in self._consumers.values():
            if consumer.fences:
                consumer.fences = {
                    p: f for p, f in consumer.fences.items() if self._parts[p].acks.cursor < f
                }
        for part in self._parts:
            if part.tries and len(part.tries) > 2 * part.held() + 64:
                part.tries = {o: t for o, t in part.tries.items() if not part.acks.is_acked(o)}
        return []

    _live = staticmethod(is_live)  # whether a lease still holds records (tests' name)

    # -- moving positions -------------------------------------------------------------

    def _seek(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Seek)
        check_seek(self._parts, cmd)
        for part, offset in zip(self._parts, cmd.offsets, strict=True):
            for _lo, _hi, lease in part.leases.cut(0, 1 << 62):
                lease.consumer.leases.discard(lease)
            for consumer in self._consumers.values():
                consumer.in_flight = sum(lease.remaining for lease in consumer.leases)
            part.waiting.clear()
            part.parked.clear()
            part.acks.reset(offset)
            part.read_pos = offset
            part.sent_mark = max(part.sent_mark, offset)
            part.tries.clear()
            self._exhausted[part.index].clear()
            unblock(part)
        self.changes += 1
        return []

    def _deleted(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Deleted)
        part = self._part(cmd.partition)
        first = cmd.first_offset
        lost = max(0, first - part.acks.cursor - part.acks.acked_count(first))
        part.sent_mark = max(part.sent_mark, first)
        self._apply_ack(part, part.acks.cursor, first)
        part.read_pos = max(part.read_pos, first)
        return [
            Note(
                logging.WARNING,
                f"partition {part.index}: {lost} records below offset {first} were deleted "
                f"by retention before they were acknowledged; continuing at {first}",
            )
        ]

    # -- dead letters -----------------------------------------------------------------

    def _dead_lettered(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, DeadLettered)
        self._poison.dead_lettered(self._part(cmd.partition), cmd.begin, cmd.end)
        return []

    def _dead_letter_failed(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, DeadLetterFailed)
        part = self._part(cmd.partition)
        return self._poison.dead_letter_failed(part, cmd.begin, cmd.end, cmd.error, now)


def router_for(kind: SubscriptionType, names: tuple[str, str]) -> Router:
    """The router of subscription type ``kind`` (chosen once, when the state is built)."""
    if kind is SubscriptionType.EXCLUSIVE:
        return ExclusiveRouter(names)
    if kind is SubscriptionType.FAILOVER:
        return FailoverRouter()
    if kind is SubscriptionType.SHARED:
        return SharedRouter()
    return KeySharedRouter()


def _nobody() -> None:
    """The caller when the shell names none: nobody (only an unset owner accepts it)."""
