"""The pacer thread's timer slack (bench/_pubsub_system.py ``timer_slack``): set for the
block on the calling thread only, put back after it, refused when not positive."""

from __future__ import annotations

import sys
import threading

import pytest

from bench._pubsub_system import PACER_TIMER_SLACK_NS, _prctl, timer_slack

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def _slack() -> int:
    prctl = _prctl()
    assert prctl is not None
    return prctl(30, 0, 0, 0, 0)  # PR_GET_TIMERSLACK


@linux_only
def test_the_slack_holds_inside_the_block_and_is_put_back() -> None:
    """Scenario: a thread runs a block under a slack of 1 us. Expected: 1,000 ns inside,
    the old value after."""
    before = _slack()
    with timer_slack(PACER_TIMER_SLACK_NS):
        inside = _slack()
    assert inside == 1_000
    assert _slack() == before


@linux_only
def test_another_thread_keeps_its_slack() -> None:
    """Scenario: a thread started before the block reads its slack while the block runs
    on this one. Expected: unchanged (the slack is per thread)."""
    started = threading.Event()
    go = threading.Event()
    seen: list[int] = []

    def other() -> None:
        before = _slack()
        started.set()
        go.wait(5)
        seen.extend([before, _slack()])

    thread = threading.Thread(target=other)
    thread.start()
    started.wait(5)
    with timer_slack(PACER_TIMER_SLACK_NS):
        go.set()
        thread.join(5)
    assert len(seen) == 2
    assert seen[0] == seen[1] != PACER_TIMER_SLACK_NS


@linux_only
def test_the_slack_is_put_back_when_the_block_raises() -> None:
    """Scenario: the block raises. Expected: the error goes through; the slack is back."""
    before = _slack()
    inside: list[int] = []

    def fail() -> None:
        with timer_slack(5_000):
            inside.append(_slack())
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert inside == [5_000]
    assert _slack() == before


@pytest.mark.parametrize("bad", [0, -1])
def test_a_slack_that_is_not_positive_is_refused(bad: int) -> None:
    """Scenario: a slack of 0 (which Linux reads as "the default") or below. Expected:
    ValueError naming the rule."""
    with pytest.raises(ValueError, match="timer slack must be > 0 ns"), timer_slack(bad):
        pass
