"""``AdminClient.create_topic(exist_ok=...)`` against a real broker on loopback: a program
that creates the topics it needs can run twice."""

from __future__ import annotations

import asyncio

import pytest

from broker.app import Broker
from client import AdminClient, AlreadyExists, AsyncAdminClient
from tests.client.conftest import address

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_exist_ok_returns_the_existing_topic_of_the_same_shape(broker: Broker) -> None:
    """Scenario: create "events" with 3 partitions, then again with exist_ok, then again
    without. Expected: the second call returns the same TopicInfo; the third raises
    AlreadyExists, as before."""
    async with AsyncAdminClient(address(broker)) as admin:
        made = await admin.create_topic("events", 3)
        again = await admin.create_topic("events", 3, exist_ok=True)
        assert again == made
        assert [p.partition for p in again.partitions] == [0, 1, 2]
        with pytest.raises(AlreadyExists):
            await admin.create_topic("events", 3)


async def test_exist_ok_with_another_partition_count_names_both(broker: Broker) -> None:
    """Scenario: "events" exists with 3 partitions; create it with exist_ok and 5.
    Expected: AlreadyExists whose message names 3 and 5; the topic keeps 3 partitions."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("events", 3)
        with pytest.raises(AlreadyExists, match=r"exists with 3 partitions, not the 5 asked"):
            await admin.create_topic("events", 5, exist_ok=True)
        assert len((await admin.describe_topic("events")).partitions) == 3


async def test_the_sync_twin_passes_exist_ok(broker: Broker) -> None:
    """Scenario: the blocking AdminClient creates "events" twice with exist_ok, and once
    more with another count. Expected: the same TopicInfo both times; AlreadyExists on
    the third."""

    def blocking() -> None:
        with AdminClient(address(broker)) as admin:
            first = admin.create_topic("events", 2, exist_ok=True)
            assert admin.create_topic("events", 2, exist_ok=True) == first
            with pytest.raises(AlreadyExists, match="not the 1 asked"):
                admin.create_topic("events", 1, exist_ok=True)

    await asyncio.to_thread(blocking)
