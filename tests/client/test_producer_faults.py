"""The AsyncProducer under faults, against a real broker over real gRPC on loopback.

- A TCP proxy between producer and broker cuts every connection through it again and
  again, while a slow fdatasync keeps each batch in the broker's log writer long enough
  for the cuts to land mid-append; the log must then hold every record exactly once.
- A gRPC front forwards every call to the broker and answers chosen Publishes with an
  error *after* the broker appended them: the producer must not reuse their sequences.
- The log is cut back behind the broker's back, so the producer's next batch leaves a
  sequence gap: the producer must go on under a new producer id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.app import Broker
from client import (
    AsyncAdminClient,
    AsyncProducer,
    ClientError,
    FailedPrecondition,
    PublishOutcome,
    RecordFuture,
    RecordMetadata,
)
from proto import broker_pb2 as _pb
from tests.broker.conftest import broker_config
from tests.client.conftest import address, read_batches, read_partition
from wal import FaultyFs, iter_batches


class SlowSyncFs(FaultyFs):
    """Every fdatasync takes ``delay_s`` longer, so batches wait in the log writer."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def fdatasync(self, fd: int) -> None:
        time.sleep(self.delay_s)  # on the writer's worker thread, never the loop
        super().fdatasync(fd)


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 to ``upstream``: it forwards bytes both ways and, after
    every ``every``-th chunk from a client, cuts every connection through it (both sides
    aborted, as a dropped network would) ``delay_s`` later, ``max_cuts`` times at most.

    Cutting on client chunks, not on a timer, aims the cuts at requests the broker has
    just received: with a slow fdatasync they land while the batch waits in the writer.
    """

    def __init__(self, upstream: int, *, every: int, delay_s: float, max_cuts: int) -> None:
        self.upstream = upstream
        self.every = every
        self.delay_s = delay_s
        self.max_cuts = max_cuts
        self.cuts = 0
        self._chunks = 0
        self._live: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen on an ephemeral loopback port; return its ``host:port``."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    def cut(self) -> None:
        """Abort every live connection, both the client's side and the broker's."""
        self.cuts += 1
        for writer in list(self._live):
            writer.transport.abort()
        self._live.clear()

    async def aclose(self) -> None:
        assert self._server is not None
        self._server.close()
        self.max_cuts = self.cuts  # no more cuts
        for writer in list(self._live):
            writer.transport.abort()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._live |= {writer, up_writer}
        for task in (
            asyncio.create_task(self._pipe(reader, up_writer, from_client=True)),
            asyncio.create_task(self._pipe(up_reader, writer, from_client=False)),
        ):
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, from_client: bool
    ) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
                if from_client:
                    self._client_chunk()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()
            self._live.discard(writer)

    def _client_chunk(self) -> None:
        self._chunks += 1
        if self._chunks % self.every == 0 and self.cuts < self.max_cuts:
            asyncio.get_running_loop().call_later(self.delay_s, self._cut_if_allowed)

    def _cut_if_allowed(self) -> None:
        if self.cuts < self.max_cuts:
            self.cut()


@contextlib.asynccontextmanager
async def slow_broker(tmp_path: Path, delay_s: float) -> AsyncIterator[Broker]:
    """A broker whose every fdatasync takes ``delay_s`` longer."""
    async with Broker(broker_config(tmp_path / "d"), fs=SlowSyncFs(delay_s)) as running:
        yield running


async def acknowledged(futures: list[RecordFuture]) -> list[bool]:
    """For each send, whether the producer reported it acknowledged (else it failed)."""
    results = await asyncio.gather(*futures, return_exceptions=True)
    for r in results:
        assert isinstance(r, RecordMetadata | ClientError), r
    return [isinstance(r, RecordMetadata) for r in results]


@pytest.mark.asyncio
@pytest.mark.parametrize(("linger_ms", "max_in_flight"), [(2, 1), (2, 5), (0, None)])
async def test_connections_cut_mid_append_never_duplicate_a_record(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    linger_ms: float,
    max_in_flight: int | None,
) -> None:
    """Scenario: an AsyncProducer sends distinct keyed records to a 2-partition topic, one
    a millisecond, through a proxy that cuts every connection 5 ms after every 3rd chunk
    the producer sends, until it has cut 40 times (at most 3,000 records); each fdatasync
    takes 20 ms more, so cuts land while batches wait in the writer, and the producer
    retries the same bytes (unary; the whole window of 5 on a new PublishStream; or, the
    ``linger_ms=0`` default, the one batch of the stream's window).
    Expected: the proxy really cut 40 times; every send is
    acknowledged, the log holds each key exactly once, and the broker logged nothing at
    ERROR for the cancelled calls."""
    caplog.set_level(logging.WARNING)
    async with slow_broker(tmp_path, 0.02) as broker:
        async with AsyncAdminClient(f"127.0.0.1:{broker.port}") as admin:
            await admin.create_topic("cut", 2)
        proxy = CuttingProxy(broker.port, every=3, delay_s=0.005, max_cuts=40)
        target = await proxy.start()
        try:
            async with AsyncProducer(
                target,
                linger_ms=linger_ms,
                batch_max_bytes=2_000,
                delivery_timeout_s=60,
                max_in_flight=max_in_flight,
            ) as producer:
                assert producer.streams == (max_in_flight != 1)
                keys: list[bytes] = []
                futures = []
                while proxy.cuts < proxy.max_cuts and len(keys) < 3_000:
                    keys.append(b"k%04d" % len(keys))
                    futures.append(await producer.send("cut", b"v", key=keys[-1]))
                    await asyncio.sleep(0.001)
                acked = await acknowledged(futures)
        finally:
            await proxy.aclose()
        stored = [k for p in (0, 1) for _, _, k in await read_partition(broker, "cut", p)]
    assert proxy.cuts == 40
    counts = Counter(stored)
    assert all(acked)
    assert [k for k, n in counts.items() if n > 1] == []
    assert set(counts) == set(keys)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# -- an error answered after the append ---------------------------------------------------


class FaultyFront:
    """A gRPC server on 127.0.0.1 that forwards every unary call, as bytes, to the broker
    at ``upstream``; the ``n``-th Publish (from 1) listed in ``fail`` is forwarded, and once
    the broker has answered it (the batch is appended) the front answers ``fail[n]``
    instead: a broker that fails after appending, as seen by its client."""

    def __init__(self, upstream: str, fail: dict[int, grpc.StatusCode]) -> None:
        self.fail = fail
        self.publishes = 0
        self._channel = grpc.aio.insecure_channel(upstream)
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((_Forwarding(self.forward, self.forward_stream),))
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"

    async def __aenter__(self) -> FaultyFront:
        await self._server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.stop(None)
        await self._channel.close()

    async def forward(self, method: str, request: bytes, context: Any) -> bytes:
        """Forward one call; answer the broker's status, or the injected one."""
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(
            method  # no (de)serializers: bytes in, bytes out
        )
        try:
            response: bytes = await call(request, timeout=context.time_remaining())
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        if method.endswith("/Publish"):
            self.publishes += 1
            code = self.fail.get(self.publishes)
            if code is not None:
                await context.abort(code, "injected by the test after the broker appended")
        return response

    async def forward_stream(
        self, method: str, requests: AsyncIterator[bytes], context: Any
    ) -> AsyncIterator[bytes]:
        """Forward a PublishStream: each answer is the broker's, or, for the publishes
        counted in ``fail``, that answer turned into the injected error (after the append)."""
        call: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = self._channel.stream_stream(method)
        upstream = call()

        async def pump() -> None:
            async for request in requests:
                await upstream.write(request)
            await upstream.done_writing()

        pumping = asyncio.create_task(pump())
        try:
            async for answer in upstream:
                self.publishes += 1
                code = self.fail.get(self.publishes)
                raw: bytes = answer
                if code is not None:
                    request_id = _pb.PublishResponse.FromString(answer).request_id
                    raw = _pb.PublishResponse(
                        request_id=request_id,
                        error_code=code.value[0],
                        error_message="injected by the test after the broker appended",
                    ).SerializeToString()
                yield raw
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        finally:
            pumping.cancel()
            upstream.cancel()


class _Forwarding(grpc.GenericRpcHandler):
    """Every method without (de)serializers (the handler sees raw bytes): unary, but
    PublishStream as a stream."""

    def __init__(
        self,
        forward: Callable[[str, bytes, Any], Awaitable[bytes]],
        forward_stream: Callable[[str, AsyncIterator[bytes], Any], AsyncIterator[bytes]],
    ) -> None:
        self._forward = forward
        self._forward_stream = forward_stream

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        method: str = details.method
        if method.endswith("/PublishStream"):
            return grpc.stream_stream_rpc_method_handler(
                functools.partial(self._forward_stream, method)
            )
        return grpc.unary_unary_rpc_method_handler(functools.partial(self._forward, method))


@pytest.mark.asyncio
@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN])
async def test_an_error_after_the_append_never_lends_its_sequences(
    broker: Broker, code: grpc.StatusCode
) -> None:
    """Scenario: through a front that answers ``code`` to the first Publish after the
    broker appended it, a producer sends batch a (2 records), then batch b (2 records: the
    same size, so under a's sequences the broker would take b for a's duplicate).
    Expected: a fails with ``code``, outcome UNKNOWN and a message saying it may have been
    written; b is acknowledged at offsets 2-3, not as a duplicate; the log holds a0 a1 b0
    b1, b under another producer id than a: every acknowledged record is in the log."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("f", 1)
    async with (
        FaultyFront(address(broker), fail={1: code}) as front,
        AsyncProducer(front.address, linger_ms=0, max_in_flight=1) as producer,  # unary
    ):
        with pytest.raises(ClientError) as failed:
            await (await producer.send_many("f", [b"a0", b"a1"], partition=0))
        sent = await (await producer.send_many("f", [b"b0", b"b1"], partition=0))
    assert (failed.value.code, failed.value.outcome) == (code, PublishOutcome.UNKNOWN)
    assert str(failed.value).endswith("(may or may not have been written; resending may duplicate)")
    assert [(m.offset, m.duplicate) for m in sent] == [(2, False), (3, False)]
    batches = await read_batches(broker, "f", 0)
    assert [v for b in batches for v in b.values()] == [b"a0", b"a1", b"b0", b"b1"]
    assert batches[0].producer_id != batches[1].producer_id


# -- a sequence gap -----------------------------------------------------------------------


def cut_log_to_first_batch(data_dir: Path, topic: str) -> None:
    """Cut partition 0 of ``topic`` back to its first batch, behind the broker's back:
    truncate the segment, drop its index (a cache) and the producer snapshot."""
    partition = data_dir / "topics" / topic / "0"
    segment = partition / ("0" * 20 + ".log")
    first = next(iter_batches(segment.read_bytes()))
    with segment.open("r+b") as f:
        f.truncate(len(first.buffer))
    (partition / ("0" * 20 + ".index")).unlink(missing_ok=True)
    (data_dir / "topics" / topic / "0.producers.json").unlink()


@pytest.mark.asyncio
async def test_a_sequence_gap_moves_the_producer_to_a_new_id(tmp_path: Path) -> None:
    """Scenario: a producer publishes batches a and b (2 records each); the broker stops
    and its log is cut back to batch a behind its back (acknowledged b is gone); the broker
    restarts on the same port. The producer sends c (a sequence gap for the broker), then
    five more batches, then c again. Expected: c fails FAILED_PRECONDITION with outcome
    REFUSED and a message saying it was not written and is safe to resend; every later
    batch is acknowledged, under one new producer id, and so is the re-sent c; the log
    holds a, the five batches and c, each once."""
    config = broker_config(tmp_path / "d")
    first = Broker(config)
    await first.start()
    config = config.replace(listen=f"127.0.0.1:{first.port}")
    async with AsyncAdminClient(address(first)) as admin:
        await admin.create_topic("g", 1)
    channel = grpc.aio.insecure_channel(address(first))
    async with AsyncProducer(channel=channel, linger_ms=0) as producer:

        async def send(*values: bytes) -> Any:
            return await (await producer.send_many("g", list(values), partition=0))

        await send(b"a0", b"a1")
        await send(b"b0", b"b1")
        await first.aclose()
        cut_log_to_first_batch(tmp_path / "d", "g")
        async with Broker(config) as second:
            await asyncio.wait_for(channel.channel_ready(), 10)
            with pytest.raises(FailedPrecondition) as gap:
                await send(b"c0", b"c1")
            later = [await send(b"d%d" % i) for i in range(5)]
            resent = await send(b"c0", b"c1")
            batches = await read_batches(second, "g", 0)
    await channel.close()
    assert gap.value.outcome is PublishOutcome.REFUSED
    assert "expected 2" in str(gap.value)
    assert str(gap.value).endswith("(not written; safe to resend)")
    assert [r[0].offset for r in later] == [2, 3, 4, 5, 6]
    assert [m.offset for m in resent] == [7, 8]
    values = [v for b in batches for v in b.values()]
    assert values == [b"a0", b"a1", b"d0", b"d1", b"d2", b"d3", b"d4", b"c0", b"c1"]
    assert len({b.producer_id for b in batches[1:]}) == 1
    assert batches[0].producer_id != batches[1].producer_id
