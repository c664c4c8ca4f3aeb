"""The per-partition bookkeeping of the dispatch state machine. Pure: no I/O, no clock.

Owns the records :class:`~dispatcher.state.SubscriptionState` keeps and changes:
:class:`Consumer` (one attached consumer: credit, leases, key_shared fences and weights),
:class:`Lease` (records sent together to one consumer), :class:`Tries` (an offset whose
delivery failed), :class:`PartitionBook` (one partition: acked, leased, waiting, parked and
stuck offsets, the read position and ``sent_mark``), :class:`BatchContext` (one batch
being sent) and the key_shared slot hash (:func:`key_slot`, with the slots' owners by
rendezvous hashing: :func:`slot_weights`, :func:`slot_owners`). The rules that move
offsets between those places live in :mod:`dispatcher.state`, :mod:`dispatcher.sending`
and :mod:`dispatcher.poison`; the helpers here
(:func:`pass_over`, :func:`unsend`, :func:`record_failures`, :func:`unblock`,
:func:`failures_of`, :func:`failure_runs`) each change or read one partition only.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from dispatcher.acks import AckRanges
from dispatcher.protocol import Action, Failure, FailureRun, PartitionSnapshot
from dispatcher.ranges import RangeMap
from wal import RecordBatch

#: Key slots of a key_shared subscription; a consumer owns whole slots.
SLOTS = 1024
#: The most failure entries (offsets whose delivery failed) kept per partition.
MAX_FAILURES = 100_000


class Consumer:
    """One attached consumer: its credit, what it holds, and its key_shared fences and
    slot weights."""

    __slots__ = ("credit", "fences", "id", "in_flight", "leases", "name", "order", "weights")

    def __init__(self, consumer_id: str, name: str, order: int, credit: int) -> None:
        self.id = consumer_id
        self.name = name
        self.order = order
        self.credit = credit
        self.in_flight = 0
        self.leases: set[Lease] = set()
        self.fences: dict[int, int] = {}  # key_shared: partition -> held from this offset
        self.weights: list[int] = []  # key_shared: rendezvous weight per slot


class Lease:
    """Records ``[begin, end)`` sent together to one consumer (pieces may be acked)."""

    __slots__ = ("begin", "consumer", "deadline", "end", "partition", "remaining", "sent_at")

    def __init__(
        self,
        partition: int,
        begin: int,
        end: int,
        consumer: Consumer,
        *,
        now: float,
        ttl: float,
        sent_at: float | None = None,
    ) -> None:
        self.partition = partition
        self.begin = begin
        self.end = end
        self.consumer = consumer
        self.sent_at = now if sent_at is None else sent_at  # wall seconds, recorded
        self.deadline = now + ttl
        self.remaining = end - begin

    def __lt__(self, other: Lease) -> bool:  # heap order ties
        return id(self) < id(other)


class Tries:
    """An offset's failure entry: how often it was sent, why the last try failed, when
    each failed try was sent (ms since the epoch), and whether a consumer rejected it
    (a nack with ``dead_letter``: it goes to the poison policy whatever its count)."""

    __slots__ = ("deliveries", "reason", "rejected", "times")

    def __init__(
        self, deliveries: int, reason: str, times: list[int], *, rejected: bool = False
    ) -> None:
        self.deliveries = deliveries
        self.reason = reason
        self.times = times
        self.rejected = rejected


class PartitionBook:
    """One partition of a subscription: its acked, leased, waiting, parked and stuck
    offsets, its read position and ``sent_mark``, its failure entries, and why it is
    blocked (see :mod:`dispatcher.state` for the rules that move offsets between them)."""

    __slots__ = (
        "acks",
        "blocked",
        "blocked_offset",
        "index",
        "leases",
        "parked",
        "read_pos",
        "retry_dead_letters",
        "sent_mark",
        "stuck",
        "tries",
        "waiting",
    )

    def __init__(self, index: int, snap: PartitionSnapshot) -> None:
        self.index = index
        self.acks = AckRanges(snap.cursor, snap.acked)
        self.read_pos = self.acks.cursor
        self.sent_mark = max(snap.delivered, self.acks.cursor)
        self.leases: RangeMap[Lease] = RangeMap()
        self.waiting: RangeMap[float] = RangeMap()  # value: ready_at
        self.parked: RangeMap[float | None] = RangeMap()  # value: retry at, None: pending
        # key_shared: waiting offsets whose key's owner could not take them (no credit, or
        # held back by its fence). Reads and timers pass over them, so that they hold up
        # neither other keys nor the loop; cleared by any command but Fetched and Tick.
        # A filter only: an offset here that no longer waits means nothing.
        self.stuck: RangeMap[bool] = RangeMap()
        self.tries: dict[int, Tries] = {}
        for run in snap.failures:
            for offset in range(max(run.begin, self.acks.cursor), run.end):
                self.tries[offset] = Tries(
                    run.deliveries, run.reason, list(run.times_ms), rejected=run.rejected
                )
        self.blocked = ""  # why this partition sends nothing, or ""
        self.blocked_offset = -1  # the offset it waits on
        self.retry_dead_letters = False  # blocked by a failed dead-letter write

    def deliveries(self, offset: int) -> int:
        tries = self.tries.get(offset)
        if tries is not None:
            return tries.deliveries
        return 1 if offset < self.sent_mark else 0

    def is_poison(self, offset: int, max_deliveries: int) -> bool:
        """Whether ``offset`` goes to the poison policy instead of out again: a consumer
        rejected it, or it was sent ``max_deliveries`` times (0: no limit)."""
        tries = self.tries.get(offset)
        if tries is not None and tries.rejected:
            return True
        return max_deliveries > 0 and self.deliveries(offset) >= max_deliveries

    def held(self) -> int:
        return self.leases.total + self.waiting.total + self.parked.total

    def sendable_waiting(self) -> Iterator[tuple[int, int, float]]:
        """The waiting pieces ``(lo, hi, ready_at)`` that are not stuck, in order."""
        stuck = self.stuck
        for lo, hi, at in self.waiting:
            if not stuck:
                yield lo, hi, at
                continue
            pos = lo
            for s_lo, s_hi, _ in stuck.overlapping(lo, hi):
                if s_lo > pos:
                    yield pos, s_lo, at
                pos = max(pos, s_hi)
            if pos < hi:
                yield pos, hi, at


@dataclass(slots=True)
class BatchContext:
    """One batch being sent at ``now``, with its bytes and key slots computed at most
    once, and the actions produced so far."""

    batch: RecordBatch
    now: float
    out: list[Action]
    base: int = field(init=False)
    _data: bytes | None = None
    _slots: list[int] | None = None

    def __post_init__(self) -> None:
        self.base = self.batch.base_offset

    def data(self) -> bytes:
        if self._data is None:
            buffer = self.batch.buffer
            whole = buffer.obj  # the log's tail cache holds each batch as its own bytes
            if type(whole) is bytes and len(whole) == buffer.nbytes:
                self._data = whole  # shared by every subscription, never copied
            else:
                self._data = bytes(buffer)
        return self._data

    def slots(self) -> list[int]:
        if self._slots is None:
            keys = self.batch.keys()
            self._slots = [key_slot(k) for k in keys]
        return self._slots


def key_slot(key: bytes | None) -> int:
    """The key_shared slot of ``key`` (records without a key share slot 0)."""
    return zlib.crc32(key) % SLOTS if key else 0


def slot_weights(name: str) -> list[int]:
    """A key_shared consumer's rendezvous weight for each slot, from its name alone: a
    consumer that comes back under the same name owns the same slots."""
    encoded = name.encode()
    return [zlib.crc32(b"%s/%d" % (encoded, s)) for s in range(SLOTS)]


def slot_owners(consumers: Iterable[Consumer]) -> list[Consumer]:
    """The owner of each key_shared slot: the consumer with the highest weight for it (a
    tie goes to the first by name, then by attach order)."""
    members = sorted(consumers, key=lambda c: (c.name, c.order))
    return [max(members, key=lambda c: c.weights[s]) for s in range(SLOTS)]


def pass_over(part: PartitionBook, below: int) -> None:
    """Give a delivery count of 0 to the records in ``[sent_mark, below)`` that wait
    without ever having been sent (a key_shared consumer without credit, or held for
    order), before ``sent_mark`` moves past them: below it, a count of 1 is implicit."""
    for lo, hi, _ in part.waiting.overlapping(part.sent_mark, below):
        for offset in range(lo, hi):
            if offset not in part.tries and len(part.tries) < MAX_FAILURES:
                part.tries[offset] = Tries(0, "", [])


def unsend(part: PartitionBook, lo: int, hi: int) -> None:
    """Give ``[lo, hi)`` back the delivery counts they had before their last send."""
    mark = part.sent_mark
    for offset in range(hi - 1, lo - 1, -1):
        tries = part.tries.get(offset)
        if tries is not None:  # a redelivery: one send fewer
            tries.deliveries = max(0, tries.deliveries - 1)
        elif offset == mark - 1:  # a first delivery at the top: unsent again
            mark = offset
        elif len(part.tries) < MAX_FAILURES:  # a first delivery below others
            part.tries[offset] = Tries(0, "", [])
        # else: entries at their bound; it keeps its implicit 1 (an overcount by one)
    part.sent_mark = mark


def record_failures(
    part: PartitionBook,
    lo: int,
    hi: int,
    reason: str,
    *,
    sent_ms: int,
    reject: bool,
    max_deliveries: int,
) -> tuple[int, list[int]]:
    """Record that the delivery of ``[lo, hi)`` sent at ``sent_ms`` failed for
    ``reason`` (``reject``: its consumer rejected it); return the most deliveries among
    them and the offsets that are now poison (rejected, or at ``max_deliveries``; 0: no
    limit). A rejected offset gets an entry past MAX_FAILURES, since the mark is what
    sends it to the poison policy, after a restart too."""
    failures = 0
    poison = []
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
        if tries.rejected or (max_deliveries and tries.deliveries >= max_deliveries):
            poison.append(offset)
    return failures, poison


def unblock(part: PartitionBook) -> None:
    part.blocked = ""
    part.blocked_offset = -1
    part.retry_dead_letters = False
    for lo, hi, _ in part.parked.cut(0, 1 << 62):  # failed dead letters go round again
        part.waiting.add(lo, hi, 0.0)


def failures_of(part: PartitionBook, lo: int, hi: int) -> tuple[Failure, ...]:
    """What each offset of ``[lo, hi)`` went through, as the dead-letter queue gets it:
    its delivery count, the last failure's reason and the time of each failed attempt."""
    failures = []
    for offset in range(lo, hi):
        tries = part.tries.get(offset)
        failures.append(
            Failure(
                offset,
                part.deliveries(offset),
                tries.reason if tries else "",
                tuple(tries.times) if tries else (),
            )
        )
    return tuple(failures)


def failure_runs(part: PartitionBook) -> tuple[FailureRun, ...]:
    """The failures of unacknowledged offsets, merged into runs of equal history."""
    runs: list[FailureRun] = []
    for offset, t in sorted(part.tries.items()):
        if part.acks.is_acked(offset):
            continue
        times = tuple(t.times)
        last = runs[-1] if runs else None
        history = (t.deliveries, t.reason, times, t.rejected)
        if (
            last is not None
            and last.end == offset
            and (last.deliveries, last.reason, last.times_ms, last.rejected) == history
        ):
            runs[-1] = FailureRun(last.begin, offset + 1, *history)
        else:
            runs.append(FailureRun(offset, offset + 1, *history))
    return tuple(runs)
