"""Who commits to a subscription, and rejects, through the client over real gRPC.

A reader that pulls by offset (the Spark source) names itself with
``ack_up_to(..., committer=...)``; the broker keeps it with the subscription and refuses
a consumer that attaches without ``force=True``. ``nack(..., dead_letter=True)`` hands a
record to the subscription's poison policy at once.
"""

from __future__ import annotations

import asyncio

import pytest

from broker.app import Broker
from client import (
    AsyncAdminClient,
    AsyncConsumer,
    AsyncFetcher,
    AsyncProducer,
    Consumer,
    FailedPrecondition,
    InvalidArgument,
)
from tests.client.conftest import address


async def _topic(broker: Broker, records: int) -> None:
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("t")
    async with AsyncProducer(address(broker)) as producer:
        await (await producer.send_many("t", [b"v%d" % i for i in range(records)], partition=0))


@pytest.mark.asyncio
async def test_a_committed_subscription_refuses_a_consumer_unless_forced(broker: Broker) -> None:
    """Scenario: a reader commits offset 1 of ``t`` for ``s`` as committer ``job-7``; a
    consumer opens ``s``; another opens it with force=True.
    Expected: describe shows committer ``job-7``; the first consumer fails
    FailedPrecondition naming the committer and force; the forced one receives offset 1;
    a subscription nobody committed to shows committer ""."""
    await _topic(broker, 3)
    async with AsyncFetcher(address(broker)) as fetcher:
        assert await fetcher.ack_up_to("t", "s", 0, 1, committer="job-7") == 1
    async with AsyncAdminClient(address(broker)) as admin:
        assert (await admin.describe_subscription("t", "s")).committer == "job-7"
    consumer = AsyncConsumer("t", "s", broker=address(broker), connect_timeout=5)
    with pytest.raises(FailedPrecondition, match=r"committed to by 'job-7'.*force=True"):
        async with consumer:
            await consumer.receive(timeout=5)
    async with AsyncConsumer("t", "s", broker=address(broker), force=True) as forced:
        got = await forced.receive(timeout=5)
        assert got.offset == 1
    async with AsyncConsumer("t", "other", broker=address(broker)) as plain:
        assert (await plain.receive(timeout=5)).offset == 0
    async with AsyncAdminClient(address(broker)) as admin:
        assert (await admin.describe_subscription("t", "other")).committer == ""


@pytest.mark.asyncio
async def test_a_committer_with_a_control_character_is_refused(broker: Broker) -> None:
    """Scenario: AckUpTo with committer "spark\\n2026 ERROR forged".
    Expected: InvalidArgument naming the committer field; nothing is created."""
    await _topic(broker, 1)
    async with AsyncFetcher(address(broker)) as fetcher:
        with pytest.raises(InvalidArgument, match="committer"):
            await fetcher.ack_up_to("t", "s", 0, 1, committer="spark\n2026 ERROR forged")
    async with AsyncAdminClient(address(broker)) as admin:
        assert await admin.list_subscriptions("t") == []


@pytest.mark.asyncio
async def test_a_dead_letter_nack_goes_to_the_queue_at_once(broker: Broker) -> None:
    """Scenario: max_deliveries is the default 10; the sync consumer rejects offset 0 with
    nack(dead_letter=True, reason="schema"); acks offset 1.
    Expected: the dead-letter queue holds offset 0 with 1 attempt and reason "schema";
    the subscription is caught up (nothing redelivered); a delay with dead_letter is a
    ValueError."""
    await _topic(broker, 2)

    def consume() -> None:
        with Consumer("t", "s", broker=address(broker)) as consumer:
            first = consumer.receive(timeout=5)
            with pytest.raises(ValueError, match="no delay"):
                consumer.nack(first, delay=1.0, dead_letter=True)
            consumer.nack(first, reason="schema", dead_letter=True)
            consumer.ack(consumer.receive(timeout=5))

    await asyncio.to_thread(consume)
    async with AsyncAdminClient(address(broker)) as admin:
        for _ in range(100):
            if (await admin.describe_subscription("t", "s")).lag == 0:
                break
            await asyncio.sleep(0.05)
        [entry] = await admin.peek_dead_letters("t", "s")
        assert (entry.offset, entry.attempts, entry.reason) == (0, 1, "schema")
        assert (await admin.describe_subscription("t", "s")).lag == 0
