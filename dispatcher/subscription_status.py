"""What a subscription reports about itself: the value types of ``lag`` and admin replies.

Owns :class:`PartitionStatus` (one partition: cursor, head, lag, in-flight records, rates,
the state and reason :func:`~dispatcher.diagnosis.diagnose` gives) and
:class:`SubscriptionStatus` (every partition, the consumers, the type, mode and
committer).
:meth:`dispatcher.subscription.Subscription.status` builds them; ``broker.convert`` turns
them into admin replies.

Invariant: ``SubscriptionStatus.lag`` is the sum of its partitions' ``lag``. Example: two
partitions with cursors 10 and 0 and heads 15 and 0, nothing in flight, report lags 5 and
0, and the subscription reports 5.

Pure: frozen data only; imports neither ``asyncio``, ``os`` nor ``time``, and of ours the
pure ``dispatcher.protocol`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.protocol import DeliveryMode, SubscriptionType


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One partition of a subscription, as ``lag`` reports it."""

    partition: int
    cursor: int  # the first offset not acknowledged
    head: int  # the next offset to be written (durable records lie below it)
    lag: int  # records at or above the cursor not yet acknowledged
    in_flight: int  # sent and not yet acknowledged
    oldest_unacked_age_s: float  # age of the record at the cursor (0 when caught up)
    state: str  # CAUGHT_UP | LAGGING | STALLED | NO_CONSUMER | BLOCKED
    reason: str  # "<cause>: <detail>" (dispatcher.diagnosis), "" when caught up
    ingress_rate: float = 0.0  # records/s appended, over the rate window (dispatcher.lag)
    ack_rate: float = 0.0  # records/s acknowledged by this subscription, same window
    drain_s: float | None = 0.0  # lag / (ack_rate - ingress_rate); None: never drains
    trend: str = "steady"  # growing | shrinking | steady: the lag over the window


@dataclass(frozen=True, slots=True)
class SubscriptionStatus:
    """A subscription's state for admin replies."""

    topic: str
    name: str
    type: SubscriptionType
    consumers: tuple[str, ...]
    partitions: tuple[PartitionStatus, ...]
    mode: DeliveryMode = DeliveryMode.AT_LEAST_ONCE
    committer: str = ""  # who commits to it by offset (e.g. "spark"); "" nobody

    @property
    def lag(self) -> int:
        """Records not yet acknowledged, over every partition."""
        return sum(p.lag for p in self.partitions)
