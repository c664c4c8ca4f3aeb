"""The broker's /metrics endpoint over real HTTP, read with the real Prometheus parser."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.app import Broker
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, Message
from dispatcher import DispatchConfig, DispatchPolicy, HeartbeatConfig
from tests.broker.conftest import broker_config

pytestmark = pytest.mark.asyncio(loop_scope="function")


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_subscription_lag_and_polls_are_exported(tmp_path: Path) -> None:
    """Scenario: 10 records on a 2-partition topic, a consumer that takes and acks 4 of
    them, then leaves; the heartbeat runs every 20 ms. Expected: /metrics shows lag 6 over
    the partitions, notifier polls for the subscription, a STALLED flag of 0, and the
    published-records counter."""
    config = broker_config(
        tmp_path / "data",
        metrics_listen="127.0.0.1:0",
        heartbeat=HeartbeatConfig(interval_s=0.02),
    )
    async with Broker(config) as broker:
        address = f"127.0.0.1:{broker.port}"
        async with AsyncAdminClient(address) as admin:
            await admin.create_topic("orders", 2)
        async with AsyncProducer(address) as producer:
            await (await producer.send_many("orders", [b"%d" % i for i in range(10)]))
        async with AsyncConsumer("orders", "billing", broker=address) as consumer:
            taken: list[Message] = []
            async with asyncio.timeout(5):
                while len(taken) < 4:
                    taken += await consumer.receive_batch(4 - len(taken))
            consumer.ack_many(taken)
        sub = frozenset({("topic", "orders"), ("subscription", "billing")})
        async with asyncio.timeout(5):
            while True:
                samples = await asyncio.to_thread(_scrape, broker.metrics_port)
                lags = [
                    v
                    for (name, labels), v in samples.items()
                    if name == "headrace_subscription_lag_messages" and sub <= labels
                ]
                if sum(lags) == 6:
                    break
                await asyncio.sleep(0.02)
        assert len(lags) == 2
        assert samples["headrace_dispatcher_notifier_polls_total", sub] >= 1
        assert samples["headrace_subscription_stalled", sub] == 0
        published = sum(
            v for (name, _), v in samples.items() if name == "headrace_published_records_total"
        )
        assert published == 10
        assert samples["headrace_dispatched_records_total", sub] == 10
        assert samples["headrace_redelivered_records_total", sub] == 0
        assert samples["headrace_dlq_entries", sub] == 0

        def total(name: str) -> float:
            return sum(v for (n, _), v in samples.items() if n == name)

        assert total("headrace_wal_append_seconds_count") >= 1
        assert total("headrace_wal_fsync_seconds_count") >= 1
        assert total("headrace_dispatch_latency_seconds_count") >= 1


async def test_redelivery_and_dead_letter_metrics(tmp_path: Path) -> None:
    """Scenario: max_deliveries 2 with dead_letter; a consumer nacks its one record twice.
    Expected: /metrics shows one redelivery, one dead-lettered record, one DLQ event and one
    DLQ entry for the subscription, and no evictions or rejections."""
    policy = DispatchPolicy(max_deliveries=2, backoff_initial_s=0.01)
    config = broker_config(
        tmp_path / "data",
        metrics_listen="127.0.0.1:0",
        heartbeat=HeartbeatConfig(interval_s=0.02),
        dispatch=DispatchConfig(defaults=policy),
    )
    async with Broker(config) as broker:
        address = f"127.0.0.1:{broker.port}"
        async with AsyncAdminClient(address) as admin:
            await admin.create_topic("orders", 1)
        async with AsyncProducer(address) as producer:
            await (await producer.send("orders", b"poison"))
        async with AsyncConsumer("orders", "billing", broker=address, ack_interval_ms=0) as c:
            for _ in range(2):
                c.nack(await c.receive(timeout=5), delay=0, reason="bad")
            with pytest.raises(TimeoutError):
                await c.receive(timeout=0.2)
        sub = frozenset({("topic", "orders"), ("subscription", "billing")})
        async with asyncio.timeout(5):
            while True:
                samples = await asyncio.to_thread(_scrape, broker.metrics_port)
                if samples.get(("headrace_dlq_entries", sub)) == 1:
                    break
                await asyncio.sleep(0.02)
        assert samples["headrace_redelivered_records_total", sub] == 1
        assert samples["headrace_dead_lettered_records_total", sub] == 1
        assert samples["headrace_dlq_events_total", sub] == 1
        assert samples["headrace_dlq_evicted_total", sub] == 0
        assert samples["headrace_dlq_rejected_total", sub] == 0
        assert samples["headrace_subscription_timed_out_records_total", sub] == 0
