"""Tests of :meth:`broker.replica.leader.LeaderTopic.follower_lag` (issue 37): what the
leader reports of each follower per partition (fetch offset, records behind, seconds
since caught up, in sync), for describe, status and metrics.

Real partitions on tmp dirs and fetch requests made directly, with the helpers and the
fake clock of ``test_leader.py``: ``orders`` (2 partitions) led by b1, followers b2, b3.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.replica.leader import FollowerLag
from tests.broker.replica.test_leader import fetch, leading, publish, record


@pytest.mark.asyncio
async def test_lag_in_records_and_seconds_per_follower_and_partition(tmp_path: Path) -> None:
    """Scenario: isr (b1, b2); 5 publishes durable on b1 in partition 0; b2 fetches from
    5 (and 0 in partition 1), b3 (not in sync) from 2; then 4 s pass on the leader's
    clock. Expected: partition 0: b2 at 5, 0 records and 0 s behind, in sync; b3 at 2, 3
    records and 4 s behind (since the leadership began: never caught up here), not in
    sync; partition 1 (empty): both 0 behind; b2 fetches from 5 again after the 4 s and
    stays 0 s behind, b3's seconds keep growing until it fetches from 5."""
    async with leading(tmp_path, record(isr=("b1", "b2"))) as (leader, topic, clock, _):
        tasks = await publish(topic, 5)
        await fetch(leader, "b2", 5)
        await fetch(leader, "b3", 2)
        clock.now += 4
        assert leader.follower_lag() == [
            FollowerLag(0, "b2", 5, 0, 0.0, True),
            FollowerLag(0, "b3", 2, 3, 4.0, False),
            FollowerLag(1, "b2", 0, 0, 0.0, True),
            FollowerLag(1, "b3", 0, 0, 0.0, False),
        ]
        clock.now += 1
        await fetch(leader, "b2", 5)
        lags = {(lag.partition, lag.node): lag for lag in leader.follower_lag()}
        assert lags[0, "b2"].lag_s == 0.0
        assert lags[0, "b3"].lag_s == 5.0
        await fetch(leader, "b3", 5)
        lags = {(lag.partition, lag.node): lag for lag in leader.follower_lag()}
        assert (lags[0, "b3"].lag_records, lags[0, "b3"].lag_s) == (0, 0.0)
        await asyncio.gather(*tasks)
