"""Placement rules, pure: fewest partitions, then fewest topics, then node id; a burst
spreads; replicated topics spread their replicas and preferred leaders; a factor above
the live brokers is unplaceable."""

from __future__ import annotations

from collections import Counter

import pytest

from cluster.placement import Ask, Placement, Unplaceable, choose_owner, place, plan


@pytest.mark.parametrize(
    ("load", "owner"),
    [
        ({}, None),
        ({"b1": (0, 0)}, "b1"),
        ({"b1": (4, 2), "b2": (4, 1), "b3": (6, 1)}, "b2"),  # partitions tie: fewer topics
        ({"b1": (3, 9), "b2": (4, 0)}, "b1"),  # partitions first, whatever the topics
        ({"b2": (1, 1), "b1": (1, 1)}, "b1"),  # full tie: smallest node id
    ],
)
def test_choose_owner(load: dict[str, tuple[int, int]], owner: str | None) -> None:
    """Each load table picks the broker the rule names (None with no live broker)."""
    assert choose_owner(load) == owner


def test_a_burst_spreads_over_every_broker() -> None:
    """Six topics of 2 partitions placed at once on three empty brokers: two each, in
    node-id order, because each placement counts toward the next."""
    placed = place([(f"t{i}", 2) for i in range(6)], {"b1": (0, 0), "b2": (0, 0), "b3": (0, 0)})
    assert [owner for _, owner in placed] == ["b1", "b2", "b3", "b1", "b2", "b3"]
    assert place([("t", 1)], {}) == []


def test_a_big_topic_weighs_more_than_many_small_ones() -> None:
    """A broker given one 8-partition topic is passed over until the others hold 8."""
    placed = place([("big", 8)] + [(f"s{i}", 1) for i in range(9)], {"b1": (0, 0), "b2": (0, 0)})
    owners = [owner for _, owner in placed]
    assert owners[0] == "b1"
    assert owners[1:9] == ["b2"] * 8
    assert owners[9] == "b1"  # 8 partitions each, b1 has fewer topics (1 vs 8)


LIVE3 = {"b1": (0, 0), "b2": (0, 0), "b3": (0, 0)}


def test_replicated_topics_spread_replicas_and_preferred_leaders() -> None:
    """Scenario: three idle brokers; three topics of factor 3, then three of factor 2,
    placed in one pass. Expected: each factor-3 topic is on all three brokers, with a
    different preferred leader each time (b1, b2, b3); the owner is always the first
    replica; after the factor-2 topics every broker holds 5 replicas (15 over 3) and leads
    2 topics (6 over 3): replicas and leaderships within one of each other."""
    asks = [Ask(f"r{i}", 1, 3) for i in range(3)] + [Ask(f"s{i}", 1, 2) for i in range(3)]
    decided = plan(asks, LIVE3, {})
    assert all(isinstance(d, Placement) for d in decided)
    placed = [d for d in decided if isinstance(d, Placement)]
    assert [p.replicas[0] for p in placed[:3]] == ["b1", "b2", "b3"]
    assert all(sorted(p.replicas) == ["b1", "b2", "b3"] for p in placed[:3])
    assert all(p.owner == p.replicas[0] and len(set(p.replicas)) == len(p.replicas) for p in placed)
    held = Counter(node for p in placed for node in p.replicas)
    leading = Counter(p.owner for p in placed)
    assert held == {"b1": 5, "b2": 5, "b3": 5}
    assert leading == {"b1": 2, "b2": 2, "b3": 2}


@pytest.mark.parametrize(
    ("factor", "replicas"),
    [(0, ()), (1, ())],  # one replica: issue 36's record, no replica set written
)
def test_one_replica_is_placed_by_partitions_as_before(
    factor: int, replicas: tuple[str, ...]
) -> None:
    """Scenario: a topic of factor 0 or 1 with b2 holding the fewest partitions (but the
    most replicas). Expected: placed on b2 by issue 36's rule, with no replica set."""
    load = {"b1": (4, 1), "b2": (1, 1), "b3": (4, 1)}
    replica_load = {"b1": (0, 0), "b2": (9, 9), "b3": (0, 0)}
    assert plan([Ask("t", 2, factor)], load, replica_load) == [Placement("t", "b2", replicas)]


def test_both_kinds_count_toward_each_other_in_a_pass() -> None:
    """Scenario: two idle brokers; a factor-2 topic of 4 partitions, then a factor-1
    topic, then a factor-2 topic, in one pass. Expected: ``a`` is led by b1; ``b`` goes to
    b2 (b1 owns a's 4 partitions) and counts as a replica and a leadership of b2's; so
    for ``c`` both brokers lead one topic and b1 holds fewer replicas (1 against 2): b1
    leads it. Without ``b`` counting, b2 (leading none) would have led ``c``."""
    decided = plan(
        [Ask("a", 4, 2), Ask("b", 1, 1), Ask("c", 1, 2)], {"b1": (0, 0), "b2": (0, 0)}, {}
    )
    assert decided == [
        Placement("a", "b1", ("b1", "b2")),
        Placement("b", "b2"),
        Placement("c", "b1", ("b1", "b2")),
    ]


def test_a_factor_above_the_live_brokers_is_unplaceable_and_the_rest_placed() -> None:
    """Scenario: three live brokers; asks of factor 4, then 3; and the same with no live
    broker. Expected: the first is Unplaceable naming 4 and 3, the second placed on all
    three; with no live broker nothing is decided (every ask waits)."""
    decided = plan([Ask("big", 1, 4), Ask("ok", 1, 3)], LIVE3, {})
    assert decided[0] == Unplaceable("big", 4, 3)
    assert isinstance(decided[1], Placement)
    assert len(decided[1].replicas) == 3
    assert plan([Ask("t", 1, 3)], {}, {}) == []
