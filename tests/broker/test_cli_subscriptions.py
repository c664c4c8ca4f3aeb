"""The pure parts of :mod:`broker.cli_subscriptions`: the rows it prints. No broker."""

from __future__ import annotations

import pytest

from broker.cli_subscriptions import partition_rows, state_of, summary
from client import PartitionLag, SubscriptionInfo

TOPIC, SUB = "orders", "billing"


def lag(state: str) -> PartitionLag:
    return PartitionLag(0, 0, 1, 1, 0, 0.0, state, "")


@pytest.mark.parametrize(
    ("states", "want"),
    [
        (("CAUGHT_UP", "CAUGHT_UP"), "CAUGHT_UP"),
        (("CAUGHT_UP", "LAGGING"), "LAGGING"),
        (("LAGGING", "NO_CONSUMER"), "NO_CONSUMER"),
        (("NO_CONSUMER", "STALLED", "LAGGING"), "STALLED"),
        (("STALLED", "BLOCKED"), "BLOCKED"),
    ],
)
def test_the_state_is_the_most_urgent_partition_state(states: tuple[str, ...], want: str) -> None:
    """Scenario: partitions in ``states``. Expected: the subscription's state is ``want``."""
    info = SubscriptionInfo(TOPIC, SUB, "shared", (), tuple(lag(s) for s in states))
    assert state_of(info) == want


def test_summary_and_partition_rows() -> None:
    """Scenario: a subscription with two partitions (lag 2 and 1) and one consumer.
    Expected: the summary sums the lag, lists the consumer, has the subscription's
    delivery mode; partition rows carry every field, the age rounded to ms."""
    parts = (
        PartitionLag(0, 5, 7, 2, 1, 1.23456, "LAGGING", "2 records not yet acknowledged"),
        PartitionLag(1, 0, 1, 1, 0, 0.5, "LAGGING", "1 records not yet acknowledged"),
    )
    info = SubscriptionInfo(TOPIC, SUB, "shared", ("w1",), parts, mode="at_most_once")
    assert summary(info) == {
        "topic": TOPIC,
        "subscription": SUB,
        "type": "shared",
        "mode": "at_most_once",
        "consumers": ["w1"],
        "lag": 3,
        "state": "LAGGING",
    }
    assert partition_rows(info)[0] == {
        "partition": 0,
        "cursor": 5,
        "head": 7,
        "lag": 2,
        "in_flight": 1,
        "oldest_unacked_age_s": 1.235,
        "state": "LAGGING",
        "reason": "2 records not yet acknowledged",
    }
