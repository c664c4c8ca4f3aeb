"""Headrace as a system of the ``pubsub`` scenario.

Owns :class:`HeadraceSystem`: a real ``headrace serve`` process (fsync ``always``, the
default; ``max_unacked`` 20,000, as the JetStream consumer's ``max_ack_pending``) on a free
loopback port, driven through the public client library only
(``AsyncProducer``, ``AsyncConsumer``, ``AsyncAdminClient``), as a user would.

- ``publish``: one producer, every record handed over in one ``send_many`` call (the
  client's columnar bulk path: batches of up to 1 MiB encoded straight from the list, the
  partitions in turn, one batch in flight per partition); every record is acknowledged
  after fsync, and the call's result is checked to hold all of them.
- ``consume``: one exclusive subscription from ``earliest`` with a receive queue of
  20,000 records; the application reads every message's value and acks each
  ``receive_batch`` with one ``ack_many`` (the client sends the acks as ranges). The time
  includes closing the consumer, which waits until the broker has applied every ack.
- ``send_per_record``: one ``AsyncProducer`` (default settings) and one
  ``AsyncProducer.send`` per record in a plain loop, then ``flush``, as an application that
  pipelines its sends does; every future must then hold its record's metadata.
- ``sync_send_per_record``: the blocking ``Producer`` (default settings), one ``send`` per
  record in a plain loop on a worker thread, then ``flush``; every future must be done and
  hold its metadata.
- ``consume_per_record``: one exclusive subscription from ``earliest`` with the client's
  default receive queue, ``async for`` over the consumer and ``ack`` on each message, up to
  ``count``; the time includes closing the consumer (the last acks applied).
- ``sync_consume_per_record``: the same with the blocking ``Consumer`` (default
  settings, its own subscription), ``for message in consumer`` and ``ack`` on each, on a
  worker thread.
- The four per-record phases use their own topic (``PER_RECORD_TOPIC``), so the bulk
  phases' counts are untouched; both send phases write to it, then the consume phase
  reads the first ``count`` records.
- ``e2e``: ``publish`` (one record, awaited) with ``linger_ms`` 0 (so, by default, one
  batch in flight on a PublishStream) against a consumer that subscribed at ``latest``
  and acks each message with the client's default ack batching (sent every 20 ms). An
  ``ack_interval_ms`` of 1 sent up to 1,000 ack requests a second, each a stream write on
  the client and ack commands on the broker, on the 2 cores the publish path needs: in
  six pairs of e2e runs in the same minutes (load average 3.3-3.5) its p50 was 1.10-1.26x
  the default's (median 1.2x).
- ``kill_and_restart``: SIGKILL, then a fresh gRPC channel (its own subchannel pool, so no
  backoff is inherited) publishes one record until it is acknowledged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path

import grpc

from bench._peers import NATS_MAX_ACK_PENDING
from bench._pubsub_system import LatencyRecorder, measure_e2e
from bench._server_process import (
    ServerFailedError,
    ServerProcess,
    free_port,
    restart_to_serving,
    rss_mib,
    wait_until_serving,
)
from client import (
    AsyncAdminClient,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    Producer,
    RecordFuture,
    RecordMetadata,
)
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc
from proto.batch import encode_columns

TOPIC = "bench"
E2E_TOPIC = "bench-e2e"
#: The topic of the per-record phases, as many partitions as the bulk one.
PER_RECORD_TOPIC = "bench-per-record"
PARTITIONS = 4
#: The consumer's receive queue in the consume phase: two 1 MiB batches of 100 B records
#: may be on their way while the application works through a third.
CONSUME_QUEUE = 20_000
#: The broker's cap on unacked records per subscription (default 1,000), raised as the
#: JetStream consumer's ``max_ack_pending`` is raised in this bench, and to the same value.
MAX_UNACKED = NATS_MAX_ACK_PENDING


class HeadraceSystem:
    """``headrace serve`` with fsync ``always``, measured through the Python client."""

    system = "headrace"
    fsync = "always"

    def __init__(self, data_dir: Path) -> None:
        self._process, self._address = serve_process(
            data_dir, f"[broker]\nmax_unacked = {MAX_UNACKED}\n"
        )

    async def start(self) -> None:
        self._process.start()
        await wait_until_serving(self._probe_admin, timeout_s=60, process=self._process)
        async with AsyncAdminClient(self._address) as admin:
            await admin.create_topic(TOPIC, PARTITIONS)
            await admin.create_topic(E2E_TOPIC, 1)
            await admin.create_topic(PER_RECORD_TOPIC, PARTITIONS)

    async def _probe_admin(self) -> None:
        await probe_admin(self._address)

    async def publish(self, count: int, payload: bytes) -> float:
        values = [payload] * count
        async with AsyncProducer(self._address) as producer:
            started = time.perf_counter()
            sent = await (await producer.send_many(TOPIC, values))  # raises on any failure
            elapsed = time.perf_counter() - started
        if len(sent) != count:
            raise ServerFailedError(f"{len(sent)} of {count} records were acknowledged")
        return elapsed

    async def consume(self, count: int) -> float:
        started = time.perf_counter()
        async with AsyncConsumer(
            TOPIC, "bench-consume", broker=self._address, receive_queue=CONSUME_QUEUE
        ) as consumer:
            taken = 0
            while taken < count:
                batch = await consumer.receive_batch(10_000, timeout=30)
                for message in batch:
                    message.value  # noqa: B018 - the application gets every value in hand
                consumer.ack_many(batch)
                taken += len(batch)
        # Leaving the block sent the last acks and saw the broker end the stream, which it
        # does after applying every ack before the half-close.
        return time.perf_counter() - started

    async def send_per_record(self, count: int, payload: bytes) -> float:
        async with AsyncProducer(self._address) as producer:
            started = time.perf_counter()
            futures = [await producer.send(PER_RECORD_TOPIC, payload) for _ in range(count)]
            await producer.flush()
            elapsed = time.perf_counter() - started
        _check_acknowledged(futures)
        return elapsed

    async def sync_send_per_record(self, count: int, payload: bytes) -> float:
        return await asyncio.to_thread(_sync_send, self._address, count, payload)

    async def consume_per_record(self, count: int) -> float:
        taken = 0
        started = time.perf_counter()
        async with AsyncConsumer(
            PER_RECORD_TOPIC, "bench-per-record", broker=self._address
        ) as consumer:
            async for message in consumer:
                message.value  # noqa: B018 - the application gets every value in hand
                consumer.ack(message)
                taken += 1
                if taken == count:
                    break
        return time.perf_counter() - started

    async def sync_consume_per_record(self, count: int) -> float:
        return await asyncio.to_thread(_sync_consume, self._address, count)

    async def e2e(self, rate: float, seconds: float) -> list[float]:
        async with AsyncProducer(self._address, linger_ms=0) as producer:

            async def send(payload: bytes) -> None:
                await producer.publish(E2E_TOPIC, payload)

            consume = e2e_consumer(self._address, E2E_TOPIC, "bench-e2e")
            return await measure_e2e(rate, seconds, send, consume)

    async def kill_and_restart(self) -> float:
        return await restart_to_serving(self._process, self._probe_publish)

    async def _probe_publish(self) -> None:
        channel = fresh_channel(self._address)
        try:
            stub = broker_pb2_grpc.BrokerStub(channel)
            request = _pb.PublishRequest(topic=TOPIC, partition=0, batch=encode_columns([b"probe"]))
            await stub.Publish(request, timeout=1)
        finally:
            await channel.close()

    def rss_mib(self) -> float:
        return rss_mib(self._process.pid)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._process.stop)


def e2e_consumer(
    address: str, topic: str, subscription: str
) -> Callable[[LatencyRecorder], Coroutine[object, object, None]]:
    """The consumer of an e2e phase (:func:`bench._pubsub_system.measure_e2e`): it
    subscribes to ``topic`` at ``latest``, records each message's latency and acks it."""

    async def consume(recorder: LatencyRecorder) -> None:
        async with AsyncConsumer(
            topic, subscription, broker=address, initial_position="latest"
        ) as consumer:
            recorder.set_ready()
            while recorder.running:
                try:
                    batch = await consumer.receive_batch(timeout=0.1)
                except TimeoutError:
                    continue
                for message in batch:
                    recorder.record(message.value)
                    consumer.ack(message)

    return consume


def _sync_send(address: str, count: int, payload: bytes) -> float:
    """Seconds for a blocking :class:`Producer` to send ``count`` records one ``send`` at a
    time and flush; every record must be acknowledged. Runs on a thread without a loop."""
    with Producer(address) as producer:
        started = time.perf_counter()
        futures = [producer.send(PER_RECORD_TOPIC, payload) for _ in range(count)]
        producer.flush()
        elapsed = time.perf_counter() - started
    _check_acknowledged(futures)
    return elapsed


def _sync_consume(address: str, count: int) -> float:
    """Seconds for a blocking :class:`Consumer` to take ``count`` records with a ``for``
    loop, acking each, and close (the last acks applied). Runs on a thread without a loop."""
    started = time.perf_counter()
    with Consumer(PER_RECORD_TOPIC, "bench-per-record-sync", broker=address) as consumer:
        for message in itertools.islice(consumer, count):  # takes no message past ``count``
            message.value  # noqa: B018 - the application gets every value in hand
            consumer.ack(message)
    return time.perf_counter() - started


def _check_acknowledged(
    futures: Sequence[RecordFuture | concurrent.futures.Future[RecordMetadata]],
) -> None:
    """Raise unless every send's future holds its record's metadata (after a flush)."""
    failed = [f for f in futures if not f.done() or f.cancelled() or f.exception() is not None]
    if failed:
        first = next((f.exception() for f in failed if f.done() and not f.cancelled()), None)
        raise ServerFailedError(
            f"{len(failed)} of {len(futures)} records were not acknowledged "
            f"(first error: {first!r})"
        )


def serve_process(directory: Path, config: str) -> tuple[ServerProcess, str]:
    """``headrace serve`` (not started yet) on a free loopback port, with ``config`` as its
    TOML file, its data and log in ``directory``, no metrics listener, warnings only.
    Returns the process and its address."""
    address = f"127.0.0.1:{free_port()}"
    path = directory / "headrace.toml"
    path.write_text(config)
    argv = [sys.executable, "-c", "from broker.cli import main; main()", "serve"]
    argv += ["--config", str(path), "--data-dir", str(directory / "data")]
    argv += ["--listen", address, "--metrics-listen", "", "--log-level", "WARNING"]
    return ServerProcess(argv, directory / "headrace.log"), address


async def probe_admin(address: str) -> None:
    """One admin call on a fresh channel: succeeds once the broker serves."""
    async with AsyncAdminClient(address, channel=fresh_channel(address)) as admin:
        await admin.list_topics()


def fresh_channel(address: str) -> grpc.aio.Channel:
    """A channel with its own subchannel pool: no connection backoff left by a dead server."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
