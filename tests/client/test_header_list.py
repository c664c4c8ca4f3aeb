"""Duplicate header names end to end: a producer sends ``(name, value)`` pairs, a consumer
reads them all, over real gRPC against a real broker."""

from __future__ import annotations

import asyncio

import pytest

from broker.app import Broker
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, Message
from tests.client.conftest import address

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_duplicate_header_names_arrive_in_order(broker: Broker) -> None:
    """Scenario: one record with headers ``[("via", a), ("via", b), ("id", c)]`` and one
    with a mapping. Expected: ``header_list`` gives the pairs as sent, duplicates and order
    kept; ``headers`` (the dict view) keeps the last value of a repeated name."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("h", 1)
    pairs = [("via", b"edge-1"), ("via", b"edge-2"), ("id", b"7")]
    async with AsyncProducer(address(broker), linger_ms=5) as producer:
        sent = [
            await producer.send("h", b"first", headers=pairs),
            await producer.send("h", b"second", headers={"only": b"one"}),
        ]
        await asyncio.gather(*sent)
    got: list[Message] = []
    async with AsyncConsumer("h", "s", broker=address(broker)) as consumer:
        async with asyncio.timeout(10):
            while len(got) < 2:
                got.append(await consumer.receive())
    first, second = got
    assert first.header_list == pairs
    assert first.headers == {"via": b"edge-2", "id": b"7"}
    assert second.header_list == [("only", b"one")]
    assert second.headers == {"only": b"one"}
