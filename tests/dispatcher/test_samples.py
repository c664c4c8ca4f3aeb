"""The heartbeat's subscription samples (what /metrics exports): the oldest unacknowledged
record's publish time, read from the log only when needed, over a real log and a manual
monotonic clock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dispatcher import (
    DispatchConfig,
    DispatchPolicy,
    HeartbeatConfig,
    PoisonPolicy,
    Subscription,
    SubscriptionRegistry,
)
from dispatcher.heartbeat import PartitionSample, SubscriptionSample
from tests._helpers import ManualClock
from wal import FaultyFs, LogConfig, LogWriter, encode_columns
from wal.fs import reading_nonblocking

pytestmark = pytest.mark.asyncio(loop_scope="function")

#: Record i was published at T0 + i seconds (ms since the epoch).
T0 = 1_700_000_000_000


@pytest_asyncio.fixture
async def writer(tmp_path: Path) -> AsyncIterator[LogWriter]:
    opened = await LogWriter.open(str(tmp_path / "logs" / "0"))
    await opened.append(
        encode_columns(
            [b"r%d" % i for i in range(10)], timestamps_ms=[T0 + i * 1000 for i in range(10)]
        )
    )
    yield opened
    await opened.aclose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest_asyncio.fixture
async def registry(tmp_path: Path, clock: ManualClock) -> AsyncIterator[SubscriptionRegistry]:
    reg = SubscriptionRegistry(
        str(tmp_path / "data"), heartbeat=HeartbeatConfig(interval_s=0.5), monotonic=clock
    )
    await reg.open({})
    yield reg
    await reg.aclose()


async def _sent(
    registry: SubscriptionRegistry, writer: LogWriter
) -> tuple[Subscription, list[int]]:
    """A subscription whose consumer has been sent all ten records, and a list that
    counts the log reads made for the age (one entry per read)."""
    sub = await registry.subscribe("t", "s", [writer])
    sub.attach("c", credit=100)
    await _settle()
    reads: list[int] = []
    read = sub.cursor_timestamp_ms

    def counted(partition: int) -> float | None:
        reads.append(partition)
        return read(partition)

    sub.cursor_timestamp_ms = counted  # type: ignore[method-assign]
    return sub, reads


async def _settle() -> None:
    """Let every task that is ready run (the dispatch path is all on this loop)."""
    for _ in range(50):
        await asyncio.sleep(0)


def _partition(
    registry: SubscriptionRegistry, clock: ManualClock, seconds: float
) -> PartitionSample:
    clock.advance(seconds)
    registry.heartbeat_round()
    (sample,) = registry.samples()
    return sample.partitions[0]


async def test_the_time_is_read_once_while_the_cursor_stays(
    registry: SubscriptionRegistry, writer: LogWriter, clock: ManualClock
) -> None:
    """Scenario: ten records sent, none acknowledged; twenty heartbeat rounds. Expected:
    the sample carries record 0's publish time, read from the log once."""
    _sub, reads = await _sent(registry, writer)
    for _ in range(20):
        part = _partition(registry, clock, 0.5)
        assert part.lag == 10
        assert part.oldest_unacked_ms == T0
    assert len(reads) == 1


async def test_a_moving_cursor_is_read_again_at_most_every_five_seconds(
    registry: SubscriptionRegistry, writer: LogWriter, clock: ManualClock
) -> None:
    """Scenario: the cursor moves to 3 right after the first read, then stays. Expected:
    for five seconds the sample keeps record 0's time (no read); then, with nothing else
    changed, the next round reads record 3's time, once."""
    sub, reads = await _sent(registry, writer)
    assert _partition(registry, clock, 0.5).oldest_unacked_ms == T0
    sub.ack(0, 0, 3)
    await sub.applied()  # the dispatch task applied it
    for _ in range(8):  # 4 s
        assert _partition(registry, clock, 0.5).oldest_unacked_ms == T0
    assert len(reads) == 1
    assert _partition(registry, clock, 1.0).oldest_unacked_ms == T0 + 3000
    for _ in range(5):
        assert _partition(registry, clock, 0.5).oldest_unacked_ms == T0 + 3000
    assert len(reads) == 2


async def test_caught_up_has_no_oldest_record(
    registry: SubscriptionRegistry, writer: LogWriter, clock: ManualClock
) -> None:
    """Scenario: every record acknowledged. Expected: lag 0 and no publish time (the
    exported age is 0), at once, without a read."""
    sub, reads = await _sent(registry, writer)
    assert _partition(registry, clock, 0.5).oldest_unacked_ms == T0
    sub.ack(0, 0, 10)
    await sub.applied()  # the dispatch task applied it
    part = _partition(registry, clock, 0.5)
    assert part.lag == 0
    assert part.oldest_unacked_ms is None
    assert len(reads) == 1


async def test_a_blocked_partition_is_in_the_sample(
    tmp_path: Path, writer: LogWriter, clock: ManualClock
) -> None:
    """Scenario: poison policy block after one delivery; the consumer nacks offset 0.
    Expected: the next heartbeat's sample says the partition and the subscription are
    BLOCKED; once offset 0 is acknowledged (an operator's seek or commit past it), they
    are not."""
    policy = DispatchPolicy(max_deliveries=1, poison=PoisonPolicy.BLOCK)
    reg = SubscriptionRegistry(
        str(tmp_path / "blocked"),
        heartbeat=HeartbeatConfig(interval_s=0.5),
        monotonic=clock,
        dispatch=DispatchConfig(defaults=policy),
    )
    await reg.open({})
    try:
        sub, _reads = await _sent(reg, writer)
        sub.nack(0, 0, 1, delay_s=0, reason="poison")
        await _settle()  # the dispatch task finds it poison as it would send it again
        assert _partition(reg, clock, 0.5).blocked
        assert reg.samples()[0].blocked
        await sub.commit(0, 1)
        assert not _partition(reg, clock, 0.5).blocked
        assert not reg.samples()[0].blocked
    finally:
        await reg.aclose()


async def test_a_scrape_from_another_thread_sees_what_changed_since_the_last_round(
    registry: SubscriptionRegistry, writer: LogWriter, clock: ManualClock
) -> None:
    """Scenario: one round with subscription ``s``; then ``s2`` is created and ``s`` acks
    three records, with no round after. Expected: samples asked for from another thread
    (as the metrics exporter does) are built on the loop, now: both subscriptions, and
    ``s``'s lag of 7."""
    sub, _reads = await _sent(registry, writer)
    assert _partition(registry, clock, 0.5).lag == 10
    await registry.subscribe("t", "s2", [writer])
    sub.ack(0, 0, 3)
    await sub.applied()
    samples = await asyncio.to_thread(registry.samples)
    lags = {s.subscription: s.partitions[0].lag for s in samples}
    assert lags == {"s": 7, "s2": 10}


async def test_a_scrape_gets_the_last_samples_built_while_the_loop_is_busy(
    registry: SubscriptionRegistry, writer: LogWriter, clock: ManualClock
) -> None:
    """Scenario: samples built once with ``s``; ``s2`` is created; then a thread asks for
    samples (waiting up to 50 ms) while the loop is blocked until that thread is done.
    Expected: the thread gets the samples last built (``s`` only) instead of hanging; the
    loop, free again, builds both."""
    await _sent(registry, writer)
    assert [s.subscription for s in registry.samples()] == ["s"]
    await registry.subscribe("t", "s2", [writer])
    answered = threading.Event()
    got: list[tuple[SubscriptionSample, ...]] = []

    def scrape() -> None:
        got.append(registry.samples(wait_s=0.05))
        answered.set()

    thread = threading.Thread(target=scrape)
    thread.start()
    assert answered.wait(10)  # blocks the loop: the request cannot run until this returns
    thread.join()
    assert [s.subscription for s in got[0]] == ["s"]
    await _settle()  # the cancelled request runs now, and does nothing
    assert [s.subscription for s in registry.samples(wait_s=0.05)] == ["s", "s2"]


async def test_a_cold_cursor_record_is_read_off_the_loop_and_reported_a_round_later(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Scenario: ten records sent, none acknowledged, the log's file not in the page cache
    (FaultyFs.cold) and no tail cache. Expected: the first round reports no time (it does
    not wait for the disk) and starts a read on a worker thread; once that read is done,
    the next round reports record 0's time, read on the loop from the cache. The loop
    itself never read the cold file."""
    fs = LoopWatchFs()
    config = LogConfig(tail_cache_bytes=0)
    writer = await LogWriter.open(str(tmp_path / "logs" / "0"), config, fs=fs)
    registry = SubscriptionRegistry(
        str(tmp_path / "data"), heartbeat=HeartbeatConfig(interval_s=0.5), monotonic=clock
    )
    await registry.open({})
    try:
        await writer.append(
            encode_columns(
                [b"r%d" % i for i in range(10)], timestamps_ms=[T0 + i * 1000 for i in range(10)]
            )
        )
        sub = await registry.subscribe("t", "s", [writer])
        sub.attach("c", credit=100)
        await _settle()
        fs.cold = {f"{0:020d}.log"}
        # From a thread with no event loop (the exporter's, once the loop stopped): no
        # time, no error, and nothing started.
        assert await asyncio.to_thread(sub.cursor_timestamp_ms, 0) is None
        assert fs.cold
        part = _partition(registry, clock, 0.5)
        assert part.lag == 10
        assert part.oldest_unacked_ms is None
        assert writer.cold_reads == 2  # the thread's attempt, then the round's
        async with asyncio.timeout(5):
            while fs.cold:  # noqa: ASYNC110 - the worker thread's read warms it
                await asyncio.sleep(0.005)
        await _settle()
        assert _partition(registry, clock, 0.5).oldest_unacked_ms == T0
        assert threading.current_thread().name not in fs.blocking_cold_readers
        assert fs.blocking_cold_readers
    finally:
        await registry.aclose()
        await writer.aclose()


class LoopWatchFs(FaultyFs):
    """FaultyFs that notes the threads that read a cold file blocking (warming it)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocking_cold_readers: set[str] = set()

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        path = self.path_of(fd)
        if any(part in path for part in self.cold) and not reading_nonblocking():
            self.blocking_cold_readers.add(threading.current_thread().name)
        return super().pread(fd, size, offset)
