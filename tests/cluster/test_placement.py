"""Placement rules, pure: fewest partitions, then fewest topics, then node id; a burst
spreads."""

from __future__ import annotations

import pytest

from cluster.placement import choose_owner, place


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
