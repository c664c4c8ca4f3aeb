"""The ``dispatch`` bench scenario, run small: it measures what it says, and judges goals."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import dispatch
from bench._output import Goal
from bench._runner import SCENARIOS, RunOptions


def test_a_small_run_delivers_every_lost_notification(tmp_path: Path) -> None:
    """Scenario: 40 records in 2 rounds, every notification dropped, and 50 idle
    subscriptions for 0.2 s. Expected: the three metrics and their goal verdicts, with
    all 40 records delivered (by the heartbeat alone: nothing else can wake the
    dispatcher), none stuck, every delay positive, and a CPU share in [0, 100]."""
    sizes = dispatch.Sizes(losses=40, per_round=20, idle_subscriptions=50, cpu_seconds=0.2)
    results = list(dispatch.run(RunOptions(quick=True, data_dir=tmp_path), sizes=sizes))
    measured = {r.metric: r for r in results if not r.is_goal}
    goals = {r.metric: r for r in results if r.is_goal}
    assert set(measured) == set(goals) == set(dispatch.GOALS)
    missed = measured["missed_notification_delivery_ms"]
    assert missed.params["delivered"] == 40
    assert missed.value > 0
    assert measured["stuck_records"].value == 0
    assert goals["stuck_records"].params["met"] is True
    assert 0 <= measured["heartbeat_cpu_pct"].value <= 100
    assert all(r.bench == "dispatch" and r.system == "headrace" for r in results)
    assert "dispatch" in SCENARIOS


@pytest.mark.parametrize(
    ("op", "value", "met"),
    [("<=", 5.0, True), ("<=", 5.01, False), ("<", 5.0, False), (">=", 5.0, True)],
)
def test_goal_operators(op: str, value: float, met: bool) -> None:
    assert Goal(op, 5.0).met(value) is met


def test_an_unknown_goal_operator_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown goal operator"):
        Goal("~", 1.0).met(1.0)
