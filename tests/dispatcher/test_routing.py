"""The routers, one per subscription type, driven directly with an outlet that records
what it is handed: no state machine, no loop, no disk. The state machine's tests
(test_state.py) check the same rules end to end; these pin each router's own rule."""

from __future__ import annotations

import pytest

from dispatcher.errors import SubscriptionBusyError
from dispatcher.partition_book import BatchContext, Consumer, Lease, PartitionBook, key_slot
from dispatcher.protocol import PartitionSnapshot
from dispatcher.route_exclusive import ExclusiveRouter
from dispatcher.route_failover import FailoverRouter
from dispatcher.route_key_shared import KeySharedRouter
from dispatcher.route_shared import SharedRouter
from dispatcher.routing import Router
from wal import RecordBatch, decode_batch, encode_columns


class RecordingOutlet:
    """An outlet that keeps what it is handed: ``(lo, hi, consumer name)`` for a send,
    ``(lo, hi, None)`` for a set-aside (which also waits, as the sender's does)."""

    def __init__(self) -> None:
        self.given: list[tuple[int, int, str | None]] = []

    def give(
        self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int, consumer: Consumer
    ) -> None:
        consumer.credit -= hi - lo
        self.given.append((lo, hi, consumer.name))

    def set_aside(self, part: PartitionBook, lo: int, hi: int, now: float) -> None:
        part.waiting.add(lo, hi, now)
        self.given.append((lo, hi, None))


def _batch(base: int, keys: list[bytes]) -> RecordBatch:
    first = decode_batch(encode_columns([b"v"] * len(keys), keys=keys, timestamps_ms=0))
    assert first is not None
    placed = decode_batch(first.with_base_offset(base))
    assert placed is not None
    return placed


def _attach(
    router: Router, consumers: dict[str, Consumer], name: str, credit: int, part: PartitionBook
) -> None:
    router.check_attach(consumers)
    consumer = Consumer(name, name, len(consumers) + 1, credit)
    router.joining(consumer, consumers, [part])
    consumers[name] = consumer
    router.consumers_changed(consumers)


def _route(router: Router, part: PartitionBook, batch: RecordBatch) -> RecordingOutlet:
    outlet = RecordingOutlet()
    ctx = BatchContext(batch, 0.0, [])
    router.assign(part, ctx, batch.base_offset, batch.next_offset, outlet)
    return outlet


def test_failover_sends_to_the_first_attached_and_the_next_takes_over() -> None:
    """Scenario: failover, A then B attach; a slice is routed; A leaves and another is.
    Expected: the first goes to A alone, the second to B; B was eligible only then."""
    router = FailoverRouter()
    part = PartitionBook(0, PartitionSnapshot(0))
    consumers: dict[str, Consumer] = {}
    _attach(router, consumers, "a", 100, part)
    _attach(router, consumers, "b", 100, part)
    assert [c.name for c in router.consumers_changed(consumers)] == ["a"]
    assert _route(router, part, _batch(0, [b"k"] * 4)).given == [(0, 4, "a")]
    del consumers["a"]
    assert [c.name for c in router.consumers_changed(consumers)] == ["b"]
    assert _route(router, part, _batch(4, [b"k"] * 4)).given == [(4, 8, "b")]


def test_failover_without_credit_makes_the_slice_wait() -> None:
    """Scenario: failover, the active consumer has no credit; a slice is routed.
    Expected: nothing is handed out; the slice waits, ready at once (not set aside)."""
    router = FailoverRouter()
    part = PartitionBook(0, PartitionSnapshot(0))
    consumers: dict[str, Consumer] = {}
    _attach(router, consumers, "a", 0, part)
    assert _route(router, part, _batch(0, [b"k"] * 3)).given == []
    assert list(part.waiting) == [(0, 3, 0.0)]
    assert not part.stuck


def test_exclusive_refuses_a_second_consumer_naming_the_first() -> None:
    """Scenario: exclusive, A attached; B tries to attach.
    Expected: SubscriptionBusyError naming A; A still routes alone."""
    router = ExclusiveRouter(("t", "s"))
    part = PartitionBook(0, PartitionSnapshot(0))
    consumers: dict[str, Consumer] = {}
    _attach(router, consumers, "a", 10, part)
    with pytest.raises(SubscriptionBusyError, match="a"):
        router.check_attach(consumers)
    assert _route(router, part, _batch(0, [b"k"] * 2)).given == [(0, 2, "a")]


def test_shared_takes_turns_per_slice_and_skips_a_consumer_without_credit() -> None:
    """Scenario: shared, A, B and C with credit, then B without; four slices routed.
    Expected: A, B, C in turn; then, with B empty, A and C alternate."""
    router = SharedRouter()
    part = PartitionBook(0, PartitionSnapshot(0))
    consumers: dict[str, Consumer] = {}
    for name in ("a", "b", "c"):
        _attach(router, consumers, name, 100, part)
    names = [_route(router, part, _batch(o, [b"k"])).given[0][2] for o in range(3)]
    assert names == ["a", "b", "c"]
    consumers["b"].credit = 0
    names = [_route(router, part, _batch(o, [b"k"])).given[0][2] for o in range(3, 7)]
    assert names == ["a", "c", "a", "c"]


def test_key_shared_cuts_a_batch_where_the_owner_changes() -> None:
    """Scenario: key_shared, A and B with credit; a batch with keys of both owners.
    Expected: runs cut at each change of owner, each to the owner of its keys' slot,
    covering the batch once and in order."""
    router = KeySharedRouter()
    part = PartitionBook(0, PartitionSnapshot(0))
    consumers: dict[str, Consumer] = {}
    _attach(router, consumers, "a", 100, part)
    _attach(router, consumers, "b", 100, part)
    keys = [b"k%d" % i for i in range(16)]
    given = _route(router, part, _batch(0, keys)).given
    assert [lo for lo, _, _ in given] == [0, *[hi for _, hi, _ in given][:-1]]
    assert given[-1][1] == 16
    owners = {consumers[n].name: consumers[n] for n in ("a", "b")}
    for lo, hi, name in given:
        assert name is not None
        weights = owners[name].weights
        for offset in range(lo, hi):
            slot = key_slot(keys[offset])
            other = owners["b" if name == "a" else "a"].weights
            assert weights[slot] >= other[slot]
    assert {name for _, _, name in given} == {"a", "b"}


def test_key_shared_fences_a_newcomer_until_what_is_in_flight_is_acked() -> None:
    """Scenario: key_shared, A holds 0..3 in flight (read position 4); B joins, then a
    batch 4..19 is routed.
    Expected: B's fence is 4, so B's records are set aside (they wait), A's go to A."""
    router = KeySharedRouter()
    part = PartitionBook(0, PartitionSnapshot(0, delivered=4))
    part.read_pos = 4
    consumers: dict[str, Consumer] = {}
    _attach(router, consumers, "a", 100, part)
    part.leases.add(0, 4, Lease(0, 0, 4, consumers["a"], now=0.0, ttl=30.0))
    _attach(router, consumers, "b", 100, part)
    assert consumers["b"].fences == {0: 4}
    assert consumers["a"].fences == {}
    keys = [b"k%d" % i for i in range(16)]
    given = _route(router, part, _batch(4, keys)).given
    assert {name for _, _, name in given} == {"a", None}
    set_aside = sum(hi - lo for lo, hi, name in given if name is None)
    assert set_aside == part.waiting.total > 0
