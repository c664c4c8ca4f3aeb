"""The composition root: one broker process's parts, started and stopped in order.

Role: build the topic registry, the gRPC server (data plane, admin plane, the standard
``grpc.health.v1`` service and server reflection) and the Prometheus listener from a
:class:`BrokerConfig`, and run them.

Order of shutdown (STYLE rule 39): health goes to NOT_SERVING; the retention task stops
(publishes blocked by the backlog quota fail with ``UNAVAILABLE``); subscriptions stop
dispatching, end their consumer streams (``UNAVAILABLE``: consumers reconnect elsewhere or
later) and save their cursors; the server stops accepting and lets in-flight calls finish
for ``grace_seconds``; then every log syncs and closes.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import signal
import socket
from types import TracebackType
from typing import Self
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from broker.admin_service import AdminService
from broker.admin_service import add_to_server as add_admin_service
from broker.config import BrokerConfig, parse_address
from broker.errors import ListenError
from broker.ingest import append_batch
from broker.metrics import BrokerMetrics
from broker.partition import Partition
from broker.retention import RetentionService
from broker.service import BrokerService
from broker.service import add_to_server as add_broker_service
from broker.topics import TopicRegistry
from dispatcher import SubscriptionRegistry
from proto import admin_pb2 as _admin
from proto import broker_pb2 as _pb
from wal.lock import DirectoryLock
from wal.log import Clock

logger = logging.getLogger(__name__)

SERVICE_NAMES = (
    _pb.DESCRIPTOR.services_by_name["Broker"].full_name,
    _admin.DESCRIPTOR.services_by_name["Admin"].full_name,
)


class Broker:
    """One broker: ``await start()``, serve, ``await aclose()``. Use from one event loop.

    Args:
        config: The settings.
        metrics: Where metrics are recorded. Default: a fresh registry.
        clock: Wall-clock ms since the epoch for the partitions (log rolling and retention
            by age, producer expiry). Default: the system clock; tests pass a manual one.
    """

    def __init__(
        self,
        config: BrokerConfig,
        *,
        metrics: BrokerMetrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or BrokerMetrics()
        self.topics = TopicRegistry(
            config.data_dir, config.wal, on_open=self._watch_partition, clock=clock
        )
        self.subscriptions = SubscriptionRegistry(
            config.data_dir,
            max_unacked=config.max_unacked,
            dispatch=config.dispatch,
            on_dispatch=self.metrics.dispatch_observer,
            flush_interval_s=config.cursor_flush_interval_ms / 1000,
            heartbeat=config.heartbeat,
        )
        self.metrics.watch_subscriptions(lambda: self.subscriptions.samples)
        self.retention = RetentionService(
            self.topics,
            self.subscriptions.saved_floor,
            self.metrics,
            backlog=config.backlog,
            interval_s=config.retention_check_interval_ms / 1000,
            producer_expiry_ms=config.producer_expiry_ms,
        )
        self.port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._metrics_http: WSGIServer | None = None
        self._lock: DirectoryLock | None = None

    def _watch_partition(self, topic: str, partition: Partition) -> None:
        """Time every group commit of a partition's log (WAL latency histograms)."""
        partition.writer.on_commit = self.metrics.commit_observer(topic, partition.index)

    async def start(self) -> None:
        """Lock the data directory, open the topics and subscriptions, then start serving
        gRPC and metrics.

        Raises:
            DataDirLockedError: Another broker holds the data directory.
        """
        check_listen("listen", self.config.listen)
        if self.config.metrics_listen:
            check_listen("metrics_listen", self.config.metrics_listen)
        # Synchronous (a mkdir, an open, a flock, one small file): no await between taking
        # the lock and owning it, so a cancelled start cannot leave it held by nobody.
        self._lock = DirectoryLock(self.config.data_dir)
        try:
            await self._open_and_serve()
        except BaseException:
            await self.aclose()
            raise

    async def _open_and_serve(self) -> None:
        await self.topics.open()
        await self.subscriptions.open(
            {n: [p.writer for p in self.topics.get(n).partitions] for n in self.topics.names()}
        )
        self.retention.start()
        limit = self.config.max_request_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ]
        )
        add_broker_service(
            BrokerService(
                self.topics,
                self.subscriptions,
                self.metrics,
                auto_create=self.config.auto_create_topics,
                default_partitions=self.config.default_partitions,
                retention=self.retention,
            ),
            server,
        )
        append = functools.partial(append_batch, retention=self.retention, metrics=self.metrics)
        add_admin_service(AdminService(self.topics, self.subscriptions, append), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        host, port = parse_address(self.config.listen)
        try:
            self.port = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:  # grpc's only signal that the bind failed
            raise ListenError("listen", self.config.listen, "the port cannot be bound") from exc
        await server.start()
        self._server = server
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._start_metrics()
        logger.info("headrace serving on %s:%d (data in %s)", host, self.port, self.config.data_dir)

    def _start_metrics(self) -> None:
        if not self.config.metrics_listen:
            return
        host, port = parse_address(self.config.metrics_listen)
        http, _thread = start_http_server(port, host, registry=self.metrics.registry)
        self.metrics_port = http.server_port
        self._metrics_http = http

    async def aclose(self) -> None:
        """Shut down in order: NOT_SERVING, end consumer streams and save cursors, drain
        calls, close the logs. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            await self._health.enter_graceful_shutdown()
        await self.retention.aclose()  # before the subscriptions: it reads their floors
        await self.subscriptions.aclose()
        if server is not None:
            await server.stop(self.config.grace_seconds)
        await self.topics.aclose()
        http, self._metrics_http = self._metrics_http, None
        if http is not None:
            await asyncio.to_thread(http.shutdown)  # stop serve_forever on its thread
            http.server_close()  # and release the listening socket
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()  # last: nothing of this broker touches the directory after it
        logger.info("headrace stopped")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def check_listen(setting: str, address: str) -> None:
    """Bind ``address`` once and let it go, so that a port clash is reported, naming the
    address and its setting, before the broker touches its data directory.

    Raises:
        ListenError: The address cannot be bound.
    """
    host, port = parse_address(address)
    if port == 0:
        return  # any free port
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as exc:
        raise ListenError(setting, address, (exc.strerror or str(exc)).lower()) from exc


async def serve(config: BrokerConfig) -> None:
    """Run a broker until SIGINT or SIGTERM, then shut down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Broker(config):
        # Everything built so far (modules, topics, subscriptions) lives as long as the
        # process: take it out of the cyclic GC's view. Otherwise each full collection
        # walks it all, a 12 ms pause here, and every record in flight waits that long.
        gc.freeze()
        await stop.wait()
        logger.info("signal received; shutting down")
