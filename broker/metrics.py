"""Every Prometheus metric of the broker, declared in one place.

Role: names, help texts and labels (DESIGN section 4: every name starts with ``headrace_``,
every counter ends in ``_total``), built on an injected ``CollectorRegistry`` so tests get
a fresh one. Only the asyncio shells record metrics.

Subscription metrics are not pushed: a collector reads the dispatcher's snapshot, which the
heartbeat replaces after every round, when Prometheus scrapes. The scrape runs on the
exporter's thread, and the snapshot is immutable, so it never sees a half-updated state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dispatcher import SubscriptionSample
from wal import AppendResult
from wal.writer import CommitObserver

_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
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
)


class BrokerMetrics:
    """The broker's metrics on one registry. Task-safe (prometheus_client locks)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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
            "headrace_backlog_quota_exceeded",
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
            "headrace_publish_disk_full",
            "Publishes rejected (RESOURCE_EXHAUSTED) because the disk holding the partition's "
            "log was full; nothing of them was written.",
            labels,
            registry=self.registry,
        )
        self.producer_ids_expired = Counter(
            "headrace_producer_ids_expired",
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
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

        self.wal_append = Histogram(
            "headrace_wal_append_seconds",
            "Time to write one group commit of batches to a partition's log (no fsync).",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.wal_fsync = Histogram(
            "headrace_wal_fsync_seconds",
            "Time of the fsync that makes one group commit durable (fsync always).",
            labels,
            buckets=_LATENCY_BUCKETS,
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

    def forget_topic(self, topic: str) -> None:
        """Drop every label set of ``topic`` (a deleted topic): each would otherwise be
        kept, and exported, for the life of the process (about 9 KiB per partition)."""
        for metric, names in self._per_topic:
            for family in metric.collect():
                for labels in {tuple(s.labels[n] for n in names) for s in family.samples}:
                    if labels[0] == topic:
                        metric.remove(*labels)

    def commit_observer(self, topic: str, partition: int) -> CommitObserver:
        """What a partition's log calls after each group commit (its ``on_commit``), with
        its histograms' children looked up once, not per commit."""
        labels = (topic, str(partition))
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
        self.registry.register(_SubscriptionCollector(samples))

    @functools.cached_property
    def subscriptions_expired(self) -> Counter:
        """``headrace_subscriptions_expired_total{topic}``: subscriptions deleted for
        inactivity (``[subscriptions] inactive_expiry_ms``). Registered on first use: the
        broker uses it at start when expiry is on, so it is exported only then."""
        return Counter(
            "headrace_subscriptions_expired",
            "Subscriptions deleted because no consumer was attached and nothing was acked, "
            "committed or sought for [subscriptions] inactive_expiry_ms.",
            ("topic",),
            registry=self.registry,
        )


class _SubscriptionCollector(Collector):
    """Lag, in-flight records, polls and the STALLED flag of every subscription."""

    def __init__(self, samples: Callable[[], Iterable[SubscriptionSample]]) -> None:
        self._samples = samples

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        sub_labels = ["topic", "subscription"]
        part_labels = ["topic", "partition", "subscription"]
        lag = GaugeMetricFamily(
            "headrace_subscription_lag_messages",
            "Records at or above the cursor not yet acknowledged.",
            labels=part_labels,
        )
        in_flight = GaugeMetricFamily(
            "headrace_subscription_in_flight_messages",
            "Records sent to consumers and not yet acknowledged.",
            labels=part_labels,
        )
        stalled = GaugeMetricFamily(
            "headrace_subscription_stalled",
            "1 while the subscription has a backlog, room, and no progress (STALLED).",
            labels=sub_labels,
        )
        notifier = CounterMetricFamily(
            "headrace_dispatcher_notifier_polls",
            "Dispatch passes triggered by the notifier (new durable records, credit, acks).",
            labels=sub_labels,
        )
        heartbeat = CounterMetricFamily(
            "headrace_dispatcher_heartbeat_polls",
            "Dispatch passes triggered by the heartbeat lag monitor.",
            labels=sub_labels,
        )
        restarts = CounterMetricFamily(
            "headrace_dispatcher_task_restarts",
            "Dispatch tasks the heartbeat found dead and restarted.",
            labels=sub_labels,
        )
        counters = {
            field: CounterMetricFamily(name, text, labels=sub_labels)
            for field, name, text in _SUBSCRIPTION_COUNTERS
        }
        dlq_entries = GaugeMetricFamily(
            "headrace_dlq_entries",
            "Entries in the subscription's dead-letter queue.",
            labels=sub_labels,
        )
        for s in self._samples():
            names = [s.topic, s.subscription]
            stalled.add_metric(names, 1.0 if s.stalled else 0.0)
            notifier.add_metric(names, s.notifier_polls)
            heartbeat.add_metric(names, s.heartbeat_polls)
            restarts.add_metric(names, s.task_restarts)
            for field, family in counters.items():
                family.add_metric(names, getattr(s, field))
            dlq_entries.add_metric(names, s.dlq_entries)
            for p in s.partitions:
                labels = [s.topic, str(p.partition), s.subscription]
                lag.add_metric(labels, p.lag)
                in_flight.add_metric(labels, p.in_flight)
        yield from (lag, in_flight, stalled, notifier, heartbeat, restarts, dlq_entries)
        yield from counters.values()


#: Per-subscription counters: (SubscriptionSample field, metric name, help).
_SUBSCRIPTION_COUNTERS = (
    ("dispatched", "headrace_dispatched_records", "Records sent to consumers (first sends)."),
    ("redelivered", "headrace_redelivered_records", "Records sent again (any reason)."),
    (
        "ack_timeouts",
        "headrace_subscription_ack_timeouts",
        "Records not acknowledged within the ack timeout (each is sent again).",
    ),
    (
        "dead_lettered",
        "headrace_dead_lettered_records",
        "Poison records moved to the dead-letter queue (or rejected by it).",
    ),
    ("dropped", "headrace_poison_dropped_records", "Poison records dropped (policy drop)."),
    ("dlq_events", "headrace_dlq_events", "Entries written to the dead-letter queue."),
    (
        "dlq_evicted",
        "headrace_dlq_evicted",
        "Dead-letter entries removed by overflow (drop_oldest) or max_age.",
    ),
    (
        "dlq_rejected",
        "headrace_dlq_rejected",
        "Dead letters refused by a full queue (overflow policy reject).",
    ),
)
