"""The composition root: one broker process's parts, started and stopped in order.

Role: build the topic registry, the gRPC server (data plane, admin plane, the standard
``grpc.health.v1`` service and server reflection) and the Prometheus listener from a
:class:`BrokerConfig`, and run them.

Order of shutdown (STYLE rule 39): in cluster mode, the replicated topics led here are
first handed to in-sync followers that are fetching and not stopping too (controlled
shutdown, ``ClusterNode.hand_over``, at most ``[cluster] controlled_shutdown_timeout_s``,
default 10 s); health goes to NOT_SERVING; the retention task stops
(publishes blocked by the backlog quota fail with ``UNAVAILABLE``); subscriptions stop
dispatching, end their consumer streams (``UNAVAILABLE``: consumers reconnect elsewhere or
later) and save their cursors; the server stops accepting and lets in-flight calls finish
for ``grace_seconds``; in cluster mode the member then leaves (its etcd lease is revoked,
so liveness and the controller role move at once); then every log syncs and closes. A
shutdown step that fails on the disk (a state save on a full disk) is logged and the next
step still runs.

Security (docs/operations/security.md): with ``[security] tls_cert``/``tls_key`` the one port serves
TLS only (:mod:`broker.tls`); a certificate that cannot be used stops the start with one
line. A ``listen`` address other hosts can reach needs TLS plus tokens or client
certificates unless ``insecure`` is set (:mod:`broker.exposure`); a metrics listener
there is allowed, with a warning. Both checks run before the data directory is touched.

Start-up I/O errors (a read-only or full data directory, a file that cannot be opened) are
raised as :class:`wal.WalIOError` naming the file and the cause, so that ``headrace
serve`` can print one line for them.

One piece, though past 600 lines (:class:`Broker` about 430): a composition root is read
as one sequence, start in one order and shutdown in the reverse one above, and each
part's place in it is the thing to review; the parts themselves live in their modules.
The pre-start checks at the end (``check_exposure``, ``check_listen``,
``raise_fd_limit``) are plain functions, outside the class.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import resource
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from broker.admin_service import AdminService
from broker.admin_service import add_to_server as add_admin_service
from broker.auth import AuthInterceptor, TokensFile
from broker.cluster_service import (
    LOCAL_NODE,
    ClusterService,
    ClusterSource,
    SingleBrokerSource,
)
from broker.cluster_service import add_to_server as add_cluster_service
from broker.config import BrokerConfig, parse_address
from broker.config_cluster import check_cluster
from broker.errors import ClusterJoinError, InsecureListenError, ListenError, TopicNotFoundError
from broker.exposure import is_loopback, refusal
from broker.ingest import append_batch
from broker.load_monitor import LoadMonitor
from broker.memory import relieve_forever, tune_allocator
from broker.metrics import BrokerMetrics, PartitionLog
from broker.partition import Partition
from broker.replica.service import ReplicationService
from broker.replica.service import add_to_server as add_replication_service
from broker.retention import RetentionService
from broker.rpc_handlers import transport_receive_limit
from broker.service import BrokerService
from broker.service import add_to_server as add_broker_service
from broker.tls import PeerTls, ServerTls, load_peer_tls, load_server_tls
from broker.topic_guard import TopicGuard
from broker.topics import TopicRegistry
from cluster.ownership import Ownership
from dispatcher import SubscriptionRegistry
from proto import admin_pb2 as _admin
from proto import broker_pb2 as _pb
from proto import cluster_pb2 as _cluster
from wal import FileSystem, WalIOError
from wal.errors import io_error
from wal.lock import DirectoryLock
from wal.log import Clock

if TYPE_CHECKING:  # cluster mode imports etcd only when it runs (see start)
    from broker.auth.cluster_tokens import EtcdTokenSource
    from broker.cluster_defaults import TopicDefaults
    from broker.cluster_node import ClusterNode
    from broker.replica.leader import LeaderTopic
    from cluster.etcd import EtcdStore

logger = logging.getLogger(__name__)

SERVICE_NAMES = (
    _pb.DESCRIPTOR.services_by_name["Broker"].full_name,
    _admin.DESCRIPTOR.services_by_name["Admin"].full_name,
    _cluster.DESCRIPTOR.services_by_name["Cluster"].full_name,
)


class Broker:
    """One broker: ``await start()``, serve, ``await aclose()``. Use from one event loop.

    Args:
        config: The settings.
        metrics: Where metrics are recorded. Default: a fresh registry.
        clock: Wall-clock ms since the epoch for the partitions (log rolling and retention
            by age, producer expiry). Default: the system clock; tests pass a manual one.
        fs: File operations for the logs and subscription state. Default: the real ones;
            tests pass a :class:`wal.FaultyFs` (a full disk, failing syncs).
        monotonic: Monotonic seconds for the subscriptions (heartbeat, inactivity expiry).
            Default: the system's; tests pass a manual one.
        ownership: Asked before every topic-scoped call whether this broker serves the
            topic now (:mod:`broker.topic_guard`). Default: :class:`SingleBroker`, which
            serves every topic (no cluster: nothing changes).
        cluster: Answers the Cluster service (Lookup, ClusterStatus). Default: this broker
            alone (:class:`~broker.cluster_service.SingleBrokerSource`).
        node_id: The node id ListTopics and ListSubscriptions answer with, which tells a
            client whether to ask other brokers (tests' static clusters give theirs).
            Default ``local``; in cluster mode the joined node's id.

    Raises:
        ConfigError: ``config.cluster`` breaks a rule that needs other settings
            (:func:`~broker.config_cluster.check_cluster`).

    Cluster mode (``config.cluster`` set, no ``ownership`` given): :meth:`start` joins the
    cluster after the port is bound and before it serves (:mod:`broker.cluster_node`),
    advertising ``[cluster] advertise`` or the listen host with the bound port; the member
    is the guard's ownership and the Cluster service's source.
    """

    def __init__(
        self,
        config: BrokerConfig,
        *,
        metrics: BrokerMetrics | None = None,
        clock: Clock | None = None,
        fs: FileSystem | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        ownership: Ownership | None = None,
        cluster: ClusterSource | None = None,
        node_id: str = LOCAL_NODE,
    ) -> None:
        check_cluster(
            config.cluster,
            config.listen,
            insecure=config.security.insecure,
            tokens_file=config.security.tokens_file,
            tls_cert=config.security.tls_cert,
            tls_client_ca=config.security.tls_client_ca,
        )
        self.config = config
        self.guard = TopicGuard(ownership)
        self._cluster = cluster
        self._node_id = node_id
        #: Cluster mode's membership, joined at start (None: a single broker, or tests that
        #: pass their own ``ownership``).
        self.node: ClusterNode | None = None
        #: The leaders of the replicated topics this broker leads, by name (cluster mode's
        #: replica manager sets it; the Replication service asks it on every call).
        self.replica_leader: Callable[[str], LeaderTopic | None] = _leads_nothing
        #: The cluster's internal credential (``cluster.internal_credential``), which alone
        #: may call the Replication service when tokens are on; cluster mode sets it.
        self.internal_credential: str | None = None
        self._etcd: EtcdStore | None = None  # opened at start, before the data directory
        self._topic_defaults: TopicDefaults | None = None  # cluster mode: read at start
        self._join = config.cluster.enabled and ownership is None
        self._clock = clock  # None: the system clock
        self.metrics = metrics or BrokerMetrics()
        self.guard.on_refusal = self.metrics.refused  # headrace_cluster_refusals_total
        self.topics = TopicRegistry(
            config.data_dir,
            config.log_config,
            fs,
            on_open=self._watch_partition,
            on_delete=self.metrics.forget_topic,
            clock=clock,
            snapshot_bytes=config.producer_snapshot_bytes,
            max_partitions=config.limits.max_partitions_per_topic,
            max_producers=config.limits.max_producers_per_partition,
            topic_wal_configs=config.topic_log_configs,
        )
        self.subscriptions = SubscriptionRegistry(
            config.data_dir,
            fs=fs,
            max_unacked=config.max_unacked,
            dispatch=config.dispatch,
            on_dispatch=self.metrics.dispatch_observer,
            flush_interval_s=config.cursor_flush_interval_ms / 1000,
            heartbeat=config.heartbeat,
            limits=config.limits.dispatch_limits(),
            inactive_expiry_s=config.subscriptions.inactive_expiry_s,
            on_expired=self._expired_counter(),
            monotonic=monotonic,
            on_cursor_flush=self.metrics.cursor_flush.observe,
        )
        self.metrics.watch_subscriptions(self.subscriptions.samples)
        self.metrics.watch_cursors(self.subscriptions.cursor_stats)
        #: The process's CPU, read as publishes are answered: their in-flight hint.
        self.load = LoadMonitor()
        self.metrics.watch_partitions(self._partition_logs, self.load.rule)
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
        self._auth: AuthInterceptor | None = None
        #: ``[cluster] tokens``: the cluster's tokens in etcd, watched (its own connection).
        self._token_source: EtcdTokenSource | None = None
        self._tls: ServerTls | None = None
        self._peer_tls: PeerTls | None = None  # cluster mode serving TLS: calls to peers

    def _partition_logs(self) -> list[PartitionLog]:
        """Every partition's log, for the metrics exporter's thread (a topic deleted
        meanwhile is left out: its series go with it)."""
        logs: list[PartitionLog] = []
        for name in self.topics.names():
            try:
                topic = self.topics.get(name)
            except TopicNotFoundError:
                continue
            logs.extend(
                PartitionLog(name, p.index, p.writer, functools.partial(_hint_of, p))
                for p in topic.partitions
            )
        return logs

    def _expired_counter(self) -> Callable[[str], None]:
        """What the subscriptions call with the topic of each one that expiry deleted."""
        if self.config.subscriptions.inactive_expiry_ms is None:
            return lambda _topic: None
        counter = self.metrics.subscriptions_expired  # declared now, exported from start
        return lambda topic: counter.labels(topic).inc()

    def _watch_partition(self, topic: str, partition: Partition) -> None:
        """Time every group commit of a partition's log (WAL latency histograms)."""
        partition.writer.on_commit = self.metrics.commit_observer(topic, partition.index)

    async def start(self) -> None:
        """Lock the data directory, open the topics and subscriptions, then start serving
        gRPC and metrics.

        Raises:
            TokensFileError: ``[security] tokens_file`` is missing, unreadable or invalid.
            TlsSetupError: A ``[security]`` TLS file cannot be used (names it and why).
            InsecureListenError: ``listen`` is reachable from other hosts without enough
                protection, and ``insecure`` is not set.
            DataDirLockedError: Another broker holds the data directory.
            ClusterJoinError: cluster mode: etcd does not answer (checked before the data
                directory is touched), or a live broker holds this node id.
            WalIOError: A file or directory under the data directory cannot be created,
                read or written (read-only, full, no permission); it names which and why.
        """
        self._tls = load_server_tls(self.config.security)
        if self._join:
            self._peer_tls = load_peer_tls(self.config.cluster, self.config.security, self._tls)
        check_exposure(self.config)
        self._auth = auth_interceptor(self.config, self.metrics)
        check_listen("listen", self.config.listen)
        if self.config.metrics_listen:
            check_listen("metrics_listen", self.config.metrics_listen)
        if self._join:  # a wrong etcd endpoint stops the start before the data directory
            # Here, not at the top: a single broker never imports the etcd client.
            from broker.cluster_node import connect  # noqa: PLC0415

            self._etcd = await connect(self.config.cluster)
            if self.config.cluster.tokens:
                self._auth = await self._cluster_auth()
            await self._read_cluster_defaults(self._etcd)
        # Synchronous (a mkdir, an open, a flock, one small file): no await between taking
        # the lock and owning it, so a cancelled start cannot leave it held by nobody.
        try:
            self._lock = DirectoryLock(self.config.data_dir)
        except BaseException as exc:
            etcd, self._etcd = self._etcd, None
            if etcd is not None:
                await etcd.aclose()
            await self._close_token_source()
            if isinstance(exc, OSError):
                raise io_error("lock the data directory", self.config.data_dir, exc) from exc
            raise
        raise_fd_limit()
        try:
            await self._open_and_serve()
        except BaseException as exc:
            await self._abandon_start()
            if isinstance(exc, OSError) and exc.filename:  # a file, not a socket
                raise io_error("open the data directory", self.config.data_dir, exc) from exc
            raise

    async def _cluster_auth(self) -> AuthInterceptor:
        """Token authentication against the cluster's tokens in etcd (``[cluster] tokens``),
        listed now, like the member's etcd check, before the data directory is touched.

        Raises:
            ClusterJoinError: etcd did not answer the listing of the tokens.
        """
        from broker.auth.cluster_tokens import open_token_source  # noqa: PLC0415 - as connect
        from cluster.errors import ClusterError  # noqa: PLC0415

        try:
            self._token_source = await open_token_source(self.config.cluster)
        except BaseException as exc:
            etcd, self._etcd = self._etcd, None
            if etcd is not None:
                await etcd.aclose()
            if isinstance(exc, ClusterError):
                raise ClusterJoinError(f"cannot read the cluster's tokens in etcd: {exc}") from exc
            raise
        failures = self.metrics.auth_failures
        return AuthInterceptor(self._token_source, lambda reason: failures.labels(reason).inc())

    async def _read_cluster_defaults(self, store: EtcdStore) -> None:
        """Read the cluster's defaults (``headrace cluster config``) and apply them before
        the topics open, so that they open with the cluster's ``[wal]`` defaults.

        Raises:
            ClusterJoinError: etcd did not answer.
        """
        from broker.cluster_defaults import TopicDefaults  # noqa: PLC0415 - as connect
        from broker.cluster_node import apply_defaults, read_defaults  # noqa: PLC0415

        config = self.config
        try:
            record = await read_defaults(store, config.cluster)
        except BaseException:
            self._etcd = None
            await store.aclose()
            await self._close_token_source()
            raise
        defaults = TopicDefaults(
            config.default_partitions, config.auto_create_topics, config.log_config
        )
        apply_defaults(defaults, self.topics, record)
        self._topic_defaults = defaults

    async def _close_token_source(self) -> None:
        source, self._token_source = self._token_source, None
        if source is not None:
            await source.aclose()

    async def _abandon_start(self) -> None:
        """Close what a failed start opened; a second failure is logged, so that the first,
        the one that explains the failed start, is what the caller sees."""
        try:
            await self.aclose()
        except Exception as exc:
            logger.warning("closing after a failed start failed too: %s", exc)

    async def _open_and_serve(self) -> None:
        await self.topics.open()
        await self.subscriptions.open(
            {n: [p.writer for p in self.topics.get(n).partitions] for n in self.topics.names()}
        )
        self.retention.start()
        limit = self.config.max_request_bytes
        if self._auth is not None:
            self._auth.internal = lambda: self.internal_credential
        server = grpc.aio.server(
            interceptors=[self._auth] if self._auth else [],
            options=[
                # the limit itself: gRPC refuses a larger request before any handler
                ("grpc.max_receive_message_length", transport_receive_limit(limit)),
                # no send limit: each answer is bounded by its handler (a fetch: max_bytes
                # plus one batch; a ReplicaFetch: its batches plus every log's marks), and
                # one over this limit was refused at every try (a follower stuck for good)
                ("grpc.max_send_message_length", -1),
            ],
        )
        host, port = parse_address(self.config.listen)
        try:
            if self._tls is None:
                self.port = server.add_insecure_port(f"{host}:{port}")
            else:
                self.port = server.add_secure_port(f"{host}:{port}", self._tls.credentials())
        except RuntimeError as exc:  # grpc's only signal that the bind failed
            raise ListenError("listen", self.config.listen, "the port cannot be bound") from exc
        if self._etcd is not None:  # bound, not serving: registration advertises the port
            from broker.cluster_node import ClusterNode  # noqa: PLC0415 - as connect above

            assert self._topic_defaults is not None  # read with the etcd connection

            store, self._etcd = self._etcd, None  # the node closes it from now on
            try:
                self.node = await ClusterNode.join(
                    store,
                    self.config.cluster,
                    self._advertised(),
                    self.topics,
                    self.subscriptions,
                    max_partitions=self.config.limits.max_partitions_per_topic,
                    defaults=self._topic_defaults,
                    peer_tls=self._peer_tls,
                )
            except BaseException:
                await server.stop(None)  # release the bound port
                raise
            self.guard.ownership = self.node.member
            self.replica_leader = self.node.replica_leader
            self.internal_credential = self.node.internal_credential
            self._watch_member(self.node)
        add_broker_service(
            BrokerService(
                self.topics,
                self.subscriptions,
                self.metrics,
                auto_create=self.config.auto_create_topics,
                default_partitions=self.config.default_partitions,
                retention=self.retention,
                limits=self.config.limits,
                clock=self._clock,
                load=self.load,
                guard=self.guard,
                cluster=self.node,
            ),
            server,
            max_request_bytes=limit,
        )
        append = functools.partial(append_batch, retention=self.retention, metrics=self.metrics)
        add_admin_service(
            AdminService(
                self.topics,
                self.subscriptions,
                append,
                self.guard,
                cluster=self.node,
                node_id=self._node_id,
                default_partitions=self.config.default_partitions,
            ),
            server,
            max_request_bytes=limit,
        )
        source: ClusterSource = (
            self.node
            if self.node is not None
            else self._cluster or SingleBrokerSource(self.topics, self._advertised)
        )
        add_cluster_service(ClusterService(source), server, max_request_bytes=limit)
        # Late bound: cluster mode's replica manager sets replica_leader after this.
        replication = ReplicationService(lambda name: self.replica_leader(name))  # noqa: PLW0108
        add_replication_service(replication, server, max_request_bytes=limit)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        await server.start()
        self._server = server
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._start_metrics()
        logger.info(
            "headrace serving on %s:%d (%s; data in %s)",
            host,
            self.port,
            _describe_tls(self._tls),
            self.config.data_dir,
        )

    def _watch_member(self, node: ClusterNode) -> None:
        """Name this broker's node in its metrics and export its member's state."""
        from broker.cluster_metrics import lag_sampler, loop_sampler  # noqa: PLC0415

        self.metrics.set_node(node.member.node_id)
        self.metrics.watch_cluster(loop_sampler(node.member, asyncio.get_running_loop()))
        self.metrics.watch_replication(lag_sampler(node, asyncio.get_running_loop()))

    def _advertised(self) -> str:
        """This broker's address as clients call it: ``[cluster] advertise`` when set, else
        the listen host with the bound port; on a wildcard listen (``0.0.0.0``, ``::``),
        which a cluster member may not have without ``advertise``, this host's name."""
        cluster = self.config.cluster
        host, _ = parse_address(self.config.listen)
        if cluster.advertise is None and host in ("0.0.0.0", "::"):
            return f"{socket.gethostname()}:{self.port}"
        return cluster.advertised(self.config.listen, self.port)

    def _start_metrics(self) -> None:
        if not self.config.metrics_listen:
            return
        host, port = parse_address(self.config.metrics_listen)
        http, _thread = start_http_server(port, host, registry=self.metrics.registry)
        self.metrics_port = http.server_port
        self._metrics_http = http

    async def aclose(self) -> None:
        """Shut down in order: NOT_SERVING, end consumer streams and save cursors, drain
        calls, leave the cluster (cluster mode), close the logs. Idempotent."""
        server, self._server = self._server, None
        if server is not None and self.node is not None:  # controlled shutdown first
            await self.node.hand_over(self.config.cluster.controlled_shutdown_timeout_s)
        if server is not None:
            await self._health.enter_graceful_shutdown()
        await self.retention.aclose()  # before the subscriptions: it reads their floors
        try:
            await self.subscriptions.aclose()
        except (OSError, WalIOError) as exc:
            logger.error(
                "saving subscription state at shutdown failed (%s); acknowledgements since "
                "the last save will be redelivered",
                exc,
            )
        if server is not None:
            await server.stop(self.config.grace_seconds)
        node, self.node = self.node, None
        if node is not None:  # after the server: its lease revoked, the cluster sees us go
            await node.aclose()
        etcd, self._etcd = self._etcd, None
        if etcd is not None:  # a start that failed before it joined
            await etcd.aclose()
        await self._close_token_source()  # after the server: no call checks a token now
        try:
            await self.topics.aclose()
        except (OSError, WalIOError) as exc:
            logger.error("closing the topics failed (%s); the next start recovers them", exc)
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


def _leads_nothing(_name: str) -> LeaderTopic | None:
    """The replica leaders of a broker that leads no replicated topic."""
    return None


def auth_interceptor(config: BrokerConfig, metrics: BrokerMetrics) -> AuthInterceptor | None:
    """Token authentication when ``[security] tokens_file`` is set, else None. The file is
    loaded now, before the data directory is touched, so a bad one stops the start with
    one line naming it.

    Raises:
        TokensFileError: The tokens file is missing, unreadable or invalid.
    """
    path = config.security.tokens_file
    if not path:
        return None
    tokens = TokensFile(path)
    count = len(tokens.load())
    logger.info("bearer tokens required on every RPC: %d tokens in %s", count, path)
    failures = metrics.auth_failures
    return AuthInterceptor(tokens, lambda reason: failures.labels(reason).inc())


def raise_fd_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit, and log the budget.

    Every partition holds a descriptor (:mod:`broker.fd_budget`), so the soft limit, often
    1024, would cap a broker far below what the hard limit allows. Returns the soft limit
    now in force (unchanged if raising it is refused).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, exc)
    logger.info(
        "file descriptor budget: soft limit %s, hard limit %s (RLIMIT_NOFILE)",
        "unlimited" if soft == resource.RLIM_INFINITY else soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
    )
    return soft


def check_exposure(config: BrokerConfig) -> None:
    """Refuse to serve on an exposed, unprotected ``listen`` address (the rules are in
    :mod:`broker.exposure`); with ``[security] insecure`` log the reason instead. Warn
    when the metrics listener is reachable from other hosts.

    Raises:
        InsecureListenError: Refused, naming the address, why, and what to do.
    """
    security = config.security
    host, _ = parse_address(config.listen)
    reason = refusal(
        host,
        tls=security.tls,
        client_certs=security.tls_client_ca is not None,
        tokens=security.tokens_file is not None or config.cluster.tokens,
    )
    if reason and not security.insecure:
        raise InsecureListenError(config.listen, reason)
    if reason:
        logger.warning("serving on %s with --insecure: %s", config.listen, reason)
    if config.metrics_listen and not is_loopback(parse_address(config.metrics_listen)[0]):
        logger.warning(
            "metrics_listen %s is not a loopback address: /metrics (topic and subscription "
            "names, lag, rates) is readable, without TLS or tokens, by anyone who reaches it",
            config.metrics_listen,
        )


def _hint_of(partition: Partition) -> int:
    """``partition``'s in-flight hint, for the metrics (read at each scrape)."""
    return partition.in_flight_hint


def _describe_tls(tls: ServerTls | None) -> str:
    if tls is None:
        return "plain TCP, no TLS"
    clients = "client certificates required" if tls.client_ca else "no client certificates"
    return f"TLS, {clients}, certificate valid until {tls.not_after:%Y-%m-%d}"


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


@contextlib.asynccontextmanager
async def _relief() -> AsyncIterator[None]:
    """Run :func:`broker.memory.relieve_forever` while the broker serves."""
    task = asyncio.create_task(relieve_forever(), name="memory-relief")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def serve(config: BrokerConfig, on_ready: Callable[[Broker], None] | None = None) -> None:
    """Run a broker until SIGINT or SIGTERM, then shut down gracefully.

    Args:
        config: What to serve, where.
        on_ready: Called once the broker is listening, with the started broker (its bound
            ``port`` and ``metrics_port``): ``headrace serve`` prints its banner there.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tune_allocator()  # the process is ours: large buffers go back to the system when freed
    async with Broker(config) as broker, _relief():
        # Everything built so far (modules, topics, subscriptions) lives as long as the
        # process: take it out of the cyclic GC's view. Otherwise each full collection
        # walks it all, a 12 ms pause here, and every record in flight waits that long.
        gc.freeze()
        if on_ready is not None:
            on_ready(broker)
        await stop.wait()
        logger.info("signal received; shutting down")
