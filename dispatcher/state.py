"""The dispatch state machine of one subscription. Pure: no I/O, no asyncio, no clock.

Owns :class:`SubscriptionState`: the rules. The records it keeps per partition and per
consumer (leases, failure entries, the key_shared slot hash) are in
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
even when no consumer has credit (all drained, or none attached): a consumer that nacks
a record's last try and closes does not leave it waiting for the next consumer.

Routing by type: ``exclusive`` has one consumer; ``failover`` sends to the consumer that
attached first, the others stand by, and a takeover resends the unacknowledged records
first, in order; ``shared`` sends each slice to the next consumer with credit; ``key_shared``
maps each key to one of :data:`~dispatcher.partition_book.SLOTS` slots and each slot to a
consumer by rendezvous hashing of consumer names. A consumer that joins a key_shared
subscription while records are in flight gets nothing at or past the read position of its
arrival until everything below it is acknowledged, and a record below that position (read
before it came, and set aside or nacked) only once every record before it is, so keys that
move to it keep their order.

Example: exclusive, ack timeout 30 s. Records 0..9 are read and sent at t=0 (one lease).
The consumer acks 0..4 and nacks 5 with a 2 s delay at t=1: 5 waits until t=3, 6..9 stay
leased. At t=3 a read is asked from offset 5; 5 goes out again with redelivery count 1. At
t=30 the lease of 6..9 expires; they wait ``backoff(1)`` (1 s +- 20 %) and go out again.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable, Sequence

from dispatcher.errors import (
    InvalidAckError,
    InvalidSubscriptionError,
    StateOwnerError,
    SubscriptionBusyError,
)
from dispatcher.partition_book import (
    MAX_FAILURES,
    BatchContext,
    Consumer,
    Lease,
    PartitionBook,
    Tries,
    failure_runs,
    failures_of,
    pass_over,
    slot_owners,
    slot_weights,
    unblock,
    unsend,
)
from dispatcher.protocol import (
    MAX_REASON_CHARS,
    PERSIST,
    Ack,
    AckUpTo,
    Action,
    Attach,
    Command,
    Commit,
    DeadLettered,
    DeadLetterFailed,
    Deleted,
    Delivery,
    DeliveryMode,
    Detach,
    DispatchPolicy,
    Drain,
    Fetched,
    Grant,
    Nack,
    Note,
    PartitionSnapshot,
    PoisonPolicy,
    Release,
    Seek,
    Send,
    SubscriptionType,
    Tick,
    ToDeadLetter,
    check_number,
)
from wal import RecordBatch

#: Builds a named tuple from a tuple of its fields without its Python ``__new__`` (3x
#: faster): for the :class:`Delivery` and :class:`Send` of every delivery.
_new = tuple.__new__

#: How long a dead letter that could not be written waits before the next try, seconds.
DEAD_LETTER_RETRY_S = 1.0


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
        self._consumers: dict[str, Consumer] = {}
        self._draining: set[str] = set()  # consumers that drained: credit is ignored
        # Per partition: waiting offsets whose failures reached max_deliveries. They go to
        # the poison policy at once, with or without a consumer that has credit (one that
        # nacked its last try and closed must not leave them waiting for the next one).
        self._exhausted: list[set[int]] = [set() for _ in self._parts]
        self._eligible_now: list[Consumer] = []  # see _eligible
        self._order = 0
        self._rr = 0  # shared: the next consumer to try
        self._next_partition = 0
        self._owners: list[Consumer] = []  # key_shared: owner per slot
        self._deadlines: list[tuple[float, Lease]] = []  # lazily pruned heap
        self._wall = 0.0  # wall-clock seconds of the command being handled (see handle)
        self._unsaved_counts = False
        self._stuck = False  # whether any partition has stuck offsets
        #: The one caller :meth:`handle` accepts (the shell's dispatch task), as told by
        #: ``caller()`` (the shell passes ``asyncio.current_task``); ``None``: anyone (no
        #: task runs, or pure use). ``owner_lends``: the owner lends the state to the code
        #: running now (the notifier's synchronous pass, while the task sleeps).
        self.owner: object | None = None
        self.owner_lends = False
        self.caller: Callable[[], object] = _nobody
        #: Bumped whenever something that is persisted changed.
        self.changes = 0
        # counters, read by the shell for metrics
        self.sent_total = 0
        #: key_shared records newly set aside for a consumer that cannot take them yet (no
        #: credit, or a fence). Setting some aside is progress: the reads after them may
        #: find records for other consumers, so the shell reads again at once.
        self.set_aside_total = 0
        self.acked_total = 0
        self.redelivered_total = 0
        self.ack_timeouts_total = 0
        self.nacked_total = 0
        #: Records consumers gave back unseen (a clean close): not delivery attempts.
        self.released_total = 0
        self.dead_lettered_total = 0
        self.dropped_total = 0
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
            Fetched: self._fetched,
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
        self._wall = now if wall is None else wall
        if self._stuck and type(cmd) not in (Fetched, Tick):
            # Credit, acks (fences), consumers coming and going: what was stuck may go now.
            for part in self._parts:
                part.stuck.clear()
            self._stuck = False
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
        if kind is Ack or kind is Release or kind is Nack:
            assert isinstance(cmd, Ack | Release | Nack)
            if isinstance(cmd, Nack):
                self._check_nack(cmd)
            else:
                what = "ack" if kind is Ack else "release"
                self._check_range(what, cmd.partition, cmd.begin, cmd.end)
        elif isinstance(cmd, AckUpTo):
            self._check_up_to(cmd.partition, cmd.offset)
        elif isinstance(cmd, Commit):
            self._check_commit(cmd)
        elif isinstance(cmd, Seek):
            self._check_seek(cmd)
        elif isinstance(cmd, Attach):
            self._check_attach()

    def _check_range(self, what: str, partition: int, begin: int, end: int) -> PartitionBook:
        part = self._part(partition)
        if not 0 <= begin < end:
            raise InvalidSubscriptionError(what, f"[{begin}, {end}) is not an offset range")
        if end > part.sent_mark:
            raise InvalidAckError(partition, end - 1, part.sent_mark, what)
        return part

    def _check_nack(self, cmd: Nack) -> PartitionBook:
        part = self._check_range("nack", cmd.partition, cmd.begin, cmd.end)
        if cmd.delay_s is not None:
            check_number("nack delay", cmd.delay_s, 0, 86_400, "seconds")
        return part

    def _check_up_to(self, partition: int, offset: int) -> PartitionBook:
        part = self._part(partition)
        if offset > part.sent_mark:
            raise InvalidAckError(partition, offset - 1, part.sent_mark)
        return part

    def _check_commit(self, cmd: Commit) -> PartitionBook:
        part = self._part(cmd.partition)
        if not 0 <= cmd.offset <= cmd.head:
            raise InvalidSubscriptionError(
                "offset", f"{cmd.offset} is outside [0, {cmd.head}] on partition {part.index}"
            )
        return part

    def _check_seek(self, cmd: Seek) -> None:
        if len(cmd.offsets) != len(self._parts):
            raise InvalidSubscriptionError("seek", f"needs {len(self._parts)} offsets")

    def _check_attach(self) -> None:
        if self.policy.type is SubscriptionType.EXCLUSIVE and self._consumers:
            holder = next(iter(self._consumers.values())).name
            raise SubscriptionBusyError(*self._names, holder)

    def has_consumer(self, consumer: str) -> bool:
        """Whether ``consumer`` is attached."""
        return consumer in self._consumers

    # -- queries ----------------------------------------------------------------------

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
        return [c.name for c in sorted(self._consumers.values(), key=lambda c: c.order)]

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
        total = 0
        for part, head in zip(self._parts, heads, strict=True):
            if part.blocked:
                continue
            total += max(0, head - part.read_pos)
            if part.waiting:
                total += sum(e - b for b, e, at in part.sendable_waiting() if at <= now)
        return total

    def caught_up(self, heads: Sequence[int]) -> bool:
        """Whether nothing is left to send: every partition read up to its head and no
        record waiting (the heartbeat's cheap check for idle subscriptions)."""
        for part, head in zip(self._parts, heads, strict=True):
            if head > part.read_pos or part.waiting:
                return False
        return True

    def has_room(self) -> bool:
        """Whether some consumer may receive a record now."""
        return self._credit() and self.held < self.policy.max_unacked

    def _credit(self) -> bool:
        """Whether some eligible consumer has credit (a loop: several calls a pass)."""
        for c in self._eligible_now:  # noqa: SIM110 - any() over a generator costs more
            if c.credit > 0:
                return True
        return False

    def next_deadline(self) -> float | None:
        """When the next lease expires or the next waiting record becomes ready.

        Waiting records count only while a consumer that may receive them has credit:
        else their time may have passed already, and a grant is a command anyway."""
        times = []
        heap = self._deadlines
        while heap and not self._live(heap[0][1]):
            heapq.heappop(heap)
        if heap:
            times.append(heap[0][0])
        credit: bool | None = None  # looked at only for a partition with waiting records
        for part in self._parts:
            if not (part.waiting or part.retry_dead_letters or self._exhausted[part.index]):
                continue  # the common case: nothing of this partition waits
            if credit is None:
                credit = self._credit()
            if part.waiting and not part.blocked and credit:
                times.extend(at for _, _, at in part.sendable_waiting())
            elif self._exhausted[part.index] and not part.blocked:
                for offset in self._exhausted[part.index]:
                    times.extend(at for _, _, at in part.waiting.overlapping(offset, offset + 1))
            if part.retry_dead_letters:
                times.extend(at for _, _, at in part.parked if at is not None)
        return min(times) if times else None

    def reads(self, heads: Sequence[int], now: float) -> list[tuple[int, int]]:
        """``(partition, offset)`` to read from, round robin: the first ready waiting
        record, or the read position when new records are durable and there is room."""
        if (
            not self._consumers
            and not any(self._exhausted)
            and not any(p.retry_dead_letters for p in self._parts)
        ):
            return []  # nothing can go: dead letters and poison need no consumer
        count = len(self._parts)
        start = self._next_partition
        self._next_partition = (start + 1) % count
        credit = self._credit()
        room = credit and self.held < self.policy.max_unacked
        out = []
        for i in range(count):
            p = (start + i) % count
            part = self._parts[p]
            offset = None
            if part.blocked:
                if part.retry_dead_letters:
                    offset = next(
                        (b for b, _, at in part.parked if at is not None and at <= now), None
                    )
            else:
                if credit:  # waiting records are held already: credit is all they need
                    if part.waiting:
                        offset = next(
                            (b for b, _, at in part.sendable_waiting() if at <= now), None
                        )
                elif self._exhausted[p]:  # poison needs no credit
                    offset = self._first_exhausted(part, now)
                if room and offset is None and part.read_pos < heads[p]:
                    offset = part.read_pos
            if offset is not None:
                out.append((p, offset))
        return out

    def _first_exhausted(self, part: PartitionBook, now: float) -> int | None:
        """The first waiting offset of ``part`` that reached max_deliveries and is ready
        at ``now``; forgets those that no longer wait (acked, sent, sought past)."""
        exhausted = self._exhausted[part.index]
        first = None
        for offset in sorted(exhausted):
            pieces = list(part.waiting.overlapping(offset, offset + 1))
            if not pieces:
                exhausted.discard(offset)
            elif first is None and pieces[0][2] <= now:
                first = offset
        return first

    def _poison_exhausted(self, part: PartitionBook, ctx: BatchContext) -> None:
        """With no consumer to send to, apply the poison policy to the waiting offsets of
        ``ctx``'s batch that reached max_deliveries and are ready."""
        base, nxt = ctx.base, ctx.batch.next_offset
        for offset in sorted(o for o in self._exhausted[part.index] if base <= o < nxt):
            if part.blocked:
                return
            if any(at <= ctx.now for _, _, at in part.waiting.overlapping(offset, offset + 1)):
                part.waiting.cut(offset, offset + 1)
                self._poison(part, ctx, offset)

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
        self._unsaved_counts = False
        return out

    # -- consumers --------------------------------------------------------------------

    def _eligible(self) -> list[Consumer]:
        """Consumers that may receive records at all (failover: only the active one).
        Kept up to date by attach and detach: several calls a pass, do not change it."""
        return self._eligible_now

    def _consumers_changed(self) -> None:
        if not self._consumers:
            self._eligible_now = []
        elif self.policy.type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            self._eligible_now = [min(self._consumers.values(), key=lambda c: c.order)]
        else:
            self._eligible_now = list(self._consumers.values())

    def _attach(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Attach)
        self._check_attach()
        self._order += 1
        consumer = Consumer(cmd.consumer, cmd.name, self._order, cmd.credit)
        if self.policy.type is SubscriptionType.KEY_SHARED:
            consumer.weights = slot_weights(cmd.name)
            if self._consumers:  # keys that move here keep their order: see module doc
                for part in self._parts:
                    if part.leases:
                        consumer.fences[part.index] = part.read_pos
        self._consumers[cmd.consumer] = consumer
        self._consumers_changed()
        self._rebalance()
        return []

    def _detach(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Detach)
        consumer = self._consumers.pop(cmd.consumer, None)
        self._draining.discard(cmd.consumer)
        if consumer is None:
            return []
        self._consumers_changed()
        reason = f"consumer {consumer.name} left before acknowledging"
        for lease in list(consumer.leases):
            self._return_lease(lease, lease.begin, lease.end, now, reason=reason, delay=0.0)
        self._rebalance()
        return []

    def _grant(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Grant)
        consumer = self._consumers.get(cmd.consumer)
        if consumer is not None and cmd.consumer not in self._draining:
            consumer.credit += cmd.credit
        return []

    def _drain(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Drain)
        consumer = self._consumers.get(cmd.consumer)
        if consumer is not None:
            consumer.credit = min(consumer.credit, 0)
            self._draining.add(consumer.id)
        return []

    def _release(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Release)
        part = self._check_range("release", cmd.partition, cmd.begin, cmd.end)
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
        for lo, hi, _ in reversed(part.leases.cut(begin, end, only=lease)):
            lease.remaining -= hi - lo
            lease.consumer.in_flight -= hi - lo
            unsend(part, lo, hi)
            part.waiting.add(lo, hi, now)
            self.released_total += hi - lo
            self.changes += 1
        if lease.remaining <= 0:
            lease.consumer.leases.discard(lease)

    def _rebalance(self) -> None:
        if self.policy.type is not SubscriptionType.KEY_SHARED or not self._consumers:
            self._owners = []
            return
        self._owners = slot_owners(self._consumers.values())

    # -- acknowledgements -------------------------------------------------------------

    def check_partition(self, partition: int) -> None:
        """Raise ``InvalidSubscriptionError`` unless ``partition`` exists."""
        self._part(partition)

    def _part(self, partition: int) -> PartitionBook:
        if not 0 <= partition < len(self._parts):
            raise InvalidSubscriptionError(
                "partition",
                f"{partition} does not exist; the topic has partitions 0..{len(self._parts) - 1}",
            )
        return self._parts[partition]

    def _ack(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Ack)
        part = self._check_range("ack", cmd.partition, cmd.begin, cmd.end)
        self._apply_ack(part, cmd.begin, cmd.end)
        return []

    def _ack_up_to(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, AckUpTo)
        part = self._check_up_to(cmd.partition, cmd.offset)
        self._apply_ack(part, part.acks.cursor, cmd.offset)
        return []

    def _commit(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Commit)
        part = self._check_commit(cmd)
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
        part = self._check_nack(cmd)
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
        for lo, hi, _ in part.leases.cut(begin, end, only=lease):
            lease.remaining -= hi - lo
            lease.consumer.in_flight -= hi - lo
            failures = 0
            for offset in range(lo, hi):
                tries = part.tries.get(offset)
                if tries is None:
                    if len(part.tries) >= MAX_FAILURES and not reject:
                        continue  # bounded memory; the offset keeps its implicit count
                    tries = part.tries[offset] = Tries(1, reason, [])
                tries.reason = reason
                tries.times.append(sent_ms)
                tries.rejected = tries.rejected or reject
                failures = max(failures, tries.deliveries)
                if tries.rejected or (limit and tries.deliveries >= limit):
                    self._exhausted[part.index].add(offset)
            wait = delay if delay is not None else self.policy.backoff_s(failures, self._random())
            part.waiting.add(lo, hi, now + wait)
            self.changes += 1
        if lease.remaining <= 0:
            lease.consumer.leases.discard(lease)

    def tick_due(self, now: float) -> bool:
        """Whether a ``Tick`` at ``now`` may change anything: a lease expired, a key_shared
        fence may lift, or failure entries may be pruned. When not, the shell skips it
        (it comes before every pass)."""
        heap = self._deadlines
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
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, lease = heapq.heappop(heap)
            if not self._live(lease):
                continue
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

    def _live(self, lease: Lease) -> bool:
        return lease.remaining > 0 and lease in lease.consumer.leases

    # -- moving positions -------------------------------------------------------------

    def _seek(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Seek)
        self._check_seek(cmd)
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
        part = self._part(cmd.partition)
        self.dead_lettered_total += sum(
            hi - lo for lo, hi, _ in part.parked.overlapping(cmd.begin, cmd.end)
        )
        self._apply_ack(part, cmd.begin, cmd.end)
        return []

    def _dead_letter_failed(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, DeadLetterFailed)
        part = self._part(cmd.partition)
        retry = part.parked.cut(cmd.begin, cmd.end)
        if not retry:  # acknowledged or sought past meanwhile: nothing is owed any more
            return []
        for lo, hi, _ in retry:
            part.parked.add(lo, hi, now + DEAD_LETTER_RETRY_S)
        first = retry[0][0]
        part.blocked = (
            f"dead-letter queue write failed for offset {first} ({cmd.error}); retrying "
            f"every {DEAD_LETTER_RETRY_S:g} s; nothing is acknowledged until it succeeds"
        )
        part.blocked_offset = first
        part.retry_dead_letters = True
        return [Note(logging.ERROR, f"partition {part.index}: {part.blocked}")]

    # -- sending ----------------------------------------------------------------------

    def _fetched(self, cmd: Command, now: float) -> list[Action]:
        assert isinstance(cmd, Fetched)
        part = self._part(cmd.partition)
        out: list[Action] = []
        for batch in cmd.batches:
            if not self._send_batch(part, batch, now, out):
                break
        if self._unsaved_counts:
            out.insert(0, PERSIST)
            self._unsaved_counts = False
        return out

    def _send_batch(
        self, part: PartitionBook, batch: RecordBatch, now: float, out: list[Action]
    ) -> bool:
        """Send what may go of one batch; return False once nothing more can go."""
        base, nxt = batch.base_offset, batch.next_offset
        if part.blocked:
            if part.retry_dead_letters:
                ctx = BatchContext(batch, now, out)
                for lo, hi, at in part.parked.overlapping(base, nxt):
                    if at is not None and at <= now:
                        part.parked.cut(lo, hi)
                        self._to_dead_letter(part, ctx, lo, hi)
            return False
        spans: list[tuple[int, int, bool]] = []  # (lo, hi, from waiting), in offset order
        if part.waiting:
            spans.extend(
                (lo, hi, True) for lo, hi, at in part.waiting.overlapping(base, nxt) if at <= now
            )
        # A batch past the read position is from a read that went stale (a seek moved the
        # position back while the shell awaited): its records must not be sent from there.
        fresh = base <= part.read_pos < nxt
        if fresh:
            acks = part.acks
            if acks.has_ranges():
                spans.extend((lo, hi, False) for lo, hi in acks.unacked(part.read_pos, nxt))
            else:  # nothing acked above the cursor: what unacked() would give, at once
                lo = max(part.read_pos, acks.cursor)
                if lo < nxt:
                    spans.append((lo, nxt, False))
        if not spans:
            if fresh:  # all acknowledged (ranges saved above the cursor): read on past it
                part.read_pos = nxt
            return True
        ctx = BatchContext(batch, now, out)
        if self._exhausted[part.index] and not self._credit():
            self._poison_exhausted(part, ctx)  # nothing else can go without credit
            return False
        for lo, hi, waited in spans:
            if waited:
                if not self._credit():
                    return False
                part.waiting.cut(lo, hi)
            elif not self.has_room():
                return False
            self._route(part, ctx, lo, hi)
            if not waited:
                part.read_pos = hi
            if part.blocked:
                return False
        if fresh:
            part.read_pos = max(part.read_pos, nxt)
        return True

    def _route(self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int) -> None:
        """Send ``[lo, hi)`` (unacknowledged, not leased) or make it wait."""
        if lo < part.sent_mark and (self.policy.max_deliveries or part.tries):
            # redeliveries: poison records first (per offset; this path is rare), those
            # past max_deliveries and those a consumer rejected (with no limit too)
            limit = self.policy.max_deliveries
            run_lo = lo
            for offset in range(lo, min(hi, part.sent_mark)):
                if part.is_poison(offset, limit):
                    self._assign(part, ctx, run_lo, offset)
                    self._poison(part, ctx, offset)
                    run_lo = offset + 1
                    if part.blocked:
                        part.waiting.add(offset + 1, hi, ctx.now)
                        return
                    if not self.has_room():
                        part.waiting.add(offset + 1, hi, ctx.now)
                        return
            lo = run_lo
        self._assign(part, ctx, lo, hi)

    def _poison(self, part: PartitionBook, ctx: BatchContext, offset: int) -> None:
        self._exhausted[part.index].discard(offset)
        deliveries = part.deliveries(offset)
        tries = part.tries.get(offset)
        rejected = tries is not None and tries.rejected
        policy = self.policy.poison
        if policy is PoisonPolicy.DROP:
            self.dropped_total += 1
            self._apply_ack(part, offset, offset + 1)
            why = "rejected by its consumer" if rejected else f"after {deliveries} deliveries"
            ctx.out.append(
                Note(
                    logging.WARNING,
                    f"partition {part.index} offset {offset}: dropped {why} (poison policy drop)",
                )
            )
        elif policy is PoisonPolicy.BLOCK:
            part.parked.add(offset, offset + 1, None)
            why = "was rejected by its consumer" if rejected else f"failed {deliveries} deliveries"
            part.blocked = (
                f"offset {offset} {why} (poison policy block); seek past it or change the policy"
            )
            part.blocked_offset = offset
            ctx.out.append(Note(logging.ERROR, f"partition {part.index}: {part.blocked}"))
        else:
            self._to_dead_letter(part, ctx, offset, offset + 1)

    def _to_dead_letter(self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int) -> None:
        part.parked.add(lo, hi, None)
        ctx.out.append(ToDeadLetter(part.index, ctx.batch, lo, hi, failures_of(part, lo, hi)))

    def _assign(self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int) -> None:
        """Give ``[lo, hi)`` to consumers by the subscription's type; what none can take
        now waits."""
        if lo >= hi:
            return
        kind = self.policy.type
        if kind is SubscriptionType.KEY_SHARED:
            owners = self._owners
            slots = ctx.slots()
            run_lo = lo
            run_owner = owners[slots[lo - ctx.base]]
            for offset in range(lo + 1, hi):
                owner = owners[slots[offset - ctx.base]]
                if owner is not run_owner:
                    self._give(part, ctx, run_lo, offset, run_owner)
                    run_lo, run_owner = offset, owner
            self._give(part, ctx, run_lo, hi, run_owner)
            return
        eligible = self._eligible()
        target = None
        if kind is SubscriptionType.SHARED:
            n = len(eligible)
            for i in range(n):
                candidate = eligible[(self._rr + i) % n]
                if candidate.credit > 0:
                    target = candidate
                    self._rr = (self._rr + i + 1) % n
                    break
        elif eligible and eligible[0].credit > 0:
            target = eligible[0]
        if target is None:
            part.waiting.add(lo, hi, ctx.now)
            return
        self._give(part, ctx, lo, hi, target)

    def _stick(self, part: PartitionBook, lo: int, hi: int, now: float) -> None:
        """``[lo, hi)`` waits for the one consumer that may take it (key_shared's owner of
        its keys, or the only eligible one) to have credit or its fence lifted."""
        part.waiting.add(lo, hi, now)
        if self.policy.type is SubscriptionType.KEY_SHARED:
            already = sum(b - a for a, b, _ in part.stuck.cut(lo, hi))
            part.stuck.add(lo, hi, True)
            self._stuck = True
            self.set_aside_total += hi - lo - already

    def _give(
        self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int, consumer: Consumer
    ) -> None:
        fence = consumer.fences.get(part.index) if consumer.fences else None
        if fence is not None:
            if hi > fence:  # held until everything below is acked
                if lo < fence:
                    self._give(part, ctx, lo, fence, consumer)
                self._stick(part, max(lo, fence), hi, ctx.now)
                return
            # Below the fence: records read before this consumer came (set aside for a
            # key's owner without credit, or nacked) whose key moved here. An earlier
            # record of the key may still be in flight at its former owner, so one goes
            # only once nothing before it is unacknowledged (it is at the cursor).
            cursor = part.acks.cursor
            if lo > cursor:
                self._stick(part, lo, hi, ctx.now)
                return
            if hi > cursor + 1:
                self._give(part, ctx, lo, cursor + 1, consumer)
                self._stick(part, cursor + 1, hi, ctx.now)
                return
        if consumer.credit <= 0:
            self._stick(part, lo, hi, ctx.now)
            return
        redeliveries: dict[int, int] = {}
        if lo < part.sent_mark:
            for offset in range(lo, min(hi, part.sent_mark)):
                count = part.deliveries(offset)
                if count == 0:  # passed over while it waited (see pass_over): first send
                    del part.tries[offset]
                    continue
                redeliveries[offset] = count
                tries = part.tries.get(offset)
                if tries is not None:
                    tries.deliveries += 1
                elif count >= 1:
                    part.tries[offset] = Tries(count + 1, "", [])
            if redeliveries:  # their new counts are saved before they go out
                self._unsaved_counts = True
                self.changes += 1
            self.redelivered_total += len(redeliveries)
        count = hi - lo
        consumer.credit -= count
        self.sent_total += count
        if hi > part.sent_mark:
            if part.waiting:  # else nothing waits to be passed over
                pass_over(part, lo)
            part.sent_mark = hi
            self.changes += 1
        delivery = _new(Delivery, (part.index, ctx.data(), lo, hi, redeliveries))
        ctx.out.append(_new(Send, (consumer.id, delivery, ctx.batch.max_timestamp_ms)))
        if self.policy.mode is DeliveryMode.AT_MOST_ONCE:
            self._apply_ack(part, lo, hi)
            return
        ttl = self.policy.ack_timeout_s
        lease = Lease(
            part.index,
            lo,
            hi,
            consumer,
            now=ctx.now,
            ttl=ttl if ttl is not None else math.inf,
            sent_at=self._wall,
        )
        part.leases.add(lo, hi, lease)
        consumer.leases.add(lease)
        consumer.in_flight += count
        if ttl is not None:
            heapq.heappush(self._deadlines, (lease.deadline, lease))


def _nobody() -> None:
    """The caller when the shell names none: nobody (only an unset owner accepts it)."""
