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
from broker.partition import Partition
from broker.replica.dlq_log import ReplicaDlqLog
from broker.replica.leader import LeaderTopic
from broker.replica.state_log import ReplicaStateLog
from broker.topics import Topic
from proto.record import Record
from tests.broker.replica.test_leader import (
    LAG_MS,
    TOPIC_ID,
    Clock,
    fetch,
    fetch_request,
    leading,
    publish,
    record,
)
from tests.broker.test_metric_names import naming_errors
from wal import FileSystem, LogConfig, LogWriter, encode_records


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


async def _append(writer: LogWriter, count: int) -> None:
    for n in range(count):
        await writer.append(encode_records([Record(b"v%d" % n)]))


@pytest.mark.asyncio
async def test_the_state_log_and_the_worst_dead_letter_queue_have_one_series_each(
    tmp_path: Path,
) -> None:
    """Scenario: b1 leads ``orders`` (isr b1, b2, b3) with its state log (4 records) and
    two dead-letter queues' logs, ``dlq/a`` (2 letters) and ``dlq/b`` (6 letters); b2
    fetches everything to the ends; b3 fetches the state log from 1, ``dlq/a`` from 2
    and ``dlq/b`` from 1; 3 s pass; the registry is scraped on another thread. Expected:
    beside the partitions' series (``log="partition"``), one ``log="state"`` series per
    follower (b2 0, b3 3 records and 3 s) and one ``log="dlq"`` series per follower,
    the largest over both queues (b3: 5 records of ``dlq/b``, 3 s), partition empty:
    two series per follower however many queues the topic has."""
    fs = FileSystem()
    parts = [await Partition.open(i, str(tmp_path / "orders"), LogConfig(), fs) for i in range(2)]
    topic = Topic("orders", parts, TOPIC_ID)
    state = await LogWriter.open(str(tmp_path / "state"), LogConfig())
    dlq_a = await LogWriter.open(str(tmp_path / "dlq-a"), LogConfig())
    dlq_b = await LogWriter.open(str(tmp_path / "dlq-b"), LogConfig())
    extra = {
        "state": ReplicaStateLog(state),
        "dlq/a": ReplicaDlqLog(dlq_a, -2),
        "dlq/b": ReplicaDlqLog(dlq_b, -3),
    }
    clock = Clock()

    async def no_change(_isr: tuple[str, ...]) -> bool:
        return False

    rec = record(isr=("b1", "b2", "b3"))
    leader = LeaderTopic(
        topic, rec, "b1", lag_time_max_ms=LAG_MS, change_isr=no_change, clock=clock,
        isr_check_s=3600, extra_logs=cast(dict[str, Partition], extra),
    )  # fmt: skip
    await leader.start()
    try:
        for writer, count in ((state, 4), (dlq_a, 2), (dlq_b, 6)):
            await _append(writer, count)
        ends = {"p/0": 0, "p/1": 0, "state": 4, "dlq/a": 2, "dlq/b": 6}
        await leader.fetch(fetch_request("b2", ends))
        await leader.fetch(fetch_request("b3", {**ends, "state": 1, "dlq/a": 2, "dlq/b": 1}))
        clock.now += 3
        node = _Node(_Roles({"orders": ("leader", 1)}), {"orders": leader})
        metrics = BrokerMetrics()
        metrics.watch_replication(lag_sampler(cast(Any, node), asyncio.get_running_loop()))
        text = (await asyncio.to_thread(generate_latest, metrics.registry)).decode()
        got: dict[tuple[str, str, str, str], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if (
                    s.name.startswith("headrace_replication_lag_")
                    and s.labels["log"] != "partition"
                ):
                    labels = s.labels
                    got[(s.name, labels["log"], labels["partition"], labels["follower"])] = s.value
        records, seconds = "headrace_replication_lag_records", "headrace_replication_lag_seconds"
        assert got == {
            (records, "dlq", "", "b2"): 0,
            (records, "dlq", "", "b3"): 5,
            (records, "state", "", "b2"): 0,
            (records, "state", "", "b3"): 3,
            (seconds, "dlq", "", "b2"): 0,
            (seconds, "dlq", "", "b3"): 3.0,
            (seconds, "state", "", "b2"): 0,
            (seconds, "state", "", "b3"): 3.0,
        }
        assert all(s.log == "partition" for s in replica_lag(cast(Any, node)) if s.partition >= 0)
    finally:
        await leader.aclose()
        for writer in (state, dlq_a, dlq_b):
            await writer.aclose()
        for p in parts:
            await p.aclose()
