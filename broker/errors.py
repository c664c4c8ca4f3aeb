"""Errors of the broker's own domain, under one root: :class:`BrokerError`.

Role: what the services raise for requests that cannot be served; :mod:`broker.status` maps
each class (and the ``wal`` errors) to one gRPC status code. Messages say what was wrong and
what to do.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Root of every error raised by the ``broker`` package."""


class InvalidRequestError(BrokerError):
    """Raised when a request field is missing or out of range."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class MalformedRequestError(BrokerError):
    """Raised when a request's bytes do not parse as the RPC's request message."""

    def __init__(self, message_type: str, reason: str) -> None:
        self.message_type = message_type
        self.reason = reason
        super().__init__(
            f"request does not parse as {message_type}: {reason}; send a serialized "
            f"{message_type} (regenerate the client from proto/ if it is out of date)"
        )


class TopicNotFoundError(BrokerError):
    """Raised when a request names a topic that does not exist."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(
            f"topic {topic!r} does not exist; create it with `headrace topics create {topic} "
            "--partitions N`"
        )


class TopicExistsError(BrokerError):
    """Raised when creating a topic whose name is taken."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} already exists")


class ProducerSequenceError(BrokerError):
    """Raised when an idempotent producer's batch leaves a sequence gap, runs past the next
    expected sequence, or starts below the producer's first appended sequence."""

    def __init__(self, producer_id: int, expected: int, got: int) -> None:
        self.producer_id = producer_id
        self.expected = expected
        self.got = got
        super().__init__(
            f"producer {producer_id}: batch sequence {got} is out of order (expected "
            f"{expected}); restart the producer to get a new producer id"
        )


class ShuttingDownError(BrokerError):
    """Raised when a request arrives while the broker shuts down."""

    def __init__(self) -> None:
        super().__init__("the broker is shutting down; retry against it once it is back")


class BacklogQuotaExceededError(BrokerError):
    """Raised when a publish goes to a partition whose backlog is over its quota (policy
    ``reject_producer``), or stayed over it for the whole block timeout (``block_producer``).
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        backlog: int,
        quota: int,
        policy: str,
        *,
        waited_ms: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.backlog = backlog
        self.quota = quota
        self.policy = policy
        self.waited_ms = waited_ms
        waited = "" if waited_ms is None else f" after waiting {waited_ms} ms"
        super().__init__(
            f"topic {topic!r} partition {partition}: a backlog of {backlog} unconsumed records "
            f"is over the quota of {quota}{waited} (policy {policy}); consume and acknowledge "
            "to shrink it, raise [backlog] quota_messages, or change [backlog] policy"
        )


class DeadLetterReplayError(BrokerError):
    """Raised when a dead-letter replay cannot go on: an entry's original topic or partition
    is gone, or another replay of the same queue is running."""

    def __init__(self, topic: str, subscription: str, problem: str) -> None:
        self.topic = topic
        self.subscription = subscription
        self.problem = problem
        super().__init__(f"replay of the dead-letter queue of {topic}/{subscription}: {problem}")


class ListenError(BrokerError):
    """Raised at start when the broker cannot listen on a configured address (in use,
    not an address of this host, or not permitted)."""

    def __init__(self, setting: str, address: str, cause: str) -> None:
        self.setting = setting
        self.address = address
        super().__init__(
            f"cannot listen on {address} ({setting}): {cause}; free the port or choose "
            f"another with --{setting.replace('_', '-')}"
        )
