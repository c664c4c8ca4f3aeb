"""Tests of the followers' lag as metrics (issue 37): ``headrace_replication_lag_records``
and ``_seconds`` per topic, partition and follower, from a real
:class:`~broker.replica.leader.LeaderTopic` (real partitions, fetches made directly, the
fake clock of ``test_leader.py``) through :func:`broker.cluster_metrics.replica_lag` and
:meth:`broker.metrics.BrokerMetrics.watch_replication`, scraped on another thread as the
exporter does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.cluster_metrics import lag_sampler, replica_lag
from broker.metrics import BrokerMetrics
from broker.replica.leader import LeaderTopic
from tests.broker.replica.test_leader import fetch, leading, publish, record
from tests.broker.test_metric_names import naming_errors


@dataclass
class _Roles:
    roles_now: dict[str, tuple[str, int]] = field(default_factory=dict)

    def roles(self) -> dict[str, tuple[str, int]]:
        return self.roles_now


@dataclass
class _Node:
    """What replica_lag reads of a ClusterNode: its roles and its started leaders."""

    replicas: _Roles
    leaders: dict[str, LeaderTopic]

    def replica_leader(self, name: str) -> LeaderTopic | None:
        return self.leaders.get(name)


@pytest.mark.asyncio
async def test_a_leader_exports_each_followers_lag(tmp_path: Path) -> None:
    """Scenario: b1 leads ``orders`` (2 partitions; isr b1, b2) and follows ``audit``
    (no leader here); 5 publishes durable in partition 0; b2 fetches from 5, b3 from 2;
    3 s pass; the registry is scraped on another thread. Expected: lag records 0 / 3 and
    seconds 0 / 3 for b2 / b3 in partition 0, 0 in partition 1, nothing for ``audit``;
    both families are gauges that keep the naming rule."""
    async with leading(tmp_path, record(isr=("b1", "b2"))) as (leader, topic, clock, _):
        tasks = await publish(topic, 5)
        await fetch(leader, "b2", 5)
        await fetch(leader, "b3", 2)
        clock.now += 3
        node = _Node(
            _Roles({"orders": ("leader", 1), "audit": ("follower", 4)}), {"orders": leader}
        )
        assert len(replica_lag(cast(Any, node))) == 4
        metrics = BrokerMetrics()
        metrics.watch_replication(lag_sampler(cast(Any, node), asyncio.get_running_loop()))
        text = (await asyncio.to_thread(generate_latest, metrics.registry)).decode()
        kinds: dict[str, str] = {}
        got: dict[tuple[str, str, str, str], float] = {}
        for family in text_string_to_metric_families(text):
            if family.name.startswith("headrace_replication_"):
                kinds[family.name] = family.type
                for s in family.samples:
                    key = (s.name, s.labels["topic"], s.labels["partition"], s.labels["follower"])
                    got[key] = s.value
        assert kinds == {
            "headrace_replication_lag_records": "gauge",
            "headrace_replication_lag_seconds": "gauge",
        }
        assert naming_errors(kinds) == []
        records, seconds = "headrace_replication_lag_records", "headrace_replication_lag_seconds"
        assert got == {
            (records, "orders", "0", "b2"): 0,
            (records, "orders", "0", "b3"): 3,
            (records, "orders", "1", "b2"): 0,
            (records, "orders", "1", "b3"): 0,
            (seconds, "orders", "0", "b2"): 0,
            (seconds, "orders", "0", "b3"): 3.0,
            (seconds, "orders", "1", "b2"): 0,
            (seconds, "orders", "1", "b3"): 0,
        }
        await asyncio.gather(*tasks)
