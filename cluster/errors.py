"""Every error of cluster mode, under one root: :class:`ClusterError`.

Each message says what went wrong and what to do; the broker prints it as one line.
Foreign errors (the etcd client's, gRPC's) are translated once, in :mod:`cluster.etcd`.
"""

from __future__ import annotations


class ClusterError(Exception):
    """Root of every error raised by :mod:`cluster`."""


class EtcdUnavailableError(ClusterError):
    """Raised when etcd did not answer a request in time (no endpoint reachable, no quorum).

    The outcome of a write that raised this is unknown: a caller re-reads before it
    decides anything.
    """

    def __init__(self, operation: str, endpoints: list[str], detail: str) -> None:
        self.operation = operation
        self.endpoints = endpoints
        self.detail = detail
        super().__init__(
            f"etcd did not answer {operation} ({detail}); endpoints {','.join(endpoints)}: "
            "check that a majority of the etcd members are up and reachable from this broker"
        )


class EtcdRequestError(ClusterError):
    """Raised when etcd refused a request (bad request, permission, authentication, TLS)."""

    def __init__(self, operation: str, detail: str) -> None:
        self.operation = operation
        self.detail = detail
        super().__init__(f"etcd refused {operation}: {detail}")


class RecordError(ClusterError):
    """Raised when a value under the cluster's prefix is not the record its key calls for."""

    def __init__(self, key: str, detail: str) -> None:
        self.key = key
        self.detail = detail
        super().__init__(f"etcd key {key} holds no valid record ({detail})")


class DuplicateNodeError(ClusterError):
    """Raised at registration when a live broker already holds this node id."""

    def __init__(self, node_id: str, address: str, waited_s: float) -> None:
        self.node_id = node_id
        self.address = address
        super().__init__(
            f"node id {node_id!r} is held by a live broker at {address or 'an unknown address'} "
            f"(its session did not end within {waited_s:.1f} s): give this broker another "
            "--node-id, or stop the other one"
        )


class SessionLostError(ClusterError):
    """Raised when a call needs this broker's etcd session and it has none (lost, or closed)."""

    def __init__(self, node_id: str, detail: str) -> None:
        self.node_id = node_id
        super().__init__(f"broker {node_id} has no etcd session ({detail})")


class TopicExistsError(ClusterError):
    """Raised when a topic name is created that the cluster already holds."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} already exists")


class TopicNotReadyError(ClusterError):
    """Raised when a created topic did not become ready before the deadline.

    The topic exists in the cluster (its name is taken); it becomes ready when its owner
    makes it.
    """

    def __init__(self, topic: str, state: str, owner_node: str, waited_s: float) -> None:
        self.topic = topic
        self.state = state
        self.owner_node = owner_node
        where = f" on broker {owner_node}" if owner_node else " (no broker chosen yet)"
        super().__init__(
            f"topic {topic!r} exists and is {state}{where}; it was not ready after "
            f"{waited_s:.1f} s: it becomes ready when that broker is up"
        )


class NotControllerError(ClusterError):
    """Raised when a controller write is refused: its fencing token is no longer the
    controller key's create_revision (another broker was elected since)."""

    def __init__(self, node_id: str, token: int, current: int) -> None:
        self.node_id = node_id
        self.token = token
        self.current = current
        super().__init__(
            f"broker {node_id} is no longer the controller (its token {token}, the "
            f"controller key's now {current or 'absent'}): its write was refused"
        )


class NotOwnerError(ClusterError):
    """Raised when a broker asks to change a topic it does not own (at its claimed epoch)."""

    def __init__(self, topic: str, node_id: str, owner: str) -> None:
        self.topic = topic
        self.owner = owner
        super().__init__(
            f"broker {node_id} does not own topic {topic!r} (owner: {owner or 'none'})"
        )


class NoBrokersError(ClusterError):
    """Raised by placement when no live broker can take a topic."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"no live broker to place topic {topic!r} on")


class TokenError(ClusterError):
    """Raised when a token change in etcd is refused: a name taken, no such token, the
    cluster full. The message says what to do."""


class NotEnoughReplicasError(ClusterError):
    """Raised when a publish is refused before anything is appended: the topic has fewer
    in-sync replicas than its ``min_insync`` (Kafka's NOT_ENOUGH_REPLICAS)."""

    def __init__(self, topic: str, in_sync: int, replicas: int, needed: int) -> None:
        self.topic = topic
        self.in_sync = in_sync
        self.replicas = replicas
        self.needed = needed
        super().__init__(
            f"topic {topic} has {in_sync} in-sync replica{'' if in_sync == 1 else 's'} "
            f"of {replicas}; at least {needed} are needed (min_insync_replicas): nothing "
            "was written; retry when a replica has caught up, or bring its broker back"
        )


class NotEnoughBrokersError(ClusterError):
    """Raised when a topic asks for more replicas than there are live brokers."""

    def __init__(self, factor: int, live: int) -> None:
        self.factor = factor
        self.live = live
        super().__init__(
            f"replication factor {factor} needs {factor} live brokers and {live} "
            f"{'is' if live == 1 else 'are'} up: ask for a factor of at most {live}, "
            "or start more brokers"
        )


class ReplicationSettingsError(ClusterError):
    """Raised when a topic's replication settings cannot hold (``min_insync`` above the
    factor, an empty or repeating replica list)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"invalid replication settings: {detail}")


class TopicCreateFailedError(ClusterError):
    """Raised when the broker a new topic was placed on cannot make it as asked, whatever
    the retries (its open-files budget, its partition limit, a local topic of that name):
    the create ended and the name is free again. ``code`` is the gRPC status name that
    broker gave, the one a single broker would answer."""

    def __init__(self, topic: str, owner_node: str, code: str, message: str) -> None:
        self.topic = topic
        self.owner_node = owner_node
        self.code = code
        super().__init__(message)
