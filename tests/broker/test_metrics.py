"""BrokerMetrics on its own registry (no broker): bucket bounds, the partition gauges over
a real log, the subscription collector's age, BLOCKED and dead-letter capacity, build info
and the process collectors."""

from __future__ import annotations

import dataclasses
import errno
import platform
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.busy import BusyRule
from broker.metrics import DISPATCH_BUCKETS, WAL_BUCKETS, BrokerMetrics, PartitionLog
from dispatcher import SubscriptionSample
from dispatcher.heartbeat import PartitionSample
from wal import Fault, FaultyFs, LogConfig, LogWriter, WalFailedError, encode_columns

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _samples(metrics: BrokerMetrics) -> Samples:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _bucket(samples: Samples, name: str, le: str, **labels: str) -> float:
    return samples[name + "_bucket", frozenset({**labels, "le": le}.items())]


@pytest.mark.parametrize(
    ("seconds", "smallest_bound"),
    [(0.0002, "0.00025"), (0.003, "0.005"), (7.0, "10.0"), (600.0, "600.0"), (3000.0, "3600.0")],
)
def test_a_dispatch_latency_lands_in_a_finite_bucket(seconds: float, smallest_bound: str) -> None:
    """Scenario: one dispatch latency from 0.2 ms to 50 minutes (a drained backlog).
    Expected: it is counted by its smallest covering finite bucket, so the p99 of a backlog
    reads its real age rather than the top bound."""
    metrics = BrokerMetrics(CollectorRegistry())
    metrics.dispatch_observer("orders")(seconds)
    samples = _samples(metrics)
    name = "headrace_dispatch_latency_seconds"
    assert _bucket(samples, name, smallest_bound, topic="orders") == 1
    finite = [b for b in DISPATCH_BUCKETS if b < float(smallest_bound)]
    if finite:
        assert _bucket(samples, name, str(float(finite[-1])), topic="orders") == 0


def test_the_bounds_span_what_happens() -> None:
    """Scenario: the bucket tables. Expected: dispatch covers 0.25 ms to an hour, the WAL
    50 us to 10 s (an fsync of 100 ms+ on a busy disk is resolved), both ascending."""
    assert DISPATCH_BUCKETS[0] == 0.00025
    assert DISPATCH_BUCKETS[-1] == 3600
    assert WAL_BUCKETS[0] == 0.00005
    assert WAL_BUCKETS[-1] == 10
    for table in (DISPATCH_BUCKETS, WAL_BUCKETS):
        assert list(table) == sorted(set(table))
    assert {0.1, 0.25, 0.5, 1} <= set(WAL_BUCKETS)


def test_a_slow_fsync_is_resolved() -> None:
    """Scenario: a group commit whose fsync took 300 ms. Expected: it is counted in the
    0.5 s bucket, not only in +Inf."""
    metrics = BrokerMetrics(CollectorRegistry())
    metrics.commit_observer("orders", 0)(0.0001, 0.3, 1)
    samples = _samples(metrics)
    labels = {"topic": "orders", "partition": "0"}
    assert _bucket(samples, "headrace_wal_fsync_seconds", "0.25", **labels) == 0
    assert _bucket(samples, "headrace_wal_fsync_seconds", "0.5", **labels) == 1


def _sample(**changes: object) -> SubscriptionSample:
    base = SubscriptionSample(
        "orders",
        "billing",
        notifier_polls=3,
        heartbeat_polls=1,
        task_restarts=0,
        stalled=False,
        partitions=(
            PartitionSample(0, lag=5, in_flight=2, oldest_unacked_ms=1_000_000.0),
            PartitionSample(1, lag=0, in_flight=0, oldest_unacked_ms=None),
        ),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_oldest_unacked_age_is_taken_at_the_scrape() -> None:
    """Scenario: partition 0's oldest unacknowledged record was published at t=1000 s;
    partition 1 is caught up; the clock reads 1100 s, then 1160 s. Expected: ages 100 s
    then 160 s for partition 0 from the same sample (no rebuild needed), 0 for
    partition 1."""
    now = [1100.0]
    metrics = BrokerMetrics(CollectorRegistry(), clock=lambda: now[0])
    metrics.watch_subscriptions(lambda: [_sample()])
    name = "headrace_subscription_oldest_unacked_age_seconds"

    def age(partition: str) -> float:
        labels = {"topic": "orders", "partition": partition, "subscription": "billing"}
        return _samples(metrics)[name, frozenset(labels.items())]

    assert age("0") == 100.0
    assert age("1") == 0.0
    now[0] = 1160.0
    assert age("0") == 160.0


@pytest.mark.parametrize(("blocked", "expected"), [((False, False), 0.0), ((False, True), 1.0)])
def test_blocked_is_any_partition(blocked: tuple[bool, bool], expected: float) -> None:
    """Scenario: a subscription whose partitions are BLOCKED or not. Expected:
    headrace_subscription_blocked is 1 exactly when one of them is."""
    parts = tuple(
        PartitionSample(i, lag=1, in_flight=0, oldest_unacked_ms=0.0, blocked=b)
        for i, b in enumerate(blocked)
    )
    metrics = BrokerMetrics(CollectorRegistry())
    metrics.watch_subscriptions(lambda: [_sample(partitions=parts)])
    sub = frozenset({("topic", "orders"), ("subscription", "billing")})
    assert _samples(metrics)["headrace_subscription_blocked", sub] == expected


def test_dlq_capacity_is_exported_only_with_a_queue() -> None:
    """Scenario: one subscription with a dead-letter queue of 1000 entries, one without.
    Expected: headrace_dlq_max_entries 1000 for the first, no series for the second (a
    ratio over it would be 0/0)."""
    metrics = BrokerMetrics(CollectorRegistry())
    metrics.watch_subscriptions(
        lambda: [_sample(dlq_max_entries=1000, dlq_entries=850), _sample(subscription="audit")]
    )
    samples = _samples(metrics)
    billing = frozenset({("topic", "orders"), ("subscription", "billing")})
    audit = frozenset({("topic", "orders"), ("subscription", "audit")})
    assert samples["headrace_dlq_max_entries", billing] == 1000
    assert samples["headrace_dlq_entries", billing] == 850
    assert ("headrace_dlq_max_entries", audit) not in samples


def test_build_info_and_process_metrics() -> None:
    """Scenario: a fresh BrokerMetrics. Expected: headrace_build_info is 1 with the Python
    and grpcio versions, and the standard process families are on the broker's registry."""
    samples = _samples(BrokerMetrics(CollectorRegistry()))
    (labels,) = [dict(labels) for name, labels in samples if name == "headrace_build_info"]
    assert labels["python"] == platform.python_version()
    assert labels["grpc"] == grpc.__version__
    assert labels["version"]
    names = {name for name, _ in samples}
    assert {
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_cpu_seconds_total",
        "python_info",
    } <= names


@pytest.mark.asyncio(loop_scope="function")
async def test_partition_gauges_follow_the_log_and_its_failed_latch(tmp_path: Path) -> None:
    """Scenario: a real log gets two batches (5 records), then an fsync fails with EIO,
    which latches it. Expected: head 5, first offset 0, its size and one segment, failed 0
    before the fault and 1 after, with no restart."""
    fs = FaultyFs()
    writer = await LogWriter.open(str(tmp_path / "log"), fs=fs)
    try:
        metrics = BrokerMetrics(CollectorRegistry())
        metrics.watch_partitions(lambda: [PartitionLog("orders", 3, writer)])
        await writer.append(encode_columns([b"a", b"b"]))
        await writer.append(encode_columns([b"c", b"d", b"e"]))
        labels = frozenset({("topic", "orders"), ("partition", "3")})
        samples = _samples(metrics)
        assert samples["headrace_partition_head_offset", labels] == 5
        assert samples["headrace_partition_first_offset", labels] == 0
        assert samples["headrace_partition_size_bytes", labels] == writer.log.size_bytes > 0
        assert samples["headrace_partition_segments", labels] == 1
        assert samples["headrace_wal_failed", labels] == 0
        fs.faults.append(Fault("fdatasync", error=errno.EIO, path_contains=".log"))
        with pytest.raises(WalFailedError):
            await writer.append(encode_columns([b"f"]))
        assert _samples(metrics)["headrace_wal_failed", labels] == 1
    finally:
        await writer.aclose()


@pytest.mark.asyncio(loop_scope="function")
async def test_the_in_flight_hint_gauge_is_what_publish_answers_carry(tmp_path: Path) -> None:
    """Scenario: a partition's commit cost says 1, then 2; then the broker is busy.
    Expected: the gauge reads 1, 2, then 1 (the busy rule overrides the partition's)."""
    writer = await LogWriter.open(str(tmp_path / "log"))
    try:
        busy = BusyRule()
        metrics = BrokerMetrics(CollectorRegistry())
        metrics.watch_partitions(lambda: [PartitionLog("orders", 0, writer)], busy)
        labels = frozenset({("topic", "orders"), ("partition", "0")})
        name = "headrace_partition_in_flight_hint_batches"
        assert _samples(metrics)[name, labels] == 1
        writer.commit_cost.pipelined = True
        assert _samples(metrics)[name, labels] == 2
        busy.busy = True
        assert _samples(metrics)[name, labels] == 1
    finally:
        await writer.aclose()


@pytest.mark.asyncio(loop_scope="function")
async def test_cold_reads_are_counted_per_partition(tmp_path: Path) -> None:
    """Scenario: a log whose first segment is cold (FaultyFs.cold); one read on the loop
    misses, the thread reads it, a second read hits. Expected:
    headrace_partition_cold_reads_total goes 0, then 1, and stays 1."""
    fs = FaultyFs()
    config = LogConfig(segment_bytes=512, index_interval_bytes=100, tail_cache_bytes=0)
    writer = await LogWriter.open(str(tmp_path / "log"), config, fs=fs)
    try:
        for i in range(20):
            await writer.append(encode_columns([b"%04d" % i]))
        metrics = BrokerMetrics(CollectorRegistry())
        metrics.watch_partitions(lambda: [PartitionLog("orders", 0, writer)], BusyRule())
        key = (
            "headrace_partition_cold_reads_total",
            frozenset({("topic", "orders"), ("partition", "0")}),
        )
        assert _samples(metrics)[key] == 0
        fs.cold = {f"{0:020d}.log"}
        assert writer.read_nowait(0, 100) is None
        await writer.read_cold(0, 100)
        assert _samples(metrics)[key] == 1
        assert writer.read_nowait(0, 100)
        assert _samples(metrics)[key] == 1
    finally:
        await writer.aclose()
