"""A bare gRPC fan-out: the floor under the ``dispatch`` scenario's fan-out latency.

Owns :func:`measure` and the two processes it runs (:func:`server_main` and
:func:`consumer_main`). It moves what the e2e phase moves (stamped 100 B records from an
open-loop publisher to ``streams`` subscribers) over the same transport as Headrace
(grpc.aio on loopback, uvloop, one server process, one consumer process with one channel
and one stream per subscriber), and does nothing else: no log, no fsync, no cursor, no
acks. The server forwards the publishes that arrive in one turn of its loop as one message
per stream, as a group commit would. Its latency is what any broker written with Python
gRPC pays on this machine before it does any work of its own.

The messages are raw bytes (generic handlers, no protobuf): a stream message is a run of
records, each prefixed with its length as 4 bytes, big-endian; an empty message says the
stream is subscribed.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import time
from array import array
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc

from bench import _fanout_child as _child
from bench._measure import new_runner
from bench._pubsub_system import E2E_PAYLOAD_BYTES, read_stamp, stamp_payload
from bench._server_process import ServerProcess, free_port, wait_until_serving

SYSTEM = "grpc-aio-floor"
_PUBLISH = "/headrace.bench.Fanout/Publish"
_SUBSCRIBE = "/headrace.bench.Fanout/Subscribe"
_LENGTH = struct.Struct(">I")
_SERVER = "from bench._fanout_floor import server_main; server_main()"
_CONSUMER = "from bench._fanout_floor import consumer_main; consumer_main()"


def _same(data: bytes) -> bytes:
    return data


# ---------------------------------------------------------------------------------------
# The driver


async def measure(
    directory: Path, *, streams: int, rate: float, seconds: float, grace_s: float
) -> tuple[list[float], int]:
    """Latencies (ms, ascending) of every (record, stream) pair that arrived within
    ``grace_s`` of the last send, and the number of records sent.

    Raises:
        ServerFailedError: the server or the consumer process failed or never got ready.
    """
    address = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, "-c", _SERVER, "--listen", address]
    server = ServerProcess(argv, directory / "floor-server.log")
    server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            publish = channel.unary_unary(
                _PUBLISH, request_serializer=_same, response_deserializer=_same
            )
            stamp = stamp_payload(time.monotonic_ns(), E2E_PAYLOAD_BYTES)
            await wait_until_serving(
                lambda: publish(stamp, timeout=1), timeout_s=_child.READY_TIMEOUT_S, process=server
            )
            return await _child.drive(
                _CONSUMER,
                server=address,
                subscribers=streams,
                rate=rate,
                seconds=seconds,
                grace_s=grace_s,
                publish=publish,
                directory=directory,
                name="floor",
            )
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------
# The server process


def server_main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the server process: serve until killed."""
    parser = argparse.ArgumentParser(prog="bench fan-out floor server")
    parser.add_argument("--listen", required=True)
    args = parser.parse_args(argv)
    _, runner = new_runner()
    with runner:
        runner.run(_serve(args.listen))


async def _serve(address: str) -> None:
    streams: list[asyncio.Queue[bytes]] = []
    pending: list[bytes] = []
    arrived = asyncio.Event()

    async def fan_out() -> None:
        while True:
            await arrived.wait()
            arrived.clear()
            await asyncio.sleep(0)  # the publishes of this turn of the loop join in
            group = b"".join(_LENGTH.pack(len(p)) + p for p in pending)
            pending.clear()
            for queue in streams:
                queue.put_nowait(group)

    async def publish(request: bytes, _context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        pending.append(request)
        arrived.set()
        return b""

    async def subscribe(
        _request: bytes, _context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        streams.append(queue)
        try:
            yield b""  # subscribed
            while True:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                yield b"".join(items)
        finally:
            streams.remove(queue)

    handler = grpc.method_handlers_generic_handler(
        "headrace.bench.Fanout",
        {
            "Publish": grpc.unary_unary_rpc_method_handler(publish, _same, _same),
            "Subscribe": grpc.unary_stream_rpc_method_handler(subscribe, _same, _same),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(address)
    await server.start()
    fanning = asyncio.create_task(fan_out())
    try:
        await server.wait_for_termination()
    finally:
        fanning.cancel()


# ---------------------------------------------------------------------------------------
# The consumer process


def consumer_main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the consumer process (the protocol of :mod:`bench._fanout_child`)."""
    _child.main("bench fan-out floor consumer", _consume, argv)


async def _consume(address: str, streams: int, expected: int) -> array[float]:
    latencies = array("d")
    counts = [0] * streams
    done = asyncio.Event()
    subscribed = [asyncio.Event() for _ in range(streams)]
    channels = [grpc.aio.insecure_channel(address) for _ in range(streams)]

    async def take(i: int) -> None:
        call = channels[i].unary_stream(
            _SUBSCRIBE, request_serializer=_same, response_deserializer=_same
        )(b"")
        async for message in call:
            now = time.monotonic_ns()
            subscribed[i].set()
            pos = 0
            while pos < len(message):
                (length,) = _LENGTH.unpack_from(message, pos)
                pos += _LENGTH.size
                latencies.append((now - read_stamp(message[pos : pos + length])) / 1e6)
                pos += length
                counts[i] += 1
            if all(count >= expected for count in counts):
                done.set()

    async def close() -> None:
        await asyncio.gather(*(channel.close() for channel in channels))

    await _child.consume(
        [take(i) for i in range(streams)],
        asyncio.gather(*(event.wait() for event in subscribed)),
        done,
        close,
    )
    return latencies
