"""AsyncConsumers under dropped connections, against a real broker over real gRPC.

A TCP proxy between the consumers and the broker cuts every connection through it again
and again (both sides aborted, as a dropped network would), aimed at the moments the
consumers have just sent something (the first Subscribe, acks, credit). A producer goes
on publishing straight to the broker meanwhile. The subscriptions must still hand every
record to the application at least once, never a wrong value at an offset, and end with
nothing left to deliver; no consumer may give up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from broker.app import Broker
from broker.config import BrokerConfig
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, ClientError
from dispatcher import DispatchConfig, DispatchPolicy
from tests.broker.conftest import broker_config
from tests.client.conftest import address
from tests.client.test_producer_faults import CuttingProxy

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

TOPIC = "cuts"
PARTITIONS = 3
RECORDS = 3_000
CUTS = 30
#: Subscription -> (type, consumers).
SUBSCRIPTIONS = {"audit": ("exclusive", 1), "workers": ("shared", 2)}
DEADLINE_S = 60.0
#: Every record a broken stream leaves unacked counts as a failed delivery (the broker
#: cannot tell a dropped connection from a crashed consumer), so a record caught in
#: flight by many cuts would back off for up to a minute, then go to the dead-letter
#: queue. Short backoffs and no poison limit make "every record arrives" the rule here.
POLICY = DispatchPolicy(backoff_initial_s=0.05, backoff_max_s=0.2, max_deliveries=0)


class Readers:
    """The consumers of every subscription, each taking and acking in a task of its own,
    and what they handed to the application."""

    def __init__(self, target: str) -> None:
        self.seen: dict[str, set[bytes]] = defaultdict(set)
        self._at: dict[tuple[int, int], bytes] = {}
        self._done = asyncio.Event()
        self.consumers = [
            AsyncConsumer(
                TOPIC,
                name,
                broker=target,
                type=type_,
                initial_position="earliest",
                consumer_name=f"{name}-{i}",
                ack_interval_ms=1,
            )
            for name, (type_, count) in SUBSCRIPTIONS.items()
            for i in range(count)
        ]
        self._tasks = [asyncio.create_task(self._take(c)) for c in self.consumers]

    def have_all(self) -> bool:
        """Whether every subscription handed out every record; re-raises a reader's
        error (a consumer that gave up, or a wrong value at an offset)."""
        for task in self._tasks:
            if task.done():
                task.result()
        return all(len(self.seen[name]) == RECORDS for name in SUBSCRIPTIONS)

    async def stop(self) -> None:
        """End the readers (re-raising an error of theirs) and close the consumers."""
        self._done.set()
        try:
            await asyncio.gather(*self._tasks)
        finally:
            for consumer in self.consumers:
                with contextlib.suppress(ClientError):
                    await consumer.aclose()

    async def _take(self, consumer: AsyncConsumer) -> None:
        while not self._done.is_set():
            try:
                batch = await consumer.receive_batch(100, timeout=0.05)
            except TimeoutError:
                continue
            for message in batch:
                key = (message.partition, message.offset)
                assert self._at.setdefault(key, message.value) == message.value, key
                self.seen[consumer.subscription].add(message.value)
                consumer.ack(message)


@pytest.fixture
def config(tmp_path: Path) -> BrokerConfig:
    return broker_config(tmp_path / "data", dispatch=DispatchConfig(defaults=POLICY))


@pytest_asyncio.fixture
async def cut_broker(config: BrokerConfig) -> AsyncIterator[Broker]:
    async with Broker(config) as running:
        yield running


async def test_connections_cut_under_consumers_lose_no_record(
    cut_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: 3,000 distinct records are published, 1 ms apart, straight to a broker
    with a 3-partition topic; an exclusive subscription (one consumer) and a shared one
    (two consumers) read it through a proxy that cuts every connection 2 ms after every
    4th chunk a consumer sends, from its first Subscribe on (and every 50 ms once the
    publishing is over), 30 times. Each consumer acks every message it takes.
    Expected: the proxy really cut 30 times; no consumer gave up (a cut under its first
    Subscribe included); each subscription handed every published record to its
    consumers at least once; an offset always carried the same value; once all is read,
    each subscription's cursor is at the head of every partition with nothing in flight;
    the broker logged nothing at ERROR."""
    caplog.set_level(logging.WARNING)
    async with AsyncAdminClient(address(cut_broker)) as admin:
        await admin.create_topic(TOPIC, PARTITIONS)
    proxy = CuttingProxy(cut_broker.port, every=4, delay_s=0.002, max_cuts=CUTS)
    readers = Readers(await proxy.start())
    sent = [b"r%05d" % n for n in range(RECORDS)]
    try:
        async with AsyncProducer(address(cut_broker)) as producer:
            for n, value in enumerate(sent):
                await producer.publish(TOPIC, value, partition=n % PARTITIONS)
                await asyncio.sleep(0.001)
        deadline = time.monotonic() + DEADLINE_S
        while not (proxy.cuts >= CUTS and readers.have_all()) and time.monotonic() < deadline:
            if proxy.cuts < CUTS:  # the acks alone may come to too few cuts
                proxy.cut()
            await asyncio.sleep(0.05)
        lagging = await _until_caught_up(cut_broker)
    finally:
        try:
            await readers.stop()
        finally:
            await proxy.aclose()
    assert proxy.cuts == CUTS
    for name in SUBSCRIPTIONS:
        assert sorted(set(sent) - readers.seen[name]) == [], name
    assert lagging == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def _until_caught_up(broker: Broker, timeout_s: float = 10.0) -> list[str]:
    """Wait until every subscription's cursor is at the head of every partition with
    nothing in flight (the consumers' last acks landing); return what still lags then."""
    deadline = time.monotonic() + timeout_s
    async with AsyncAdminClient(address(broker)) as admin:
        while True:
            lagging = [
                f"{info.subscription}/{p.partition}: cursor {p.cursor} head {p.head} "
                f"in flight {p.in_flight}"
                for info in await admin.list_subscriptions(TOPIC)
                for p in info.partitions
                if p.cursor != p.head or p.in_flight
            ]
            if not lagging or time.monotonic() > deadline:
                return lagging
            await asyncio.sleep(0.05)
