"""The peers of the ``pubsub`` scenario: NATS JetStream and Redis Streams, and their servers.

Owns the two :class:`~bench._pubsub_system.PubSubSystem` implementations a user would
pick instead of Headrace, each driven by its usual Python client on loopback, and the
:class:`Peer` records saying what each needs on the machine (``bench.pubsub`` finds or
installs it).

- :class:`NatsJetStream`: Debian's ``nats-server -js`` with file storage in the system's
  data dir; ``nats-py``; a durable pull consumer with explicit acks. JetStream does not
  fsync each message by default (its ``sync_interval`` is 2 minutes): ``fsync="default"``.
  Publishing keeps a window of ``publish_async`` futures in flight, each resolved by the
  server's ack. Consuming keeps pull requests outstanding on an inbox (JetStream's pull
  API, as newer NATS clients' ``consume()`` does; nats-py's ``fetch`` waits a round trip
  per batch, and for a whole batch once the stream is drained) and acks every message.
- :class:`RedisStreams`: Debian's ``redis-server`` with AOF (``appendfsync always`` or
  ``everysec``) and RDB snapshots off; ``redis-py`` asyncio with the hiredis parser;
  ``XADD`` in pipelines, ``XREADGROUP`` and multi-id ``XACK``.

The client libraries (the ``bench`` extra) are imported only when a peer runs. Every
client is built without retries or reconnects: a failure must show, not be papered over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._pubsub_system import LatencyRecorder, measure_e2e
from bench._server_process import (
    ServerFailedError,
    ServerProcess,
    free_port,
    restart_to_serving,
    rss_mib,
    wait_until_serving,
)

_START_TIMEOUT_S = 30.0
_CLOSE_TIMEOUT_S = 5.0
#: Longest wait for messages of an e2e consumer: it returns this soon after being told to.
_E2E_POLL_S = 0.1


# ---------------------------------------------------------------------------------------
# What each peer needs


@dataclass(frozen=True, slots=True)
class Peer:
    """A peer system and what it needs on this machine.

    Attributes:
        system: The system name results carry, e.g. ``"nats-jetstream"``.
        binary: The server executable looked up on ``PATH``.
        package: The Debian package that ships it.
        client_module: The Python client's top-level module.
        client_dist: The client's PyPI name, for the message when it is missing.
    """

    system: str
    binary: str
    package: str
    client_module: str
    client_dist: str


NATS = Peer("nats-jetstream", "nats-server", "nats-server", "nats", "nats-py")
REDIS = Peer("redis-streams", "redis-server", "redis-server", "redis", "redis")
PEERS = (NATS, REDIS)


async def _close_quietly(close: Callable[[], Any]) -> None:
    """Await ``close()`` with a deadline, ignoring errors (the server may be gone)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(close(), _CLOSE_TIMEOUT_S)


# ---------------------------------------------------------------------------------------
# NATS JetStream

NATS_STREAM = "BENCH"
NATS_SUBJECT = "bench.msgs"
NATS_DURABLE = "bench"
#: JetStream's pull API: a request on this subject asks the consumer for a batch.
NATS_PULL_SUBJECT = f"$JS.API.CONSUMER.MSG.NEXT.{NATS_STREAM}.{NATS_DURABLE}"
#: ``publish_async`` futures in flight at once (nats-py's own default cap is 4000).
NATS_PUBLISH_WINDOW = 4000
#: Messages per pull request, and how many messages pull requests keep asked for.
NATS_PULL_BATCH = 5000
NATS_PULL_WINDOW = 2 * NATS_PULL_BATCH
#: The consumer's cap on delivered, unacked messages (above the pull window).
NATS_MAX_ACK_PENDING = 20_000
_CONSUME_TIMEOUT_S = 120.0


async def _ignore(*_: object) -> None:
    """A nats-py callback that does nothing (its default logs every disconnect)."""


async def _nats_connect(url: str) -> Any:
    """A nats-py connection that fails fast: nats-py's connect retries a refused server
    until ``max_reconnect_attempts`` (0 means forever), pausing ``reconnect_time_wait``."""
    import nats

    return await nats.connect(
        url,
        allow_reconnect=False,
        connect_timeout=1,
        max_reconnect_attempts=1,
        reconnect_time_wait=0,
        error_cb=_ignore,
        disconnected_cb=_ignore,
        closed_cb=_ignore,
    )


def _is_status(msg: Any) -> bool:
    """Whether a message on a pull inbox is a JetStream status (e.g. 408 expired)."""
    return bool(msg.headers and msg.headers.get("Status"))


class _PullRequests:
    """Keeps a durable consumer's pull requests outstanding on one inbox, the way newer
    NATS clients' ``consume()`` does: messages flow as they are stored, up to ``total``
    asked for in all, never more than ``window`` asked for and not yet received (so no
    request is left open to swallow later messages). Called from one subscription's
    callback task; not task-safe.
    """

    def __init__(self, nc: Any, inbox: str, total: int, expires_s: float) -> None:
        self._nc = nc
        self._inbox = inbox
        self._total = total
        self._expires_ns = round(expires_s * 1e9)
        self.requested = 0
        self.received = 0

    async def top_up(self) -> None:
        """Ask for more messages while fewer than the window are asked for."""
        while self.requested < self._total and self.requested - self.received < NATS_PULL_WINDOW:
            batch = min(NATS_PULL_BATCH, self._total - self.requested)
            request = json.dumps({"batch": batch, "expires": self._expires_ns}).encode()
            await self._nc.publish(NATS_PULL_SUBJECT, request, reply=self._inbox)
            self.requested += batch


class NatsJetStream:
    """NATS JetStream with file storage and a durable pull consumer with explicit acks.

    Not task-safe: driven by one task at a time.
    """

    system = "nats-jetstream"
    fsync = "default"

    def __init__(self, data_dir: Path, *, binary: str = "nats-server") -> None:
        port = free_port()
        self._url = f"nats://127.0.0.1:{port}"
        argv = [binary, "-a", "127.0.0.1", "-p", str(port)]
        argv += ["-js", "-sd", str(data_dir / "jetstream")]
        self._process = ServerProcess(argv, data_dir / "nats-server.log")
        self._nc: Any = None
        self._js: Any = None

    async def start(self) -> None:
        """Start nats-server, then create the file-stored stream and the durable consumer."""
        from nats.js.api import AckPolicy, ConsumerConfig, StorageType

        self._process.start()
        await wait_until_serving(self._connect, timeout_s=_START_TIMEOUT_S, process=self._process)
        await self._js.add_stream(
            name=NATS_STREAM, subjects=[NATS_SUBJECT], storage=StorageType.FILE
        )
        config = ConsumerConfig(
            durable_name=NATS_DURABLE,
            ack_policy=AckPolicy.EXPLICIT,
            max_ack_pending=NATS_MAX_ACK_PENDING,
        )
        await self._js.add_consumer(NATS_STREAM, config=config)

    async def _connect(self) -> None:
        """Connect, and check JetStream answers."""
        nc = await _nats_connect(self._url)
        try:
            js = nc.jetstream(publish_async_max_pending=NATS_PUBLISH_WINDOW)
            await js.account_info()
        except Exception:
            await _close_quietly(nc.close)
            raise
        self._nc, self._js = nc, js

    async def publish(self, count: int, payload: bytes) -> float:
        """Publish with up to :data:`NATS_PUBLISH_WINDOW` acks outstanding."""
        js = self._js
        start = time.perf_counter()
        futures = [await js.publish_async(NATS_SUBJECT, payload) for _ in range(count)]
        await asyncio.gather(*futures)
        return time.perf_counter() - start

    async def consume(self, count: int) -> float:
        """Pull with requests kept outstanding, ack each message as it arrives, then wait
        until the server holds no unacked message for the consumer."""
        nc = self._nc
        inbox = nc.new_inbox()
        pulls = _PullRequests(nc, inbox, count, _CONSUME_TIMEOUT_S)
        done = asyncio.Event()

        async def on_message(msg: Any) -> None:
            if _is_status(msg):
                return
            await msg.ack()
            pulls.received += 1
            if pulls.received >= count:
                done.set()
            await pulls.top_up()

        start = time.perf_counter()
        sub = await nc.subscribe(inbox, cb=on_message)
        try:
            await pulls.top_up()
            await asyncio.wait_for(done.wait(), _CONSUME_TIMEOUT_S)
            await nc.flush()
            await self._wait_all_acked()
        finally:
            await sub.unsubscribe()
        return time.perf_counter() - start

    async def _wait_all_acked(self, timeout_s: float = 30.0) -> None:
        deadline = time.perf_counter() + timeout_s
        while (await self._js.consumer_info(NATS_STREAM, NATS_DURABLE)).num_ack_pending:
            if time.perf_counter() > deadline:
                raise ServerFailedError(f"acks still pending after {timeout_s:g} s")
            await asyncio.sleep(0.001)

    async def e2e(self, rate: float, seconds: float) -> list[float]:
        """Each publish (awaiting its ack) a paced task; the consumer keeps pull requests
        outstanding, so each message is pushed to it as soon as it is stored."""
        nc, js = self._nc, self._js

        async def send(payload: bytes) -> None:
            await js.publish(NATS_SUBJECT, payload)

        async def consume(recorder: LatencyRecorder) -> None:
            inbox = nc.new_inbox()
            pulls = _PullRequests(nc, inbox, recorder.expected, seconds + _CONSUME_TIMEOUT_S)

            async def on_message(msg: Any) -> None:
                if not _is_status(msg):
                    recorder.record(msg.data)
                    await msg.ack()
                    pulls.received += 1
                    await pulls.top_up()

            sub = await nc.subscribe(inbox, cb=on_message)
            try:
                await pulls.top_up()
                recorder.set_ready()
                await recorder.wait_finished()
            finally:
                await sub.unsubscribe()

        return await measure_e2e(rate, seconds, send, consume)

    async def kill_and_restart(self) -> float:
        """Time to a publish acked on a fresh connection to the restarted server; then the
        client reconnects (untimed), so later phases can publish again."""
        await self._close_client()
        seconds = await restart_to_serving(self._process, self._probe_publish)
        await self._connect()
        return seconds

    async def _probe_publish(self) -> None:
        nc = await _nats_connect(self._url)
        try:
            await nc.jetstream().publish(NATS_SUBJECT, b"probe", timeout=1)
        finally:
            await _close_quietly(nc.close)

    def rss_mib(self) -> float:
        """nats-server's RSS, MiB."""
        return rss_mib(self._process.pid)

    async def _close_client(self) -> None:
        if self._nc is not None:
            await _close_quietly(self._nc.close)
        self._nc = self._js = None

    async def stop(self) -> None:
        """Close the client and stop the server."""
        await self._close_client()
        self._process.stop()


# ---------------------------------------------------------------------------------------
# Redis Streams

REDIS_STREAM = b"bench"
REDIS_GROUP = b"bench"
REDIS_CONSUMER = b"c1"
REDIS_FIELD = b"v"
#: XADDs per pipeline, and pipelines in flight at once (each on its own connection).
REDIS_PIPELINE = 1000
REDIS_PIPELINES = 4
#: Entries per XREADGROUP while consuming, and per blocking read in the e2e consumer.
REDIS_READ_BATCH = 1000
REDIS_FSYNC = ("always", "everysec")
#: Connections a client opens at most (paced e2e XADDs run concurrently, one per connection).
REDIS_MAX_CONNECTIONS = 64


def redis_client(port: int) -> Any:
    """A redis-py asyncio client without retries (hiredis parses replies when installed).

    Concurrent commands each take a connection of its pool; past
    :data:`REDIS_MAX_CONNECTIONS` they wait for one (the default pool raises instead).
    """
    from redis.asyncio import BlockingConnectionPool, Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    pool = BlockingConnectionPool(
        host="127.0.0.1",
        port=port,
        max_connections=REDIS_MAX_CONNECTIONS,
        timeout=30,
        socket_timeout=30,
        retry=Retry(NoBackoff(), 0),
    )
    return Redis.from_pool(pool)


def redis_argv(binary: str, port: int, data_dir: Path, fsync: str) -> list[str]:
    """redis-server on 127.0.0.1:``port`` with AOF (``appendfsync`` ``fsync``) in
    ``data_dir``, RDB snapshots off, in the foreground, logging to stdout."""
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir)]
    argv += ["--appendonly", "yes", "--appendfsync", fsync, "--save", ""]
    return [*argv, "--daemonize", "no", "--logfile", ""]


def stream_entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The (id, fields) entries of an XREADGROUP reply on one stream (empty when none)."""
    if not reply:
        return []
    return list(reply[0][1])


def _chunks(total: int, size: int) -> list[int]:
    """``total`` split into pieces of ``size`` (the last one smaller)."""
    return [min(size, total - i) for i in range(0, total, size)]


class RedisStreams:
    """Redis Streams with AOF (``appendfsync always`` or ``everysec``), RDB off.

    Not task-safe: driven by one task at a time.
    """

    system = "redis-streams"

    def __init__(
        self, data_dir: Path, fsync: str = "always", *, binary: str = "redis-server"
    ) -> None:
        if fsync not in REDIS_FSYNC:
            raise ValueError(f"redis appendfsync must be one of {REDIS_FSYNC}, not {fsync!r}")
        self.fsync = fsync
        self._port = free_port()
        argv = redis_argv(binary, self._port, data_dir, fsync)
        self._process = ServerProcess(argv, data_dir / "redis-server.log")
        self._client: Any = None

    async def start(self) -> None:
        """Start redis-server and create the consumer group (and the stream)."""
        self._process.start()
        self._client = redis_client(self._port)
        await wait_until_serving(
            self._client.ping, timeout_s=_START_TIMEOUT_S, process=self._process
        )
        await self._client.xgroup_create(REDIS_STREAM, REDIS_GROUP, id="0", mkstream=True)

    async def publish(self, count: int, payload: bytes) -> float:
        """XADD in pipelines of :data:`REDIS_PIPELINE`, :data:`REDIS_PIPELINES` in flight."""
        chunks = iter(_chunks(count, REDIS_PIPELINE))
        client = self._client

        async def pipeline_loop() -> None:
            for size in chunks:  # shared: each loop takes the next chunk
                pipe = client.pipeline(transaction=False)
                for _ in range(size):
                    pipe.xadd(REDIS_STREAM, {REDIS_FIELD: payload})
                await pipe.execute()

        start = time.perf_counter()
        await asyncio.gather(*(pipeline_loop() for _ in range(REDIS_PIPELINES)))
        return time.perf_counter() - start

    async def consume(self, count: int) -> float:
        """XREADGROUP batches; each batch's XACK is pipelined with the next read."""
        client = self._client
        start = time.perf_counter()
        received, ids = 0, list[bytes]()
        while received < count:
            pipe = client.pipeline(transaction=False)
            if ids:
                pipe.xack(REDIS_STREAM, REDIS_GROUP, *ids)
            want = min(REDIS_READ_BATCH, count - received)
            pipe.xreadgroup(REDIS_GROUP, REDIS_CONSUMER, {REDIS_STREAM: ">"}, count=want)
            replies = await pipe.execute()
            ids = [entry_id for entry_id, _ in stream_entries(replies[-1])]
            if not ids:
                raise ServerFailedError(f"the stream ran dry after {received} of {count}")
            received += len(ids)
        await client.xack(REDIS_STREAM, REDIS_GROUP, *ids)
        return time.perf_counter() - start

    async def e2e(self, rate: float, seconds: float) -> list[float]:
        """Each XADD a paced task; the consumer blocks in XREADGROUP on its own connection
        and XACKs what each read returned."""
        client, port = self._client, self._port

        async def send(payload: bytes) -> None:
            await client.xadd(REDIS_STREAM, {REDIS_FIELD: payload})

        async def consume(recorder: LatencyRecorder) -> None:
            reader = redis_client(port)
            try:
                recorder.set_ready()
                while recorder.running:
                    reply = await reader.xreadgroup(
                        REDIS_GROUP,
                        REDIS_CONSUMER,
                        {REDIS_STREAM: ">"},
                        count=REDIS_READ_BATCH,
                        block=round(_E2E_POLL_S * 1000),
                    )
                    entries = stream_entries(reply)
                    for _, fields in entries:
                        recorder.record(fields[REDIS_FIELD])
                    if entries:
                        await reader.xack(REDIS_STREAM, REDIS_GROUP, *(i for i, _ in entries))
            finally:
                await _close_quietly(reader.aclose)

        return await measure_e2e(rate, seconds, send, consume)

    async def kill_and_restart(self) -> float:
        """Time to an XADD answered on a fresh connection (after the AOF is replayed); then
        the client reconnects (untimed), so later phases can publish again."""
        await self._close_client()
        seconds = await restart_to_serving(self._process, self._probe_xadd)
        self._client = redis_client(self._port)
        return seconds

    async def _probe_xadd(self) -> None:
        client = redis_client(self._port)
        try:
            await client.xadd(REDIS_STREAM, {REDIS_FIELD: b"probe"})
        finally:
            await _close_quietly(client.aclose)

    def rss_mib(self) -> float:
        """redis-server's RSS, MiB."""
        return rss_mib(self._process.pid)

    async def _close_client(self) -> None:
        if self._client is not None:
            await _close_quietly(self._client.aclose)
        self._client = None

    async def stop(self) -> None:
        """Close the client and stop the server."""
        await self._close_client()
        self._process.stop()
