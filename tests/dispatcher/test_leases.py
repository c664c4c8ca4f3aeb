"""Leases' deadlines and taking records back from a lease: pure, no loop, no disk."""

from __future__ import annotations

from dispatcher.leases import LeaseDeadlines, is_live, take_back
from dispatcher.partition_book import Consumer, Lease, PartitionBook
from dispatcher.protocol import PartitionSnapshot


def _leased(part: PartitionBook, consumer: Consumer, lo: int, hi: int, ttl: float) -> Lease:
    lease = Lease(part.index, lo, hi, consumer, now=0.0, ttl=ttl)
    part.leases.add(lo, hi, lease)
    consumer.leases.add(lease)
    consumer.in_flight += hi - lo
    return lease


def test_expired_yields_each_live_lease_once_earliest_first() -> None:
    """Scenario: leases due at 30, 10 and 20; the one due at 20 ends (all taken back);
    expired(25) is asked twice, then expired(40).
    Expected: 10 at the first ask, nothing at the second, 30 at t=40; the ended lease
    never; due() and next() follow."""
    part = PartitionBook(0, PartitionSnapshot(0))
    consumer = Consumer("c", "c", 1, 100)
    deadlines = LeaseDeadlines()
    late, early, ended = (
        _leased(part, consumer, lo, lo + 5, ttl) for lo, ttl in ((0, 30.0), (5, 10.0), (10, 20.0))
    )
    for lease in (late, early, ended):
        deadlines.add(lease)
    assert take_back(part, ended, 10, 15) == [(10, 15)]
    assert not is_live(ended)
    assert deadlines.next() == 10.0
    assert deadlines.due(10.0)
    assert list(deadlines.expired(25.0)) == [early]
    assert list(deadlines.expired(25.0)) == []
    assert not deadlines.due(29.0)
    assert deadlines.next() == 30.0
    assert list(deadlines.expired(40.0)) == [late]
    assert deadlines.next() is None
    assert len(deadlines) == 0


def test_take_back_returns_the_pieces_held_and_ends_an_emptied_lease() -> None:
    """Scenario: one lease of [0, 10); [3, 5) is acked elsewhere (cut from the map),
    then [0, 8) and [8, 10) are taken back.
    Expected: pieces [0, 3) and [5, 8), then [8, 10); in-flight and remaining go to 0
    and the lease leaves its consumer."""
    part = PartitionBook(0, PartitionSnapshot(0))
    consumer = Consumer("c", "c", 1, 100)
    lease = _leased(part, consumer, 0, 10, 30.0)
    part.leases.cut(3, 5)
    lease.remaining -= 2
    consumer.in_flight -= 2
    assert take_back(part, lease, 0, 8) == [(0, 3), (5, 8)]
    assert lease in consumer.leases
    assert take_back(part, lease, 8, 10) == [(8, 10)]
    assert (lease.remaining, consumer.in_flight) == (0, 0)
    assert lease not in consumer.leases
