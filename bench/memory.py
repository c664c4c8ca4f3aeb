"""The ``memory`` scenario: the broker's RSS under a publish flood and slow consumers.

Owns :func:`run` and :func:`measure`. A real ``headrace serve`` process (fsync ``never``,
so the disk is not what slows the flood down) takes, for a fixed time:

- ``producers`` PublishStream producers, each sending 64 KiB batches as fast as the broker
  reads them, reading the answers in a separate task; one more that never reads its
  answers at all (the broker must stop reading its stream, not pile up answers);
- ``stalled`` consumers that open a subscription with the most credit ``[limits]``
  allows and never read their stream, ``never_ack`` consumers that read everything and
  never acknowledge, and one slow consumer that reads and acknowledges ten batches a
  second.

Every 100 ms the broker's resident set (``VmRSS`` in ``/proc/<pid>/status``) is sampled.
Reported: the RSS once serving (``baseline_rss``), the peak, the growth, and how much was
published (``published``): if the broker buffered what its stalled consumers do not read,
growth would follow ``published`` times ``stalled``. Bounded growth with a large
``published`` is the evidence of backpressure instead of buffering.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench._headrace_pubsub import fresh_channel, probe_admin, serve_process
from bench._output import Result
from bench._scenario import RunOptions
from bench._server_process import rss_mib, wait_until_serving
from client import AsyncAdminClient
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc
from proto.batch import encode_columns

BENCH = "memory"
TOPIC = "flood"
PARTITIONS = 4
RECORD_BYTES = 1024
RECORDS_PER_BATCH = 64
#: The most credit a consumer may hold under the default ``[limits]``.
CREDIT = 100_000
CONFIG = '[wal]\nfsync = "never"\n'


@dataclass(frozen=True, slots=True)
class Load:
    """The shape of one run.

    Attributes:
        seconds: How long the flood lasts.
        producers: PublishStream producers that read their answers.
        stalled: Consumers that never read their stream.
        never_ack: Consumers that read everything and never acknowledge.
    """

    seconds: float = 20.0
    producers: int = 4
    stalled: int = 4
    never_ack: int = 2


@dataclass(frozen=True, slots=True)
class Measurement:
    """What one run saw: RSS in MiB, bytes published in MiB, its duration in seconds."""

    baseline_mib: float
    peak_mib: float
    published_mib: float
    seconds: float

    @property
    def growth_mib(self) -> float:
        """Peak over baseline."""
        return self.peak_mib - self.baseline_mib


def run(options: RunOptions) -> Iterator[Result]:
    """The scenario's results (``--quick``: 4 seconds instead of 20)."""
    load = Load(seconds=4.0) if options.quick else Load()
    m = asyncio.run(measure(options.data_dir, load))
    params = {
        "seconds": load.seconds,
        "producers": load.producers,
        "stalled_consumers": load.stalled,
        "never_ack_consumers": load.never_ack,
        "batch_kib": RECORD_BYTES * RECORDS_PER_BATCH // 1024,
    }
    for metric, value, unit in (
        ("baseline_rss", m.baseline_mib, "MiB"),
        ("peak_rss", m.peak_mib, "MiB"),
        ("rss_growth", m.growth_mib, "MiB"),
        ("published", m.published_mib, "MiB"),
        ("publish_rate", m.published_mib / m.seconds, "MiB/s"),
    ):
        yield Result(BENCH, "headrace", metric, round(value, 1), unit, params)


async def measure(directory: Path, load: Load) -> Measurement:
    """Run one flood against a fresh ``headrace serve`` in ``directory``."""
    process, address = serve_process(directory, CONFIG)
    process.start()
    try:
        await wait_until_serving(lambda: probe_admin(address), timeout_s=60, process=process)
        async with AsyncAdminClient(address) as admin:
            await admin.create_topic(TOPIC, PARTITIONS)
        baseline = rss_mib(process.pid)
        return await _flood(address, load, process.pid, baseline)
    finally:
        await asyncio.to_thread(process.stop)


async def _flood(address: str, load: Load, pid: int, baseline: float) -> Measurement:
    published = [0]
    stop = asyncio.Event()
    channels = [fresh_channel(address) for _ in range(load.producers + load.stalled + 4)]
    stubs = [broker_pb2_grpc.BrokerStub(c) for c in channels]
    tasks = [
        asyncio.create_task(_produce(stubs[i], stop, published)) for i in range(load.producers)
    ]
    tasks.append(asyncio.create_task(_produce(stubs[load.producers], stop, None)))
    consumers = [("stalled", i, stubs[load.producers + 1 + i]) for i in range(load.stalled)]
    consumers += [("never-ack", i, stubs[-3]) for i in range(load.never_ack)]
    tasks += [asyncio.create_task(_consume(stub, f"{k}-{i}", k, stop)) for k, i, stub in consumers]
    tasks.append(asyncio.create_task(_consume(stubs[-2], "slow", "slow", stop)))
    peak = baseline
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < load.seconds:
        await asyncio.sleep(0.1)
        peak = max(peak, rss_mib(pid))
        for task in tasks:
            if task.done() and task.exception() is not None:
                raise RuntimeError("a load task failed") from task.exception()
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    return Measurement(baseline, peak, published[0] / (1 << 20), elapsed)


async def _produce(
    stub: broker_pb2_grpc.BrokerStub, stop: asyncio.Event, published: list[int] | None
) -> None:
    """Send batches until ``stop``; count the acknowledged bytes in ``published`` (``None``:
    never read an answer)."""
    batch = encode_columns([b"x" * RECORD_BYTES] * RECORDS_PER_BATCH, timestamps_ms=1)

    async def requests() -> AsyncIterator[_pb.PublishRequest]:
        while not stop.is_set():
            yield _pb.PublishRequest(topic=TOPIC, partition=-1, batch=batch)

    call = stub.PublishStream(requests())
    if published is None:
        await stop.wait()
        call.cancel()
        return
    async for response in call:
        if response.error_code:
            raise RuntimeError(f"publish failed: {response.error_message}")
        published[0] += len(batch)


async def _consume(
    stub: broker_pb2_grpc.BrokerStub, name: str, kind: str, stop: asyncio.Event
) -> None:
    """One consumer of subscription ``kind`` (shared) behaving as ``kind`` says."""
    acks: asyncio.Queue[_pb.SubscribeRequest] = asyncio.Queue()
    acks.put_nowait(
        _pb.SubscribeRequest(
            open=_pb.OpenSubscription(
                topic=TOPIC,
                subscription=kind,
                type=_pb.SHARED,
                consumer_name=name,
                initial_credit=CREDIT,
            )
        )
    )

    async def requests() -> AsyncIterator[_pb.SubscribeRequest]:
        while True:
            yield await acks.get()

    call = stub.Subscribe(requests())
    if kind == "stalled":
        await stop.wait()
        call.cancel()
        return
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        async for response in call:
            if kind != "slow" or not response.HasField("delivery"):
                continue
            d = response.delivery
            done = _pb.OffsetRange(partition=d.partition, begin=d.from_offset, end=d.to_offset)
            acks.put_nowait(_pb.SubscribeRequest(ack=_pb.Acks(ranges=[done])))
            await asyncio.sleep(0.1)
