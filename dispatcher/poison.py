"""Poison records and their dead letters: the subscription's poison policy. Pure.

A record is poison when a consumer rejected it (a nack with ``dead_letter``) or when its
deliveries reached ``max_deliveries``. Instead of going out again it meets the policy:

- ``dead_letter``: it is parked and handed to the dead-letter queue (a ``ToDeadLetter``
  action with what each offset went through); it is acknowledged once the queue reports
  it written (``DeadLettered``). A write that failed (``DeadLetterFailed``) blocks the
  partition, and the parked records are handed over again every
  :data:`DEAD_LETTER_RETRY_S` until a write succeeds: nothing is acknowledged meanwhile;
- ``drop``: it is acknowledged and a warning names it;
- ``block``: it is parked and its partition sends nothing (BLOCKED) until a seek moves
  past it.

A waiting record whose failures made it poison (a nack of its last try, a reject, an ack
timeout) is *exhausted*: it meets the policy as soon as it is ready, even when no
consumer has credit (all drained, or none attached), so a consumer that nacks a record's
last try and closes does not leave it waiting for the next consumer.
:class:`PoisonRules` keeps those offsets per partition; the state marks them when a lease
comes back and reads them to plan its reads and timers.

Example: max_deliveries 3, policy dead_letter. Record 7 is nacked for the third time at
t=5 and its consumer closes: 7 is exhausted, waiting with its backoff. When it is ready
the state asks for a read of 7 although no consumer is attached; the batch comes back
(``Fetched``) and 7 is parked with a ``ToDeadLetter``; at ``DeadLettered`` it is
acknowledged and the cursor moves past it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dispatcher.partition_book import BatchContext, PartitionBook, failures_of
from dispatcher.protocol import Action, Note, PoisonPolicy, ToDeadLetter

#: How long a dead letter that could not be written waits before the next try, seconds.
DEAD_LETTER_RETRY_S = 1.0


class PoisonRules:
    """The poison policy of one subscription, and the offsets it is owed. Not
    task-safe: the state that owns it calls it, from its owner only.

    Args:
        policy: What happens to a poison record.
        partitions: How many partitions.
        ack: Acknowledges ``[begin, end)`` of a partition (the state's; a drop and a
            written dead letter acknowledge).
    """

    __slots__ = ("_ack", "dead_lettered_total", "dropped_total", "exhausted", "policy")

    def __init__(
        self,
        policy: PoisonPolicy,
        partitions: int,
        ack: Callable[[PartitionBook, int, int], None],
    ) -> None:
        self.policy = policy
        self._ack = ack
        #: Per partition: waiting offsets whose failures made them poison (see the
        #: module doc). An offset here that no longer waits is forgotten when met.
        self.exhausted: list[set[int]] = [set() for _ in range(partitions)]
        self.dead_lettered_total = 0
        self.dropped_total = 0

    def apply(self, part: PartitionBook, ctx: BatchContext, offset: int) -> None:
        """Apply the policy to ``offset`` (poison, taken from where it waited)."""
        self.exhausted[part.index].discard(offset)
        deliveries = part.deliveries(offset)
        tries = part.tries.get(offset)
        rejected = tries is not None and tries.rejected
        policy = self.policy
        if policy is PoisonPolicy.DROP:
            self.dropped_total += 1
            self._ack(part, offset, offset + 1)
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

    def apply_exhausted(self, part: PartitionBook, ctx: BatchContext) -> None:
        """With no consumer to send to, apply the policy to the exhausted offsets of
        ``ctx``'s batch that are ready."""
        base, nxt = ctx.base, ctx.batch.next_offset
        for offset in sorted(o for o in self.exhausted[part.index] if base <= o < nxt):
            if part.blocked:
                return
            if any(at <= ctx.now for _, _, at in part.waiting.overlapping(offset, offset + 1)):
                part.waiting.cut(offset, offset + 1)
                self.apply(part, ctx, offset)

    def first_exhausted(self, part: PartitionBook, now: float) -> int | None:
        """The first exhausted offset of ``part`` that is ready at ``now``; forgets
        those that no longer wait (acked, sent, sought past)."""
        exhausted = self.exhausted[part.index]
        first = None
        for offset in sorted(exhausted):
            pieces = list(part.waiting.overlapping(offset, offset + 1))
            if not pieces:
                exhausted.discard(offset)
            elif first is None and pieces[0][2] <= now:
                first = offset
        return first

    def exhausted_ready_at(self, part: PartitionBook) -> list[float]:
        """When each exhausted offset of ``part`` is ready."""
        waiting = part.waiting
        return [
            at for o in self.exhausted[part.index] for _, _, at in waiting.overlapping(o, o + 1)
        ]

    def retry_dead_letters(self, part: PartitionBook, ctx: BatchContext) -> None:
        """Hand the parked records of ``ctx``'s batch whose retry time has come to the
        dead-letter queue again (the partition is blocked by a failed write)."""
        for lo, hi, at in part.parked.overlapping(ctx.base, ctx.batch.next_offset):
            if at is not None and at <= ctx.now:
                part.parked.cut(lo, hi)
                self._to_dead_letter(part, ctx, lo, hi)

    def dead_lettered(self, part: PartitionBook, begin: int, end: int) -> None:
        """``[begin, end)`` is written to the dead-letter queue: acknowledge it."""
        self.dead_lettered_total += sum(
            hi - lo for lo, hi, _ in part.parked.overlapping(begin, end)
        )
        self._ack(part, begin, end)

    def dead_letter_failed(
        self, part: PartitionBook, begin: int, end: int, error: str, now: float
    ) -> list[Action]:
        """Writing ``[begin, end)`` failed: block the partition and retry later."""
        retry = part.parked.cut(begin, end)
        if not retry:  # acknowledged or sought past meanwhile: nothing is owed any more
            return []
        for lo, hi, _ in retry:
            part.parked.add(lo, hi, now + DEAD_LETTER_RETRY_S)
        first = retry[0][0]
        part.blocked = (
            f"dead-letter queue write failed for offset {first} ({error}); retrying "
            f"every {DEAD_LETTER_RETRY_S:g} s; nothing is acknowledged until it succeeds"
        )
        part.blocked_offset = first
        part.retry_dead_letters = True
        return [Note(logging.ERROR, f"partition {part.index}: {part.blocked}")]

    def _to_dead_letter(self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int) -> None:
        part.parked.add(lo, hi, None)
        ctx.out.append(ToDeadLetter(part.index, ctx.batch, lo, hi, failures_of(part, lo, hi)))
