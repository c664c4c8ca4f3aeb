"""The peers of the ``pubsub`` scenario: NATS JetStream and Redis Streams, and their servers.

Owns the two :class:`~bench._pubsub_system.PubSubSystem` implementations a user would
pick instead of Headrace, each driven by its usual Python client on loopback, and
:func:`find_servers`, which locates their Debian servers, installs them with apt-get when
it can, and says on stderr why a peer is skipped when it cannot.

- :class:`NatsJetStream`: Debian's ``nats-server -js`` with file storage in the system's
  data dir; ``nats-py``; a durable pull consumer with explicit acks. JetStream does not
  fsync each message by default (its ``sync_interval`` is 2 minutes): ``fsync="default"``.
  Publishing keeps a window of ``publish_async`` futures in flight, each resolved by the
  server's ack; consuming fetches in batches and acks every message.
- :class:`RedisStreams`: Debian's ``redis-server`` with AOF (``appendfsync always`` or
  ``everysec``) and RDB snapshots off; ``redis-py`` asyncio with the hiredis parser;
  ``XADD`` in pipelines, ``XREADGROUP`` and multi-id ``XACK``.

The client libraries (the ``bench`` extra) are imported only when a peer runs. Every
client is built without retries or reconnects: a failure must show, not be papered over.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._pubsub_system import (
    LatencyRecorder,
    ServerFailedError,
    ServerProcess,
    free_port,
    measure_e2e,
    restart_to_serving,
    rss_mib,
    wait_until_serving,
)

_START_TIMEOUT_S = 30.0
_CLOSE_TIMEOUT_S = 5.0
#: Longest wait for messages of an e2e consumer: it returns this soon after being told to.
_E2E_POLL_S = 0.1


# ---------------------------------------------------------------------------------------
# Finding and installing the servers


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

Which = Callable[[str], str | None]
#: Installs Debian packages; returns whether it succeeded.
Installer = Callable[[Sequence[str]], bool]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def apt_install(packages: Sequence[str]) -> bool:
    """``apt-get update && apt-get install -y packages``, output on stderr (stdout may be
    JSON lines). Returns whether both succeeded."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", *packages]):
        if subprocess.run(argv, stdout=sys.stderr, env=env, check=False).returncode != 0:
            return False
    return True


def default_installer(
    which: Which = shutil.which, euid: Callable[[], int] = os.geteuid
) -> Installer | str:
    """:func:`apt_install` when this process may use it, else the reason it may not."""
    if euid() != 0:
        return "not running as root"
    if which("apt-get") is None:
        return "apt-get is not available"
    return apt_install


def find_servers(
    peers: Sequence[Peer],
    *,
    which: Which = shutil.which,
    installer: Installer | str | None = None,
    has_module: Callable[[str], bool] | None = None,
    warn: Callable[[str], None] = _stderr,
) -> dict[str, str]:
    """The peers that can run here, by system name, with the path of their server.

    Installs missing servers with ``installer`` (default: :func:`default_installer`).
    For every peer that still cannot run it calls ``warn`` with the reason and the fix.

    Args:
        peers: The peers wanted.
        which: Finds an executable on ``PATH``.
        installer: Installs packages, or a string saying why nothing can be installed.
        has_module: Whether a Python module can be imported (default: importlib's finder).
        warn: Where the messages go (default: stderr).
    """
    has_module = has_module or (lambda name: importlib.util.find_spec(name) is not None)
    runnable: list[Peer] = []
    for peer in peers:
        if has_module(peer.client_module):
            runnable.append(peer)
        else:
            warn(
                f"bench: pubsub: skipping {peer.system}: its Python client {peer.client_dist} "
                "is not installed (pip install -e '.[bench]')"
            )
    found = {p.system: path for p in runnable if (path := which(p.binary)) is not None}
    missing = [p for p in runnable if p.system not in found]
    if not missing:
        return found
    installer = installer if installer is not None else default_installer(which)
    packages = [p.package for p in missing]
    if isinstance(installer, str):
        reason = f"cannot install it here: {installer}"
    else:
        warn(f"bench: pubsub: installing {' '.join(packages)} with apt-get")
        ok = installer(packages)
        reason = "apt-get install failed" if not ok else "it is still not on PATH after install"
    for peer in missing:
        path = which(peer.binary)
        if path is not None:
            found[peer.system] = path
        else:
            warn(
                f"bench: pubsub: skipping {peer.system}: {peer.binary} is not installed and "
                f"{reason}; install it with: apt-get install -y {peer.package}"
            )
    return found


async def _close_quietly(close: Callable[[], Any]) -> None:
    """Await ``close()`` with a deadline, ignoring errors (the server may be gone)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(close(), _CLOSE_TIMEOUT_S)


# ---------------------------------------------------------------------------------------
# NATS JetStream

NATS_STREAM = "BENCH"
NATS_SUBJECT = "bench.msgs"
NATS_DURABLE = "bench"
#: ``publish_async`` futures in flight at once (nats-py's own default cap is 4000).
NATS_PUBLISH_WINDOW = 4000
#: Messages per pull request while consuming, and the consumer's cap on unacked ones.
NATS_FETCH_BATCH = 1000
NATS_MAX_ACK_PENDING = 20_000


async def _ignore(*_: object) -> None:
    """A nats-py callback that does nothing (its default logs every disconnect)."""


async def _nats_connect(url: str) -> Any:
    import nats

    return await nats.connect(
        url,
        allow_reconnect=False,
        connect_timeout=1,
        max_reconnect_attempts=0,
        error_cb=_ignore,
        disconnected_cb=_ignore,
        closed_cb=_ignore,
    )


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
        self._sub: Any = None

    async def start(self) -> None:
        """Start nats-server, then create the file-stored stream and the durable consumer."""
        from nats.js.api import AckPolicy, ConsumerConfig, StorageType

        self._process.start()
        await wait_until_serving(self._connect, timeout_s=_START_TIMEOUT_S, process=self._process)
        await self._js.add_stream(
            name=NATS_STREAM, subjects=[NATS_SUBJECT], storage=StorageType.FILE
        )
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=NATS_MAX_ACK_PENDING)
        self._sub = await self._js.pull_subscribe(
            NATS_SUBJECT, durable=NATS_DURABLE, stream=NATS_STREAM, config=config
        )

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
        """Fetch in batches, ack each message, then wait until the server holds no unacked
        message for the consumer."""
        start = time.perf_counter()
        received = 0
        while received < count:
            msgs = await self._sub.fetch(min(NATS_FETCH_BATCH, count - received), timeout=10)
            for msg in msgs:
                await msg.ack()
            received += len(msgs)
        await self._nc.flush()
        await self._wait_all_acked()
        return time.perf_counter() - start

    async def _wait_all_acked(self, timeout_s: float = 30.0) -> None:
        deadline = time.perf_counter() + timeout_s
        while (await self._sub.consumer_info()).num_ack_pending:
            if time.perf_counter() > deadline:
                raise ServerFailedError(f"acks still pending after {timeout_s:g} s")
            await asyncio.sleep(0.001)

    async def e2e(self, rate: float, seconds: float) -> list[float]:
        """Publishes (each awaiting its ack) as paced tasks; the consumer fetches one
        message per pull request, so it is handed each message as soon as it is stored."""
        js, sub = self._js, self._sub

        async def send(payload: bytes) -> None:
            await js.publish(NATS_SUBJECT, payload)

        async def consume(recorder: LatencyRecorder) -> None:
            import nats.errors

            recorder.set_ready()
            while recorder.running:
                try:
                    msgs = await sub.fetch(1, timeout=_E2E_POLL_S)
                except nats.errors.TimeoutError:
                    continue
                for msg in msgs:
                    recorder.record(msg.data)
                    await msg.ack()

        return await measure_e2e(rate, seconds, send, consume)

    async def kill_and_restart(self) -> float:
        """Time to a publish acked on a fresh connection to the restarted server."""
        await self._close_client()
        return await restart_to_serving(self._process, self._probe_publish)

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
        self._nc = self._js = self._sub = None

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


def _redis_client(port: int) -> Any:
    """A redis-py asyncio client without retries (hiredis parses replies when installed)."""
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0), socket_timeout=30)


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
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
        argv = [binary, "--bind", "127.0.0.1", "--port", str(self._port), "--dir", str(data_dir)]
        argv += ["--appendonly", "yes", "--appendfsync", fsync, "--save", ""]
        argv += ["--daemonize", "no", "--logfile", ""]
        self._process = ServerProcess(argv, data_dir / "redis-server.log")
        self._client: Any = None

    async def start(self) -> None:
        """Start redis-server and create the consumer group (and the stream)."""
        self._process.start()
        self._client = _redis_client(self._port)
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
            ids = [entry_id for entry_id, _ in _entries(replies[-1])]
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
            reader = _redis_client(port)
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
                    entries = _entries(reply)
                    for _, fields in entries:
                        recorder.record(fields[REDIS_FIELD])
                    if entries:
                        await reader.xack(REDIS_STREAM, REDIS_GROUP, *(i for i, _ in entries))
            finally:
                await _close_quietly(reader.aclose)

        return await measure_e2e(rate, seconds, send, consume)

    async def kill_and_restart(self) -> float:
        """Time to an XADD answered on a fresh connection (after the AOF is replayed)."""
        await self._close_client()
        return await restart_to_serving(self._process, self._probe_xadd)

    async def _probe_xadd(self) -> None:
        client = _redis_client(self._port)
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
