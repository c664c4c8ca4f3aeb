"""Key_shared routing: each key to one consumer, and its records in order. Pure.

Each key maps to one of :data:`~dispatcher.partition_book.SLOTS` slots
(:func:`~dispatcher.partition_book.key_slot`), and each slot to a consumer by rendezvous
hashing of consumer names (:func:`~dispatcher.partition_book.slot_owners`): a consumer
that comes back under the same name owns the same slots, and one that joins or leaves
moves only the slots it wins or held. A run of a batch is cut where the owner changes.

A record whose owner has no credit is set aside for it (the outlet's ``set_aside``): it
waits, and reads and timers pass over it so that it holds up neither other keys nor the
loop, until a command other than a read or a tick may have freed it.

Keys that move keep their order. A consumer that joins while records are in flight gets
a fence per partition at the read position of its arrival: nothing at or past it goes to
the newcomer until everything below it is acknowledged (the state's tick lifts the fence
then). A record below the fence (read before the consumer came, and set aside or nacked)
whose key moved to it goes only once every record before it is acknowledged (it is at
the cursor): an earlier record of its key may still be in flight at the former owner.

Example: consumer A owns every slot; records 0..9 are sent to A; B joins (read position
10, so B's fence is 10) and wins the slots of keys at 10, 12 and 14. Records 10..14 are
read: 11 and 13 go to A; 10, 12 and 14 wait, set aside for B, until A has acknowledged
0..9. See :mod:`dispatcher.routing` for the interface.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dispatcher.partition_book import (
    BatchContext,
    Consumer,
    PartitionBook,
    slot_owners,
    slot_weights,
)
from dispatcher.routing import Outlet, Router


class KeySharedRouter(Router):
    """Runs of a batch go to the owners of their keys' slots, behind each owner's
    fence and within its credit."""

    def __init__(self) -> None:
        self._members: list[Consumer] = []
        self._owners: list[Consumer] = []  # the owner of each slot

    def joining(
        self,
        consumer: Consumer,
        consumers: Mapping[str, Consumer],
        parts: Sequence[PartitionBook],
    ) -> None:
        """Give ``consumer`` its slot weights, and a fence on each partition with
        records in flight (see the module doc)."""
        consumer.weights = slot_weights(consumer.name)
        if consumers:
            for part in parts:
                if part.leases:
                    consumer.fences[part.index] = part.read_pos

    def consumers_changed(self, consumers: Mapping[str, Consumer]) -> list[Consumer]:
        self._members = list(consumers.values())
        self._owners = slot_owners(self._members) if self._members else []
        return self._members

    def assign(
        self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int, outlet: Outlet
    ) -> None:
        owners = self._owners
        slots = ctx.slots()
        run_lo = lo
        run_owner = owners[slots[lo - ctx.base]]
        for offset in range(lo + 1, hi):
            owner = owners[slots[offset - ctx.base]]
            if owner is not run_owner:
                self._offer(part, ctx, run_lo, offset, run_owner, outlet=outlet)
                run_lo, run_owner = offset, owner
        self._offer(part, ctx, run_lo, hi, run_owner, outlet=outlet)

    def _offer(
        self,
        part: PartitionBook,
        ctx: BatchContext,
        lo: int,
        hi: int,
        consumer: Consumer,
        *,
        outlet: Outlet,
    ) -> None:
        """Give ``[lo, hi)`` to its owner ``consumer`` as far as its fence and credit
        allow; set the rest aside for it."""
        fence = consumer.fences.get(part.index) if consumer.fences else None
        if fence is not None:
            if hi > fence:  # held until everything below is acked
                if lo < fence:
                    self._offer(part, ctx, lo, fence, consumer, outlet=outlet)
                outlet.set_aside(part, max(lo, fence), hi, ctx.now)
                return
            # Below the fence: one goes only at the cursor (see the module doc).
            cursor = part.acks.cursor
            if lo > cursor:
                outlet.set_aside(part, lo, hi, ctx.now)
                return
            if hi > cursor + 1:
                self._offer(part, ctx, lo, cursor + 1, consumer, outlet=outlet)
                outlet.set_aside(part, cursor + 1, hi, ctx.now)
                return
        if consumer.credit <= 0:
            outlet.set_aside(part, lo, hi, ctx.now)
            return
        outlet.give(part, ctx, lo, hi, consumer)
