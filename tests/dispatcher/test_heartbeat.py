"""The heartbeat lag monitor: the failure modes it exists for, reproduced deterministically
(a manual clock, injected read faults, a killed task) and shown to heal, over real logs.

Each scenario drives heartbeat rounds by hand with :meth:`SubscriptionRegistry.heartbeat_round`
after advancing a manual clock, so nothing depends on real timers. The registry's own
heartbeat task runs too, but on the same manual clock it never finds a tick due on its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import BrokerMetrics
from dispatcher import (
    ConsumerSession,
    Delivery,
    HeartbeatConfig,
    InitialPosition,
    SubscriptionRegistry,
)
from tests._helpers import ManualClock
from wal import FileSystem, LogWriter, RecordBatch, encode_columns

pytestmark = pytest.mark.asyncio(loop_scope="function")

INTERVAL = 0.5
STALL = 2.0


class FaultyReads:
    """A LogWriter whose reads can be made to come back empty, or to fail."""

    def __init__(self, writer: LogWriter) -> None:
        self._writer = writer
        self.empty_reads = 0
        self.error: OSError | None = None
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)

    def read(self, offset: int, max_bytes: int) -> list[RecordBatch]:
        self.reads += 1
        if self.error is not None:
            raise self.error
        if self.empty_reads:
            self.empty_reads -= 1
            return []  # as if the data were not readable yet (I/O lag)
        return self._writer.read(offset, max_bytes)

    def read_nowait(self, offset: int, max_bytes: int) -> list[RecordBatch]:
        return self.read(offset, max_bytes)  # as if the page cache held everything


@pytest_asyncio.fixture
async def writer(tmp_path: Path) -> AsyncIterator[LogWriter]:
    opened = await LogWriter.open(str(tmp_path / "logs" / "0"))
    yield opened
    await opened.aclose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _registry(tmp_path: Path, clock: ManualClock, fs: FileSystem | None = None) -> Any:
    return SubscriptionRegistry(
        str(tmp_path / "data"),
        fs=fs,
        heartbeat=HeartbeatConfig(interval_s=INTERVAL, stall_timeout_s=STALL),
        monotonic=clock,
    )


@pytest_asyncio.fixture
async def registry(tmp_path: Path, clock: ManualClock) -> AsyncIterator[SubscriptionRegistry]:
    reg = _registry(tmp_path, clock)
    await reg.open({})
    yield reg
    await reg.aclose()


async def _append(writer: LogWriter, count: int = 1) -> None:
    await writer.append(encode_columns([b"r%d" % i for i in range(count)]))


async def _settle() -> None:
    """Let every task that is ready run (the dispatch path is all on this loop)."""
    for _ in range(50):
        await asyncio.sleep(0)


def _delivered(session: ConsumerSession) -> list[Delivery]:
    out = []
    while not session.outbox.empty():
        item = session.outbox.get_nowait()
        assert item is not None
        out.append(item)
    return out


def _offsets(deliveries: list[Delivery]) -> list[int]:
    return [o for d in deliveries for o in range(d.from_offset, d.to_offset)]


async def _tick(registry: SubscriptionRegistry, clock: ManualClock) -> None:
    clock.advance(INTERVAL)
    registry.heartbeat_round()
    await _settle()


# -- the failure modes ------------------------------------------------------------------


async def test_coalesced_notifications_lose_nothing(
    writer: LogWriter, registry: SubscriptionRegistry
) -> None:
    """Scenario 1: 1,000 records appended one by one while the dispatcher has no room (the
    consumer granted no credit yet), so their notifications pile up on one wake-up.
    Expected: once credit arrives, all 1,000 are delivered by the notifier alone."""
    sub = await registry.subscribe("t", "s", [writer])
    session = sub.attach("c", credit=0)
    await asyncio.gather(*(_append(writer) for _ in range(1000)))
    await _settle()
    assert _delivered(session) == []
    sub.grant(session, 1000)
    await _settle()
    assert _offsets(_delivered(session)) == list(range(1000))
    assert sub.heartbeat_polls == 0


async def test_a_record_published_while_the_subscription_is_created_is_delivered(
    tmp_path: Path, writer: LogWriter, clock: ManualClock
) -> None:
    """Scenario 2: a subscription created at ``latest``; its first save (a journal write
    in a worker thread) is held until a record has been appended and made durable.
    Expected: that record, published during the creation, is delivered."""
    saving, release = threading.Event(), threading.Event()

    class SlowFirstSave(FileSystem):
        def write_all(
            self, fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int
        ) -> int:
            if not saving.is_set():
                saving.set()
                assert release.wait(10)
            return super().write_all(fd, buffers, offset)

    reg = _registry(tmp_path, clock, fs=SlowFirstSave())
    await reg.open({})
    try:
        creating = asyncio.create_task(
            reg.subscribe("t", "s", [writer], initial=InitialPosition.LATEST)
        )
        assert await asyncio.to_thread(saving.wait, 10)
        await _append(writer)  # durable while the subscription is half made
        release.set()
        sub = await creating
        session = sub.attach("c", credit=10)
        await _settle()
        assert _offsets(_delivered(session)) == [0]
    finally:
        release.set()
        await reg.aclose()


async def test_an_empty_read_is_retried_by_the_heartbeat(
    writer: LogWriter, registry: SubscriptionRegistry, clock: ManualClock
) -> None:
    """Scenario 3: the log has a durable record but the read after its notification comes
    back empty (injected I/O lag), and no further notification comes.
    Expected: nothing is delivered until the next heartbeat, which re-polls and delivers
    it; the poll is counted as a heartbeat poll."""
    flaky = FaultyReads(writer)
    sub = await registry.subscribe("t", "s", [cast(LogWriter, flaky)])
    session = sub.attach("c", credit=10)
    await _settle()
    flaky.empty_reads = 1
    await _append(writer)
    await _settle()
    assert flaky.reads >= 1
    assert _delivered(session) == []
    assert sub.heartbeat_polls == 0
    await _tick(registry, clock)
    assert _offsets(_delivered(session)) == [0]
    assert sub.heartbeat_polls == 1


async def test_dropped_notifications_leave_new_records_to_the_heartbeat(
    writer: LogWriter, registry: SubscriptionRegistry, clock: ManualClock
) -> None:
    """Scenario: every notification from now on is lost (``drop_notifications``, the
    fault ``bench dispatch`` injects), then 3 records are published. Expected: nothing
    arrives on the notifier's path; the next heartbeat re-polls and delivers all 3, counted
    as one heartbeat poll; calling it twice is harmless."""
    sub = await registry.subscribe("t", "s", [writer])
    session = sub.attach("c", credit=10)
    await _settle()
    sub.drop_notifications()
    sub.drop_notifications()
    await _append(writer, 3)
    await _settle()
    assert _delivered(session) == []
    await _tick(registry, clock)
    assert _offsets(_delivered(session)) == [0, 1, 2]
    assert sub.heartbeat_polls == 1


async def test_a_subscription_idle_for_many_ticks_still_gets_a_lost_notification(
    writer: LogWriter, registry: SubscriptionRegistry, clock: ManualClock
) -> None:
    """Scenario: a caught-up subscription idles through ten heartbeats (the ticks after
    the first take the quiet path: nothing moved), then notifications are lost and 2
    records are published. Expected: the next tick sees the head move and re-polls (both
    records arrive, one heartbeat poll); the ticks after are quiet again (no more polls)."""
    sub = await registry.subscribe("t", "s", [writer])
    session = sub.attach("c", credit=10)
    await _settle()
    for _ in range(10):
        await _tick(registry, clock)
    assert sub.heartbeat_polls == 0
    sub.drop_notifications()
    await _append(writer, 2)
    await _settle()
    assert _delivered(session) == []
    await _tick(registry, clock)
    assert _offsets(_delivered(session)) == [0, 1]
    assert sub.heartbeat_polls == 1
    for _ in range(3):
        await _tick(registry, clock)
    assert sub.heartbeat_polls == 1
    assert _delivered(session) == []


async def test_a_killed_dispatch_task_is_restarted_within_one_interval(
    writer: LogWriter, registry: SubscriptionRegistry, clock: ManualClock
) -> None:
    """Scenario 4: the dispatch task (the notifier's runner) is killed, then records are
    published. Expected: nothing arrives until the heartbeat; one interval later every
    record is delivered, the restart is counted, and the metrics show heartbeat polls."""
    sub = await registry.subscribe("t", "s", [writer])
    session = sub.attach("c", credit=100)
    await _settle()
    task = sub._task
    assert task is not None
    task.cancel()
    await _settle()
    await _append(writer, 5)
    await _settle()
    assert _delivered(session) == []
    await _tick(registry, clock)
    assert _offsets(_delivered(session)) == [0, 1, 2, 3, 4]
    assert (sub.task_restarts, sub.heartbeat_polls) == (1, 1)
    metrics = BrokerMetrics()
    metrics.watch_subscriptions(registry.samples)
    registry.heartbeat_round()
    samples = _scrape(metrics)
    assert samples["headrace_dispatcher_heartbeat_polls_total", ("t", "s")] == 1
    assert samples["headrace_dispatcher_task_restarts_total", ("t", "s")] == 1


async def test_a_consumer_that_leaves_mid_dispatch_hands_its_records_on(
    writer: LogWriter, registry: SubscriptionRegistry
) -> None:
    """Scenario 5: records were sent to a consumer that disconnects before acking.
    Expected: the next consumer gets them again, marked as redelivered."""
    sub = await registry.subscribe("t", "s", [writer])
    first = sub.attach("a", credit=10)
    await _append(writer, 3)
    await _settle()
    assert _offsets(_delivered(first)) == [0, 1, 2]
    sub.ack(0, 0, 1)
    sub.detach(first)
    second = sub.attach("b", credit=10)
    async with asyncio.timeout(5):  # the failure is saved (a thread) before the resend
        again = await second.next()
    assert again is not None
    assert _offsets([again]) == [1, 2]
    assert again.redeliveries == {1: 1, 2: 1}


# -- STALLED ------------------------------------------------------------------------------


async def test_a_backlog_that_cannot_be_read_is_stalled_and_heals(
    writer: LogWriter, registry: SubscriptionRegistry, clock: ManualClock
) -> None:
    """Scenario: every read fails (EIO) while a consumer with credit waits for 3 records.
    Expected: not STALLED before the 2 s stall timeout, STALLED after it, with a reason
    naming the ready records and the read error, in status() as "read error: ...", and the
    headrace_subscription_stalled gauge. When reads work again, the next heartbeat
    delivers the records and the flag clears."""
    flaky = FaultyReads(writer)
    sub = await registry.subscribe("t", "s", [cast(LogWriter, flaky)])
    session = sub.attach("c", credit=10)
    flaky.error = OSError(5, "Input/output error")
    await _append(writer, 3)
    await _settle()
    metrics = BrokerMetrics()
    metrics.watch_subscriptions(registry.samples)
    await _tick(registry, clock)  # the backlog is first seen stuck here
    for _ in range(3):
        await _tick(registry, clock)
        assert not sub.verdict.stalled
    await _tick(registry, clock)  # 2.0 s without progress
    assert sub.verdict.stalled
    assert "3 records are ready" in sub.verdict.reason
    assert "Input/output error" in sub.verdict.reason
    (part,) = (await sub.status()).partitions
    assert part.state == "STALLED"
    assert part.reason.startswith("read error: [Errno 5] Input/output error; 3 records wait")
    assert _scrape(metrics)["headrace_subscription_stalled", ("t", "s")] == 1
    flaky.error = None
    await _tick(registry, clock)
    assert _offsets(_delivered(session)) == [0, 1, 2]
    await _tick(registry, clock)
    assert not sub.verdict.stalled
    assert _scrape(metrics)["headrace_subscription_stalled", ("t", "s")] == 0


async def test_a_slow_consumer_is_not_stalled(
    writer: LogWriter, registry: SubscriptionRegistry, clock: ManualClock
) -> None:
    """A backlog with no credit left is the consumer's pace, not a stall: no re-polls, no
    flag, however long it lasts."""
    sub = await registry.subscribe("t", "s", [writer])
    session = sub.attach("c", credit=1)
    await _append(writer, 5)
    await _settle()
    assert _offsets(_delivered(session)) == [0, 1, 2, 3, 4]  # one whole batch
    await _append(writer, 5)
    for _ in range(10):
        await _tick(registry, clock)
    assert not sub.verdict.stalled
    assert sub.heartbeat_polls == 0
    assert (await sub.status()).partitions[0].state == "LAGGING"


async def test_lag_is_evaluated_with_no_consumer_attached(
    writer: LogWriter, registry: SubscriptionRegistry, clock: ManualClock
) -> None:
    """With no consumer the heartbeat still samples lag for the metrics (4 records, then
    6), and never calls it STALLED; an unchanged subscription's sample is reused."""
    await registry.subscribe("t", "s", [writer])
    metrics = BrokerMetrics()
    metrics.watch_subscriptions(registry.samples)
    await _append(writer, 4)
    for _ in range(6):
        await _tick(registry, clock)
    samples = _scrape(metrics)
    assert samples["headrace_subscription_lag_messages", ("t", "0", "s")] == 4
    assert samples["headrace_subscription_stalled", ("t", "s")] == 0
    before = registry.samples()
    await _tick(registry, clock)
    assert registry.samples()[0] is before[0]  # nothing changed: the sample is reused
    await _append(writer, 2)
    await _tick(registry, clock)
    assert _scrape(metrics)["headrace_subscription_lag_messages", ("t", "0", "s")] == 6


async def test_each_subscription_ticks_at_its_own_interval(
    tmp_path: Path, writer: LogWriter, clock: ManualClock
) -> None:
    """Intervals come from the subscription's override, then its topic's, then the
    default; a round returns the time until the soonest next tick."""
    reg = SubscriptionRegistry(
        str(tmp_path / "data"),
        heartbeat=HeartbeatConfig(
            interval_s=1.0, topics={"t": 0.2}, subscriptions={"t/fast": 0.05}
        ),
        monotonic=clock,
    )
    await reg.open({})
    try:
        fast = await reg.subscribe("t", "fast", [writer])
        topic = await reg.subscribe("t", "topic", [writer])
        other = await reg.subscribe("u", "default", [writer])
        assert [s.heartbeat_interval_s for s in (fast, topic, other)] == [0.05, 0.2, 1.0]
        assert reg.heartbeat_round() == pytest.approx(0.05)
        ticks: dict[str, int] = {"fast": 0, "topic": 0, "default": 0}
        for sub in (fast, topic, other):
            original = sub.tick

            def counting(
                now: float, name: str = sub.name, tick: Callable[..., Any] = original
            ) -> Any:
                ticks[name] += 1
                return tick(now)

            sub.tick = counting  # type: ignore[method-assign]
        for _ in range(20):  # one second in 50 ms steps
            clock.advance(0.05)
            reg.heartbeat_round()
        assert ticks == {"fast": 20, "topic": 5, "default": 1}
    finally:
        await reg.aclose()


_LABEL_ORDER = ("topic", "partition", "subscription")


def _scrape(metrics: BrokerMetrics) -> dict[tuple[str, tuple[str, ...]], float]:
    """Every sample of the exposition, parsed by the real Prometheus text parser."""
    text = generate_latest(metrics.registry).decode()
    return {
        (
            s.name,
            tuple(s.labels[k] for k in _LABEL_ORDER if k in s.labels),
        ): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
