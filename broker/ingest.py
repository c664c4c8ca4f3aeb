"""Appending a batch to a partition as every publisher does: quota, append, metric.

Owns :func:`append_batch` and :data:`Append` (its shape once bound to a broker's parts).
The Publish RPCs and dead-letter replay both go through it, so a replay obeys the backlog
quota (waits under ``block_producer``, fails under ``reject_producer``, makes room under
``evict_oldest_backlog``) and counts in ``headrace_published_*`` like any producer. A publish
that finds the disk full is counted in ``headrace_publish_disk_full_requests_total`` and fails with
:class:`~wal.DiskFullError` (``RESOURCE_EXHAUSTED``); nothing of it stays in the log, and
the next publish tries the disk again. A publish a replicated topic's leader refuses before
appending (``not-enough-replicas``) is counted in ``headrace_cluster_refusals_total``
under its reason, as the ownership refusals are.

Cancellation: the wait for the quota ends with the caller; once the partition has
admitted the batch, the append and its count run to their end (:class:`Partition` runs
them under :func:`wal.run_to_end`), so a Publish whose deadline expires or whose
connection drops leaves the batch in the log, its dedup entry committed and its records
counted, exactly as if it had been answered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from broker.errors import TopicRefusedError
from broker.metrics import BrokerMetrics
from broker.partition import Partition
from broker.retention import RetentionService
from wal import AppendResult, DiskFullError

#: ``append(topic, partition, data) -> (result, duplicate)``: :func:`append_batch` bound to
#: a broker's backlog quota and metrics.
Append = Callable[[str, Partition, bytes], Awaitable[tuple[AppendResult, bool]]]


async def append_batch(
    topic: str,
    partition: Partition,
    data: bytes,
    *,
    retention: RetentionService | None,
    metrics: BrokerMetrics,
    on_queued: Callable[[], None] | None = None,
) -> tuple[AppendResult, bool]:
    """Admit ``data`` under the backlog quota (``retention``; ``None``: no quota), append it
    to ``partition`` and count it as published (unless it was a producer's duplicate).

    ``on_queued`` is told when the batch has its place in the log writer's queue (see
    :meth:`Partition.append`): after the quota admitted it, before it is written.

    Returns:
        Where the batch landed, and whether it was a duplicate of one already appended.

    Raises:
        BacklogQuotaExceededError: over quota under ``reject_producer``, or still over it
            when ``block_producer``'s wait ends.
        InvalidBatchError: the batch is malformed or over a limit; nothing was appended.
        DiskFullError: the disk is full; nothing was appended.
        TopicRefusedError: (replicated) too few in-sync replicas; nothing was appended.
    """
    blocked = retention.admit(topic, partition) if retention is not None else None
    if blocked is not None:
        await blocked  # block_producer: the backlog is over its quota

    def count(result: AppendResult) -> None:
        metrics.published(topic, partition.index, result, len(data))

    try:
        return await partition.append(data, count, on_queued=on_queued)
    except DiskFullError:
        metrics.disk_full(topic, partition.index)
        raise
    except TopicRefusedError as exc:
        metrics.refused(exc.refusal.reason)
        raise
