"""SIGKILL a real ``headrace serve`` process while it publishes and delivers (DESIGN 2.6).

The broker runs as a child process on a fixed port and data directory, with fsync
``always``. In this process an :class:`AsyncProducer` publishes keyed records (each value
carries its key's sequence number) and an :class:`AsyncConsumer` on an exclusive
subscription receives and acknowledges them. Meanwhile the test SIGKILLs the broker a few
times at seeded random moments, each after more records were acknowledged and delivered,
and starts it again on the same port and directory. Producer and consumer ride over each
restart with their own retries and reconnects.

At the end every record the producer saw acknowledged must have been delivered with its
value, each partition's offsets must have been delivered for the first time in order with
no gap, and each key's records must stand in the log in the order they were sent.
Redeliveries after a restart are allowed (at least once: acks the broker had not saved yet
come again) and only counted.

SIGKILL loses the process, not the page cache: this checks the broker's logic across
crashes (acks after fsync, notify after fsync, cursors, idempotent retries, recovery);
``tests/wal/test_faults.py`` covers torn writes and power loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, RecordMetadata, partition_for
from tests._helpers import check_first_deliveries_in_order, until
from tests.broker.test_serve_process import free_port

pytestmark = [
    pytest.mark.asyncio(loop_scope="function"),
    pytest.mark.slow,
    pytest.mark.timeout(150),
]

ROOT = Path(__file__).resolve().parents[2]
SEED = 20240611
KILLS = 4
TOPIC = "orders"
PARTITIONS = 3
KEYS = 12
RATE = 4_000  # records sent per second, at most: enough to check, not millions
IN_FLIGHT = 400  # records sent and not yet acknowledged, at most
DELIVERY_TIMEOUT_S = 20.0  # long enough to ride over a restart
DRAIN_TIMEOUT_S = 30.0
T = TypeVar("T")
Position = tuple[int, int]  # (partition, offset)
CONFIG = """\
[broker]
grace_seconds = 1.0

[wal]
fsync = "always"
segment_bytes = 65536
"""


class BrokerProcess:
    """``headrace serve`` as a child process, restartable on the same port and data dir."""

    def __init__(self, tmp_path: Path, port: int, config_text: str = CONFIG) -> None:
        self.address = f"127.0.0.1:{port}"
        self.log = tmp_path / "serve.log"
        config = tmp_path / "headrace.toml"
        config.write_text(config_text)
        self._cmd = [
            sys.executable,
            "-c",
            "from broker.cli import main; main()",
            "serve",
            "--config",
            str(config),
            "--data-dir",
            str(tmp_path / "data"),
            "--listen",
            self.address,
            "--metrics-listen",
            "",
        ]
        self._proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        """Start the broker and wait until its health service says SERVING."""
        self._spawn()
        await self._wait_serving(time.monotonic() + 20)

    def kill(self) -> None:
        """SIGKILL the broker and reap it. Does nothing when it is not running."""
        proc, self._proc = self._proc, None
        if proc is not None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        """SIGTERM the broker (a clean shutdown, which saves every subscription) and reap
        it. Does nothing when it is not running."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)

    def _spawn(self) -> None:
        # Popen only forks and execs: it does not wait for the child.
        assert self._proc is None
        with self.log.open("ab") as stderr:
            self._proc = subprocess.Popen(self._cmd, cwd=ROOT, stderr=stderr)

    async def _wait_serving(self, deadline: float) -> None:
        request = health_pb2.HealthCheckRequest()
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                break
            async with grpc.aio.insecure_channel(self.address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                with contextlib.suppress(grpc.RpcError):
                    got = await stub.Check(request, timeout=0.5)
                    if got.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the broker did not start serving:\n{self.log.read_text()}")


@dataclass
class Ledger:
    """What the producer got acknowledged and what the consumer received."""

    #: (partition, offset) -> the value the producer got acknowledged there.
    acked: dict[Position, bytes] = field(default_factory=dict)
    failed: int = 0
    #: Per partition, every delivery's offset in arrival order.
    deliveries: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    #: (partition, offset) -> the value first delivered there.
    delivered: dict[Position, bytes] = field(default_factory=dict)
    #: Acknowledged records not delivered yet.
    unseen: set[Position] = field(default_factory=set)
    #: Violations noticed in future callbacks, where raising would only be logged.
    problems: list[str] = field(default_factory=list)
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def settled(self, key: bytes, value: bytes, future: asyncio.Future[RecordMetadata]) -> None:
        """A send's future is done: note the acknowledged position, or count the failure."""
        if future.cancelled() or future.exception() is not None:
            self.failed += 1
            return
        meta = future.result()
        position = (meta.partition, meta.offset)
        if meta.partition != partition_for(key, PARTITIONS):
            self.problems.append(f"{value!r} was acknowledged on partition {meta.partition}")
        if position in self.acked:
            self.problems.append(f"{position} acknowledged for {self.acked[position]!r}, {value!r}")
        self.acked[position] = value
        if position not in self.delivered:
            self.unseen.add(position)
        self.progress.set()

    def received(self, partition: int, offset: int, value: bytes) -> None:
        """Note one delivery; an offset must carry the same value every time."""
        self.deliveries[partition].append(offset)
        first = self.delivered.setdefault((partition, offset), value)
        assert first == value, f"{partition}/{offset} was delivered as {first!r}, now {value!r}"
        self.unseen.discard((partition, offset))
        self.progress.set()

    async def wait_for(self, acked: int, delivered: int) -> None:
        """Wait until at least ``acked`` records were acknowledged and ``delivered``
        distinct records were received."""
        await self.wait_until(lambda: len(self.acked) >= acked and len(self.delivered) >= delivered)

    async def wait_until(self, done: Callable[[], bool]) -> None:
        """Wait until ``done()`` holds, checking after every acknowledgement or delivery."""
        while not done():
            self.progress.clear()
            await self.progress.wait()


async def produce(producer: AsyncProducer, ledger: Ledger, stop: asyncio.Event) -> int:
    """Send keyed records (value ``k<key>:<sequence>``) until ``stop``; return the count."""
    window = asyncio.Semaphore(IN_FLIGHT)
    sequences = [0] * KEYS
    sent = 0
    started = time.monotonic()
    while not stop.is_set():
        await window.acquire()
        if sent % 100 == 0:
            await asyncio.sleep(max(0.0, started + sent / RATE - time.monotonic()))
        k = sent % KEYS
        key, value = b"k%d" % k, b"k%d:%d" % (k, sequences[k])
        sequences[k] += 1
        future = await producer.send(TOPIC, value, key=key)
        future.add_done_callback(functools.partial(ledger.settled, key, value))
        future.add_done_callback(lambda _: window.release())
        sent += 1
    return sent


async def consume(consumer: AsyncConsumer, ledger: Ledger) -> None:
    """Receive, record and acknowledge messages until cancelled."""
    while True:
        try:
            batch = await consumer.receive_batch(timeout=0.5)
        except TimeoutError:
            continue
        for message in batch:
            ledger.received(message.partition, message.offset, message.value)
            consumer.ack(message)


@contextlib.asynccontextmanager
async def running(task: asyncio.Task[T]) -> AsyncIterator[asyncio.Task[T]]:
    """Cancel ``task`` on the way out unless it already finished."""
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def drain(ledger: Ledger, consumer_task: asyncio.Task[None]) -> None:
    """Wait until every acknowledged record was delivered."""
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            await until(ledger.wait_until(lambda: not ledger.unseen), consumer_task)
    except TimeoutError:
        missing = sorted(ledger.unseen)
        raise AssertionError(
            f"{len(missing)} acknowledged records never delivered, e.g. {missing[:10]}"
        ) from None


def check_key_order(ledger: Ledger) -> None:
    """Per key, sequence numbers rise with the offset: the producer's order held, and no
    retry was appended twice."""
    last: dict[bytes, tuple[int, Position]] = {}
    for position, value in sorted(ledger.delivered.items()):
        key, seq = value.split(b":")
        assert position[0] == partition_for(key, PARTITIONS), f"{value!r} at {position}"
        previous = last.get(key)
        assert previous is None or previous[0] < int(seq), (
            f"{key!r}: sequence {int(seq)} at {position} follows {previous[0]} at {previous[1]}"
        )
        last[key] = (int(seq), position)


async def test_sigkill_during_publish_and_consume_loses_and_reorders_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scenario: a producer and an exclusive consumer run against a `headrace serve`
    process (fsync always, 3 partitions, keyed records) that is SIGKILLed 4 times at seeded
    random moments, each after more records were acknowledged and delivered, and restarted
    on the same port and data directory. Then production stops and the consumer drains.
    Expected: every acknowledged (partition, offset) is delivered with the acknowledged
    value; per partition, first deliveries come in offset order with no gap; per key,
    sequence numbers rise with the offset; an offset never changes its value between
    deliveries. Redeliveries are counted and printed, not asserted."""
    rng = random.Random(SEED)
    broker = BrokerProcess(tmp_path, free_port())
    ledger = Ledger()
    stop = asyncio.Event()
    started = time.monotonic()
    kills: list[tuple[int, int]] = []
    await broker.start()
    try:
        async with asyncio.timeout(100):
            async with AsyncAdminClient(broker.address) as admin:
                await admin.create_topic(TOPIC, PARTITIONS)
            async with (
                AsyncProducer(broker.address, delivery_timeout_s=DELIVERY_TIMEOUT_S) as producer,
                AsyncConsumer(TOPIC, "audit", broker=broker.address, type="exclusive") as consumer,
                running(asyncio.create_task(produce(producer, ledger, stop), name="producer")) as p,
                running(asyncio.create_task(consume(consumer, ledger), name="consumer")) as c,
            ):
                for _ in range(KILLS):
                    acked = len(ledger.acked) + rng.randint(300, 1500)
                    delivered = len(ledger.delivered) + rng.randint(100, 500)
                    await until(ledger.wait_for(acked, delivered), p, c)
                    await asyncio.sleep(rng.uniform(0, 0.2))
                    kills.append((len(ledger.acked), len(ledger.delivered)))
                    broker.kill()
                    await asyncio.sleep(rng.uniform(0, 0.3))
                    await broker.start()
                acked, delivered = len(ledger.acked) + 500, len(ledger.delivered) + 500
                await until(ledger.wait_for(acked, delivered), p, c)
                stop.set()
                sent = await p
                await producer.flush()
                await drain(ledger, c)
    finally:
        broker.kill()

    assert not ledger.problems, ledger.problems[:10]
    for position, value in ledger.acked.items():
        assert ledger.delivered[position] == value, f"{position}: {ledger.delivered[position]!r}"
    check_first_deliveries_in_order(ledger.deliveries, "the consumer's")
    check_key_order(ledger)
    assert len(ledger.acked) + ledger.failed == sent
    total = sum(len(offsets) for offsets in ledger.deliveries.values())
    with capsys.disabled():
        print(
            f"\n[broker-kill] {len(kills)} SIGKILLs at (acked, delivered) {kills}; "
            f"{sent} sent, {len(ledger.acked)} acknowledged, {ledger.failed} failed; "
            f"{len(ledger.delivered)} delivered, {total - len(ledger.delivered)} "
            f"redelivered; {time.monotonic() - started:.1f} s"
        )
