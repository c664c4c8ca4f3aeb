"""Every Prometheus metric of the broker, declared in one place.

Role: names, help texts and labels, built on an injected ``CollectorRegistry`` so tests get
a fresh one. Only the asyncio shells record metrics. docs/metrics.md lists every family.

Naming (DESIGN section 4, checked by tests/broker/test_metric_names.py): every name starts
with ``headrace_``; base units (seconds, bytes); a counter ends in ``<unit noun>_total``
(``headrace_published_records_total``), a gauge in a unit noun
(``headrace_partition_size_bytes``) unless it is a 0/1 flag (``..._stalled``) or ``_info``.
The design contract fixes three names that keep its spelling:
``headrace_subscription_lag_messages``, ``headrace_dlq_evicted_total`` and
``headrace_dlq_rejected_total`` (entries evicted, dead letters rejected).
The standard ``process_*`` and ``python_info`` families keep their standard names.

Subscription metrics are not pushed: a collector reads the dispatcher's snapshot, which the
heartbeat replaces after every round, when Prometheus scrapes. The scrape runs on the
exporter's thread, and the snapshot is immutable, so it never sees a half-updated state.
Partition metrics are read at the scrape from each log's in-memory state (no I/O).

One piece, though past 600 lines: the rule (STYLE rule 42, DESIGN's module map, and
docs/metrics.md's promise) is that every family is declared in one module, so that one
file answers "which metrics exist, under which names, labels and help". The recorders
(:class:`BrokerMetrics`) and the scrape-time collectors are short; most of the length is
the declarations themselves (names, help texts, buckets), which a split would scatter.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.busy import BusyRule
from dispatcher import SubscriptionSample
from dispatcher.cursor_store import CursorStats
from wal import AppendResult
from wal.writer import CommitObserver, LogWriter

#: Publish-to-dispatch latency, seconds: sub-millisecond when consumers keep up, up to an
#: hour when they drain a backlog (a 10-minute-old record still lands in a finite bucket,
#: so a quantile over a backlog reads its real age, not the top bucket).
DISPATCH_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1200,
    1800,
    3600,
)

#: One write or fsync of a group commit, seconds: tens of microseconds in the page cache, up
#: to seconds for an fsync on a busy or failing disk.
WAL_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)


class BrokerMetrics:
    """The broker's metrics on one registry. Task-safe (prometheus_client locks).

    Args:
        registry: Where every metric is registered. Default: a fresh registry.
        clock: Wall-clock seconds, for the age of the oldest unacknowledged record at
            each scrape. Default: the system clock.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self._clock = clock
        # No <name>_created gauge beside every counter and histogram child: it would double
        # the series a broker with many partitions exports, and no dashboard or alert uses
        # it (Prometheus detects counter resets itself). Process-wide in prometheus_client.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        # The standard process_* and python_info families, under their standard names.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(_BuildInfoCollector())
        labels = ("topic", "partition")
        self.published_records = Counter(
            "headrace_published_records",
            "Records acknowledged to producers.",
            labels,
            registry=self.registry,
        )
        self.published_bytes = Counter(
            "headrace_published_bytes",
            "Bytes of record batches acknowledged to producers.",
            labels,
            registry=self.registry,
        )
        self.backlog_quota_exceeded = Counter(
            "headrace_backlog_quota_exceeded_requests",
            "Publishes that found their partition's backlog over quota, by the policy applied "
            "(rejected, blocked, or admitted with eviction).",
            (*labels, "policy"),
            registry=self.registry,
        )
        self.backlog_evicted_records = Counter(
            "headrace_backlog_evicted_records",
            "Unconsumed records deleted by the evict_oldest_backlog quota policy.",
            labels,
            registry=self.registry,
        )
        self.publish_disk_full = Counter(
            "headrace_publish_disk_full_requests",
            "Publishes rejected (RESOURCE_EXHAUSTED) because the disk holding the partition's "
            "log was full; nothing of them was written.",
            labels,
            registry=self.registry,
        )
        self.producer_ids_expired = Counter(
            "headrace_expired_producer_ids",
            "Idempotent producer ids forgotten: idle for producer_expiry_ms, or the least "
            "recently active past [limits] max_producers_per_partition.",
            labels,
            registry=self.registry,
        )
        self.retention_deleted_segments = Counter(
            "headrace_retention_deleted_segments",
            "Segments deleted by retention (below the subscriptions' saved floor).",
            labels,
            registry=self.registry,
        )
        self.cluster_refusals = Counter(
            "headrace_cluster_refusals",
            "Topic-scoped calls refused before anything was done because this broker may not "
            "serve the topic now, by reason: not-owner, offline, no-session, data-missing, "
            "creating, not-enough-replicas (a replicated topic's publish refused before it "
            "was appended) (cluster mode; always 0 on a single broker).",
            ("reason",),
            registry=self.registry,
        )
        self._node = _NodeInfoCollector()
        self.registry.register(self._node)
        self.auth_failures = Counter(
            "headrace_auth_failures",
            "Calls refused by token authentication or authorization, by reason: missing "
            "(no bearer token), unknown (malformed, unknown or wrong secret), revoked, or "
            "denied (no grant of the role on the resource).",
            ("reason",),
            registry=self.registry,
        )

        self.dispatch_latency = Histogram(
            "headrace_dispatch_latency_seconds",
            "From a record's publish time to its first dispatch to a consumer (per delivery "
            "of a batch slice, using the batch's newest record).",
            ("topic",),
            buckets=DISPATCH_BUCKETS,
            registry=self.registry,
        )

        self.wal_append = Histogram(
            "headrace_wal_append_seconds",
            "Time to write one group commit of batches to a partition's log (no fsync).",
            labels,
            buckets=WAL_BUCKETS,
            registry=self.registry,
        )
        self.wal_fsync = Histogram(
            "headrace_wal_fsync_seconds",
            "Time of the fsync that makes one group commit durable (fsync always).",
            labels,
            buckets=WAL_BUCKETS,
            registry=self.registry,
        )
        self.cursor_flush = Histogram(
            "headrace_cursor_flush_seconds",
            "Time of one save of subscription cursors: an append and fdatasync of each "
            "topic's cursor journal, or a checkpoint of a topic's state files.",
            buckets=WAL_BUCKETS,
            registry=self.registry,
        )
        #: Every metric labelled by topic first, with its label names (in the order
        #: ``remove`` takes them): what :meth:`forget_topic` clears.
        self._per_topic: tuple[tuple[Counter | Histogram, tuple[str, ...]], ...] = (
            (self.published_records, labels),
            (self.published_bytes, labels),
            (self.backlog_quota_exceeded, (*labels, "policy")),
            (self.backlog_evicted_records, labels),
            (self.publish_disk_full, labels),
            (self.producer_ids_expired, labels),
            (self.retention_deleted_segments, labels),
            (self.dispatch_latency, ("topic",)),
            (self.wal_append, labels),
            (self.wal_fsync, labels),
        )

    @functools.cached_property
    def subscriptions_expired(self) -> Counter:
        """``headrace_expired_subscriptions_total{topic}``: subscriptions deleted for
        inactivity (``[subscriptions] inactive_expiry_ms``). Registered on first use: the
        broker uses it at start when expiry is on, so it is exported only then."""
        return Counter(
            "headrace_expired_subscriptions",
            "Subscriptions deleted because no consumer was attached and nothing was acked, "
            "committed or sought for [subscriptions] inactive_expiry_ms.",
            ("topic",),
            registry=self.registry,
        )

    def forget_topic(self, topic: str) -> None:
        """Drop every label set of ``topic`` (a deleted topic): each would otherwise be
        kept, and exported, for the life of the process (about 9 KiB per partition)."""
        per_topic = list(self._per_topic)
        if "subscriptions_expired" in self.__dict__:  # created only when expiry is on
            per_topic.append((self.subscriptions_expired, ("topic",)))
        for metric, names in per_topic:
            for family in metric.collect():
                for labels in {tuple(s.labels[n] for n in names) for s in family.samples}:
                    if labels[0] == topic:
                        metric.remove(*labels)

    def commit_observer(self, topic: str, partition: int) -> CommitObserver:
        """What a partition's log calls after each group commit (its ``on_commit``), with
        its histograms' children looked up once, not per commit. Called as the partition
        opens, it also starts its published counters at 0, so a rate over them covers
        the first batch."""
        labels = (topic, str(partition))
        self.published_records.labels(*labels)
        self.published_bytes.labels(*labels)
        append = self.wal_append.labels(*labels).observe
        fsync = self.wal_fsync.labels(*labels).observe

        def committed(write_s: float, sync_s: float | None, _batches: int) -> None:
            append(write_s)
            if sync_s is not None:
                fsync(sync_s)

        return committed

    def dispatch_observer(self, topic: str) -> Callable[[float], None]:
        """What a subscription of ``topic`` calls with the seconds from publish to each
        first delivery; the histogram child is looked up once, not per delivery."""
        return self.dispatch_latency.labels(topic).observe

    def published(self, topic: str, partition: int, result: AppendResult, size: int) -> None:
        """Count one acknowledged batch."""
        labels = (topic, str(partition))
        self.published_records.labels(*labels).inc(result.last_offset - result.first_offset + 1)
        self.published_bytes.labels(*labels).inc(size)

    def disk_full(self, topic: str, partition: int) -> None:
        """Count one publish rejected because the disk was full."""
        self.publish_disk_full.labels(topic, str(partition)).inc()

    def quota_exceeded(self, topic: str, partition: int, policy: str) -> None:
        """Count one publish that found its partition over the backlog quota."""
        self.backlog_quota_exceeded.labels(topic, str(partition), policy).inc()

    def evicted(self, topic: str, partition: int, records: int) -> None:
        """Count unconsumed records deleted by the eviction policy."""
        self.backlog_evicted_records.labels(topic, str(partition)).inc(records)

    def retention_deleted(self, topic: str, partition: int, segments: int) -> None:
        """Count segments deleted by retention."""
        self.retention_deleted_segments.labels(topic, str(partition)).inc(segments)

    def producers_expired(self, topic: str, partition: int, count: int) -> None:
        """Count producer ids forgotten by expiry."""
        self.producer_ids_expired.labels(topic, str(partition)).inc(count)

    def watch_subscriptions(self, samples: Callable[[], Iterable[SubscriptionSample]]) -> None:
        """Export the subscriptions that ``samples()`` returns at each scrape."""
        self.registry.register(_SubscriptionCollector(samples, self._clock))

    def set_node(self, node_id: str) -> None:
        """Name this broker in ``headrace_node_info{node_id}`` (``local`` until called)."""
        self._node.node_id = node_id

    def refused(self, reason: str) -> None:
        """Count a topic-scoped call refused by the cluster's ownership rule, or a publish
        refused by a replicated topic's leader (``not-enough-replicas``)."""
        self.cluster_refusals.labels(reason).inc()

    def watch_cluster(self, sample: Callable[[], ClusterSample | None]) -> None:
        """Export the cluster member's state that ``sample()`` returns at each scrape:
        an immutable :class:`ClusterSample` taken on the event loop (the scrape runs on the
        exporter's thread), or None before the broker joined."""
        self.registry.register(_ClusterCollector(sample))

    def watch_replication(self, sample: Callable[[], Iterable[ReplicaLagSample] | None]) -> None:
        """Export each follower's lag that ``sample()`` returns at each scrape (the
        replicated topics this broker leads; taken on the event loop, or None)."""
        self.registry.register(_ReplicaLagCollector(sample))

    def watch_cursors(self, stats: Callable[[], CursorStats]) -> None:
        """Export the cursor store's failures, checkpoints and journal sizes that
        ``stats()`` returns at each scrape (safe from the exporter's thread)."""
        self.registry.register(_CursorCollector(stats))

    def watch_partitions(
        self, partitions: Callable[[], Iterable[PartitionLog]], busy: BusyRule | None = None
    ) -> None:
        """Export the head, size, health and in-flight hint of the logs ``partitions()``
        returns at each scrape (read from the exporter's thread: plain attribute reads, no
        I/O); ``busy``: the process-wide rule the hint passes through (none: never busy)."""
        self.registry.register(_PartitionCollector(partitions, busy or BusyRule()))


@dataclass(frozen=True, slots=True)
class PartitionLog:
    """One partition's log, as the partition collector sees it; ``hint``: the
    partition's own in-flight hint (``broker.partition.Partition.in_flight_hint``: 1 while
    replicated), ``None``: the log's commit-cost hint."""

    topic: str
    partition: int
    writer: LogWriter
    hint: Callable[[], int] | None = None


class _BuildInfoCollector(Collector):
    """``headrace_build_info{version,python,grpc} 1``. The package version is looked up at
    the first scrape, not at start (``importlib.metadata`` costs ~40 ms)."""

    def __init__(self) -> None:
        self._labels: list[str] | None = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # The name for the registry's duplicate check, without collecting: a registry
        # with auto_describe would otherwise collect (and look the version up) at start-up.
        yield GaugeMetricFamily("headrace_build_info", "", labels=_BUILD_LABELS)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self._labels is None:
            self._labels = [_package_version(), platform.python_version(), grpc.__version__]
        info = GaugeMetricFamily(
            "headrace_build_info",
            "Always 1; the labels say which headrace, Python and grpcio this broker runs.",
            labels=_BUILD_LABELS,
        )
        info.add_metric(self._labels, 1.0)
        yield info


_BUILD_LABELS = ("version", "python", "grpc")


def _package_version() -> str:
    try:
        return importlib.metadata.version("headrace")
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        return "0+unknown"


class _PartitionCollector(Collector):
    """Head, first offset, size, segments, the failed latch, the in-flight hint and the
    cold reads of every partition's log."""

    def __init__(self, partitions: Callable[[], Iterable[PartitionLog]], busy: BusyRule) -> None:
        self._partitions = partitions
        self._busy = busy

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families()
        yield self._cold_reads()

    @staticmethod
    def _cold_reads() -> CounterMetricFamily:
        return CounterMetricFamily(
            "headrace_partition_cold_reads",
            "Reads of the partition's log that the page cache could not serve, done on a "
            "worker thread instead of the event loop (consumers and Fetch reading data "
            "older than what memory holds).",
            labels=["topic", "partition"],
        )

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        labels = ["topic", "partition"]
        return tuple(
            GaugeMetricFamily(name, text, labels=labels)
            for name, text in (
                (
                    "headrace_partition_head_offset",
                    "Offset just past the partition's last durable record (the next one "
                    "written gets this offset).",
                ),
                (
                    "headrace_partition_first_offset",
                    "The partition's first retained offset (retention moves it up).",
                ),
                ("headrace_partition_size_bytes", "Bytes in the partition's segment logs."),
                ("headrace_partition_segments", "Segments the partition's log holds."),
                (
                    "headrace_wal_failed",
                    "1 once the partition's log latched as failed after an I/O error: it "
                    "refuses every write until the broker restarts (see the broker's log).",
                ),
                (
                    "headrace_partition_in_flight_hint_batches",
                    "Batches the partition's publish answers now suggest a producer keep in "
                    "flight: 2 while its fdatasync outweighs the broker's work per commit "
                    "and the broker is not busy, else 1 (docs/protocol.md, section 4).",
                ),
            )
        )

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        head, first, size, segments, failed, hint = families = self._families()
        cold = self._cold_reads()
        for p in self._partitions():
            labels = [p.topic, str(p.partition)]
            log = p.writer.log
            head.add_metric(labels, p.writer.high_water_mark)
            first.add_metric(labels, p.writer.first_offset)
            size.add_metric(labels, log.size_bytes)
            segments.add_metric(labels, log.segment_count)
            failed.add_metric(labels, 0.0 if log.failure is None else 1.0)
            own = p.hint() if p.hint is not None else p.writer.commit_cost.in_flight_hint
            hint.add_metric(labels, self._busy.in_flight_hint(own))
            cold.add_metric(labels, p.writer.cold_reads)
        yield from families
        yield cold


class _NodeInfoCollector(Collector):
    """``headrace_node_info{node_id} 1``: which cluster node this broker is (``local``
    with no cluster). An info metric, not a label on every series: existing queries,
    dashboards and recording rules keep their label sets, and a query that wants the node
    joins it by instance (``... * on (instance) group_left (node_id)
    headrace_node_info``)."""

    def __init__(self) -> None:
        self.node_id = "local"

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("headrace_node_info", "", labels=("node_id",))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "headrace_node_info",
            "Always 1; node_id is this broker's cluster node id (local with no cluster).",
            labels=("node_id",),
        )
        info.add_metric([self.node_id], 1.0)
        yield info


@dataclass(frozen=True, slots=True)
class ClusterSample:
    """A cluster member's state at one moment, for the scrape (immutable).

    Attributes:
        session_alive: its session (etcd lease) lets it write now.
        session_age_s: seconds since the current session began.
        sessions: sessions made since start (1, +1 at each new session after a loss).
        is_controller: it is the cluster's controller.
        owned_topics: topics it owns and serves.
        owned_partitions: their partitions.
        etcd_reachable: etcd answered its last keepalive in time.
        offline: ``(topic, owner_node, reason)`` of each topic its view says is offline.
        replication: ``(topic, replicas, in_sync, min_insync)`` of each replicated topic
            (more than one replica) it leads, as its view of etcd holds them.
        leader_elections: elections of a replicated topic's leader it won since start.
        unclean_elections: those it won out of sync (``unclean_leader_election``).
        unclean_records_lost: ``(topic, records)``: what its unclean elections gave up
            (at least; ``cluster.replica_member``), summed per topic.
    """

    session_alive: bool
    session_age_s: float
    sessions: int
    is_controller: bool
    owned_topics: int
    owned_partitions: int
    etcd_reachable: bool
    offline: tuple[tuple[str, str, str], ...] = ()
    replication: tuple[tuple[str, int, int, int], ...] = ()
    leader_elections: int = 0
    unclean_elections: int = 0
    unclean_records_lost: tuple[tuple[str, int], ...] = ()


class _ClusterCollector(Collector):
    """The ``headrace_cluster_*`` gauges, read from a :class:`ClusterSample` at the scrape."""

    def __init__(self, sample: Callable[[], ClusterSample | None]) -> None:
        self._sample = sample

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families().values()

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        gauge, topic = GaugeMetricFamily, ("topic", "owner_node", "reason")
        return {
            "alive": gauge(
                "headrace_cluster_session_alive",
                "1 while this broker's etcd session (lease) lets it write; 0: it refuses "
                "writes (reason no-session) until it has a new session.",
            ),
            "age": gauge(
                "headrace_cluster_session_age_seconds",
                "Seconds since this broker's current session began.",
            ),
            "sessions": CounterMetricFamily(
                "headrace_cluster_sessions",
                "Sessions this broker made since it started (a rise after the first: its "
                "session was lost and it re-registered).",
            ),
            "controller": gauge(
                "headrace_cluster_is_controller", "1 while this broker is the controller."
            ),
            "topics": gauge("headrace_cluster_owned_topics", "Topics this broker owns."),
            "partitions": gauge(
                "headrace_cluster_owned_partitions", "Partitions of the topics it owns."
            ),
            "etcd": gauge(
                "headrace_cluster_etcd_reachable",
                "1 while etcd answers this broker's session keepalives in time.",
            ),
            "offline": gauge(
                "headrace_cluster_topic_offline",
                "1 for each topic this broker's view says is offline (its owner is down, "
                "its data missing, or it is still being created), with the owner and why.",
                labels=topic,
            ),
            "replicas": gauge(
                "headrace_cluster_topic_replicas",
                "Replicas of each replicated topic this broker leads.",
                labels=("topic",),
            ),
            "in_sync": gauge(
                "headrace_cluster_topic_in_sync_replicas",
                "In-sync replicas (the leader included) of each replicated topic this broker "
                "leads; below headrace_cluster_topic_replicas: under-replicated.",
                labels=("topic",),
            ),
            "min_insync": gauge(
                "headrace_cluster_topic_min_insync_replicas",
                "min_insync_replicas of each replicated topic this broker leads; "
                "headrace_cluster_topic_in_sync_replicas below it: every publish is "
                "refused (not-enough-replicas).",
                labels=("topic",),
            ),
            "elections": CounterMetricFamily(
                "headrace_cluster_leader_elections",
                "Elections of a replicated topic's leader this broker won (its leader's "
                "session had ended), clean or unclean.",
            ),
            "unclean": CounterMetricFamily(
                "headrace_cluster_unclean_elections",
                "Elections this broker won as an out-of-sync replica "
                "(unclean_leader_election): records only the old in-sync set had are lost.",
            ),
            "lost": CounterMetricFamily(
                "headrace_cluster_unclean_lost_records",
                "Records committed by an old leader that this broker's unclean elections "
                "gave up, at least (its last published high watermark over this broker's "
                "log end), per topic.",
                labels=("topic",),
            ),
        }

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        sample = self._sample()
        if sample is None:
            return
        families = self._families()
        families["alive"].add_metric([], float(sample.session_alive))
        families["age"].add_metric([], sample.session_age_s)
        families["sessions"].add_metric([], float(sample.sessions))
        families["controller"].add_metric([], float(sample.is_controller))
        families["topics"].add_metric([], float(sample.owned_topics))
        families["partitions"].add_metric([], float(sample.owned_partitions))
        families["etcd"].add_metric([], float(sample.etcd_reachable))
        for name, owner, reason in sample.offline:
            families["offline"].add_metric([name, owner, reason], 1.0)
        for name, replicas, in_sync, min_insync in sample.replication:
            families["replicas"].add_metric([name], float(replicas))
            families["in_sync"].add_metric([name], float(in_sync))
            families["min_insync"].add_metric([name], float(min_insync))
        families["elections"].add_metric([], float(sample.leader_elections))
        families["unclean"].add_metric([], float(sample.unclean_elections))
        for name, lost in sample.unclean_records_lost:
            families["lost"].add_metric([name], float(lost))
        yield from families.values()


@dataclass(frozen=True, slots=True)
class ReplicaLagSample:
    """One follower of a replicated topic this broker leads, in one partition (or one
    kind of other log: ``log`` ``state`` or ``dlq``, the largest over those logs,
    ``partition`` -1), at one scrape: the records it lacks of the leader's durable end
    and the seconds since it was last caught up (:class:`broker.replica.leader.FollowerLag`,
    :class:`broker.replica.leader.LogLag`)."""

    topic: str
    partition: int
    follower: str
    lag_records: int
    lag_s: float
    log: str = "partition"


class _ReplicaLagCollector(Collector):
    """``headrace_replication_lag_records`` and ``_seconds`` per topic, partition,
    follower and log kind, on the leader."""

    def __init__(self, sample: Callable[[], Iterable[ReplicaLagSample] | None]) -> None:
        self._sample = sample

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        labels = ("topic", "partition", "follower", "log")
        return (
            GaugeMetricFamily(
                "headrace_replication_lag_records",
                "Records a follower lacks of its leader's durable end, per replicated topic "
                "this broker leads, partition and follower (0: caught up); log=state and "
                "log=dlq (partition empty): its subscription-state log and the largest "
                "over its dead-letter queues.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "headrace_replication_lag_seconds",
                "Seconds since a follower was last caught up with its leader's end (0 "
                "while it is), per replicated topic this broker leads, partition and "
                "follower, and log=state / log=dlq as for _records; past "
                "replica_lag_time_max_ms behind in a partition it leaves the in-sync set.",
                labels=labels,
            ),
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        records, seconds = families = self._families()
        for lag in self._sample() or ():
            partition = str(lag.partition) if lag.partition >= 0 else ""
            labels = [lag.topic, partition, lag.follower, lag.log]
            records.add_metric(labels, float(lag.lag_records))
            seconds.add_metric(labels, lag.lag_s)
        yield from families


class _CursorCollector(Collector):
    """The cursor store's failed flushes, checkpoints and journal sizes."""

    def __init__(self, stats: Callable[[], CursorStats]) -> None:
        self._stats = stats

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families()

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, CounterMetricFamily, GaugeMetricFamily]:
        return (
            CounterMetricFamily(
                "headrace_cursor_flush_failures",
                "Saves of subscription cursors that failed (an I/O error such as a full "
                "disk): retried every cursor_flush_interval_ms; until one succeeds, acks "
                "since the last save would be redelivered after a crash.",
            ),
            CounterMetricFamily(
                "headrace_cursor_checkpoints",
                "Checkpoints of a topic's subscription states into their files (the "
                "journal passed its size limit, the broker stopped, or it started on a "
                "damaged journal).",
            ),
            GaugeMetricFamily(
                "headrace_cursor_journal_bytes",
                "Bytes in the topic's cursor journal (emptied by each checkpoint).",
                labels=["topic"],
            ),
        )

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        failures, checkpoints, journal = families = self._families()
        failures.add_metric([], stats.failed_flushes)
        checkpoints.add_metric([], stats.checkpoints)
        for topic, size in sorted(stats.journal_bytes.items()):
            journal.add_metric([topic], size)
        yield from families


class _SubscriptionCollector(Collector):
    """Lag (records and age), in-flight records, polls, the STALLED and BLOCKED flags and
    the dead-letter queue of every subscription.

    Cheap with many subscriptions: ``samples()`` is called once per scrape and rebuilds a
    subscription's sample only when something in it changed, and the age needs no read
    here (the sample carries the oldest unacknowledged record's publish time; the scrape
    subtracts it from now).
    """

    def __init__(
        self, samples: Callable[[], Iterable[SubscriptionSample]], clock: Callable[[], float]
    ) -> None:
        self._samples = samples
        self._clock = clock

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families().values()

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for field, (kind, name, text) in _SUBSCRIPTION_FAMILIES.items():
            labels = _PART_LABELS if field in _PER_PARTITION else _SUB_LABELS
            if kind == "counter":
                families[field] = CounterMetricFamily(name, text, labels=labels)
            else:
                families[field] = GaugeMetricFamily(name, text, labels=labels)
        return families

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        families = self._families()
        now = self._clock()
        for s in self._samples():
            names = [s.topic, s.subscription]
            for field in _SUBSCRIPTION_COUNTER_FIELDS:
                families[field].add_metric(names, getattr(s, field))
            families["stalled"].add_metric(names, 1.0 if s.stalled else 0.0)
            families["blocked"].add_metric(names, 1.0 if s.blocked else 0.0)
            families["dlq_entries"].add_metric(names, s.dlq_entries)
            if s.dlq_max_entries:
                families["dlq_max_entries"].add_metric(names, s.dlq_max_entries)
            for p in s.partitions:
                labels = [s.topic, str(p.partition), s.subscription]
                families["lag"].add_metric(labels, p.lag)
                families["in_flight"].add_metric(labels, p.in_flight)
                age = 0.0
                if p.oldest_unacked_ms is not None:
                    age = max(0.0, now - p.oldest_unacked_ms / 1000)
                families["oldest_unacked_age"].add_metric(labels, age)
        yield from families.values()


_SUB_LABELS = ["topic", "subscription"]
_PART_LABELS = ["topic", "partition", "subscription"]
_PER_PARTITION = frozenset({"lag", "in_flight", "oldest_unacked_age"})

#: Every subscription family: key -> (type, name, help). Counter keys are
#: :class:`SubscriptionSample` fields.
_SUBSCRIPTION_FAMILIES: dict[str, tuple[str, str, str]] = {
    "lag": (
        "gauge",
        "headrace_subscription_lag_messages",
        "Records at or above the cursor not yet acknowledged.",
    ),
    "oldest_unacked_age": (
        "gauge",
        "headrace_subscription_oldest_unacked_age_seconds",
        "Seconds since the oldest unacknowledged record (the one at the cursor) was "
        "published; 0 when caught up.",
    ),
    "in_flight": (
        "gauge",
        "headrace_subscription_in_flight_records",
        "Records sent to consumers and not yet acknowledged.",
    ),
    "stalled": (
        "gauge",
        "headrace_subscription_stalled",
        "1 while the subscription has a backlog, room, and no progress (STALLED).",
    ),
    "blocked": (
        "gauge",
        "headrace_subscription_blocked",
        "1 while any partition is BLOCKED (poison policy block, or a dead-letter write "
        "that keeps failing): it sends nothing until an operator acts.",
    ),
    "notifier_polls": (
        "counter",
        "headrace_dispatcher_notifier_polls",
        "Dispatch passes triggered by the notifier (new durable records, credit, acks).",
    ),
    "heartbeat_polls": (
        "counter",
        "headrace_dispatcher_heartbeat_polls",
        "Dispatch passes triggered by the heartbeat lag monitor.",
    ),
    "task_restarts": (
        "counter",
        "headrace_dispatcher_task_restarts",
        "Dispatch tasks the heartbeat found dead and restarted.",
    ),
    "dispatched": (
        "counter",
        "headrace_dispatched_records",
        "Records sent to consumers (first sends).",
    ),
    "redelivered": ("counter", "headrace_redelivered_records", "Records sent again (any reason)."),
    "acked": (
        "counter",
        "headrace_acked_records",
        "Records newly acknowledged (by consumers, commits, or once dead-lettered or dropped).",
    ),
    "nacked": (
        "counter",
        "headrace_nacked_records",
        "Records a consumer gave back (nack); each is sent again or becomes poison.",
    ),
    "released": (
        "counter",
        "headrace_released_records",
        "Records a consumer closing cleanly gave back unseen: not delivery attempts; each is "
        "sent again at once (and counted again by dispatched or redelivered).",
    ),
    "ack_timeouts": (
        "counter",
        "headrace_subscription_timed_out_records",
        "Records not acknowledged within the ack timeout (each is sent again).",
    ),
    "dead_lettered": (
        "counter",
        "headrace_dead_lettered_records",
        "Poison records moved to the dead-letter queue (or rejected by it).",
    ),
    "dropped": (
        "counter",
        "headrace_poison_dropped_records",
        "Poison records dropped (policy drop).",
    ),
    "dlq_events": ("counter", "headrace_dlq_events", "Entries written to the dead-letter queue."),
    "dlq_entries": (
        "gauge",
        "headrace_dlq_entries",
        "Entries in the subscription's dead-letter queue.",
    ),
    "dlq_max_entries": (
        "gauge",
        "headrace_dlq_max_entries",
        "The dead-letter queue's capacity (max_entries); only for subscriptions that have a queue.",
    ),
    "dlq_evicted": (
        "counter",
        "headrace_dlq_evicted",
        "Dead-letter entries removed by overflow (drop_oldest) or max_age.",
    ),
    "dlq_rejected": (
        "counter",
        "headrace_dlq_rejected",
        "Dead letters refused by a full queue (overflow policy reject).",
    ),
}

_SUBSCRIPTION_COUNTER_FIELDS = tuple(
    field for field, (kind, _, _) in _SUBSCRIPTION_FAMILIES.items() if kind == "counter"
)
