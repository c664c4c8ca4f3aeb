"""Chaos: SIGKILL a real broker 20 times under producers, exclusive and shared consumers.

The broker is a ``headrace serve`` child process (fsync ``always``) on a fixed loopback
port and data directory. In this process three :class:`AsyncProducer` s publish numbered
records (value ``p<producer>-<sequence>``, each unique) to a three-partition topic, the
partitions in turn, and note every record whose publish was acknowledged. One consumer
reads an ``exclusive`` subscription; two consumers share a ``shared`` subscription. Each
notes every (partition, offset, value) it receives and acks it on its own.

The test SIGKILLs the broker 20 times at seeded random moments, each after the producers
and both subscriptions made some progress since the previous restart, and starts it again
on the same port and directory. Clients ride over each restart by themselves: producers
retry with the same bytes (the broker drops retried duplicates), consumers reconnect and
the broker resumes at the saved cursor. Records whose publish raised may or may not be in
the log. After the last restart production stops and the consumers drain.

Checked (DESIGN 2.6 and 3): every acknowledged record reaches both subscriptions, at the
position it was acknowledged at; each partition's offsets reach the exclusive
subscription for the first time in order with no gap; an offset never changes its value;
no record is in the log twice; each producer's records stand in each partition in the
order they were sent. Redeliveries (at least once: acks not yet saved come again) are
counted and reported per subscription, not asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, RecordMetadata
from tests._helpers import check_first_deliveries_in_order, until
from tests.broker.test_kill import BrokerProcess
from tests.broker.test_serve_process import free_port

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(180)]

SEED = 20261121
KILLS = 20
TOPIC = "chaos"
PARTITIONS = 3
PRODUCERS = 3
RATE = 500  # records a second per producer, at most
IN_FLIGHT = 200  # records a producer has sent and not yet seen settled, at most
DELIVERY_TIMEOUT_S = 20.0  # a producer's retries ride over a restart
PROGRESS_TIMEOUT_S = 20.0  # for progress between kills, and for the final drain
EXCLUSIVE = "audit"
SHARED = "workers"
#: Subscription -> (type, consumers). Every check covers each subscription listed here.
SUBSCRIPTIONS = {EXCLUSIVE: ("exclusive", 1), SHARED: ("shared", 2)}
Position = tuple[int, int]  # (partition, offset)


@dataclass
class Received:
    """Everything one subscription delivered, over all of its consumers."""

    name: str
    #: Per partition, every delivered offset in arrival order.
    offsets: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    #: (partition, offset) -> the value first delivered there.
    at: dict[Position, bytes] = field(default_factory=dict)
    total: int = 0

    @property
    def duplicates(self) -> int:
        """Deliveries of a position that had been delivered before."""
        return self.total - len(self.at)


@dataclass
class Ledger:
    """What the producers got acknowledged and what each subscription received."""

    #: value -> the position its publish was acknowledged at.
    acked: dict[bytes, Position] = field(default_factory=dict)
    failed: int = 0
    subscriptions: dict[str, Received] = field(
        default_factory=lambda: {name: Received(name) for name in SUBSCRIPTIONS}
    )
    #: Violations noticed in callbacks, where raising would only be logged.
    problems: list[str] = field(default_factory=list)
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def settled(self, value: bytes, future: asyncio.Future[RecordMetadata]) -> None:
        """A send's future is done: note where it was acknowledged, or count the failure."""
        if future.cancelled() or future.exception() is not None:
            self.failed += 1
            return
        meta = future.result()
        self.acked[value] = (meta.partition, meta.offset)
        self.progress.set()

    def received(self, subscription: str, partition: int, offset: int, value: bytes) -> None:
        """Note one delivery; a position must carry the same value every time."""
        got = self.subscriptions[subscription]
        got.total += 1
        got.offsets[partition].append(offset)
        first = got.at.setdefault((partition, offset), value)
        if first != value:
            self.problems.append(
                f"{subscription}: {partition}/{offset} was {first!r}, now {value!r}"
            )
        self.progress.set()

    def counts(self) -> tuple[int, ...]:
        """Acknowledged records, then distinct records received per subscription."""
        return (len(self.acked), *(len(s.at) for s in self.subscriptions.values()))

    def grown_by(self, more: Sequence[int]) -> Callable[[], bool]:
        """A test that each of :meth:`counts` grew by at least ``more`` from now."""
        need = [n + m for n, m in zip(self.counts(), more, strict=True)]
        return lambda: all(n >= k for n, k in zip(self.counts(), need, strict=True))

    def unseen(self) -> dict[str, int]:
        """Per subscription, acknowledged records it has not received."""
        return {
            name: sum(1 for pos in self.acked.values() if pos not in got.at)
            for name, got in self.subscriptions.items()
        }

    async def wait_until(self, done: Callable[[], bool], what: str) -> None:
        """Wait until ``done()`` holds, checking after every acknowledgement or delivery.

        Raises:
            AssertionError: it did not hold within :data:`PROGRESS_TIMEOUT_S`.
        """
        try:
            async with asyncio.timeout(PROGRESS_TIMEOUT_S):
                while not done():
                    self.progress.clear()
                    await self.progress.wait()
        except TimeoutError:
            raise AssertionError(
                f"no {what} within {PROGRESS_TIMEOUT_S:g} s: acked, received per subscription "
                f"= {self.counts()}; unseen {self.unseen()}; {self.failed} publishes failed"
            ) from None


async def produce(index: int, producer: AsyncProducer, ledger: Ledger, stop: asyncio.Event) -> int:
    """Send ``p<index>-<sequence>`` to the partitions in turn until ``stop``; return the
    number sent."""
    window = asyncio.Semaphore(IN_FLIGHT)
    sent = 0
    started = time.monotonic()
    while not stop.is_set():
        await window.acquire()
        if sent % 50 == 0:
            await asyncio.sleep(max(0.0, started + sent / RATE - time.monotonic()))
        value = b"p%d-%d" % (index, sent)
        future = await producer.send(TOPIC, value, partition=sent % PARTITIONS)
        future.add_done_callback(functools.partial(ledger.settled, value))
        future.add_done_callback(lambda _: window.release())
        sent += 1
    return sent


async def consume(consumer: AsyncConsumer, ledger: Ledger) -> None:
    """Receive, note and ack (one by one) messages until cancelled."""
    while True:
        try:
            batch = await consumer.receive_batch(timeout=0.5)
        except TimeoutError:
            continue
        for message in batch:
            ledger.received(consumer.subscription, message.partition, message.offset, message.value)
            consumer.ack(message)


@contextlib.asynccontextmanager
async def cancelled_on_exit(tasks: Sequence[asyncio.Task[Any]]) -> AsyncIterator[None]:
    """Cancel ``tasks`` on the way out (those not finished yet), and wait for them."""
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def kill_repeatedly(broker: BrokerProcess, ledger: Ledger, rng: random.Random) -> list[str]:
    """SIGKILL and restart the broker :data:`KILLS` times, each after the producers and
    both subscriptions made progress; return what each kill interrupted."""
    kills = []
    for _ in range(KILLS):
        more = [rng.randint(50, 300) for _ in ledger.counts()]
        await ledger.wait_until(ledger.grown_by(more), "progress since the last restart")
        await asyncio.sleep(rng.uniform(0, 0.25))
        kills.append("/".join(map(str, ledger.counts())))
        broker.kill()
        await asyncio.sleep(rng.uniform(0, 0.2))
        await broker.start()
    return kills


def check_log(ledger: Ledger) -> None:
    """Both subscriptions saw the same log: a position holds one value, a value is at one
    position (retries were dropped as duplicates), and each producer's sequence numbers
    rise with the offset within a partition."""
    log: dict[Position, bytes] = {}
    for got in ledger.subscriptions.values():
        for position, value in got.at.items():
            other = log.setdefault(position, value)
            assert other == value, f"{position} holds {other!r} in one subscription, {value!r}"
    where: dict[bytes, Position] = {}
    last: dict[tuple[bytes, int], tuple[int, int]] = {}
    for position, value in sorted(log.items()):
        assert value not in where, f"{value!r} is in the log twice: {where[value]}, {position}"
        where[value] = position
        producer, sequence = value.split(b"-")
        previous = last.get((producer, position[0]))
        assert previous is None or previous[0] < int(sequence), (
            f"{producer!r} on partition {position[0]}: sequence {int(sequence)} at offset "
            f"{position[1]} follows {previous[0]} at offset {previous[1]}"
        )
        last[(producer, position[0])] = (int(sequence), position[1])


async def test_twenty_sigkills_under_producers_and_exclusive_and_shared_consumers(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    record_property: Callable[[str, object], None],
) -> None:
    """Scenario: 3 producers (one with ``linger_ms=0``: pipelined on a PublishStream as the
    broker's in-flight hint says; two unary, with a linger) publish numbered records to a
    3-partition topic of a `headrace serve` process (fsync always) while one consumer reads
    an exclusive subscription and two consumers share a shared one, each acking every
    record. The broker is SIGKILLed 20 times at seeded random moments (each after more
    progress) and restarted on the same port and data dir. Then production stops and the
    consumers drain.
    Expected: every acknowledged record is received by the exclusive subscription and by
    the shared one (the union of its consumers), at its acknowledged position; per
    partition, the exclusive subscription's first deliveries come in offset order with no
    gap; a position never changes its value; no record is in the log twice; each
    producer's order holds per partition. Duplicates (redeliveries) are reported per
    subscription, not asserted."""
    rng = random.Random(SEED)
    broker = BrokerProcess(tmp_path, free_port())
    ledger = Ledger()
    stop = asyncio.Event()
    started = time.monotonic()
    await broker.start()
    try:
        async with asyncio.timeout(150):
            async with AsyncAdminClient(broker.address) as admin:
                await admin.create_topic(TOPIC, PARTITIONS)
            async with contextlib.AsyncExitStack() as stack:
                consumers = [
                    await stack.enter_async_context(
                        AsyncConsumer(TOPIC, name, broker=broker.address, type=kind)
                    )
                    for name, (kind, count) in SUBSCRIPTIONS.items()
                    for _ in range(count)
                ]
                producers = [
                    await stack.enter_async_context(
                        AsyncProducer(
                            broker.address,
                            delivery_timeout_s=DELIVERY_TIMEOUT_S,
                            # the first on a PublishStream, its window the broker's hint
                            linger_ms=0 if i == 0 else 5,
                        )
                    )
                    for i in range(PRODUCERS)
                ]
                readers = [
                    asyncio.create_task(consume(c, ledger), name=f"consumer {c.subscription}")
                    for c in consumers
                ]
                writers = [
                    asyncio.create_task(produce(i, p, ledger, stop), name=f"producer {i}")
                    for i, p in enumerate(producers)
                ]
                tasks = [*readers, *writers]
                await stack.enter_async_context(cancelled_on_exit(tasks))
                kills = await until(kill_repeatedly(broker, ledger, rng), *tasks)
                more = [300] * len(ledger.counts())
                grown = ledger.grown_by(more)
                await until(ledger.wait_until(grown, "progress after the last restart"), *tasks)
                stop.set()
                sent = sum(await asyncio.gather(*writers))
                await asyncio.gather(*(p.flush() for p in producers))
                await until(
                    ledger.wait_until(
                        lambda: not any(ledger.unseen().values()), "delivery of every acked record"
                    ),
                    *readers,
                )
    finally:
        broker.kill()

    assert not ledger.problems, ledger.problems[:10]
    assert len(ledger.acked) + ledger.failed == sent
    for value, position in ledger.acked.items():
        for got in ledger.subscriptions.values():
            assert got.at[position] == value, f"{got.name}: {position} holds {got.at[position]!r}"
    exclusive = ledger.subscriptions[EXCLUSIVE]
    check_first_deliveries_in_order(exclusive.offsets, exclusive.name)
    check_log(ledger)
    duplicates = {name: got.duplicates for name, got in ledger.subscriptions.items()}
    for name, count in duplicates.items():
        record_property(f"duplicates_{name}", count)
    with capsys.disabled():
        print(
            f"\n[chaos] {len(kills)} SIGKILLs at acked/{'/'.join(SUBSCRIPTIONS)} {kills}; "
            f"{sent} sent, {len(ledger.acked)} acknowledged, {ledger.failed} failed; "
            f"duplicates {duplicates}; {time.monotonic() - started:.1f} s"
        )
