"""Plain values the client returns: topics, partitions, acknowledged records.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_BROKER = "127.0.0.1:50051"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition: retained offsets ``[first_offset, head)``, bytes and segments."""

    partition: int
    first_offset: int
    head: int
    size_bytes: int
    segments: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic and its partitions."""

    name: str
    partitions: tuple[PartitionInfo, ...]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record was stored. ``duplicate``: the broker had it already."""

    topic: str
    partition: int
    offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a subscription.

    ``cursor`` is the first offset not yet acknowledged, ``head`` the next offset to be
    written, ``lag`` the records at or above the cursor not yet acknowledged, and
    ``in_flight`` those sent to a consumer and not yet acknowledged. ``state`` is one of
    ``CAUGHT_UP``, ``LAGGING``, ``STALLED``, ``NO_CONSUMER`` or ``BLOCKED``; ``reason`` says
    why in words.
    """

    partition: int
    cursor: int
    head: int
    lag: int
    in_flight: int
    oldest_unacked_age_s: float
    state: str
    reason: str


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    """A subscription: its type, attached consumers and per-partition lag."""

    topic: str
    subscription: str
    type: str
    consumers: tuple[str, ...]
    partitions: tuple[PartitionLag, ...]

    @property
    def lag(self) -> int:
        """Records not yet acknowledged, over every partition."""
        return sum(p.lag for p in self.partitions)
