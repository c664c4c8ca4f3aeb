"""Pipelined publishing: each partition keeps up to ``max_in_flight`` batches on one
PublishStream, against a real broker over real gRPC on loopback.

- With a slow fdatasync, records sent one by one go out in batches of their own while
  earlier ones wait in the broker (several in flight); with ``max_in_flight=1`` they wait
  and form the next, larger batch, as before pipelining.
- Order: concurrent senders' records keep their send order per partition.
- Failures inside a window: a retryable answer on batch n with n+1.. in flight (the
  broker appended them all; the retry is answered as a duplicate), and a batch refused
  for good with batches in flight behind it (they are refused for the gap, re-stamped
  under a new producer id and sent again). A stream cut mid-flight is in
  tests/client/test_producer_faults.py (run with windows of 1 and 5).
- ``max_in_flight`` is validated.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from broker.app import Broker
from client import (
    AsyncAdminClient,
    AsyncProducer,
    DeadlineExceeded,
    Producer,
    PublishOutcome,
    ResourceExhausted,
)
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from tests.broker.conftest import broker_config
from tests.client.conftest import address, read_batches, read_partition
from tests.client.test_producer_faults import FaultyFront, SlowSyncFs, slow_broker
from wal import encode_columns
from wal.commit_cost import PIPELINED, WARMUP_COMMITS


@pytest.mark.asyncio
@pytest.mark.parametrize(("max_in_flight", "alone"), [(1, 1), (None, 1), (2, 2), (5, 5)])
async def test_records_sent_while_a_batch_is_in_flight(
    tmp_path: Path, max_in_flight: int | None, alone: int
) -> None:
    """Scenario: each fdatasync takes 50 ms more; a producer with ``linger_ms=0`` sends 12
    records to one partition, 2 ms apart, then flushes. Expected with a window of 5: the
    first 5 records go out in batches of one record each (each was sent while the ones
    before waited in the broker); with a window of 2 the first 2; with a window of 1 (on
    a PublishStream, the default without a linger, or unary) the first. The next batch
    holds the several records that came while the window was full. Either way the log
    holds the 12 records once, in send order, and every future has its offset."""
    async with slow_broker(tmp_path, 0.05) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("w", 1)
        async with AsyncProducer(
            address(broker), linger_ms=0, max_in_flight=max_in_flight
        ) as producer:
            offsets = await _paced_sends(producer, "w", 0, 12)
        batches = await read_batches(broker, "w", 0)
    assert offsets == list(range(12))
    assert [v for b in batches for v in b.values()] == [b"%02d" % i for i in range(12)]
    sizes = [b.record_count for b in batches]
    assert sizes[:alone] == [1] * alone, sizes
    assert sizes[alone] >= 3, sizes


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("linger_ms", "max_in_flight", "window", "streams"),
    [
        (0, None, 1, True),
        (5, None, 1, False),
        (0.5, None, 1, False),
        (0, 1, 1, False),
        (5, 3, 3, True),
        (0, 2, 2, True),
    ],
)
async def test_the_default_window_follows_the_linger(
    linger_ms: float, max_in_flight: int | None, window: int, streams: bool
) -> None:
    """Scenario: producers with and without a linger, the window left to the producer or
    given. Expected: left to it, one batch in flight: a unary Publish with a linger, on a
    PublishStream with ``linger_ms=0`` (a stream write is the shorter trip); a given
    window is kept, a window over 1 on a stream, a given 1 unary."""
    producer = AsyncProducer("127.0.0.1:1", linger_ms=linger_ms, max_in_flight=max_in_flight)
    try:
        assert producer.max_in_flight == window
        assert producer.streams is streams
        # Only the linger-0 default follows the broker's in_flight_hint.
        assert producer.adaptive_window is (linger_ms == 0 and max_in_flight is None)
    finally:
        await producer.aclose()


async def _paced_sends(producer: AsyncProducer, topic: str, first: int, n: int) -> list[int]:
    """Send records ``first`` .. ``first + n - 1`` to partition 0, 2 ms apart, awaiting no
    answer in between; return their offsets."""
    futures = []
    for i in range(first, first + n):
        futures.append(await producer.send(topic, b"%02d" % i, partition=0))
        await asyncio.sleep(0.002)
    return [m.offset for m in await asyncio.gather(*futures)]


@pytest.mark.asyncio
@pytest.mark.parametrize(("max_in_flight", "alone"), [(None, 2), (1, 1)])
async def test_the_default_window_follows_the_brokers_hint(
    tmp_path: Path, max_in_flight: int | None, alone: int
) -> None:
    """Scenario: each fdatasync takes 30 ms more and no subscription costs the broker
    anything per commit; a ``linger_ms=0`` producer publishes ``WARMUP_COMMITS`` records
    one at a time (each its own commit), then 12 records 2 ms apart. Expected: the
    answers' ``in_flight_hint`` turned 2 during the warm-up, so with the default window
    the first 2 of the 12 go out alone (both in flight at once) and the rest share the
    next batch; a window the user gave (1) ignores the hint. The log holds every record
    once, in send order."""
    async with slow_broker(tmp_path, 0.03) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("h", 1)
        async with AsyncProducer(
            address(broker), linger_ms=0, max_in_flight=max_in_flight
        ) as producer:
            for i in range(WARMUP_COMMITS):
                await (await producer.send("h", b"%02d" % i, partition=0))
            offsets = await _paced_sends(producer, "h", WARMUP_COMMITS, 12)
        batches = await read_batches(broker, "h", 0)
    total = WARMUP_COMMITS + 12
    assert offsets == list(range(WARMUP_COMMITS, total))
    assert [v for b in batches for v in b.values()] == [b"%02d" % i for i in range(total)]
    sizes = [b.record_count for b in batches[WARMUP_COMMITS:]]
    assert sizes[:alone] == [1] * alone, sizes
    assert sizes[alone] >= 3, sizes


@pytest.mark.asyncio
async def test_publish_answers_carry_the_in_flight_hint(tmp_path: Path) -> None:
    """Scenario: raw PublishStream requests, one at a time, to a broker whose fdatasync
    takes 20 ms more. Expected: every answer has a hint; 1 until ``WARMUP_COMMITS``
    commits were seen, 2 from then on (the disk outweighs the broker's work per commit);
    a unary Publish answer carries it too."""
    async with slow_broker(tmp_path, 0.02) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("raw", 1)
        async with grpc.aio.insecure_channel(address(broker)) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            stream = stub.PublishStream()
            hints = []
            for i in range(WARMUP_COMMITS + 2):
                batch = encode_columns([b"%d" % i])
                await stream.write(pb.PublishRequest(topic="raw", batch=batch, request_id=i))
                answer = await stream.read()
                assert isinstance(answer, pb.PublishResponse)
                hints.append(answer.in_flight_hint)
            await stream.done_writing()
            unary = await stub.Publish(pb.PublishRequest(topic="raw", batch=batch))
    assert hints == [1] * (WARMUP_COMMITS - 1) + [PIPELINED] * 3
    assert unary.in_flight_hint == PIPELINED


@pytest.mark.asyncio
async def test_without_a_linger_the_sender_takes_a_record_in_one_loop_turn(broker: Broker) -> None:
    """Scenario: ``linger_ms=0``, window 1, a record sent to an idle partition, then one
    loop turn. Expected: the sender has taken it (its batch is on its way), without a
    zero-timeout wait for more records, which costs two more turns per batch."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("t", 1)
    async with AsyncProducer(address(broker), linger_ms=0, max_in_flight=1) as producer:
        await (await producer.send("t", b"warm", partition=0))  # the sender waits, idle
        future = await producer.send("t", b"now", partition=0)
        await asyncio.sleep(0)
        assert not producer._accumulators[("t", 0)].pending.values  # taken
        assert (await future).offset == 1


@pytest.mark.asyncio
async def test_concurrent_senders_keep_their_order(broker: Broker) -> None:
    """Scenario: 4 tasks each send 300 keyed records (key = task) to a 3-partition topic
    through one producer (window 5, tiny batches so many are in flight), awaiting nothing
    until the end. Expected: every record acknowledged once; per key, the partition holds
    its values in send order, at increasing offsets matching the futures."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("o", 3)
    async with AsyncProducer(
        address(broker), linger_ms=0, batch_max_bytes=200, max_in_flight=5
    ) as producer:

        async def sender(task: int) -> list[int]:
            key = b"task%d" % task
            futures = [
                await producer.send("o", b"%d-%03d" % (task, i), key=key) for i in range(300)
            ]
            return [m.offset for m in await asyncio.gather(*futures)]

        offsets = await asyncio.gather(*(sender(t) for t in range(4)))
    stored = [row for p in range(3) for row in await read_partition(broker, "o", p)]
    assert len(stored) == 1200
    for task in range(4):
        mine = [(off, v) for off, v, k in stored if k == b"task%d" % task]
        assert [v for _, v in mine] == [b"%d-%03d" % (task, i) for i in range(300)]
        assert [off for off, _ in mine] == offsets[task]


@pytest.mark.asyncio
async def test_a_retryable_answer_inside_a_window_is_answered_as_a_duplicate(
    broker: Broker,
) -> None:
    """Scenario: through a front that turns the broker's answer to the 2nd publish into
    UNAVAILABLE (after the append), a producer queues 8 batches of 2 records at once
    (window 5: batches 3.. are in flight behind the 2nd). Expected: every record is
    acknowledged; the 2nd batch's retry (same bytes) is answered as a duplicate with its
    original offsets 2-3; the log holds each record once, in order, under one id."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("r", 1)
    values = [b"v%02d" % i for i in range(16)]
    async with (
        FaultyFront(address(broker), fail={2: grpc.StatusCode.UNAVAILABLE}) as front,
        AsyncProducer(front.address, linger_ms=0, max_in_flight=5) as producer,
    ):
        calls = [
            await producer.send_many("r", values[i : i + 2], partition=0) for i in range(0, 16, 2)
        ]
        sent = await asyncio.gather(*calls)
    assert [m.offset for s in sent for m in s] == list(range(16))
    assert [s.ranges[0].duplicate for s in sent] == [False, True] + [False] * 6
    batches = await read_batches(broker, "r", 0)
    assert [v for b in batches for v in b.values()] == values
    assert len({b.producer_id for b in batches}) == 1


@pytest.mark.asyncio
async def test_batches_behind_a_refused_one_go_again_under_a_new_id(broker: Broker) -> None:
    """Scenario: a producer publishes a0 and waits; then, without waiting, a record over the
    broker's 1 MiB record limit and three small batches behind it (in flight in one
    window). Expected: the big one fails RESOURCE_EXHAUSTED, outcome REFUSED; the three
    behind it (refused by the broker for the gap it left) are acknowledged after a0, in
    order, each once, under a new producer id; a batch sent later follows them."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("g", 1)
    async with AsyncProducer(address(broker), linger_ms=0, max_in_flight=5) as producer:
        await (await producer.send_many("g", [b"a0"], partition=0))
        big = await producer.send_many("g", [b"x" * 1_500_000], partition=0)
        behind = [await producer.send_many("g", [b"s%d" % i], partition=0) for i in range(3)]
        with pytest.raises(ResourceExhausted) as refused:
            await big
        offsets = [(await f)[0].offset for f in behind]
        after = await (await producer.send_many("g", [b"later"], partition=0))
    assert refused.value.outcome is PublishOutcome.REFUSED
    assert offsets == [1, 2, 3]
    assert after[0].offset == 4
    batches = await read_batches(broker, "g", 0)
    assert [v for b in batches for v in b.values()] == [b"a0", b"s0", b"s1", b"s2", b"later"]
    assert batches[0].producer_id != batches[1].producer_id
    assert len({b.producer_id for b in batches[1:]}) == 1
    assert [b.base_sequence for b in batches[1:]] == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [0, -1, 257, True, 2.0, "5"])
def test_max_in_flight_is_validated(bad: object) -> None:
    """Scenario: max_in_flight outside 1..256 or not an int, on both producers. Expected:
    ValueError naming the option, its range and the broker limit, before any thread or
    channel is left behind."""
    with pytest.raises(ValueError, match=r"max_in_flight must be an integer from 1 to 256"):
        asyncio.run(_make_async(bad))
    with pytest.raises(ValueError, match=r"max_in_flight must be an integer from 1 to 256"):
        Producer("127.0.0.1:1", max_in_flight=bad)  # type: ignore[arg-type]


async def _make_async(bad: object) -> None:
    AsyncProducer("127.0.0.1:1", max_in_flight=bad)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_an_unanswered_window_fails_after_the_delivery_timeout(tmp_path: Path) -> None:
    """Scenario: each fdatasync takes 1 s more; a pipelining producer with a 0.3 s delivery
    timeout sends 3 records (3 batches in flight). Expected: all three fail with
    DEADLINE_EXCEEDED and outcome UNKNOWN well before the broker answers (the stream is
    cut at the oldest batch's deadline, not left waiting)."""
    fs = SlowSyncFs(1.0)
    async with Broker(broker_config(tmp_path / "d"), fs=fs) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("t", 1)
        async with AsyncProducer(
            address(broker), linger_ms=0, delivery_timeout_s=0.3, max_in_flight=5
        ) as producer:
            started = time.monotonic()
            futures = []
            for i in range(3):
                futures.append(await producer.send("t", b"%d" % i, partition=0))
                await asyncio.sleep(0.01)
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            waited = time.monotonic() - started
            fs.delay_s = 0.0
    assert waited < 0.9, waited
    for outcome in outcomes:
        assert isinstance(outcome, DeadlineExceeded), outcome
        assert outcome.outcome is PublishOutcome.UNKNOWN


@pytest.mark.asyncio
@pytest.mark.parametrize("max_in_flight", [None, 2])
@pytest.mark.parametrize("partitions", [2, 3])
async def test_unkeyed_records_move_on_once_per_batch(
    tmp_path: Path, max_in_flight: int | None, partitions: int
) -> None:
    """Scenario: each fdatasync takes 30 ms more, so each partition's sender takes its
    sealed batches late; 30 unkeyed records, each filling a batch of its own, go to a
    topic, four at a time with 10 ms between (the senders take batches in between, while
    the sticky partition may have come back to theirs). Expected: the sticky partition
    moves once per batch, when the batch is sealed, so the records go round the
    partitions in turn: record ``i`` to partition ``(first + i) % partitions``, each
    partition's in send order. (Moving it again when a sealed batch was taken put two
    records in a row on one partition.)"""
    async with slow_broker(tmp_path, 0.03) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("sticky", partitions)
        async with AsyncProducer(
            address(broker), linger_ms=0, batch_max_bytes=1, max_in_flight=max_in_flight
        ) as producer:
            for i in range(30):
                await producer.send("sticky", b"%02d" % i)
                if i % 4 == 3:
                    await asyncio.sleep(0.01)
            await producer.flush()
        parts = [
            [int(value) for _, value, _ in await read_partition(broker, "sticky", p)]
            for p in range(partitions)
        ]
    first = next(p for p in range(partitions) if parts[p] and parts[p][0] == 0)
    assert parts == [
        list(range((p - first) % partitions, 30, partitions)) for p in range(partitions)
    ]
