"""Tests of :mod:`broker.ingest`: what ``append_batch`` counts besides the append.

A real partition led by a real :class:`~broker.replica.leader.LeaderTopic` (its in-sync
set below ``min_insync``), a real log on disk and a fresh metrics registry.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.errors import TopicRefusedError
from broker.ingest import append_batch
from broker.metrics import BrokerMetrics
from broker.partition import Partition
from broker.replica.leader import LeaderTopic
from broker.topics import Topic
from cluster.records import TopicRecord, TopicState
from wal import FileSystem, LogConfig, encode_columns


async def _no_change(_isr: tuple[str, ...]) -> bool:
    return False


@pytest.mark.asyncio
async def test_a_not_enough_replicas_refusal_is_counted(tmp_path: Path) -> None:
    """Scenario: a replicated topic led here with isr (b1) of 3 replicas, min_insync 2;
    two publishes through append_batch.
    Expected: each is refused not-enough-replicas with nothing appended, and
    headrace_cluster_refusals_total{reason="not-enough-replicas"} is 2 (it was 0); no
    record is counted as published."""
    record = TopicRecord(
        "orders", "9f0c", 1, 0, "b1", 1, TopicState.READY,
        replicas=("b1", "b2", "b3"), isr=("b1",), min_insync=2,
    )  # fmt: skip
    part = await Partition.open(0, str(tmp_path / "orders"), LogConfig(), FileSystem())
    leader = LeaderTopic(
        Topic("orders", [part], "9f0c"), record, "b1",
        lag_time_max_ms=10_000, change_isr=_no_change, isr_check_s=3600,
    )  # fmt: skip
    metrics = BrokerMetrics()

    def refusals() -> float | None:
        return metrics.registry.get_sample_value(
            "headrace_cluster_refusals_total", {"reason": "not-enough-replicas"}
        )

    try:
        await leader.start()
        assert refusals() in (None, 0.0)
        for i in range(2):
            with pytest.raises(TopicRefusedError) as caught:
                await append_batch(
                    "orders", part, encode_columns([b"v%d" % i]), retention=None, metrics=metrics
                )
            assert caught.value.refusal.reason == "not-enough-replicas"
        assert refusals() == 2.0
        assert part.writer.head == 0
        published = metrics.registry.get_sample_value(
            "headrace_published_records_total", {"topic": "orders", "partition": "0"}
        )
        assert published in (None, 0.0)
    finally:
        await leader.aclose()
        await part.aclose()
