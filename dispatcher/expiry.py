"""Inactivity expiry of subscriptions: when an abandoned subscription may be deleted.

Owns :class:`IdleTracker`, the rule behind ``[subscriptions] inactive_expiry_ms``. A
subscription is *active* while a consumer is attached, and each time its activity count
moves (an ack, a nack, an ``AckUpTo`` commit, a seek, a consumer attaching or leaving:
:attr:`dispatcher.subscription.Subscription.activity`). It expires once it has been
inactive for the whole expiry, measured on a monotonic clock; the registry then deletes it
through the same path as the ``DeleteSubscription`` RPC (never forced: a consumer that
attaches at the last moment wins).

The registry looks every heartbeat interval, so activity is noticed, and an expiry acted
on, up to one interval late: the idle clock restarts when a look sees the change.

Restarts: the tracker lives in memory only, and the first observation of a subscription
counts as activity. So a broker restart (or a new subscription) starts every idle clock
from zero: a restart never deletes a subscription at once, and a subscription idle across
restarts expires only after one full expiry of uninterrupted uptime. That errs towards
keeping data, which is the side to err on.

Worked example, expiry 60 s, observations at monotonic seconds::

    t=0    no consumer, activity 7   first sight: idle clock starts       idle 0
    t=30   no consumer, activity 7                                        idle 30
    t=45   no consumer, activity 8   an AckUpTo commit: clock restarts    idle 0
    t=100  no consumer, activity 8                                        idle 55
    t=105  1 consumer,   activity 9  attached: never idle                 idle 0
    t=200  no consumer, activity 10  left at t<=200: clock restarts       idle 0
    t=260  no consumer, activity 10                                       idle 60 -> expired

Pure: imports neither ``asyncio``, ``os`` nor ``time``; every call takes ``now``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class _Seen:
    activity: int
    since: float  # monotonic seconds of the last activity


@dataclass(frozen=True, slots=True)
class Expired(Generic[K]):
    """A subscription inactive for at least the expiry."""

    key: K
    idle_s: float


class IdleTracker(Generic[K]):
    """Idle clocks of subscriptions, keyed by anything hashable. Not task-safe; the
    registry calls it from its heartbeat task.

    Args:
        expiry_s: Inactivity after which a subscription expires, seconds (> 0).
    """

    def __init__(self, expiry_s: float) -> None:
        if not expiry_s > 0:
            raise ValueError(f"expiry must be > 0 seconds, got {expiry_s!r}")
        self.expiry_s = expiry_s
        self._seen: dict[K, _Seen] = {}

    def observe(self, key: K, *, attached: bool, activity: int, now: float) -> float:
        """Record what a subscription looks like at ``now``; return its idle seconds."""
        seen = self._seen.get(key)
        if seen is None or attached or seen.activity != activity:
            self._seen[key] = _Seen(activity, now)
            return 0.0
        return max(0.0, now - seen.since)

    def expired(self, now: float) -> list[Expired[K]]:
        """Every subscription idle for at least the expiry at ``now`` (observe them all
        first), the longest idle first."""
        found = [
            Expired(key, now - seen.since)
            for key, seen in self._seen.items()
            if now - seen.since >= self.expiry_s
        ]
        return sorted(found, key=lambda e: -e.idle_s)

    def forget(self, key: K) -> None:
        """Drop ``key`` (the subscription was deleted)."""
        self._seen.pop(key, None)

    def retain(self, keys: set[K]) -> None:
        """Forget every subscription not in ``keys`` (deleted by other means)."""
        for key in [k for k in self._seen if k not in keys]:
            del self._seen[key]
