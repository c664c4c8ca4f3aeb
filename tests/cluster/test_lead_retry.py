"""The rules for a failed takeover (:mod:`cluster.lead_retry`): pure, no loop, no etcd."""

from __future__ import annotations

import pytest

from cluster.lead_retry import LeadBackoff, takeover_target
from cluster.records import TopicRecord, TopicState


@pytest.mark.parametrize(
    ("failures", "delay_s"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (6, 30.0), (40, 30.0), (3000, 30.0)],
)
def test_the_wait_doubles_from_one_second_up_to_thirty(failures: int, delay_s: float) -> None:
    """Scenario: a topic's takeover fails ``failures`` times in a row, the last at 100 s.
    Expected: the next try waits 1 s doubled per failure before, at most 30 s: refused
    just before, allowed at that time; the count is the failures."""
    backoff = LeadBackoff()
    for _ in range(failures):
        failure = backoff.failed("orders", 100.0)
    assert (failure.count, failure.delay_s, failure.retry_at) == (failures, delay_s, 100 + delay_s)
    assert backoff.waiting("orders", 100 + delay_s - 0.01)
    assert not backoff.waiting("orders", 100 + delay_s)
    assert backoff.dues() == [100 + delay_s]


def test_a_success_or_a_lost_role_resets_it_and_other_topics_are_free() -> None:
    """Scenario: two failures of ``orders``, then a success; a failure of ``audit``, then
    it is forgotten. Expected: ``billing`` never waits; after the success ``orders``
    does not wait and its next failure waits 1 s again; ``audit`` waits no more."""
    backoff = LeadBackoff()
    backoff.failed("orders", 0.0)
    backoff.failed("orders", 1.0)
    assert backoff.failures("orders") == 2
    assert not backoff.waiting("billing", 1.5)
    backoff.succeeded("orders")
    assert backoff.failures("orders") == 0
    assert not backoff.waiting("orders", 1.5)
    assert backoff.failed("orders", 2.0).delay_s == 1.0
    backoff.failed("audit", 2.0)
    backoff.forget("audit")
    assert not backoff.waiting("audit", 2.0)
    assert backoff.dues() == [3.0]


def _record(isr: tuple[str, ...]) -> TopicRecord:
    return TopicRecord(
        "orders", "00", 2, 0, "b2", 5, TopicState.READY, replicas=("b1", "b2", "b3"), isr=isr
    )


@pytest.mark.parametrize(
    ("isr", "alive", "expected"),
    [
        (("b1", "b2", "b3"), {"b1", "b2", "b3"}, "b1"),
        (("b2", "b3", "b1"), {"b1", "b2", "b3"}, "b3"),  # the in-sync order, not me
        (("b1", "b2", "b3"), {"b2", "b3"}, "b3"),  # b1 is not alive
        (("b1", "b2"), {"b2", "b3"}, None),  # b3 is alive but not in sync
        (("b2",), {"b1", "b2", "b3"}, None),
    ],
)
def test_the_topic_goes_to_the_first_alive_in_sync_follower(
    isr: tuple[str, ...], alive: set[str], expected: str | None
) -> None:
    """Scenario: b2's takeover failed; in-sync sets and live brokers. Expected: the first
    alive in-sync replica other than b2 in the in-sync order, or None (b2 retries)."""
    assert takeover_target(_record(isr), "b2", alive) == expected
