"""Subscription dispatch: cursors, acks, consumers and the task that feeds them.

Modules:
    acks          AckRanges: the cursor plus out-of-order acks above it (pure)
    lag           HeartbeatConfig, LagMonitor: the heartbeat's re-poll and STALLED rules (pure)
    subscription  Subscription, ConsumerSession, Delivery: the notifier-driven dispatch task
    registry      SubscriptionRegistry: create, find, drop, persist cursors atomically; the
                  heartbeat task and the metrics snapshot
    errors        DispatchError and its subclasses

Imports ``wal`` only (DESIGN section 1). The other subscription types, redelivery with
backoff and the dead-letter queue are still to come (issue 4).
"""

from dispatcher.acks import AckRanges
from dispatcher.errors import (
    DispatcherClosedError,
    DispatchError,
    InvalidAckError,
    InvalidSubscriptionError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
)
from dispatcher.lag import HeartbeatConfig
from dispatcher.registry import (
    PartitionSample,
    SubscriptionRegistry,
    SubscriptionSample,
    check_subscription_name,
)
from dispatcher.subscription import (
    ConsumerSession,
    Delivery,
    InitialPosition,
    PartitionStatus,
    Subscription,
    SubscriptionStatus,
    SubscriptionType,
)

__all__ = [
    "AckRanges",
    "ConsumerSession",
    "Delivery",
    "DispatchError",
    "DispatcherClosedError",
    "HeartbeatConfig",
    "InitialPosition",
    "InvalidAckError",
    "InvalidSubscriptionError",
    "PartitionSample",
    "PartitionStatus",
    "Subscription",
    "SubscriptionBusyError",
    "SubscriptionNotFoundError",
    "SubscriptionRegistry",
    "SubscriptionSample",
    "SubscriptionStatus",
    "SubscriptionType",
    "check_subscription_name",
]
