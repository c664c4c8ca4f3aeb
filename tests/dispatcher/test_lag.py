"""The heartbeat's pure rules (dispatcher.lag): re-poll, STALLED, and the config."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher import HeartbeatConfig, InvalidSubscriptionError
from dispatcher.lag import LagMonitor, Observation


def test_monitor_rules() -> None:
    """Re-poll only with records ready and room; STALLED only after the timeout without
    progress; any progress restarts the timer."""
    m = LagMonitor(stall_timeout_s=2.0)
    assert not m.tick(Observation(ready=0, has_room=True, progress=0), 0.0).repoll
    assert not m.tick(Observation(ready=5, has_room=False, progress=0), 0.5).repoll
    v = m.tick(Observation(ready=5, has_room=True, progress=0), 1.0)
    assert (v.repoll, v.stalled) == (True, False)
    assert not m.tick(Observation(ready=5, has_room=True, progress=0), 2.9).stalled
    v = m.tick(Observation(ready=5, has_room=True, progress=0, last_error="EIO"), 3.0)
    assert v.stalled
    assert v.reason.endswith("for 2.0 s; the last read failed: EIO")
    assert not m.tick(Observation(ready=5, has_room=True, progress=1), 3.5).stalled
    assert not m.tick(Observation(ready=5, has_room=True, progress=1), 5.4).stalled
    assert m.tick(Observation(ready=5, has_room=True, progress=1), 5.5).stalled


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"interval_s": 0}, "from 0.001 to 3600 seconds"),
        ({"stall_timeout_s": -1}, "from 0.001 to 86400 seconds"),
        ({"stall_timeout_s": 0}, "from 0.001 to 86400 seconds"),
        ({"interval_s": float("nan")}, "nan is not a number"),
        ({"topics": {"t": True}}, "interval of 't'"),
        ({"subscriptions": {"no-slash": 1.0}}, "'topic/subscription'"),
    ],
)
def test_heartbeat_config_is_validated(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidSubscriptionError, match=match):
        HeartbeatConfig(**kwargs)
