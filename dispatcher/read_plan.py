"""What the dispatch task reads next, and when it wakes. Pure: no I/O, no clock.

The state machine sends only records the shell has read for it (``Fetched``). These
functions read the partitions' books and say where to read (:func:`plan_reads`), how
much could go now (:func:`ready`), whether nothing is left (:func:`caught_up`) and when a
timer must fire (:func:`next_wake`); they change nothing but the poison rules' memory of
exhausted offsets that no longer wait. :class:`~dispatcher.state.SubscriptionState`
calls them with its consumers' credit and room.

A read is asked for a partition at its first ready waiting record (waiting records are
held already, so credit is all they need), else at its read position when new records
are durable and there is room. Poison and dead letters need no consumer: without credit,
an exhausted record that is ready is read so that the poison policy meets it, and a
partition blocked by a failed dead-letter write is read at its first parked record due
for a retry.

Example: two partitions, heads ``[10, 4]``, read positions ``[10, 2]``, credit and room,
record 3 of partition 0 waiting (a nack) ready at t=5. At t=6, starting at partition 0:
``[(0, 3), (1, 2)]``; at t=4: ``[(1, 2)]``, and :func:`next_wake` says 5.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dispatcher.partition_book import PartitionBook
from dispatcher.poison import PoisonRules


def ready(parts: Sequence[PartitionBook], heads: Sequence[int], now: float) -> int:
    """Records that could be sent now if a consumer had room."""
    total = 0
    for part, head in zip(parts, heads, strict=True):
        if part.blocked:
            continue
        total += max(0, head - part.read_pos)
        if part.waiting:
            total += sum(e - b for b, e, at in part.sendable_waiting() if at <= now)
    return total


def caught_up(parts: Sequence[PartitionBook], heads: Sequence[int]) -> bool:
    """Whether nothing is left to send: every partition read up to its head and no
    record waiting (the heartbeat's cheap check for idle subscriptions)."""
    for part, head in zip(parts, heads, strict=True):
        if head > part.read_pos or part.waiting:
            return False
    return True


def next_wake(
    parts: Sequence[PartitionBook],
    poison: PoisonRules,
    credit: Callable[[], bool],
    lease_deadline: float | None,
) -> float | None:
    """When the next lease expires (``lease_deadline``) or the next waiting record
    becomes ready. Waiting records count only while a consumer that may receive them has
    ``credit()``: else their time may have passed already, and a grant is a command
    anyway. Exhausted records and dead letters to retry count without credit."""
    times = [] if lease_deadline is None else [lease_deadline]
    has_credit: bool | None = None  # looked at only for a partition with waiting records
    exhausted = poison.exhausted
    for part in parts:
        if not (part.waiting or part.retry_dead_letters or exhausted[part.index]):
            continue  # the common case: nothing of this partition waits
        if has_credit is None:
            has_credit = credit()
        if part.waiting and not part.blocked and has_credit:
            times.extend(at for _, _, at in part.sendable_waiting())
        elif exhausted[part.index] and not part.blocked:
            times.extend(poison.exhausted_ready_at(part))
        if part.retry_dead_letters:
            times.extend(at for _, _, at in part.parked if at is not None)
    return min(times) if times else None


def plan_reads(
    parts: Sequence[PartitionBook],
    heads: Sequence[int],
    now: float,
    *,
    start: int,
    credit: bool,
    room: bool,
    poison: PoisonRules,
) -> list[tuple[int, int]]:
    """``(partition, offset)`` to read from, round robin from partition ``start``
    (see the module doc); ``credit``: some consumer may receive; ``room``: credit and
    fewer than ``max_unacked`` records held."""
    out = []
    count = len(parts)
    exhausted = poison.exhausted
    for i in range(count):
        p = (start + i) % count
        part = parts[p]
        offset = None
        if part.blocked:
            if part.retry_dead_letters:
                offset = next((b for b, _, at in part.parked if at is not None and at <= now), None)
        else:
            if credit:  # waiting records are held already: credit is all they need
                if part.waiting:
                    offset = next((b for b, _, at in part.sendable_waiting() if at <= now), None)
            elif exhausted[p]:  # poison needs no credit
                offset = poison.first_exhausted(part, now)
            if room and offset is None and part.read_pos < heads[p]:
                offset = part.read_pos
        if offset is not None:
            out.append((p, offset))
    return out
