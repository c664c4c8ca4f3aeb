"""Redis with one replica and ``WAIT 1`` after every write, for the ``replication`` scenario.

Owns :class:`RedisWait1`: a Redis primary and one replica (``replicaof``) on loopback, both
with ``appendonly yes`` and ``appendfsync always`` and RDB snapshots off (the argv of
:func:`bench._peers.redis_argv`, the server ``bench pubsub`` uses: Debian's
``redis-server``), a stream written with ``XADD`` and each ``XADD`` followed by
``WAIT 1 <timeout>`` in the same pipeline, on one connection.

What the acknowledgement means: the primary answers the ``XADD`` after its AOF fsync
(``appendfsync always``); ``WAIT 1`` returns once the replica has acknowledged the
replication offset of that write, i.e. received and applied it. ``WAIT`` does not promise
that the replica has fsynced it (Redis 7.2's ``WAITAOF`` does; Debian 12's 7.0 has none).
A write whose ``WAIT`` counts no replica within the timeout fails the run.

- ``publish``: :data:`CONNECTIONS` connections, each sending ``XADD`` + ``WAIT 1`` and
  awaiting both replies before its next write. Redis blocks a client in ``WAIT``, so the
  writes of one connection cannot overlap: WAIT after every write means one write in
  flight per connection, and the connections are the window.
- ``e2e``: each paced message is its own ``XADD`` + ``WAIT 1``; the consumer blocks in
  ``XREADGROUP`` on the primary and ``XACK``s what it read. A reader of the primary can see
  a write before its ``WAIT`` returns (Redis serves what the primary holds, replicated or
  not), so this latency does not wait for the replica; the publisher's acknowledgement
  does.

Depends on redis-py (imported when the system runs) and on no Headrace package.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench._peers import (
    REDIS_CONSUMER,
    REDIS_FIELD,
    REDIS_GROUP,
    REDIS_MAX_CONNECTIONS,
    REDIS_READ_BATCH,
    REDIS_STREAM,
    _close_quietly,
    redis_argv,
    redis_client,
    stream_entries,
)
from bench._pubsub_system import LatencyRecorder, measure_e2e
from bench._server_process import (
    ServerFailedError,
    ServerProcess,
    distinct_ports,
    wait_until_serving,
)

#: The e2e phase's stream: the publish phase's entries are not its consumer's to read.
E2E_STREAM = b"bench-e2e"
#: Connections writing at once in the publish phase (all of the client pool's).
CONNECTIONS = REDIS_MAX_CONNECTIONS
#: ``WAIT``'s timeout, ms: a write not replicated within it fails the run.
WAIT_TIMEOUT_MS = 5000
#: How long the replica may take to finish its first sync with the primary, seconds.
SYNC_WITHIN_S = 60.0
#: The e2e consumer's longest block in XREADGROUP, ms (it returns this soon when told to).
_E2E_BLOCK_MS = 100


def replica_argv(binary: str, port: int, data_dir: Path, primary_port: int) -> list[str]:
    """The replica's argv: the primary's settings plus ``replicaof`` the primary (pure)."""
    return [
        *redis_argv(binary, port, data_dir, "always"),
        "--replicaof",
        "127.0.0.1",
        str(primary_port),
    ]


def primary_argv(binary: str, port: int, data_dir: Path) -> list[str]:
    """The primary's argv (pure): AOF synced always, and a replica's first full sync
    started at once (Redis waits 5 s for more replicas by default)."""
    return [*redis_argv(binary, port, data_dir, "always"), "--repl-diskless-sync-delay", "0"]


def replica_online(info: dict[str, Any]) -> bool:
    """Whether an ``INFO replication`` reply of the primary shows its replica online."""
    replica = info.get("slave0")
    return (
        int(info.get("connected_slaves", 0)) >= 1
        and isinstance(replica, dict)
        and (replica.get("state") == "online")
    )


async def _write(client: Any, stream: bytes, payload: bytes) -> None:
    """One ``XADD`` and its ``WAIT 1``, pipelined on one connection.

    Raises:
        ServerFailedError: no replica acknowledged the write within the timeout.
    """
    pipe = client.pipeline(transaction=False)
    pipe.xadd(stream, {REDIS_FIELD: payload})
    pipe.execute_command("WAIT", 1, WAIT_TIMEOUT_MS)
    _, replicas = await pipe.execute()
    if int(replicas) < 1:
        raise ServerFailedError(f"WAIT 1 timed out after {WAIT_TIMEOUT_MS} ms: no replica acked")


class RedisWait1:
    """A Redis primary and one replica, AOF synced always, ``WAIT 1`` after each write.

    Not task-safe: driven by one task at a time.
    """

    system = "redis-wait1"
    fsync = "always"
    replicas = 2
    acked = "primary synced + WAIT 1"

    def __init__(self, data_dir: Path, *, binary: str = "redis-server") -> None:
        self._port, replica_port = distinct_ports(2)
        primary_dir, replica_dir = data_dir / "primary", data_dir / "replica"
        primary_dir.mkdir()
        replica_dir.mkdir()
        self._primary = ServerProcess(
            primary_argv(binary, self._port, primary_dir), data_dir / "primary.log"
        )
        self._replica = ServerProcess(
            replica_argv(binary, replica_port, replica_dir, self._port), data_dir / "replica.log"
        )
        self._client: Any = None
        self.version = "unknown"

    async def start(self) -> None:
        """Start both servers; return once the replica is online and a write was replicated."""
        self._primary.start()
        self._replica.start()
        self._client = redis_client(self._port)
        await wait_until_serving(self._client.ping, timeout_s=SYNC_WITHIN_S, process=self._primary)
        await wait_until_serving(
            self._replica_synced, timeout_s=SYNC_WITHIN_S, process=self._replica
        )
        await _write(self._client, E2E_STREAM, b"probe")  # replicated end to end once
        # At "$": the probe, written before the group, is not the e2e consumer's to read.
        await self._client.xgroup_create(E2E_STREAM, REDIS_GROUP, id="$")
        self.version = str((await self._client.info("server"))["redis_version"])

    async def _replica_synced(self) -> None:
        if not replica_online(await self._client.info("replication")):
            raise ServerFailedError("the replica is not online yet")

    async def publish(self, count: int, payload: bytes) -> float:
        """``count`` writes over :data:`CONNECTIONS` connections, each ``XADD`` + ``WAIT 1``."""
        client = self._client
        writes = iter(range(count))

        async def connection() -> None:
            for _ in writes:  # shared: each connection takes the next write
                await _write(client, REDIS_STREAM, payload)

        started = time.perf_counter()
        await asyncio.gather(*(connection() for _ in range(min(CONNECTIONS, count))))
        return time.perf_counter() - started

    async def e2e(self, rate: float, seconds: float) -> list[float]:
        """Each paced message an ``XADD`` + ``WAIT 1``; the consumer blocks in
        ``XREADGROUP`` on its own connection and ``XACK``s each read."""
        client, port = self._client, self._port

        async def send(payload: bytes) -> None:
            await _write(client, E2E_STREAM, payload)

        async def consume(recorder: LatencyRecorder) -> None:
            reader = redis_client(port)
            try:
                recorder.set_ready()
                while recorder.running:
                    reply = await reader.xreadgroup(
                        REDIS_GROUP,
                        REDIS_CONSUMER,
                        {E2E_STREAM: ">"},
                        count=REDIS_READ_BATCH,
                        block=_E2E_BLOCK_MS,
                    )
                    entries = stream_entries(reply)
                    for _, fields in entries:
                        recorder.record(fields[REDIS_FIELD])
                    if entries:
                        await reader.xack(E2E_STREAM, REDIS_GROUP, *(i for i, _ in entries))
            finally:
                await _close_quietly(reader.aclose)

        return await measure_e2e(rate, seconds, send, consume)

    async def stop(self) -> None:
        """Close the client and stop both servers; safe to call twice."""
        if self._client is not None:
            await _close_quietly(self._client.aclose)
        self._client = None
        await asyncio.to_thread(self._replica.stop)
        await asyncio.to_thread(self._primary.stop)
