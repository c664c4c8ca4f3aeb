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
Redeliveries after a restart are allowed (at least once) and only counted.

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
from tests.broker.test_serve_process import free_port

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SEED = 20240611
KILLS = 4
TOPIC = "orders"
PARTITIONS = 3
KEYS = 12
IN_FLIGHT = 400  # records sent and not yet acknowledged, at most
DELIVERY_TIMEOUT_S = 20.0  # long enough to ride over a restart
T = TypeVar("T")
CONFIG = """\
[broker]
grace_seconds = 1.0

[wal]
fsync = "always"
segment_bytes = 65536
"""


class BrokerProcess:
    """``headrace serve`` as a child process, restartable on the same port and data dir."""

    def __init__(self, tmp_path: Path, port: int) -> None:
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.log = tmp_path / "serve.log"
        config = tmp_path / "headrace.toml"
        config.write_text(CONFIG)
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

    def _spawn(self) -> None:
        # Popen only forks and execs: it does not wait for the child.
        assert self._proc is None
        with self.log.open("ab") as stderr:
            self._proc = subprocess.Popen(self._cmd, cwd=ROOT, stderr=stderr)

    def kill(self) -> None:
        """SIGKILL the broker and reap it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

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

    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    failed: int = 0
    #: Per partition, every delivery's (offset, value) in arrival order.
    deliveries: dict[int, list[tuple[int, bytes]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    #: (partition, offset) -> the value first delivered there.
    delivered: dict[tuple[int, int], bytes] = field(default_factory=dict)
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def settled(self, key: bytes, value: bytes, future: asyncio.Future[RecordMetadata]) -> None:
        """A send's future is done: note the acknowledged offset, or count the failure."""
        if future.cancelled() or future.exception() is not None:
            self.failed += 1
            return
        meta = future.result()
        assert meta.partition == partition_for(key, PARTITIONS)
        assert (meta.partition, meta.offset) not in self.acked, f"offset acked twice: {meta}"
        self.acked[(meta.partition, meta.offset)] = value
        self.progress.set()

    def received(self, partition: int, offset: int, value: bytes) -> None:
        self.deliveries[partition].append((offset, value))
        first = self.delivered.setdefault((partition, offset), value)
        assert first == value, f"{partition}/{offset} was delivered as {first!r}, now {value!r}"
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

    def missing(self) -> list[tuple[int, int]]:
        """Acknowledged records not received yet."""
        return sorted(self.acked.keys() - self.delivered.keys())


async def produce(producer: AsyncProducer, ledger: Ledger, stop: asyncio.Event) -> int:
    """Send keyed records (value ``k<key>:<sequence>``) until ``stop``; return the count."""
    window = asyncio.Semaphore(IN_FLIGHT)
    sequences = [0] * KEYS
    sent = 0
    while not stop.is_set():
        await window.acquire()
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


def check_first_deliveries_in_order(ledger: Ledger) -> None:
    """Per partition, distinct offsets in first-seen order are 0, 1, 2, ...: nothing was
    skipped, not even for a while, and nothing was delivered out of order."""
    for partition, deliveries in ledger.deliveries.items():
        first_seen = list(dict.fromkeys(offset for offset, _ in deliveries))
        expected = list(range(len(first_seen)))
        if first_seen != expected:
            bad = next(
                i for i, (a, b) in enumerate(zip(first_seen, expected, strict=True)) if a != b
            )
            raise AssertionError(
                f"partition {partition}: first deliveries {first_seen[max(0, bad - 3) : bad + 3]}"
                f" around position {bad}, expected {expected[max(0, bad - 3) : bad + 3]}"
            )


def check_key_order(ledger: Ledger) -> None:
    """Per key, sequence numbers rise with the offset: the producer's order held, and no
    retry was appended twice."""
    last: dict[bytes, tuple[int, int]] = {}
    for (partition, offset), value in sorted(ledger.delivered.items()):
        key, seq = value.split(b":")
        assert partition == partition_for(key, PARTITIONS)
        previous = last.get(key)
        assert previous is None or previous[0] < int(seq), (
            f"{key!r}: sequence {int(seq)} at {partition}/{offset} follows "
            f"{previous[0]} at offset {previous[1]}"
        )
        last[key] = (int(seq), offset)


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
        async with AsyncAdminClient(broker.address) as admin:
            await admin.create_topic(TOPIC, PARTITIONS)
        async with (
            AsyncProducer(broker.address, delivery_timeout_s=DELIVERY_TIMEOUT_S) as producer,
            AsyncConsumer(TOPIC, "audit", broker=broker.address, type="exclusive") as consumer,
            running(asyncio.create_task(produce(producer, ledger, stop))) as producing,
            running(asyncio.create_task(consume(consumer, ledger))),
        ):
            for _ in range(KILLS):
                await ledger.wait_for(
                    len(ledger.acked) + rng.randint(300, 1500),
                    len(ledger.delivered) + rng.randint(100, 500),
                )
                await asyncio.sleep(rng.uniform(0, 0.2))
                kills.append((len(ledger.acked), len(ledger.delivered)))
                broker.kill()
                await asyncio.sleep(rng.uniform(0, 0.3))
                await broker.start()
            await ledger.wait_for(len(ledger.acked) + 500, len(ledger.delivered) + 500)
            stop.set()
            sent = await producing
            await producer.flush()
            async with asyncio.timeout(30):
                await ledger.wait_until(lambda: not ledger.missing())
    finally:
        broker.kill()

    for (partition, offset), value in ledger.acked.items():
        assert ledger.delivered[(partition, offset)] == value, f"{partition}/{offset}"
    check_first_deliveries_in_order(ledger)
    check_key_order(ledger)
    total = sum(len(d) for d in ledger.deliveries.values())
    with capsys.disabled():
        print(
            f"\n[broker-kill] {len(kills)} SIGKILLs at (acked, delivered) {kills}; "
            f"{sent} sent, {len(ledger.acked)} acknowledged, {ledger.failed} failed; "
            f"{len(ledger.delivered)} distinct delivered, {total - len(ledger.delivered)} "
            f"duplicates; {time.monotonic() - started:.1f} s"
        )
    assert len(kills) == KILLS
    assert len(ledger.acked) + ledger.failed == sent
