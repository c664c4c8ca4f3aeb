"""Errors of subscription dispatch, under one root: :class:`DispatchError`.

Role: what the dispatcher raises for requests it cannot serve. The broker maps each class to
one gRPC status code (``broker.error_status``). Messages say what was wrong and what to do.
"""

from __future__ import annotations

from proto.shown import shown


class DispatchError(Exception):
    """Root of every error raised by the ``dispatcher`` package."""


class InvalidSubscriptionError(DispatchError):
    """Raised for a bad subscription name, type, position or partition."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class SubscriptionNotFoundError(DispatchError):
    """Raised when a request names a subscription that does not exist."""

    def __init__(self, topic: str, subscription: str) -> None:
        self.topic = topic
        self.subscription = subscription
        super().__init__(
            f"subscription {subscription!r} on topic {topic!r} does not exist; a consumer "
            f"creates it: `headrace consume {topic} --subscription {subscription}`"
        )


class SubscriptionBusyError(DispatchError):
    """Raised when a consumer joins an exclusive subscription that already has one."""

    def __init__(self, topic: str, subscription: str, holder: str) -> None:
        self.topic = topic
        self.subscription = subscription
        super().__init__(
            f"subscription {subscription!r} on topic {topic!r} is exclusive and consumer "
            f"{holder!r} holds it; stop that consumer or use another subscription name"
        )


class SubscriptionCommittedError(DispatchError):
    """Raised when a consumer attaches, unforced, to a subscription that a reader which
    pulls by offset (a Spark query) commits to: both would move one cursor."""

    def __init__(
        self, topic: str, subscription: str, committer: str, last_commit_s: float | None
    ) -> None:
        self.topic = topic
        self.subscription = subscription
        self.committer = committer
        when = (
            "not since the broker started"
            if last_commit_s is None
            else f"last commit {last_commit_s:.0f} s ago"
        )
        super().__init__(
            f"subscription {shown(subscription)} on topic {shown(topic)} is committed to by "
            f"{shown(committer)} ({when}): a consumer's acks would move the cursor it "
            "commits, so lag would no longer be the committer's and retention could delete "
            "records it has not read; use another subscription name, or attach anyway with "
            "--force (client: force=True)"
        )


class InvalidAckError(DispatchError):
    """Raised when a consumer acknowledges offsets that were never delivered to it."""

    def __init__(self, partition: int, offset: int, delivered: int, what: str = "ack") -> None:
        self.partition = partition
        self.offset = offset
        super().__init__(
            f"{what} of offset {offset} on partition {partition}: only offsets below "
            f"{delivered} were delivered; {what} only offsets of messages you received"
        )


class DispatcherClosedError(DispatchError):
    """Raised when a subscription is wanted while the broker shuts down."""

    def __init__(self) -> None:
        super().__init__("the broker is shutting down; reconnect once it is back")


class SubscriptionLimitError(DispatchError):
    """Raised when a request would take a topic or subscription past one of the broker's
    ``[limits]`` (subscriptions per topic, consumers per subscription, credit per
    consumer); nothing was changed."""

    def __init__(self, setting: str, limit: int, problem: str, advice: str) -> None:
        self.setting = setting
        self.limit = limit
        self.problem = problem
        super().__init__(f"{problem}; the limit is {limit} ([limits] {setting}); {advice}")


class SubscriptionInUseError(DispatchError):
    """Raised when a subscription is to be deleted while consumers are attached to it and
    the delete is not forced; nothing was changed."""

    def __init__(self, topic: str, subscription: str, consumers: tuple[str, ...]) -> None:
        self.topic = topic
        self.subscription = subscription
        self.consumers = consumers
        names = ", ".join(repr(c) for c in consumers)
        super().__init__(
            f"subscription {subscription!r} on topic {topic!r} has {len(consumers)} "
            f"consumer(s) attached ({names}); stop them, or use --force to detach them and "
            "delete anyway"
        )


class SubscriptionDeletedError(SubscriptionNotFoundError):
    """Raised to a consumer whose subscription was deleted under it (an admin's forced
    delete, or inactivity expiry): the subscription no longer exists."""

    def __init__(self, topic: str, subscription: str, why: str) -> None:
        super().__init__(topic, subscription)
        self.args = (
            f"subscription deleted: {subscription!r} on topic {topic!r} ({why}); subscribe "
            "again to create it anew at its initial position",
        )


class DlqConfigError(DispatchError, ValueError):
    """Raised when a dead-letter queue setting is out of range or of the wrong kind."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid dead-letter queue setting {field}={value!r}: {allowed}")


class DlqFullError(DispatchError):
    """Raised by ``put`` under ``OverflowPolicy.BLOCK`` when the queue is full; nothing was
    stored."""

    def __init__(self, topic: str, subscription: str, entries: int, max_entries: int) -> None:
        self.topic = topic
        self.subscription = subscription
        self.entries = entries
        self.max_entries = max_entries
        super().__init__(
            f"the dead-letter queue of {topic}/{subscription} is full at {entries} entries "
            f"(max_entries={max_entries}, overflow=block); the subscription waits until you "
            f"ack, purge or replay it (`headrace dlq ack|purge|replay`)"
        )


class DlqCorruptError(DispatchError):
    """Raised when a stored entry lacks or garbles a bookkeeping header: a damaged queue."""

    def __init__(self, sequence: int, header: str, problem: str) -> None:
        self.sequence = sequence
        self.header = header
        self.problem = problem
        super().__init__(
            f"dead-letter entry {sequence} is damaged: header {header!r} {problem}; the "
            "queue's log was not written by a dead-letter queue or is corrupt; inspect it "
            "with `headrace wal inspect`, then ack past the entry"
        )


class StateOwnerError(DispatchError):
    """Raised when a subscription's state is changed outside its owner: the dispatch task
    (or the notifier's synchronous pass while that task sleeps). A bug in the broker, never
    a client's mistake: see :mod:`dispatcher.dispatch_loop`."""

    def __init__(self, topic: str, subscription: str, owner: object, caller: object) -> None:
        self.topic = topic
        self.subscription = subscription
        name = getattr(owner, "get_name", lambda: repr(owner))()
        who = "no task" if caller is None else repr(caller)
        super().__init__(
            f"the state of {topic}/{subscription} is owned by the task {name!r}; {who} may "
            "not change it: queue a command instead (Subscription._submit)"
        )


class DlqFollowedError(DispatchError):
    """A dead-letter queue of a replicated topic this broker follows: only the replica
    fetcher writes it here (the topic's leader holds the queue)."""

    def __init__(self, topic: str, subscription: str) -> None:
        self.topic, self.subscription = topic, subscription
        super().__init__(
            f"the dead-letter queue of {topic}/{subscription} is a replica here: this broker "
            "follows the topic, and only its leader writes the queue"
        )


class NotCommittedError(DispatchError):
    """A save that must be committed before it counts (a replicated topic's subscription
    state) cannot be now: the topic's in-sync set is below ``min_insync_replicas``, or this
    broker stopped leading it. Expected while a replicated topic is degraded, not a fault of
    the dispatcher: a dispatch pass that meets it is retried by the heartbeat, and logged
    as a WARNING without a traceback. The broker raises it as
    :class:`broker.errors.ReplicationOutcomeUnknownError`."""
