"""The backlog quota of a topic partition: what the backlog is, when it is over, what to do.

Role: the pure rules behind :mod:`broker.retention`. The retention task and the publish path
feed these classes facts (the saved floor, the log's first offset and head, the time) and
carry out what they decide: reject, block or evict, log and count.

Definitions:
- The *floor* of a partition is the lowest cursor any subscription of its topic has saved
  on disk (``SubscriptionRegistry.saved_floor``); ``None`` when the topic has no
  subscription. Retention never deletes at or past it.
- The *backlog* is the records no subscription has consumed yet:
  ``head - max(floor, first_offset)``, and 0 without a subscription (nobody is behind).
- The partition is *over quota* when its backlog exceeds ``quota_messages`` (at exactly the
  quota it is not). The check runs before a batch is appended, so a partition can end up
  above the quota by the batches admitted at the same time.

Worked example: quota 1000, a subscription saved at 4000, first offset 3000, head 5000:
the backlog is 5000 - 4000 = 1000, at the quota, so a publish is admitted (the admission
limit is 4000 + 1000 = 5000, and the head must not pass it). After it lands (head 5100) the
next publish finds 1100 > 1000: over quota. Under ``evict_oldest_backlog`` with sealed
segments based at 3000, 4000, 4500 and an active one at 5050, eviction keeps what the quota
allows from offset 5100 - 1000 = 4100 on: it deletes before 4500 (the first base at or
past 4100), so the backlog becomes 5100 - 4500 = 600.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from wal.policy import SegmentInfo

#: The admission limit of a partition without a quota or a subscription: never reached.
NO_LIMIT = sys.maxsize


class BacklogPolicy(enum.Enum):
    """What a publish to a partition over its backlog quota gets.

    - ``REJECT_PRODUCER`` (default): it fails with ``RESOURCE_EXHAUSTED`` at once.
    - ``BLOCK_PRODUCER``: it waits until the backlog falls to the quota (acknowledgements
      saved move the floor), then proceeds; after ``block_timeout_ms`` it fails with
      ``RESOURCE_EXHAUSTED``.
    - ``EVICT_OLDEST_BACKLOG``: it proceeds, and the oldest sealed segments are deleted,
      past the floor if need be, until the backlog fits the quota (in whole segments; the
      active segment always stays). Subscriptions behind the new first offset skip forward.
    """

    REJECT_PRODUCER = "reject_producer"
    BLOCK_PRODUCER = "block_producer"
    EVICT_OLDEST_BACKLOG = "evict_oldest_backlog"

    def is_reject(self) -> bool:
        """Whether publishes over quota fail at once."""
        return self is BacklogPolicy.REJECT_PRODUCER

    def is_block(self) -> bool:
        """Whether publishes over quota wait for the backlog to shrink."""
        return self is BacklogPolicy.BLOCK_PRODUCER

    def is_evict(self) -> bool:
        """Whether publishes over quota proceed and the oldest backlog is deleted."""
        return self is BacklogPolicy.EVICT_OLDEST_BACKLOG


@dataclass(frozen=True, slots=True)
class BacklogConfig:
    """The backlog quota, the same for every topic partition (validated by
    :class:`broker.config.BrokerConfig`).

    Attributes:
        quota_messages: Most records of backlog per partition; 0 (default) = no quota.
        policy: What a publish over quota gets; see :class:`BacklogPolicy`. Default
            ``REJECT_PRODUCER``.
        block_timeout_ms: ``BLOCK_PRODUCER`` only: how long a publish waits for the backlog
            to shrink before it fails, milliseconds. Default 30,000.
    """

    quota_messages: int = 0
    policy: BacklogPolicy = BacklogPolicy.REJECT_PRODUCER
    block_timeout_ms: int = 30_000

    def has_quota(self) -> bool:
        """Whether any quota applies."""
        return self.quota_messages > 0


class QuotaState(enum.Enum):
    """Where a partition's backlog stands against its quota, as last observed."""

    UNDER = "under"  # at or under the quota (or no quota, or no subscription)
    OVER = "over"

    def is_over(self) -> bool:
        """Whether the backlog was over the quota."""
        return self is QuotaState.OVER


@dataclass(frozen=True, slots=True)
class QuotaCrossed:
    """Event: a partition's backlog crossed its quota, in the direction ``state`` says.

    The shell logs one line per event, so a producer hammering a full partition costs one
    log line, not one per publish.
    """

    state: QuotaState
    backlog: int
    quota: int


def backlog(head: int, floor: int | None, first_offset: int) -> int:
    """Records between the floor (or the first retained offset, if higher) and the head;
    0 without a floor (no subscription)."""
    if floor is None:
        return 0
    return max(0, head - max(floor, first_offset))


def admission_limit(floor: int | None, first_offset: int, quota: int) -> int:
    """The highest head at which a publish is still admitted: ``head <= limit`` is the one
    integer compare the publish path makes per batch."""
    if quota <= 0 or floor is None:
        return NO_LIMIT
    return max(floor, first_offset) + quota


def eviction_offset(segments: Sequence[SegmentInfo], head: int, quota: int) -> int | None:
    """The offset to pass to ``LogWriter.delete_before`` so the backlog fits ``quota``.

    Keeps every record from ``head - quota`` on: the target is the first segment base at
    or past it, so the fewest oldest segments go. When even the active segment starts
    before it, every sealed segment goes (the active one always stays). ``None`` when
    nothing would be deleted.

    Args:
        segments: Every segment, oldest first; the last is the active one.
        head: The offset just past the last record.
        quota: The backlog quota, records (> 0).
    """
    if not segments:
        return None
    keep_from = head - quota
    bases = [s.base_offset for s in segments]
    target = next((b for b in bases if b >= keep_from), bases[-1])
    return target if target > bases[0] else None


class BacklogGate:
    """The backlog quota of one partition: the cached floor, the admission limit, and the
    state last observed.

    The floor is cached because computing it walks every subscription; the shell refreshes
    it on each retention pass, after an eviction, and, at most every ``refresh_s``, when a
    publish finds the partition over quota (acknowledgements saved since may have lowered
    the backlog). A cached floor is never too low for long: it only lags behind acks, and
    the next refresh catches up. A subscription created since the last refresh counts from
    the next one.

    Not task-safe; it needs none: the event loop's tasks use it in turn, and no method
    awaits.

    Args:
        config: The quota and the policy.
        refresh_s: Least seconds between refreshes asked for by :meth:`is_stale`.
    """

    __slots__ = (
        "_evicted_at",
        "_refresh_s",
        "_refreshed_at",
        "config",
        "first_offset",
        "floor",
        "limit",
        "state",
    )

    def __init__(self, config: BacklogConfig, *, refresh_s: float = 0.1) -> None:
        self.config = config
        self._refresh_s = refresh_s
        self._refreshed_at: float | None = None
        self._evicted_at: float | None = None
        #: The saved floor at the last refresh; ``None``: no subscription.
        self.floor: int | None = None
        #: The log's first offset at the last refresh.
        self.first_offset = 0
        #: A publish is admitted while the head is at most this.
        self.limit = NO_LIMIT
        self.state = QuotaState.UNDER

    def refresh(self, floor: int | None, first_offset: int, now: float) -> None:
        """Take a fresh floor and first offset (``now``: monotonic seconds)."""
        self.floor = floor
        self.first_offset = first_offset
        self.limit = admission_limit(floor, first_offset, self.config.quota_messages)
        self._refreshed_at = now

    def is_stale(self, now: float) -> bool:
        """Whether the floor is older than ``refresh_s`` (or was never taken)."""
        return self._refreshed_at is None or now - self._refreshed_at >= self._refresh_s

    def eviction_due(self, now: float) -> bool:
        """Whether an eviction may start: the last began at least ``refresh_s`` ago. An
        active segment alone over quota cannot be evicted, so publishes to it must not each
        start another attempt."""
        return self._evicted_at is None or now - self._evicted_at >= self._refresh_s

    def evicting(self, now: float) -> None:
        """Note that an eviction began at ``now``."""
        self._evicted_at = now

    def backlog(self, head: int) -> int:
        """The backlog at ``head`` against the cached floor."""
        return backlog(head, self.floor, self.first_offset)

    def admits(self, head: int) -> bool:
        """Whether a publish is admitted with the log at ``head``."""
        return head <= self.limit

    def observe(self, head: int) -> QuotaCrossed | None:
        """Judge the partition at ``head``; return an event when the state changed."""
        state = QuotaState.UNDER if head <= self.limit else QuotaState.OVER
        if state is self.state:
            return None
        self.state = state
        return QuotaCrossed(state, self.backlog(head), self.config.quota_messages)
