"""A real broker's /metrics after a known workload: every headrace_ family follows the
naming rule (broker/metrics.py), shows the workload, and a deleted topic's series go."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.app import Broker
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer
from tests.broker import metrics_workload as work
from tests.broker.conftest import broker_config

#: What a headrace_ name may end in (before ``_total`` for a counter): the unit it counts
#: or measures. Base units only: seconds and bytes, never ms or KiB.
UNIT_NOUNS = frozenset(
    {
        "batches",
        "bytes",
        "checkpoints",
        "elections",
        "entries",
        "events",
        "failures",
        "ids",
        "offset",
        "partitions",
        "polls",
        "reads",
        "records",
        "refusals",
        "replicas",
        "requests",
        "restarts",
        "seconds",
        "segments",
        "sessions",
        "topics",
    }
)
#: Names the design contract (DESIGN section 4) fixes, kept as it spells them although
#: they break the rule: programs written from the contract scrape these.
DESIGN_NAMES = frozenset(
    {
        ("headrace_subscription_lag_messages", "gauge"),
        ("headrace_dlq_evicted", "counter"),
        ("headrace_dlq_rejected", "counter"),
    }
)
#: The other families DESIGN section 4 lists (as the text parser names them).
DESIGN_LISTED = frozenset(
    {
        "headrace_dispatcher_notifier_polls",
        "headrace_dispatcher_heartbeat_polls",
        "headrace_subscription_stalled",
        "headrace_dlq_events",
        "headrace_dlq_entries",
    }
)
#: Gauges that are 0/1 flags, not quantities.
FLAGS = frozenset({"stalled", "blocked", "failed", "alive", "controller", "reachable", "offline"})
NON_BASE_UNITS = re.compile(r"_(ms|us|millis|milliseconds|microseconds|kib|mib|kb|mb)(_|$)")


def naming_errors(families: dict[str, str]) -> list[str]:
    """What is wrong with each ``name -> type`` (names as the text parser gives them: a
    counter's without ``_total``)."""
    errors = []
    for name, kind in sorted(families.items()):
        last = name.rsplit("_", 1)[-1]
        if (name, kind) in DESIGN_NAMES:
            continue
        if NON_BASE_UNITS.search(name):
            errors.append(f"{name}: not in base units (seconds, bytes)")
        elif kind == "counter" and last not in UNIT_NOUNS:
            errors.append(f"{name}_total: a counter must end in <unit noun>_total")
        elif kind == "gauge" and last not in UNIT_NOUNS | FLAGS and last != "info":
            errors.append(f"{name}: a gauge must end in a unit noun (or be a 0/1 flag)")
        elif kind == "histogram" and last not in {"seconds", "bytes"}:
            errors.append(f"{name}: a histogram must be in seconds or bytes")
        elif kind not in {"counter", "gauge", "histogram"}:
            errors.append(f"{name}: unexpected type {kind}")
        elif kind != "counter" and name.endswith("_total"):
            errors.append(f"{name}: only counters end in _total")
    return errors


@pytest.mark.parametrize(
    ("name", "kind", "ok"),
    [
        ("headrace_dlq_events", "counter", True),
        ("headrace_dlq_evicted", "counter", True),  # fixed by the design contract
        ("headrace_dlq_evicted", "gauge", False),
        ("headrace_dlq_purged", "counter", False),
        ("headrace_subscription_lag_records", "gauge", True),
        ("headrace_subscription_in_flight_messages", "gauge", False),
        ("headrace_publish_disk_full", "counter", False),
        ("headrace_partition_size_bytes", "gauge", True),
        ("headrace_subscription_stalled", "gauge", True),
        ("headrace_wal_append_ms", "histogram", False),
        ("headrace_things_total", "gauge", False),
    ],
)
def test_the_naming_rule(name: str, kind: str, ok: bool) -> None:
    """Scenario: names that keep and break the rule. Expected: only the good pass."""
    assert (naming_errors({name: kind}) == []) is ok


@pytest.mark.asyncio(loop_scope="function")
async def test_every_family_follows_the_naming_rule_and_shows_the_workload(
    tmp_path: Path,
) -> None:
    """Scenario: a real broker after the known workload (40 published, 30 acked, 2 poison
    records dead-lettered after a redelivery each, 8 left in flight). Expected: every
    headrace_ family on /metrics follows the naming rule and is in docs/metrics.md; every
    family DESIGN section 4 lists is there under its name; the new families are there with
    the workload's values (lag 8 and an age > 0 for it, head offsets summing to 40, a DLQ
    of 2 with its capacity, the log healthy, build info 1); the process families keep their
    standard names."""
    config = work.workload_config(broker_config(tmp_path / "data"))
    async with Broker(config) as broker:
        address = f"127.0.0.1:{broker.port}"
        await work.prepare(address)
        await work.run(address)
        samples = await work.settled(broker.metrics_port)
        text = await asyncio.to_thread(work.scrape_text, broker.metrics_port)
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    ours = {n: t for n, t in families.items() if n.startswith("headrace_")}
    assert naming_errors(ours) == []
    assert ours.keys() >= DESIGN_LISTED | {name for name, _ in DESIGN_NAMES}
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    undocumented = {
        name + ("_total" if kind == "counter" else "")
        for name, kind in ours.items()
        if f"`{name}{'_total' if kind == 'counter' else ''}`" not in docs
    }
    assert undocumented == set(), "add them to docs/metrics.md"
    sub = {"topic": work.TOPIC, "subscription": work.SUBSCRIPTION}
    part = {"topic": work.TOPIC}
    assert work.total(samples, "headrace_subscription_lag_messages", **sub) == work.LAG
    assert work.total(samples, "headrace_subscription_in_flight_records", **sub) == 0
    assert work.total(samples, "headrace_subscription_oldest_unacked_age_seconds", **sub) > 0
    assert work.total(samples, "headrace_subscription_blocked", **sub) == 0
    assert work.total(samples, "headrace_acked_records_total", **sub) == work.ACKED + work.POISON
    assert work.total(samples, "headrace_nacked_records_total", **sub) == 2 * work.POISON
    assert work.total(samples, "headrace_redelivered_records_total", **sub) == work.POISON
    assert work.total(samples, "headrace_dlq_entries", **sub) == work.POISON
    assert work.total(samples, "headrace_dlq_max_entries", **sub) == 100_000
    assert work.total(samples, "headrace_partition_head_offset", **part) == work.PUBLISHED
    assert work.total(samples, "headrace_partition_first_offset", **part) == 0
    assert work.total(samples, "headrace_partition_size_bytes", **part) > 0
    assert work.total(samples, "headrace_partition_segments", **part) == work.PARTITIONS
    assert work.total(samples, "headrace_wal_failed", **part) == 0
    assert work.total(samples, "headrace_build_info") == 1
    assert {
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_cpu_seconds",
    } <= set(families)


@pytest.mark.asyncio(loop_scope="function")
async def test_a_deleted_topic_leaves_no_series(tmp_path: Path) -> None:
    """Scenario: topics "gone" and "kept", each with records and a subscription that
    consumed some; "gone" is deleted. Expected: within a heartbeat round no series on
    /metrics has topic="gone" (partition gauges, WAL and dispatch histograms, subscription
    lag and counters alike), without a restart; "kept" still has its series."""
    config = work.workload_config(broker_config(tmp_path / "data"))
    async with Broker(config) as broker:
        address = f"127.0.0.1:{broker.port}"
        async with AsyncAdminClient(address) as admin:
            for topic in ("gone", "kept"):
                await admin.create_topic(topic, 2)
            async with AsyncProducer(address) as producer:
                for topic in ("gone", "kept"):
                    await (await producer.send_many(topic, [b"a", b"b", b"c", b"d"]))
            for topic in ("gone", "kept"):
                async with AsyncConsumer(topic, "s", broker=address) as consumer:
                    async with asyncio.timeout(5):
                        consumer.ack_many(await consumer.receive_batch(1))

            def topics(samples: work.Samples) -> dict[str, set[str]]:
                found: dict[str, set[str]] = {"gone": set(), "kept": set()}
                for name, labels in samples:
                    topic = dict(labels).get("topic")
                    if topic in found:
                        found[topic].add(name)
                return found

            port = broker.metrics_port
            lag = "headrace_subscription_lag_messages"
            async with asyncio.timeout(5):  # both subscriptions in a heartbeat's sample
                while True:
                    before = topics(work.parse(await asyncio.to_thread(work.scrape_text, port)))
                    if lag in before["gone"] and lag in before["kept"]:
                        break
                    await asyncio.sleep(0.05)
            for topic in ("gone", "kept"):
                assert {
                    "headrace_partition_head_offset",
                    "headrace_published_records_total",
                    "headrace_wal_append_seconds_count",
                    "headrace_dispatch_latency_seconds_count",
                } <= before[topic]
            await admin.delete_topic("gone")
            async with asyncio.timeout(5):
                while True:
                    after = topics(work.parse(await asyncio.to_thread(work.scrape_text, port)))
                    if not after["gone"]:
                        break
                    await asyncio.sleep(0.05)
        assert after["kept"] == before["kept"]
