"""The inactivity expiry rule (:class:`dispatcher.expiry.IdleTracker`): no loop, no disk."""

from __future__ import annotations

import pytest

from dispatcher.expiry import Expired, IdleTracker

K = ("orders", "billing")


def test_the_worked_example_of_the_module_docstring() -> None:
    """Scenario: the docstring's sequence of observations with a 60 s expiry. Expected: the
    idle seconds it lists, and an expiry only at t=260."""
    idle: IdleTracker[tuple[str, str]] = IdleTracker(60.0)
    steps = [
        (0, False, 7, 0.0),
        (30, False, 7, 30.0),
        (45, False, 8, 0.0),
        (100, False, 8, 55.0),
        (105, True, 9, 0.0),
        (200, False, 10, 0.0),
        (260, False, 10, 60.0),
    ]
    for now, attached, activity, want in steps:
        assert idle.observe(K, attached=attached, activity=activity, now=now) == want
        expected = [Expired(K, 60.0)] if now == 260 else []
        assert idle.expired(now) == expected, now


@pytest.mark.parametrize(("waited", "expires"), [(59.999, False), (60.0, True), (61.0, True)])
def test_the_boundary_is_inclusive(waited: float, expires: bool) -> None:
    """Scenario: first seen at t=0, then nothing changes until ``waited``. Expected: it
    expires at exactly the expiry or later, not a moment before."""
    idle: IdleTracker[str] = IdleTracker(60.0)
    idle.observe("s", attached=False, activity=0, now=0.0)
    idle.observe("s", attached=False, activity=0, now=waited)
    assert bool(idle.expired(waited)) is expires


def test_an_attached_consumer_never_lets_it_expire() -> None:
    """Scenario: a consumer stays attached for ten expiries without acking anything.
    Expected: never expired; its idle clock starts at the last round that saw it attached."""
    idle: IdleTracker[str] = IdleTracker(10.0)
    for now in range(0, 101, 5):
        idle.observe("s", attached=True, activity=3, now=float(now))
        assert idle.expired(float(now)) == []
    assert idle.observe("s", attached=False, activity=3, now=105.0) == 5.0
    assert idle.expired(109.5) == []
    assert idle.expired(110.0) == [Expired("s", 10.0)]


def test_first_sight_counts_as_activity_so_a_restart_restarts_the_clock() -> None:
    """Scenario: a tracker (a freshly started broker) first sees a subscription that has
    been idle for ages. Expected: idle 0 then; it expires one full expiry later."""
    idle: IdleTracker[str] = IdleTracker(30.0)
    assert idle.observe("old", attached=False, activity=0, now=5_000.0) == 0.0
    assert idle.expired(5_029.0) == []
    assert idle.expired(5_030.0) == [Expired("old", 30.0)]


def test_longest_idle_first_and_forgetting() -> None:
    """Scenario: three subscriptions seen at different times; one is forgotten (deleted),
    and retain() drops one that disappeared. Expected: the rest, longest idle first."""
    idle: IdleTracker[str] = IdleTracker(10.0)
    for name, now in (("a", 5.0), ("b", 0.0), ("c", 2.0), ("d", 1.0)):
        idle.observe(name, attached=False, activity=0, now=now)
    idle.forget("c")
    idle.retain({"a", "b"})
    assert [e.key for e in idle.expired(20.0)] == ["b", "a"]


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_non_positive_expiry_is_refused(bad: float) -> None:
    """Scenario: an expiry of ``bad`` seconds. Expected: ValueError naming the value."""
    with pytest.raises(ValueError, match="must be > 0"):
        IdleTracker(bad)
