"""The AsyncProducer under faults, against a real broker over real gRPC on loopback.

A TCP proxy between producer and broker cuts every connection through it again and again,
while a slow fdatasync keeps each batch in the broker's log writer long enough for the
cuts to land mid-append; the log must then hold every record exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.app import Broker
from client import AsyncAdminClient, AsyncProducer, ClientError, RecordMetadata
from tests.broker.conftest import broker_config
from tests.client.conftest import read_partition
from wal import FaultyFs


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


async def acknowledged(futures: list[asyncio.Future[RecordMetadata]]) -> list[bool]:
    """For each send, whether the producer reported it acknowledged (else it failed)."""
    results = await asyncio.gather(*futures, return_exceptions=True)
    for r in results:
        assert isinstance(r, RecordMetadata | ClientError), r
    return [isinstance(r, RecordMetadata) for r in results]


@pytest.mark.asyncio
async def test_connections_cut_mid_append_never_duplicate_a_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: an AsyncProducer sends distinct keyed records to a 2-partition topic, one
    a millisecond, through a proxy that cuts every connection 5 ms after every 3rd chunk
    the producer sends, until it has cut 40 times (at most 3,000 records); each fdatasync
    takes 20 ms more, so cuts land while batches wait in the writer, and the producer
    retries the same bytes. Expected: the proxy really cut 40 times; every send is
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
                target, linger_ms=2, batch_max_bytes=2_000, delivery_timeout_s=60
            ) as producer:
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
