"""Sending: the records of a fetched batch go out, wait or meet the poison policy. Pure.

:class:`Sender` takes the batches the shell read for one partition (``Fetched``) and
finds what may go: waiting records whose ``ready_at`` passed (credit is all they need:
they are held already) and, in a batch at the read position, records not yet
acknowledged (while there is room: credit and ``max_unacked``). A batch past the read
position is from a read that went stale (a seek moved the position back while the shell
awaited) and sends nothing new. Redeliveries that are poison (rejected, or at
``max_deliveries``) meet the poison policy (:mod:`dispatcher.poison`) instead; the rest
goes to the subscription type's router (:mod:`dispatcher.routing`), which hands each run
back to :meth:`Sender.give` for a consumer, or to :meth:`Sender.set_aside`.

A send raises the delivery counts of redeliveries, takes the consumer's credit and leases
the run (at most once: acknowledges it at once). A pass that redelivers anything begins
with a ``Persist`` action, taken after the new counts are set: a redelivery's count is on
disk before it goes out (see :mod:`dispatcher.state` for why a crash can then only
overcount). What it changes it counts in the state's own plain attributes, its
:class:`Tally` (``changes``, records set aside, whether the read moved): the shell reads
them after every read it applies, without a call.

Example: shared, consumers A and B with credit. Records 0..3 went to A (read position 4),
and A nacked 3, which now waits, ready. A ``Fetched`` of the batch 0..9: 3 goes to B as
a redelivery, count 1 (the actions begin with ``Persist``), then 4..9 to A: the round
robin takes turns per slice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from heapq import heappush
from typing import Protocol

from dispatcher.command_checks import part_of
from dispatcher.leases import LeaseDeadlines
from dispatcher.partition_book import BatchContext, Consumer, Lease, PartitionBook, Tries, pass_over
from dispatcher.poison import PoisonRules
from dispatcher.protocol import (
    PERSIST,
    Action,
    Command,
    Delivery,
    DeliveryMode,
    DispatchPolicy,
    Fetched,
    Send,
)
from dispatcher.routing import Router
from wal import RecordBatch

#: Builds a named tuple from a tuple of its fields without its Python ``__new__`` (3x
#: faster): for the :class:`Delivery` and :class:`Send` of every delivery.
_new = tuple.__new__


class Tally(Protocol):
    """Where the sender counts what a ``Fetched`` changed: the state's own plain
    attributes, which the shell reads after every read it applies (a property there
    would be a Python call each time, several a pass)."""

    #: Bumped whenever something that is persisted changed (``sent_mark``, counts).
    changes: int
    #: key_shared records newly set aside (see :attr:`Sender.set_aside`).
    set_aside_total: int
    #: Whether the last ``Fetched`` moved its partition's read position or set records
    #: aside: progress, so the shell reads again at once.
    moved: bool


class Sender:
    """What goes out of one subscription's fetched batches, and to whom. The routers'
    :class:`~dispatcher.routing.Outlet`. Not task-safe: the state that owns it calls it,
    from its owner only.

    Args:
        policy: Type, mode, limits and the redelivery rules.
        router: The subscription type's router.
        parts: The subscription's partitions (the state's list, by index).
        tally: Where it counts changes, records set aside and progress (the state).
        poison: The poison policy and its exhausted offsets.
        deadlines: Where leases' deadlines go.
        credit: Whether some consumer that may receive has credit.
        has_room: Whether some consumer may receive a record now (credit and room).
        ack: Acknowledges ``[begin, end)`` of a partition (at most once, on send).
    """

    __slots__ = (
        "_ack",
        "_credit",
        "_deadline_heap",
        "_has_room",
        "_parts",
        "_poison",
        "_router",
        "_tally",
        "policy",
        "redelivered_total",
        "sent_total",
        "stuck",
        "unsaved_counts",
        "wall",
    )

    def __init__(
        self,
        policy: DispatchPolicy,
        router: Router,
        *,
        parts: Sequence[PartitionBook],
        tally: Tally,
        poison: PoisonRules,
        deadlines: LeaseDeadlines,
        credit: Callable[[], bool],
        has_room: Callable[[], bool],
        ack: Callable[[PartitionBook, int, int], None],
    ) -> None:
        self.policy = policy
        self._parts = parts
        self._tally = tally
        self._poison = poison
        #: Each leased run's deadline is pushed here at once: one Python call less per
        #: delivery than ``deadlines.add`` (see :attr:`LeaseDeadlines.heap`).
        self._deadline_heap = deadlines.heap
        self._credit = credit
        self._has_room = has_room
        self._ack = ack
        self._router = router
        self.wall = 0.0  # wall-clock seconds of the command being handled, recorded
        #: Redelivery counts raised and not yet saved: the next pass begins with Persist.
        self.unsaved_counts = False
        #: Whether any partition has stuck (set-aside) offsets.
        self.stuck = False
        self.sent_total = 0
        self.redelivered_total = 0

    def fetched(self, cmd: Command, now: float) -> list[Action]:
        """The ``Fetched`` transition (the state's handler of it, bound once): send what
        may go of the batches read from a partition; the actions, in order. Sets the
        tally's ``moved``.

        Raises:
            InvalidSubscriptionError: no such partition.
        """
        assert isinstance(cmd, Fetched)
        parts, p = self._parts, cmd.partition
        part = parts[p] if 0 <= p < len(parts) else part_of(parts, p)
        tally = self._tally
        read_pos, set_aside = part.read_pos, tally.set_aside_total
        out: list[Action] = []
        for batch in cmd.batches:
            if not self._send_batch(part, batch, now, out):
                break
        if self.unsaved_counts:
            out.insert(0, PERSIST)
            self.unsaved_counts = False
        tally.moved = part.read_pos != read_pos or tally.set_aside_total != set_aside
        return out

    def _send_batch(
        self, part: PartitionBook, batch: RecordBatch, now: float, out: list[Action]
    ) -> bool:
        """Send what may go of one batch; return False once nothing more can go."""
        base, nxt = batch.base_offset, batch.next_offset
        if part.blocked:
            if part.retry_dead_letters:
                self._poison.retry_dead_letters(part, BatchContext(batch, now, out))
            return False
        spans: list[tuple[int, int, bool]] = []  # (lo, hi, from waiting), in offset order
        if part.waiting:
            spans.extend(
                (lo, hi, True) for lo, hi, at in part.waiting.overlapping(base, nxt) if at <= now
            )
        fresh = base <= part.read_pos < nxt  # else a stale read: nothing new from it
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
        if self._poison.exhausted[part.index] and not self._credit():
            self._poison.apply_exhausted(part, ctx)  # nothing else can go without credit
            return False
        for lo, hi, waited in spans:
            if waited:
                if not self._credit():
                    return False
                part.waiting.cut(lo, hi)
            elif not self._has_room():
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
        assign = self._router.assign
        if lo < part.sent_mark and (self.policy.max_deliveries or part.tries):
            # redeliveries: poison records first (per offset; this path is rare), those
            # past max_deliveries and those a consumer rejected (with no limit too)
            limit = self.policy.max_deliveries
            run_lo = lo
            for offset in range(lo, min(hi, part.sent_mark)):
                if part.is_poison(offset, limit):
                    if run_lo < offset:
                        assign(part, ctx, run_lo, offset, self)
                    self._poison.apply(part, ctx, offset)
                    run_lo = offset + 1
                    if part.blocked or not self._has_room():
                        part.waiting.add(offset + 1, hi, ctx.now)
                        return
            lo = run_lo
        if lo < hi:
            assign(part, ctx, lo, hi, self)

    def set_aside(self, part: PartitionBook, lo: int, hi: int, now: float) -> None:
        """``[lo, hi)`` waits for the one consumer that may take it (key_shared's owner
        of its keys) to have credit or its fence lifted; reads and timers pass over it
        until a command but ``Fetched`` or ``Tick`` comes (the state clears ``stuck``).
        Counted in the tally's ``set_aside_total``: setting some aside is progress (the
        reads after them may find records for other consumers)."""
        part.waiting.add(lo, hi, now)
        already = sum(b - a for a, b, _ in part.stuck.cut(lo, hi))
        part.stuck.add(lo, hi, True)
        self.stuck = True
        self._tally.set_aside_total += hi - lo - already

    def give(
        self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int, consumer: Consumer
    ) -> None:
        """Send ``[lo, hi)`` to ``consumer``: raise the counts of redeliveries (saved
        before they go out), take its credit, lease it (at most once: acknowledge it)
        and append the ``Send``."""
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
                self.unsaved_counts = True
                self._tally.changes += 1
            self.redelivered_total += len(redeliveries)
        count = hi - lo
        consumer.credit -= count
        self.sent_total += count
        if hi > part.sent_mark:
            if part.waiting:  # else nothing waits to be passed over
                pass_over(part, lo)
            part.sent_mark = hi
            self._tally.changes += 1
        delivery = _new(Delivery, (part.index, ctx.data(), lo, hi, redeliveries))
        ctx.out.append(_new(Send, (consumer.id, delivery, ctx.batch.max_timestamp_ms)))
        if self.policy.mode is DeliveryMode.AT_MOST_ONCE:
            self._ack(part, lo, hi)
            return
        ttl = self.policy.ack_timeout_s
        lease = Lease(
            part.index,
            lo,
            hi,
            consumer,
            now=ctx.now,
            ttl=ttl if ttl is not None else math.inf,
            sent_at=self.wall,
        )
        part.leases.add(lo, hi, lease)
        consumer.leases.add(lease)
        consumer.in_flight += count
        if ttl is not None:
            heappush(self._deadline_heap, (lease.deadline, lease))
