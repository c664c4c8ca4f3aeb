"""When the broker gives memory back (:class:`broker.memory_rule.ReliefRule`): pure."""

from __future__ import annotations

import pytest

from broker.memory_rule import MIB, ReliefRule

#: One step: (RSS MiB, now s, RSS MiB after a relief run at that step or None).
Step = tuple[int, float, int | None]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # The module docstring's worked example, step by step.
        ([(55, 0.0, None), (100, 1.0, None)], [False, False]),
        ([(55, 0.0, None), (350, 2.0, 160)], [False, True]),
        ([(55, 0.0, None), (350, 2.0, 160), (160, 4.0, None)], [False, True, False]),
        ([(55, 0.0, None), (350, 2.0, 160), (160, 7.0, 60)], [False, True, True]),
        # Unproductive: 350 -> 340 doubles the interval to 10 s.
        ([(55, 0.0, None), (350, 2.0, 340), (340, 7.0, None)], [False, True, False]),
        ([(55, 0.0, None), (350, 2.0, 340), (340, 12.0, None)], [False, True, True]),
        # Growth is measured from the lowest RSS seen.
        ([(200, 0.0, None), (100, 1.0, None), (170, 2.0, None)], [False, False, True]),
        # Close to the floor, nothing is due however long it lasts.
        ([(300, 0.0, None), (310, 10.0, None), (360, 20.0, None)], [False, False, False]),
    ],
)
def test_relief_is_due_above_the_floor_after_the_interval(
    steps: list[Step], expected: list[bool]
) -> None:
    """Scenario: RSS readings in time, some followed by a relief. Expected: due only when
    RSS is 64 MiB or more above the lowest reading, and the interval (5 s; doubled after
    a relief that gave back under 32 MiB) has passed since the last relief."""
    rule = ReliefRule(grow_bytes=64 * MIB, min_interval_s=5.0, max_interval_s=300.0)
    got = []
    for rss, now, after in steps:
        got.append(rule.due(rss * MIB, now))
        if after is not None:
            rule.relieved(rss * MIB, after * MIB, now)
    assert got == expected


def test_unproductive_reliefs_back_off_to_the_maximum_interval() -> None:
    """Scenario: RSS stays 200 MiB above the floor (a real plateau) and every relief gives
    back nothing. Expected: the interval doubles from 5 s and stops at 300 s; a relief
    that gives back 100 MiB resets it to 5 s."""
    rule = ReliefRule(grow_bytes=64 * MIB, min_interval_s=5.0, max_interval_s=300.0)
    rule.due(50 * MIB, 0.0)
    intervals = []
    for _ in range(8):
        rule.relieved(250 * MIB, 250 * MIB, 0.0)
        intervals.append(rule.interval_s)
    assert intervals == [10, 20, 40, 80, 160, 300, 300, 300]
    rule.relieved(250 * MIB, 150 * MIB, 0.0)
    assert rule.interval_s == 5.0
