"""Redis Streams fanned out to many consumer groups: a real broker beside Headrace's fan-out.

Owns :func:`measure` and the consumer process it runs (:func:`consumer_main`). It moves
what the ``dispatch`` scenario's e2e phase moves (stamped 100 B records from an open-loop
publisher to ``groups`` subscribers, each of which gets every record) through Debian's
``redis-server`` with AOF ``appendfsync always`` (durable before the reply, as Headrace's
``fsync = "always"``): one stream, one consumer group per subscriber (a subscription, in
Headrace's words), created at ``$`` before the clock runs. The consumer process holds one
connection per group, as redis-py needs for blocking reads; each blocks in ``XREADGROUP``
(up to :data:`READ_BATCH` entries) and ``XACK``\\ s what each read returned. The publisher's
``XADD``\\ s run concurrently, one task per paced send, as in ``bench pubsub``.

The server is C; the consumers run in one Python process, like Headrace's. So the gap
between the two shows what Headrace's broker adds, and what both share shows what the
machine and the Python clients cost.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import _fanout_child as _child
from bench._peers import REDIS, redis_argv, redis_client, stream_entries
from bench._pubsub_system import read_stamp
from bench._server_process import ServerProcess, free_port, wait_until_serving

SYSTEM = REDIS.system
FSYNC = "always"
STREAM = b"fanout"
FIELD = b"v"
#: Entries one XREADGROUP returns at most.
READ_BATCH = 1000
#: How long a blocking read waits before it looks whether it should stop, ms.
_BLOCK_MS = 100
_CONSUMER = "from bench._fanout_redis import consumer_main; consumer_main()"


def group_names(groups: int) -> list[bytes]:
    """The consumer groups' names, one per subscriber."""
    return [f"fan-{i}".encode() for i in range(groups)]


async def measure(
    directory: Path, *, binary: str, groups: int, rate: float, seconds: float, grace_s: float
) -> tuple[list[float], int]:
    """Latencies (ms, ascending) of every (record, group) pair that arrived within
    ``grace_s`` of the last send, and the number of records sent.

    Raises:
        ServerFailedError: redis-server or the consumer process failed or never got ready.
    """
    port = free_port()
    server = ServerProcess(
        redis_argv(binary, port, directory, FSYNC), directory / "redis-server.log"
    )
    server.start()
    client = redis_client(port)
    try:
        await wait_until_serving(client.ping, timeout_s=_child.READY_TIMEOUT_S, process=server)
        await client.delete(STREAM)  # a fresh stream, whatever the directory held
        for name in group_names(groups):
            await client.xgroup_create(STREAM, name, id="$", mkstream=True)

        async def publish(payload: bytes) -> None:
            await client.xadd(STREAM, {FIELD: payload})

        return await _child.drive(
            _CONSUMER,
            server=str(port),
            subscribers=groups,
            rate=rate,
            seconds=seconds,
            grace_s=grace_s,
            publish=publish,
            directory=directory,
            name="redis",
        )
    finally:
        await client.aclose()
        server.stop()


# ---------------------------------------------------------------------------------------
# The consumer process


def consumer_main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the consumer process (the protocol of :mod:`bench._fanout_child`)."""
    _child.main("bench fan-out redis consumer", _consume, argv)


async def _consume(port: str, groups: int, expected: int) -> array[float]:
    latencies = array("d")
    names = group_names(groups)
    counts = dict.fromkeys(names, 0)
    done = asyncio.Event()
    clients = [redis_client(int(port)) for _ in names]

    async def take(client: Any, group: bytes) -> None:
        while counts[group] < expected:
            reply = await client.xreadgroup(
                group, b"c", {STREAM: ">"}, count=READ_BATCH, block=_BLOCK_MS
            )
            now = time.monotonic_ns()
            entries = stream_entries(reply)
            latencies.extend([(now - read_stamp(fields[FIELD])) / 1e6 for _, fields in entries])
            if entries:
                await client.xack(STREAM, group, *(entry_id for entry_id, _ in entries))
            counts[group] += len(entries)
        if all(count >= expected for count in counts.values()):
            done.set()

    async def close() -> None:
        await asyncio.gather(*(client.aclose() for client in clients))

    await _child.consume(
        [take(client, group) for client, group in zip(clients, names, strict=True)],
        asyncio.gather(*(client.ping() for client in clients)),
        done,
        close,
    )
    return latencies
