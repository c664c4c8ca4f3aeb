"""Delivery counts of a real ``headrace serve`` process that is SIGKILLed after each resend
(DESIGN 2.4: delivery-attempt counts survive a restart, so max-deliveries can be trusted).

A record whose delivery keeps taking the broker down (or a broker that keeps being killed
while a consumer holds the record unacked) must still reach max-deliveries and the
dead-letter queue, rather than come back with the same count after every restart. The
cursor flusher runs once a minute here, so only the save that a resend itself asks for
can carry its count to disk before the kill.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, Message
from tests.broker.test_kill import BrokerProcess
from tests.broker.test_serve_process import free_port

pytestmark = [
    pytest.mark.asyncio(loop_scope="function"),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

TOPIC = "jobs"
SUBSCRIPTION = "work"
CONFIG = f"""\
[broker]
grace_seconds = 1.0
cursor_flush_interval_ms = 60000

[wal]
fsync = "always"

[dispatch.subscriptions."{TOPIC}/{SUBSCRIPTION}"]
max_deliveries = 3
poison_policy = "dead_letter"
"""


async def _next(consumer: AsyncConsumer) -> Message:
    batch = await consumer.receive_batch(timeout=20)
    assert len(batch) == 1, batch
    return batch[0]


async def test_counts_grow_across_kills_until_the_record_is_dead_lettered(
    tmp_path: Path,
) -> None:
    """Scenario: max_deliveries 3, flusher at 60 s. One record; the consumer receives it
    and never acks. The broker is stopped cleanly (which saves the delivered mark), then
    SIGKILLed right after each resend reaches the consumer, twice.
    Expected: the resends carry redelivery counts 1 then 2 (each was saved before it went
    out); after the second kill the record has had 3 deliveries, so it goes to the
    dead-letter queue with 3 attempts and is not sent again."""
    broker = BrokerProcess(tmp_path, free_port(), CONFIG)
    await broker.start()
    try:
        async with AsyncAdminClient(broker.address) as admin:
            await admin.create_topic(TOPIC)
        async with AsyncProducer(broker.address) as producer:
            await (await producer.send(TOPIC, b"poison"))
        async with AsyncConsumer(TOPIC, SUBSCRIPTION, broker=broker.address) as consumer:
            counts = [(await _next(consumer)).redelivery_count]
            broker.stop()
            await broker.start()
            counts.append((await _next(consumer)).redelivery_count)
            broker.kill()
            await broker.start()
            counts.append((await _next(consumer)).redelivery_count)
            broker.kill()
            await broker.start()
            async with AsyncAdminClient(broker.address) as admin:
                for _ in range(200):
                    if await admin.count_dead_letters(TOPIC, SUBSCRIPTION):
                        break
                    await asyncio.sleep(0.05)
                entries = await admin.peek_dead_letters(TOPIC, SUBSCRIPTION)
            assert counts == [0, 1, 2]
            assert [(e.value, e.attempts) for e in entries] == [(b"poison", 3)]
            with pytest.raises(TimeoutError):  # nothing more is sent
                await consumer.receive_batch(timeout=0.5)
    finally:
        broker.kill()
