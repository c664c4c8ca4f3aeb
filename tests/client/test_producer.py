"""AsyncProducer and AsyncAdminClient against a real broker over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import grpc
import pytest

from broker.app import Broker
from client import (
    AdminClient,
    AlreadyExists,
    AsyncAdminClient,
    AsyncProducer,
    ClientClosed,
    NotFound,
    Producer,
    PublishOutcome,
    RecordMetadata,
    ResourceExhausted,
    Unavailable,
    partition_for,
)
from client._retry import backoff_s
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.batch import decode_batch
from tests.broker.conftest import broker_config
from tests.client.conftest import address, read_batches, read_partition
from tests.client.test_sync import BrokerThread


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"linger_ms": -1}, "linger_ms must be a number >= 0, not -1"),
        ({"linger_ms": float("nan")}, "linger_ms must be a number >= 0, not nan"),
        ({"batch_max_bytes": 0}, "batch_max_bytes must be at least 1, not 0"),
        ({"delivery_timeout_s": 0}, "delivery_timeout_s must be a number > 0, not 0"),
        (
            {"buffer_max_bytes": 1000, "batch_max_bytes": 4096},
            "buffer_max_bytes (1,000) must be at least batch_max_bytes (4,096)",
        ),
        ({"producer_id": -2}, "must be in [0, 2**63), not -2 (idempotent=True)"),
    ],
)
def test_a_bad_setting_is_named_when_the_producer_is_made(
    settings: dict[str, object], says: str
) -> None:
    """Scenario: a producer made with one bad setting. Expected: ValueError at
    construction naming the setting and the value it got (the message said only
    'linger_ms >= 0, batch_max_bytes >= 1 and delivery_timeout_s > 0', and NaN passed)."""
    with pytest.raises(ValueError, match=re.escape(says)):
        AsyncProducer("127.0.0.1:1", **settings)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_admin_client_round_trip(broker: Broker) -> None:
    """Create, list, describe, delete through AsyncAdminClient; errors are typed."""
    async with AsyncAdminClient(address(broker)) as admin:
        created = await admin.create_topic("events", 3)
        assert (created.name, len(created.partitions)) == ("events", 3)
        with pytest.raises(AlreadyExists, match="already exists"):
            await admin.create_topic("events", 1)
        assert [t.name for t in await admin.list_topics()] == ["events"]
        assert (await admin.describe_topic("events")).partitions[2].head == 0
        await admin.delete_topic("events")
        with pytest.raises(NotFound, match="does not exist"):
            await admin.describe_topic("events")


@pytest.mark.asyncio
async def test_keyed_records_land_by_hash_in_order(broker: Broker) -> None:
    """Scenario: 600 records over 20 keys to a 4-partition topic, sent without waiting.
    Expected: every record acknowledged; each is in partition crc32c(key) % 4; per key the
    offsets increase in send order; each partition's log holds exactly its records."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("keyed", 4)
    async with AsyncProducer(address(broker), linger_ms=2) as producer:
        futures = [
            await producer.send("keyed", f"v{i}".encode(), key=f"k{i % 20}".encode())
            for i in range(600)
        ]
        acks = await asyncio.gather(*futures)
    for i, ack in enumerate(acks):
        assert ack.partition == partition_for(f"k{i % 20}".encode(), 4)
    for k in range(20):
        offsets = [a.offset for i, a in enumerate(acks) if i % 20 == k]
        assert offsets == sorted(offsets)
    for p in range(4):
        stored = await read_partition(broker, "keyed", p)
        expected = sorted(
            (a.offset, f"v{i}".encode(), f"k{i % 20}".encode())
            for i, a in enumerate(acks)
            if a.partition == p
        )
        assert stored == expected


@pytest.mark.asyncio
async def test_records_are_batched(broker: Broker) -> None:
    """Scenario: 1,000 unkeyed records sent at once to one partition with linger 20 ms.
    Expected: far fewer batches than records in the log (a handful)."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("batched", 1)
    async with AsyncProducer(address(broker), linger_ms=20) as producer:
        futures = [await producer.send("batched", b"x" * 100) for _ in range(1000)]
        await asyncio.gather(*futures)
    async with grpc.aio.insecure_channel(address(broker)) as channel:
        got = await broker_pb2_grpc.BrokerStub(channel).Fetch(
            pb.FetchRequest(topic="batched", max_bytes=16 << 20)
        )
    decoded = [decode_batch(raw) for raw in got.batches]
    assert sum(b.record_count for b in decoded if b is not None) == 1000
    assert len(got.batches) <= 10


@pytest.mark.asyncio
async def test_a_tight_send_loop_cuts_batches_and_waits_for_room(broker: Broker) -> None:
    """Scenario: 3,000 records of 100 B queued in a loop that never yields to the sender
    task, with batch_max_bytes 20 KB and buffer_max_bytes 40 KB. Expected: no batch holds
    more than batch_max_bytes of records (one record over at most), and every record is
    acknowledged: send waited for room instead of growing the buffer without bound."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("tight", 1)
    async with AsyncProducer(
        address(broker), linger_ms=50, batch_max_bytes=20_000, buffer_max_bytes=40_000
    ) as producer:
        futures = [await producer.send("tight", b"y" * 100) for _ in range(3000)]
        done = await asyncio.gather(*futures)
        assert producer.budget.used == 0
    assert [m.offset for m in done] == list(range(3000))
    async with grpc.aio.insecure_channel(address(broker)) as channel:
        got = await broker_pb2_grpc.BrokerStub(channel).Fetch(
            pb.FetchRequest(topic="tight", max_bytes=16 << 20)
        )
    counts = [b.record_count for b in (decode_batch(raw) for raw in got.batches) if b]
    assert sum(counts) == 3000
    assert max(counts) <= 20_000 // 116 + 1  # 100 B value + 16 B accounting per record


@pytest.mark.asyncio
async def test_unknown_topic_and_closed_producer_are_typed_errors(broker: Broker) -> None:
    """send to a missing topic raises NotFound; send after close raises ClientClosed."""
    producer = AsyncProducer(address(broker))
    with pytest.raises(NotFound):
        await producer.send("nope", b"x")
    await producer.aclose()
    with pytest.raises(ClientClosed):
        await producer.send("nope", b"x")


@pytest.mark.asyncio
async def test_oversized_record_fails_its_future_not_the_producer(broker: Broker) -> None:
    """Scenario: a small record, a 2 MiB one (over the broker's 1 MiB record limit), then
    another small one. Expected: the big one fails with ResourceExhausted naming the limit,
    outcome REFUSED, and a message saying it was not written; the small ones are
    acknowledged, under the same producer id with consecutive sequences (the refused
    batch's sequence was reused: the broker never appended it)."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("limits", 1)
    async with AsyncProducer(address(broker), linger_ms=0) as producer:
        assert (await producer.publish("limits", b"first")).offset == 0
        with pytest.raises(ResourceExhausted, match="max_record_bytes") as refused:
            await producer.publish("limits", b"x" * (2 << 20))
        ok = await producer.publish("limits", b"fine")
        assert ok.offset == 1
    assert refused.value.outcome is PublishOutcome.REFUSED
    assert str(refused.value).endswith("(not written; safe to resend)")
    batches = await read_batches(broker, "limits", 0)
    assert [(b.producer_id, b.base_sequence) for b in batches] == [
        (batches[0].producer_id, 0),
        (batches[0].producer_id, 1),
    ]


def test_the_sync_producer_reports_the_same_outcome(tmp_path: Path) -> None:
    """Scenario: the blocking Producer publishes a 2 MiB record (over the limit), then a
    small one. Expected: ResourceExhausted with outcome REFUSED and the same advice as the
    async producer, from publish and from the future of send; the small one is
    acknowledged."""
    with BrokerThread(tmp_path / "data") as broker, AdminClient(broker) as admin:
        admin.create_topic("sync-limits", 1)
        with Producer(broker, linger_ms=0) as producer:
            with pytest.raises(ResourceExhausted) as refused:
                producer.publish("sync-limits", b"x" * (2 << 20))
            error = producer.send("sync-limits", b"y" * (2 << 20)).exception(10)
            assert producer.publish("sync-limits", b"fine").offset == 0
    assert refused.value.outcome is PublishOutcome.REFUSED
    assert isinstance(error, ResourceExhausted)
    assert error.outcome is PublishOutcome.REFUSED
    assert str(error).endswith("(not written; safe to resend)")


@pytest.mark.asyncio
async def test_retries_through_a_broker_restart_without_duplicates(tmp_path: Path) -> None:
    """Scenario: publish, stop the broker, publish again (the producer retries while the
    broker is down), start the broker on the same port and data. Expected: the pending
    record is acknowledged after the restart, and the log holds each record once."""
    config = broker_config(tmp_path / "d")
    first = Broker(config)
    await first.start()
    port = first.port
    config = config.replace(listen=f"127.0.0.1:{port}")
    async with AsyncAdminClient(f"127.0.0.1:{port}") as admin:
        await admin.create_topic("r", 1)
    async with AsyncProducer(f"127.0.0.1:{port}", linger_ms=0, delivery_timeout_s=20) as prod:
        assert (await prod.publish("r", b"before")).offset == 0
        await first.aclose()
        pending = asyncio.ensure_future(prod.publish("r", b"during"))
        await asyncio.sleep(0.3)
        assert not pending.done()
        second = Broker(config)
        await second.start()
        try:
            ack = await asyncio.wait_for(pending, 15)
            assert ack.offset == 1
            assert [v for _, v, _ in await read_partition(second, "r", 0)] == [b"before", b"during"]
        finally:
            await second.aclose()


@pytest.mark.asyncio
async def test_gives_up_after_the_delivery_timeout(tmp_path: Path) -> None:
    """Scenario: a producer whose broker goes away for good, delivery_timeout 1 s.
    Expected: the record fails with Unavailable after about a second, not forever."""
    config = broker_config(tmp_path / "d")
    running = Broker(config)
    await running.start()
    async with AsyncAdminClient(address(running)) as admin:
        await admin.create_topic("gone", 1)
    async with AsyncProducer(address(running), linger_ms=0, delivery_timeout_s=1) as producer:
        await producer.publish("gone", b"ok")
        await running.aclose()
        with pytest.raises(Unavailable):
            await asyncio.wait_for(producer.publish("gone", b"lost"), 10)


def test_backoff_is_full_jitter_and_capped() -> None:
    """Backoff is uniform in [0, min(2 s, 50 ms * 2**attempt)]: never above the cap, and
    spread out rather than constant."""
    rng = random.Random(1)
    for attempt in range(12):
        samples = [backoff_s(attempt, rng) for _ in range(200)]
        cap = min(2.0, 0.05 * 2**attempt)
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > cap / 2


@pytest.mark.asyncio
async def test_a_resend_older_than_the_broker_window_reports_offset_minus_one(
    broker: Broker,
) -> None:
    """Scenario: a producer with fixed id 7 sends 16 records as 8 batches of two; a second
    producer with the same id re-sends them the same way (a replayed Spark task). Expected:
    every re-sent record is a duplicate; the 3 batches older than the broker's window of 5
    report offset -1 for each record (never -1 + position), the others their offsets; the
    log holds each record once."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("replay", partitions=1)
    values = [b"%03d" % i + b"." * 97 for i in range(16)]  # 116 bytes each with overhead
    answers: list[list[RecordMetadata]] = []
    for _ in range(2):
        async with AsyncProducer(
            address(broker), producer_id=7, batch_max_bytes=232, linger_ms=1000
        ) as p:
            futures = [await p.send("replay", v, partition=0) for v in values]
            answers.append(list(await asyncio.gather(*futures)))
    first, second = answers
    assert [(m.offset, m.duplicate) for m in first] == [(i, False) for i in range(16)]
    assert [(m.offset, m.duplicate) for m in second] == [(-1, True)] * 6 + [
        (i, True) for i in range(6, 16)
    ]
    assert [v for _, v, _ in await read_partition(broker, "replay", 0)] == values
