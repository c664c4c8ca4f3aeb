"""Every Prometheus metric of the broker, declared in one place.

Role: names, help texts and labels (DESIGN section 4: every name starts with ``headrace_``,
every counter ends in ``_total``), built on an injected ``CollectorRegistry`` so tests get
a fresh one. Only the asyncio shells record metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from wal import AppendResult


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

    def published(self, topic: str, partition: int, result: AppendResult, size: int) -> None:
        """Count one acknowledged batch."""
        labels = (topic, str(partition))
        self.published_records.labels(*labels).inc(result.last_offset - result.first_offset + 1)
        self.published_bytes.labels(*labels).inc(size)
