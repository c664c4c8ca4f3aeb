"""``lag`` states, reasons and rates from real scenarios: a running broker on 127.0.0.1, real
gRPC, the client library as the caller, real files (a damaged segment for the read error).

Each scenario brings a partition into one state for one cause and asserts what
``DescribeSubscription`` reports (the ``PartitionLag`` fields ``headrace lag`` prints).
The broker runs its heartbeat every 50 ms with a 0.4 s stall timeout, so STALLED and the
rates show within a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from broker.app import Broker
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, PartitionLag
from dispatcher import DispatchConfig, DispatchPolicy, HeartbeatConfig, PoisonPolicy
from dispatcher.dead_letter_config import DlqConfig, OverflowPolicy
from tests.broker.conftest import broker_config
from wal import LogConfig

T = TypeVar("T")

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(30)]

HEARTBEAT = HeartbeatConfig(interval_s=0.05, stall_timeout_s=0.4)


@asynccontextmanager
async def running(tmp_path: Path, **changes: object) -> AsyncIterator[str]:
    """A broker with a fast heartbeat (and ``changes``) and a topic ``t`` of 1 partition;
    yields its address."""
    config = broker_config(tmp_path / "data", heartbeat=HEARTBEAT, **changes)
    async with Broker(config) as broker:
        address = f"127.0.0.1:{broker.port}"
        async with AsyncAdminClient(address) as admin:
            await admin.create_topic("t", 1)
        yield address


def policy(**changes: object) -> DispatchConfig:
    """Dispatch settings whose default policy has ``changes``."""
    return DispatchConfig(defaults=dataclasses.replace(DispatchPolicy(), **changes))  # type: ignore[arg-type]


async def publish(address: str, count: int, *, value: bytes = b"v") -> None:
    async with AsyncProducer(address) as producer:
        for i in range(count):
            await producer.publish("t", value + b"%d" % i, partition=0)


async def part(address: str, subscription: str) -> PartitionLag:
    """Partition 0 of ``subscription`` as DescribeSubscription reports it."""
    async with AsyncAdminClient(address) as admin:
        info = await admin.describe_subscription("t", subscription)
    return info.partitions[0]


async def polled(
    get: Callable[[], Awaitable[T]], good: Callable[[T], bool], timeout_s: float = 5.0
) -> T:
    """Call ``get`` every 20 ms until ``good`` holds for what it returns; return that."""
    async with asyncio.timeout(timeout_s):
        while True:
            found = await get()
            if good(found):
                return found
            await asyncio.sleep(0.02)


async def shows(
    address: str, subscription: str, state: str, cause: str, timeout_s: float = 5.0
) -> PartitionLag:
    """Wait until partition 0 is in ``state`` with a reason starting ``cause: ``."""
    return await polled(
        lambda: part(address, subscription),
        lambda p: p.state == state and p.reason.startswith(cause + ": "),
        timeout_s,
    )


async def test_no_consumer(tmp_path: Path) -> None:
    """Scenario: a consumer takes 2 of 5 records, acks them and leaves. Expected:
    NO_CONSUMER, "no consumer: 3 records wait for a consumer"."""
    async with running(tmp_path) as address:
        await publish(address, 5)
        async with AsyncConsumer("t", "s", broker=address) as consumer:
            for _ in range(2):
                consumer.ack(await consumer.receive(timeout=5))
        p = await shows(address, "s", "NO_CONSUMER", "no consumer")
        assert p.reason == "no consumer: 3 records wait for a consumer"
        assert (p.lag, p.cursor) == (3, 2)


async def test_window_full(tmp_path: Path) -> None:
    """Scenario: max_unacked 4; a consumer takes records and never acks; 10 are
    published. Expected: LAGGING, "window full: 4 of 4 records in flight, 6 more wait to be
    sent"."""
    async with running(tmp_path, max_unacked=4) as address:
        await publish(address, 10)
        async with AsyncConsumer("t", "s", broker=address) as consumer:
            for _ in range(4):
                await consumer.receive(timeout=5)
            p = await shows(address, "s", "LAGGING", "window full")
        assert p.reason == "window full: 4 of 4 records in flight, 6 more wait to be sent"
        assert (p.lag, p.in_flight) == (10, 4)


async def test_consumer_slow_out_of_credit(tmp_path: Path) -> None:
    """Scenario: 10 records are published; a consumer with a receive queue of 3 takes one
    (which gives 1 record of credit back) and then nothing (max_unacked 1000). Expected:
    LAGGING, "consumer slow" saying the consumers hold no credit, 4 in flight and 6
    waiting."""
    async with running(tmp_path) as address:
        await publish(address, 10)
        async with AsyncConsumer("t", "s", broker=address, receive_queue=3) as consumer:
            await consumer.receive(timeout=5)
            # The credit the receive gave back may still be on its way: until it lands,
            # the broker rightly shows 3 in flight and 7 waiting. Wait for it.
            p = await polled(
                lambda: part(address, "s"),
                lambda p: p.reason.startswith("consumer slow: ") and p.in_flight == 4,
                5.0,
            )
        assert p.state == "LAGGING"
        assert "hold no credit" in p.reason
        assert "4 records in flight, 6 wait to be sent" in p.reason


async def test_consumer_slow_acks_trail(tmp_path: Path) -> None:
    """Scenario: a consumer with plenty of credit holds 5 records without acking them.
    Expected: LAGGING, "consumer slow: 5 records in flight, 0 wait to be sent; acks ..."."""
    async with running(tmp_path) as address:
        await publish(address, 5)
        async with AsyncConsumer("t", "s", broker=address) as consumer:
            for _ in range(5):
                await consumer.receive(timeout=5)
            p = await shows(address, "s", "LAGGING", "consumer slow")
        assert p.reason.startswith("consumer slow: 5 records in flight, 0 wait to be sent; acks")


async def test_retry_backoff(tmp_path: Path) -> None:
    """Scenario: the consumer nacks the record at the cursor with a 60 s delay. Expected:
    LAGGING, "retry backoff: offset 0 goes out again in ~60 s (sent 1 times; last failure:
    not yet)"."""
    async with running(tmp_path) as address:
        await publish(address, 3)
        async with AsyncConsumer("t", "s", broker=address) as consumer:
            first = await consumer.receive(timeout=5)
            consumer.nack(first, delay=60, reason="not yet")
            p = await shows(address, "s", "LAGGING", "retry backoff")
        assert re.fullmatch(
            r"retry backoff: offset 0 goes out again in (5\d|60)\.\d s \(sent 1 times; "
            r"last failure: not yet\)",
            p.reason,
        ), p.reason


async def test_blocked_on_poison(tmp_path: Path) -> None:
    """Scenario: poison policy block, max_deliveries 1; the consumer nacks record 0.
    Expected: BLOCKED, "blocked on poison: offset 0 failed 1 deliveries (poison policy
    block); seek past it or change the policy"."""
    dispatch = policy(max_deliveries=1, poison=PoisonPolicy.BLOCK, backoff_initial_s=0.01)
    async with running(tmp_path, dispatch=dispatch) as address:
        await publish(address, 2)
        async with AsyncConsumer("t", "s", broker=address) as consumer:
            consumer.nack(await consumer.receive(timeout=5), delay=0)
            p = await shows(address, "s", "BLOCKED", "blocked on poison")
        assert p.reason == (
            "blocked on poison: offset 0 failed 1 deliveries (poison policy block); seek "
            "past it or change the policy"
        )


async def test_dlq_full_blocks_and_reject_does_not(tmp_path: Path) -> None:
    """Scenario: max_deliveries 1, dead-letter queues of 1 entry; the consumer nacks record
    0 (dead-lettered), then record 1. Expected with overflow block: BLOCKED, "dlq full: the
    dead-letter queue holds 1 of 1 entries (overflow=block) ...". With overflow reject the
    second record is dropped (counted as rejected), so the partition is CAUGHT_UP."""
    for overflow, state in ((OverflowPolicy.BLOCK, "BLOCKED"), (OverflowPolicy.REJECT, "")):
        dispatch = dataclasses.replace(
            policy(max_deliveries=1, backoff_initial_s=0.01),
            dlq=DlqConfig(max_entries=1, overflow=overflow),
        )
        async with running(tmp_path / overflow.value, dispatch=dispatch) as address:
            await publish(address, 2)
            async with (
                AsyncConsumer("t", "s", broker=address) as consumer,
                AsyncAdminClient(address) as admin,
            ):
                first = await consumer.receive(timeout=5)
                second = await consumer.receive(timeout=5)
                consumer.nack(first, delay=0)
                await polled(lambda: admin.count_dead_letters("t", "s"), lambda n: n == 1)
                consumer.nack(second, delay=0)
                if state:
                    p = await shows(address, "s", state, "dlq full")
                    assert p.reason.startswith(
                        "dlq full: the dead-letter queue holds 1 of 1 entries (overflow=block)"
                    )
                else:
                    p = await polled(lambda: part(address, "s"), lambda p: p.lag == 0)
                    assert (p.state, p.reason) == ("CAUGHT_UP", "")


async def test_a_purge_unblocks_a_full_dead_letter_queue_with_no_consumer(
    tmp_path: Path,
) -> None:
    """Scenario: overflow block, queues of 1 entry, max_deliveries 1; the consumer nacks
    records 0 and 1 (0 fills the queue, 1 blocks the partition), then leaves; an admin
    purges the queue. Expected: record 1 is dead-lettered by the retry (every 1 s) with
    nobody attached: the queue holds it, the cursor passes it, the partition is no
    longer BLOCKED. Before, the retry ran only while a consumer was attached, so the
    subscription stayed BLOCKED "dlq full" beside an empty queue."""
    dispatch = dataclasses.replace(
        policy(max_deliveries=1, backoff_initial_s=0.01),
        dlq=DlqConfig(max_entries=1, overflow=OverflowPolicy.BLOCK),
    )
    async with running(tmp_path, dispatch=dispatch) as address:
        await publish(address, 2)
        async with AsyncAdminClient(address) as admin:
            async with AsyncConsumer("t", "s", broker=address) as consumer:
                first = await consumer.receive(timeout=5)
                second = await consumer.receive(timeout=5)
                consumer.nack(first, delay=0)
                await polled(lambda: admin.count_dead_letters("t", "s"), lambda n: n == 1)
                consumer.nack(second, delay=0)
                await shows(address, "s", "BLOCKED", "dlq full")
            assert await admin.purge_dead_letters("t", "s") == 1
            (entry,) = await polled(
                lambda: admin.peek_dead_letters("t", "s"), lambda got: len(got) == 1, 5.0
            )
            assert entry.offset == 1
            p = await polled(lambda: part(address, "s"), lambda p: p.cursor == 2, 5.0)
            assert p.state != "BLOCKED"


async def test_read_error_then_stalled(tmp_path: Path) -> None:
    """Scenario: segments of 512 bytes; 40 records published, so the first segment is
    sealed; subscription "s" exists and acks nothing. The broker stops, a byte in the
    middle of the first segment is flipped on disk, the broker starts again (the damage is
    in a sealed segment: recovery leaves it, reads report it) and a consumer with credit
    attaches. Expected: LAGGING with "read error: ..." naming the damaged segment, then,
    after the 0.4 s stall timeout, STALLED with the same cause and how long nothing
    moved."""
    wal = LogConfig(segment_bytes=512, index_interval_bytes=100)
    async with running(tmp_path, wal=wal) as address:
        await publish(address, 40, value=b"record-with-some-bytes-")
        async with AsyncConsumer("t", "s", broker=address):
            pass
    first = tmp_path / "data" / "topics" / "t" / "0" / f"{0:020d}.log"
    assert len(list(first.parent.glob("*.log"))) > 1
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    config = broker_config(tmp_path / "data", heartbeat=HEARTBEAT, wal=wal)
    async with Broker(config) as broker:
        address = f"127.0.0.1:{broker.port}"
        async with AsyncConsumer("t", "s", broker=address):
            lagging = await shows(address, "s", "LAGGING", "read error", timeout_s=2)
            stalled = await shows(address, "s", "STALLED", "read error")
    for p in (lagging, stalled):
        assert "00000000000000000000.log" in p.reason, p.reason
        assert p.lag == 40
    assert "nothing sent or acknowledged for" in stalled.reason


async def test_rates_and_drain_at_a_known_pace(tmp_path: Path) -> None:
    """Scenario: 20 records, then a 0.1 s pause, 20 times (about 170/s as measured);
    subscription "live" acks all it gets, "idle" has no consumer. Expected: both see an
    ingress rate within -30 %..+15 % of the measured pace (the 10 s window also holds the
    0.3 s before the first record); "live" acks at that rate too and its drain time
    follows its own rates; "idle" acks 0/s, never drains (drain_s None), and its lag is
    growing."""
    async with running(tmp_path) as address:
        async with AsyncConsumer("t", "idle", broker=address):
            pass  # the subscription exists from the start
        stop = asyncio.Event()

        async def ack_all() -> None:
            async with AsyncConsumer("t", "live", broker=address) as consumer:
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        consumer.ack(await consumer.receive(timeout=0.05))

        acker = asyncio.create_task(ack_all())
        await asyncio.sleep(0.3)
        async with AsyncProducer(address) as producer:
            started = time.monotonic()
            for _ in range(20):
                await asyncio.gather(*(producer.publish("t", b"x", partition=0) for _ in range(20)))
                await asyncio.sleep(0.1)
            pace = 400 / (time.monotonic() - started)
            await asyncio.sleep(0.1)  # a heartbeat samples the last records
            live = await part(address, "live")
            idle = await part(address, "idle")
        stop.set()
        await acker
    assert 20 <= pace <= 210  # under load the pace drops; the rates must follow it
    for p in (live, idle):  # the window began ~0.3 s before the first record
        assert 0.7 * pace <= p.ingress_rate <= 1.15 * pace, (pace, p)
    assert 0.7 * pace <= live.ack_rate <= 1.15 * pace, (pace, live)
    if live.lag == 0:
        assert live.drain_s == 0
    elif live.ack_rate > live.ingress_rate:
        assert live.drain_s == pytest.approx(live.lag / (live.ack_rate - live.ingress_rate))
    else:
        assert live.drain_s is None
    assert (idle.ack_rate, idle.drain_s, idle.trend) == (0.0, None, "growing")
    assert idle.state == "NO_CONSUMER"
