"""Leases: records sent to a consumer, unacknowledged, and when they expire. Pure.

A :class:`~dispatcher.partition_book.Lease` covers records ``[begin, end)`` sent together
to one consumer; acks, nacks, releases and a consumer that leaves take pieces of it back
(:func:`take_back`), and it ends when nothing is left (``remaining`` 0). With an ack
timeout, each lease has a deadline; :class:`LeaseDeadlines` keeps them in a heap and
yields the leases whose deadline passed and that still hold records. A lease that ended
stays in the heap until it reaches the top (pruned lazily): ending one costs nothing.

Example: ack timeout 30 s. Records 0..9 are sent at t=0 (deadline 30); 0..4 are acked at
t=1 (5 remain). At t=30 :meth:`LeaseDeadlines.expired` yields the lease, and the state
takes 5..9 back as failed deliveries. Had 5..9 been acked too, the lease would have ended
and t=30 would yield nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from dispatcher.partition_book import Lease, PartitionBook


def is_live(lease: Lease) -> bool:
    """Whether ``lease`` still holds records for its consumer."""
    return lease.remaining > 0 and lease in lease.consumer.leases


def take_back(part: PartitionBook, lease: Lease, begin: int, end: int) -> list[tuple[int, int]]:
    """Take ``[begin, end)`` out of ``lease`` (of ``part``); return the pieces it held,
    in offset order. Ends the lease when nothing is left."""
    pieces = []
    consumer = lease.consumer
    for lo, hi, _ in part.leases.cut(begin, end, only=lease):
        lease.remaining -= hi - lo
        consumer.in_flight -= hi - lo
        pieces.append((lo, hi))
    if lease.remaining <= 0:
        consumer.leases.discard(lease)
    return pieces


class LeaseDeadlines:
    """The deadlines of a subscription's leases, earliest first. Not task-safe: the
    state that owns it calls it, from its owner only."""

    __slots__ = ("heap",)

    def __init__(self) -> None:
        #: ``(deadline, lease)``, a heap (:mod:`heapq`). The two checks of every
        #: delivery use it in place, a Python call less each: the sender pushes each
        #: new lease (``heappush(heap, (lease.deadline, lease))``, what :meth:`add`
        #: does) and the state looks at the top (what :meth:`due` does).
        self.heap: list[tuple[float, Lease]] = []

    def add(self, lease: Lease) -> None:
        heapq.heappush(self.heap, (lease.deadline, lease))

    def due(self, now: float) -> bool:
        """Whether a deadline (of a live lease or not) has passed at ``now``."""
        heap = self.heap
        return bool(heap) and heap[0][0] <= now

    def expired(self, now: float) -> Iterator[Lease]:
        """The live leases whose deadline passed at ``now``, each once, earliest first;
        each is forgotten as it is yielded."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, lease = heapq.heappop(heap)
            if is_live(lease):
                yield lease

    def next(self) -> float | None:
        """The earliest deadline of a live lease."""
        heap = self.heap
        while heap and not is_live(heap[0][1]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def __iter__(self) -> Iterator[tuple[float, Lease]]:
        """``(deadline, lease)`` of every entry, ended leases too, in heap order."""
        return iter(self.heap)

    def __len__(self) -> int:
        return len(self.heap)
