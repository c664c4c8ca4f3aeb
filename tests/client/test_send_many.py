"""AsyncProducer.send_many, the columnar fast path, against a real broker on loopback.

What must hold: every value lands where ``send`` would have put it, in the order passed,
cut into batches of at most ``batch_max_bytes``; the returned :class:`SentRecords` maps
value ``i`` to the offset that really holds it; bad columns are refused before anything is
queued; and a failed batch fails the call without stopping the producer.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from broker.app import Broker
from client import (
    AsyncAdminClient,
    AsyncProducer,
    ClientClosed,
    NotFound,
    Producer,
    ResourceExhausted,
    SentRecords,
    partition_for,
)
from client._types import PublishedRange, RecordMetadata
from tests.client.conftest import address, read_batches, read_partition

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def _create(broker: Broker, topic: str, partitions: int) -> None:
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic(topic, partitions)


def _stored_at(rows: dict[int, list[tuple[int, bytes, bytes | None]]], m: RecordMetadata) -> bytes:
    by_offset = {offset: value for offset, value, _ in rows[m.partition]}
    return by_offset[m.offset]


async def test_unkeyed_values_are_cut_into_batches_spread_over_partitions(
    broker: Broker,
) -> None:
    """Scenario: 5,000 unkeyed 100 B values in one call, batch_max_bytes 20,000, to a
    3-partition topic. Expected: batches of at most 20,000 // 116 + 1 records, the batches
    go to the partitions in turn, every value is stored exactly once, and SentRecords[i]
    names the partition and offset that hold value i."""
    await _create(broker, "bulk", 3)
    values = [f"{i:0100d}".encode() for i in range(5000)]
    async with AsyncProducer(address(broker), batch_max_bytes=20_000) as producer:
        sent = await (await producer.send_many("bulk", values))
    assert isinstance(sent, SentRecords)
    assert len(sent) == 5000
    per_batch = 20_000 // 116 + 1
    assert all(r.count <= per_batch for r in sent.ranges)
    assert len(sent.ranges) == -(-5000 // per_batch)
    partitions = [r.partition for r in sent.ranges]
    assert all((b - a) % 3 == 1 for a, b in itertools.pairwise(partitions))
    rows = {p: await read_partition(broker, "bulk", p) for p in range(3)}
    assert sum(len(r) for r in rows.values()) == 5000
    assert all(_stored_at(rows, sent[i]) == values[i] for i in range(5000))
    assert sent[-1] == sent[4999]
    assert list(sent)[:3] == sent[:3]


async def test_keyed_values_land_by_hash_in_order(broker: Broker) -> None:
    """Scenario: 2,000 values over 30 keys, plus every 7th without a key, in one call to a
    4-partition topic. Expected: a keyed value is in partition crc32c(key) % 4, all unkeyed
    ones share one partition, per key the offsets rise in the order passed, and each
    partition holds exactly the values SentRecords places there."""
    await _create(broker, "keyed", 4)
    keys: list[bytes | None] = [None if i % 7 == 0 else f"k{i % 30}".encode() for i in range(2000)]
    values = [f"v{i}".encode() for i in range(2000)]
    async with AsyncProducer(address(broker), batch_max_bytes=4_000) as producer:
        sent = await (await producer.send_many("keyed", values, keys=keys))
    for i, key in enumerate(keys):
        if key is not None:
            assert sent[i].partition == partition_for(key, 4)
    assert len({sent[i].partition for i, k in enumerate(keys) if k is None}) == 1
    for k in range(30):
        offsets = [sent[i].offset for i in range(2000) if keys[i] == f"k{k}".encode()]
        assert offsets == sorted(offsets)
    for p in range(4):
        expected = sorted(
            (sent[i].offset, values[i], keys[i]) for i in range(2000) if sent[i].partition == p
        )
        assert await read_partition(broker, "keyed", p) == expected


async def test_headers_timestamps_and_a_fixed_partition_round_trip(broker: Broker) -> None:
    """Scenario: 300 values with per-record headers and timestamps, to partition 1 of 2.
    Expected: partition 1 holds them in order with their headers and timestamps;
    partition 0 is empty."""
    await _create(broker, "cols", 2)
    values = [f"v{i}".encode() for i in range(300)]
    headers = [{"n": str(i).encode()} if i % 2 else {} for i in range(300)]
    stamps = [1_700_000_000_000 + i for i in range(300)]
    async with AsyncProducer(address(broker), batch_max_bytes=2_000) as producer:
        sent = await (
            await producer.send_many(
                "cols", values, headers=headers, timestamps_ms=stamps, partition=1
            )
        )
    assert {m.partition for m in sent} == {1}
    assert [m.offset for m in sent] == list(range(300))
    batches = await read_batches(broker, "cols", 1)
    assert len(batches) > 1
    assert [v for b in batches for v in b.values()] == values
    assert [h for b in batches for h in b.headers()] == headers
    assert [t for b in batches for t in b.timestamps().tolist()] == stamps
    assert await read_batches(broker, "cols", 0) == []


async def test_send_and_send_many_keep_their_order_within_a_partition(broker: Broker) -> None:
    """Scenario: send, send_many, send again to one partition without awaiting between.
    Expected: the log holds them in exactly that order."""
    await _create(broker, "order", 1)
    async with AsyncProducer(address(broker), linger_ms=50) as producer:
        first = await producer.send("order", b"a")
        many = await producer.send_many("order", [b"b", b"c", b"d"])
        last = await producer.send("order", b"e")
        await asyncio.gather(first, many, last)
    assert [v for _, v, _ in await read_partition(broker, "order", 0)] == [
        b"a",
        b"b",
        b"c",
        b"d",
        b"e",
    ]


async def test_bad_columns_are_refused_before_anything_is_queued(broker: Broker) -> None:
    """Columns of the wrong length, a partition out of range, an unknown topic and a closed
    producer are errors raised by the call, and nothing reaches the log. An empty call
    resolves to no records."""
    await _create(broker, "strict", 2)
    producer = AsyncProducer(address(broker))
    with pytest.raises(ValueError, match="keys has 1 entries but values has 2"):
        await producer.send_many("strict", [b"a", b"b"], keys=[b"k"])
    with pytest.raises(ValueError, match="timestamps_ms has 3 entries"):
        await producer.send_many("strict", [b"a", b"b"], timestamps_ms=[1, 2, 3])
    with pytest.raises(ValueError, match="headers has 0 entries"):
        await producer.send_many("strict", [b"a"], headers=[])
    with pytest.raises(ValueError, match="partitions 0-1, not 5"):
        await producer.send_many("strict", [b"a"], partition=5)
    with pytest.raises(NotFound):
        await producer.send_many("nope", [b"a"])
    empty = await (await producer.send_many("strict", []))
    assert len(empty) == 0
    assert list(empty) == []
    await producer.aclose()
    with pytest.raises(ClientClosed):
        await producer.send_many("strict", [b"a"])
    assert await read_partition(broker, "strict", 0) == []
    assert await read_partition(broker, "strict", 1) == []


async def test_an_oversized_record_fails_the_call_not_the_producer(broker: Broker) -> None:
    """Scenario: a call whose second batch holds a 2 MiB record (over the broker's 1 MiB
    limit), then a normal call. Expected: the first call fails with ResourceExhausted; its
    other batch is stored (no atomicity across batches); the second call succeeds."""
    await _create(broker, "limits", 1)
    async with AsyncProducer(address(broker), batch_max_bytes=1000) as producer:
        failing = await producer.send_many("limits", [b"x" * 990, b"y" * (2 << 20)])
        with pytest.raises(ResourceExhausted, match="max_record_bytes"):
            await failing
        ok = await (await producer.send_many("limits", [b"fine"]))
    assert [v for _, v, _ in await read_partition(broker, "limits", 0)] == [b"x" * 990, b"fine"]
    assert ok[0].offset == 1


async def test_a_call_bigger_than_the_buffer_waits_for_room(broker: Broker) -> None:
    """Scenario: 2,000 records of 100 B (232 KB) with buffer_max_bytes 20,000. Expected:
    every record acknowledged, in order, and the buffer is empty afterwards: the call
    queued batch after batch as room came free instead of growing the buffer."""
    await _create(broker, "room", 1)
    async with AsyncProducer(
        address(broker), batch_max_bytes=10_000, buffer_max_bytes=20_000
    ) as producer:
        peak = 0
        real_wait, real_released = producer._wait_for_room, producer.released

        async def wait_for_room() -> None:  # after each batch but the last was queued
            nonlocal peak
            peak = max(peak, producer.budget.used)
            await real_wait()

        def released(batch: Any) -> None:  # before any bytes leave
            nonlocal peak
            peak = max(peak, producer.budget.used)
            real_released(batch)

        producer._wait_for_room = wait_for_room  # type: ignore[method-assign]
        producer.released = released  # type: ignore[method-assign]
        sent = await (await producer.send_many("room", [b"z" * 100] * 2000))
        assert producer.budget.used == 0
    assert [m.offset for m in sent] == list(range(2000))
    assert peak < 20_000 + 10_000 + 116  # the limit, plus the batch that crossed it


async def test_the_blocking_twin_sends_many(broker: Broker) -> None:
    """Producer.send_many queues the records and returns a concurrent future of them."""
    await _create(broker, "sync", 2)

    def use() -> SentRecords:
        with Producer(address(broker)) as producer:
            return producer.send_many("sync", [b"a", b"b", b"c"], partition=0).result(10)

    sent = await asyncio.to_thread(use)
    assert sent.ranges == (PublishedRange(0, 0, 3, False, range(3)),)
    assert [v for _, v, _ in await read_partition(broker, "sync", 0)] == [b"a", b"b", b"c"]
