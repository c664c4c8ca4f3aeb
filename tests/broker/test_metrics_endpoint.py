"""The broker's /metrics endpoint over real HTTP, read with the real Prometheus parser."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.app import Broker
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, Message
from dispatcher import HeartbeatConfig
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
