"""A known workload for the metrics tests: what a real broker's /metrics must then show.

:func:`prepare` creates the topic and the subscription (so every series exists, at 0,
before a scraper's first look: a rate then sees the whole workload). :func:`run` publishes
:data:`PUBLISHED` records, acknowledges :data:`ACKED` of them, nacks the
:data:`POISON` poison ones until they are dead-lettered (one redelivery each), and leaves
:data:`LAG` unacknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from broker.config import BrokerConfig
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, Message
from dispatcher import DispatchConfig, DispatchPolicy, HeartbeatConfig

TOPIC = "orders"
SUBSCRIPTION = "billing"
PARTITIONS = 2
PUBLISHED = 40
POISON = 2  # nacked twice each: one redelivery, then dead-lettered (max_deliveries 2)
ACKED = 30
LAG = PUBLISHED - ACKED - POISON  # received, never acknowledged

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def workload_config(config: BrokerConfig) -> BrokerConfig:
    """``config`` with a metrics listener, a fast heartbeat, and dead-lettering after two
    deliveries."""
    policy = DispatchPolicy(max_deliveries=2, backoff_initial_s=0.01)
    return config.replace(
        metrics_listen="127.0.0.1:0",
        heartbeat=HeartbeatConfig(interval_s=0.05),
        dispatch=DispatchConfig(defaults=policy),
    )


async def prepare(address: str) -> None:
    """Create :data:`TOPIC` and the subscription :data:`SUBSCRIPTION` (attach, leave)."""
    async with AsyncAdminClient(address) as admin:
        await admin.create_topic(TOPIC, PARTITIONS)
    async with AsyncConsumer(TOPIC, SUBSCRIPTION, broker=address) as consumer:
        with contextlib.suppress(TimeoutError):  # nothing to receive yet: it is attached
            await consumer.receive(timeout=0.05)


async def run(address: str) -> None:
    """Publish, consume, ack, nack and dead-letter as the module docstring says."""
    values = [b"poison-%d" % i for i in range(POISON)]
    values += [b"ok-%d" % i for i in range(PUBLISHED - POISON)]
    async with AsyncProducer(address) as producer:
        await (await producer.send_many(TOPIC, values))
    async with AsyncConsumer(TOPIC, SUBSCRIPTION, broker=address, ack_interval_ms=0) as c:
        good: dict[tuple[int, int], Message] = {}
        poison_deliveries = 0
        async with asyncio.timeout(10):
            while len(good) < PUBLISHED - POISON or poison_deliveries < 2 * POISON:
                for message in await c.receive_batch(PUBLISHED):
                    if message.value.startswith(b"poison"):
                        c.nack(message, delay=0, reason="cannot parse")
                        poison_deliveries += 1
                    else:
                        good[message.partition, message.offset] = message
        c.ack_many(list(good.values())[:ACKED])


def scrape_text(port: int) -> str:
    """The broker's /metrics page (blocking: call it in a thread)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text: str = reply.read().decode()
    return text


def parse(text: str) -> Samples:
    """Every sample of an exposition, by name and label set."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every series that has ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def settled(port: int) -> Samples:
    """Scrape until the workload's effects are all visible (the heartbeat publishes them
    every 50 ms); fail after 5 s."""
    sub = {"topic": TOPIC, "subscription": SUBSCRIPTION}
    async with asyncio.timeout(5):
        while True:
            samples = parse(await asyncio.to_thread(scrape_text, port))
            if (
                total(samples, "headrace_dlq_entries", **sub) == POISON
                and total(samples, "headrace_subscription_lag_messages", **sub) == LAG
            ):
                return samples
            await asyncio.sleep(0.05)
