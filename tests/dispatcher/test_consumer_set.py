"""The consumers of a subscription: order, credit, drains and who may receive. Pure."""

from __future__ import annotations

from dispatcher.consumer_set import ConsumerSet
from dispatcher.partition_book import PartitionBook
from dispatcher.protocol import PartitionSnapshot
from dispatcher.route_failover import FailoverRouter
from dispatcher.route_shared import SharedRouter

PARTS = [PartitionBook(0, PartitionSnapshot(0))]


def test_failover_one_may_receive_until_it_leaves() -> None:
    """Scenario: failover; A then B attach with credit 10; A drains, is granted 5, leaves.
    Expected: only A eligible; after the drain no credit (the grant ignored); once A
    leaves, B is eligible and has credit; detach returns A, an unknown id None."""
    members = ConsumerSet(FailoverRouter())
    members.attach("a", "A", 10, PARTS)
    members.attach("b", "B", 10, PARTS)
    assert [c.id for c in members.eligible] == ["a"]
    assert members.any_credit()
    members.drain("a")
    members.grant("a", 5)
    assert members.by_id["a"].credit == 0
    assert not members.any_credit()
    left = members.detach("a")
    assert left is not None
    assert left.name == "A"
    assert members.detach("a") is None
    assert [c.id for c in members.eligible] == ["b"]
    assert members.any_credit()
    assert members.names() == ["B"]


def test_shared_every_consumer_may_receive_in_attach_order() -> None:
    """Scenario: shared; B, A and C attach (in that order), A with no credit.
    Expected: all three eligible, names in attach order; credit found (B, C)."""
    members = ConsumerSet(SharedRouter())
    for cid, credit in (("b", 1), ("a", 0), ("c", 1)):
        members.attach(cid, cid.upper(), credit, PARTS)
    assert [c.id for c in members.eligible] == ["b", "a", "c"]
    assert members.names() == ["B", "A", "C"]
    members.grant("b", -1)
    members.grant("c", -1)
    assert not members.any_credit()
