"""AsyncFetcher, Fetcher, offsets_for_time and per-partition seeks over real gRPC on
loopback: the calls the Spark connector is built on."""

from __future__ import annotations

import asyncio

import pytest

from broker.app import Broker
from client import (
    AdminClient,
    AsyncAdminClient,
    AsyncFetcher,
    AsyncProducer,
    Fetcher,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from tests.client.conftest import address


async def _topic_with_records(broker: Broker) -> None:
    """Topic ``t``: partition 0 holds offsets 0-9 in two batches (times 1000-1009),
    partition 1 holds nothing."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("t", partitions=2)
    async with AsyncProducer(address(broker)) as producer:
        for first in (0, 5):
            values = [b"v%d" % i for i in range(first, first + 5)]
            times = [1000 + i for i in range(first, first + 5)]
            await (await producer.send_many("t", values, partition=0, timestamps_ms=times))


@pytest.mark.asyncio
async def test_fetch_returns_whole_batches_from_the_offset(broker: Broker) -> None:
    """Scenario: fetch partition 0 at offset 7, then at 2 with end_offset 5, then at the
    head. Expected: the batch holding 7 starts at 5 (the caller slices); end_offset drops
    the batch starting at 5; at the head nothing comes back, with the head and first
    retained offset reported."""
    await _topic_with_records(broker)
    async with AsyncFetcher(address(broker)) as fetcher:
        got = await fetcher.fetch("t", 0, 7)
        assert [b.base_offset for b in got.batches] == [5]
        assert got.batches[0].values() == [b"v5", b"v6", b"v7", b"v8", b"v9"]
        assert (got.high_water_mark, got.first_offset) == (10, 0)
        bounded = await fetcher.fetch("t", 0, 2, end_offset=5)
        assert [b.base_offset for b in bounded.batches] == [0]
        empty = await fetcher.fetch("t", 0, 10)
        assert (empty.batches, empty.high_water_mark) == ([], 10)


@pytest.mark.asyncio
async def test_ack_up_to_creates_the_subscription_and_only_moves_forward(
    broker: Broker,
) -> None:
    """Scenario: AckUpTo 6 on a subscription that does not exist, then AckUpTo 3. Expected:
    the subscription exists with cursor 6 on partition 0; the lower ack leaves it at 6; the
    records behind show as LAGGING (a reader commits them), not NO_CONSUMER."""
    await _topic_with_records(broker)
    async with AsyncFetcher(address(broker)) as fetcher:
        assert await fetcher.ack_up_to("t", "spark", 0, 6) == 6
        assert await fetcher.ack_up_to("t", "spark", 0, 3) == 6
    async with AsyncAdminClient(address(broker)) as admin:
        info = await admin.describe_subscription("t", "spark")
    assert [(p.partition, p.cursor, p.lag) for p in info.partitions] == [(0, 6, 4), (1, 0, 0)]
    assert [p.state for p in info.partitions] == ["LAGGING", "CAUGHT_UP"]
    assert "AckUpTo" in info.partitions[0].reason


@pytest.mark.asyncio
async def test_offsets_for_time_and_per_partition_seek(broker: Broker) -> None:
    """Scenario: offsets for time 1003, for a time after every record, then a seek that
    names only partition 0. Expected: 3 on partition 0 and the head (0) on the empty one;
    the heads for a later time; the seek moves partition 0 only, and a negative time or an
    unknown partition is INVALID_ARGUMENT naming the field."""
    await _topic_with_records(broker)
    async with AsyncAdminClient(address(broker)) as admin:
        assert await admin.offsets_for_time("t", 1003) == [3, 0]
        assert await admin.offsets_for_time("t", 99_999) == [10, 0]
        async with AsyncFetcher(address(broker)) as fetcher:
            await fetcher.ack_up_to("t", "s", 0, 0)
        info = await admin.seek("t", "s", offsets={0: 8})
        assert [p.cursor for p in info.partitions] == [8, 0]
        with pytest.raises(InvalidArgument, match="timestamp_ms"):
            await admin.offsets_for_time("t", -1)
        with pytest.raises(InvalidArgument, match="partition 5 does not exist"):
            await admin.seek("t", "s", offsets={5: 1})
        with pytest.raises(NotFound):
            await admin.offsets_for_time("missing", 0)


@pytest.mark.asyncio
async def test_blocking_twins_give_the_same_answers(broker: Broker) -> None:
    """Scenario: the blocking Fetcher and AdminClient (on a thread: the broker runs on
    this loop) against the topic above. Expected: the same batches, cursor and offsets as
    their async twins."""
    await _topic_with_records(broker)

    def blocking() -> None:
        with Fetcher(address(broker)) as fetcher:
            assert [b.base_offset for b in fetcher.fetch("t", 0, 7).batches] == [5]
            assert fetcher.ack_up_to("t", "s", 0, 4) == 4
        with AdminClient(address(broker)) as admin:
            assert admin.offsets_for_time("t", 1003) == [3, 0]
            assert [p.cursor for p in admin.seek("t", "s", offsets={1: 0}).partitions] == [4, 0]

    await asyncio.to_thread(blocking)


@pytest.mark.asyncio
async def test_a_fixed_producer_id_makes_a_resend_a_duplicate(broker: Broker) -> None:
    """Scenario: a producer with fixed id 42 sends a few batches; a second producer with the
    same id sends the same records in the same calls (a retried Spark task). Expected:
    every batch of the second is answered as a duplicate and the log holds each record
    once; an out-of-range id is refused."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("once", partitions=1)
    values = [b"%05d" % i for i in range(300)]
    answers = []
    for _ in range(2):
        async with AsyncProducer(address(broker), producer_id=42, batch_max_bytes=4000) as p:
            sent = await (await p.send_many("once", values, partition=0))
            answers.append([(r.count, r.duplicate) for r in sent.ranges])
    first, second = answers
    assert 1 < len(first) <= 5  # within the broker's window of remembered batches
    assert not any(dup for _, dup in first)
    assert second == [(count, True) for count, _ in first]
    async with AsyncFetcher(address(broker)) as fetcher:
        got = await fetcher.fetch("once", 0, 0)
    assert [v for b in got.batches for v in b.values()] == values
    with pytest.raises(ValueError, match="producer_id"):
        AsyncProducer(address(broker), producer_id=-5)


@pytest.mark.asyncio
@pytest.mark.parametrize("fixed", [True, False])
async def test_a_failed_batch_under_a_fixed_id_fails_the_rest_of_its_partition(
    broker: Broker, fixed: bool
) -> None:
    """Scenario: a record over the broker's 1 MiB record limit, then a small one, to the
    same partition. Expected: the broker refuses the first; under a fixed producer id the
    second fails with the same error and nothing is appended (the id's sequences must not
    be reused after a failure), while a producer with random ids goes on and appends it."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("latch", partitions=1)
    producer_id = 7 if fixed else None
    async with AsyncProducer(address(broker), producer_id=producer_id) as p:
        big = await p.send("latch", b"x" * 1_500_000, partition=0)
        small = await p.send("latch", b"small", partition=0)
        with pytest.raises(ResourceExhausted, match="max_record_bytes"):
            await big
        if fixed:
            with pytest.raises(ResourceExhausted, match="max_record_bytes"):
                await small
        else:
            assert (await small).offset == 0
    async with AsyncFetcher(address(broker)) as fetcher:
        got = await fetcher.fetch("latch", 0, 0)
    assert [v for b in got.batches for v in b.values()] == ([] if fixed else [b"small"])
