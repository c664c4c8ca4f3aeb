"""Subscription dispatch: cursors, acks, consumers and the task that feeds them.

Modules:
    acks          AckRanges: the cursor plus out-of-order acks above it (pure)
    subscription  Subscription, ConsumerSession, Delivery: the notifier-driven dispatch task
    registry      SubscriptionRegistry: create, find, drop, and persist cursors atomically
    errors        DispatchError and its subclasses

Imports ``wal`` only (DESIGN section 1). The heartbeat lag monitor, the other subscription
types, redelivery with backoff and the dead-letter queue arrive with the dispatch issue.
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
from dispatcher.registry import SubscriptionRegistry, check_subscription_name
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
    "InitialPosition",
    "InvalidAckError",
    "InvalidSubscriptionError",
    "PartitionStatus",
    "Subscription",
    "SubscriptionBusyError",
    "SubscriptionNotFoundError",
    "SubscriptionRegistry",
    "SubscriptionStatus",
    "SubscriptionType",
    "check_subscription_name",
]
