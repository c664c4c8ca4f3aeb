"""Errors of the broker's own domain, under one root: :class:`BrokerError`.

Role: what the services raise for requests that cannot be served; :mod:`broker.error_status` maps
each class (and the ``wal`` errors) to one gRPC status code. Messages say what was wrong and
what to do.
"""

from __future__ import annotations

from cluster.ownership import Refusal
from dispatcher.errors import NotCommittedError
from proto.shown import shown


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


class RequestTooLargeError(BrokerError):
    """Raised when a request message is over the broker's ``max_request_bytes``."""

    def __init__(self, message_type: str, size: int, limit: int) -> None:
        self.message_type = message_type
        self.size = size
        self.limit = limit
        super().__init__(
            f"request ({message_type}) is {size} bytes, over the broker's limit of {limit} "
            "bytes ([broker] max_request_bytes); send less per request (split the records "
            "over several publishes), or raise max_request_bytes in the broker's config"
        )


class TopicNotFoundError(BrokerError):
    """Raised when a request names a topic that does not exist."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(
            f"topic {topic!r} does not exist; create it with `headrace topics create {topic} "
            "--partitions N`"
        )


class TopicDeletedError(TopicNotFoundError):
    """Raised to a request whose topic was deleted while it was being served (a Fetch
    waiting for data, a publish queued behind the delete): the topic no longer exists."""

    def __init__(self, topic: str) -> None:
        super().__init__(topic)
        self.args = (
            f"topic {topic!r} was deleted while this request was served; create it again "
            f"(`headrace topics create {topic} --partitions N`) to use the name",
        )


class TopicMetadataError(BrokerError):
    """Raised at start when a topic's ``topic.json`` cannot be read as what a create wrote
    (damaged from outside: the broker writes it whole, before a rename)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(
            f"topic metadata {path} is damaged ({problem}); the topic's records are "
            'untouched: write it again as {"name": "<topic>", "partitions": <count>} '
            "(the count of numbered directories beside it), or move the topic's directory "
            "out of the data directory, then start again"
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
            f"{expected}); the batch was not written. Send it again under a new producer id "
            "(the Python producer does so by itself)"
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


class FileLimitError(BrokerError):
    """Raised when partitions would not fit under the process's open-files limit: a topic
    create (refused before any file is made), or the topics on disk at start."""

    def __init__(self, what: str, needed: int, available: int, limit: int) -> None:
        self.what = what
        self.needed = needed
        self.available = available
        self.limit = limit
        super().__init__(
            f"{what} would need {needed} file descriptors (one per partition) but only "
            f"{available} are free under the open-files limit of {limit}; raise the limit "
            "(`ulimit -n`, or LimitNOFILE= under systemd) and restart the broker, or use "
            "fewer partitions"
        )


class LimitExceededError(BrokerError):
    """Raised when a request would take the broker past one of its ``[limits]`` (streams
    per connection, partitions per topic); nothing was changed."""

    def __init__(self, setting: str, limit: int, problem: str, advice: str) -> None:
        self.setting = setting
        self.limit = limit
        self.problem = problem
        super().__init__(f"{problem}; the limit is {limit} ([limits] {setting}); {advice}")


class AuthenticationError(BrokerError):
    """Raised when a call carries no bearer token, a malformed one, one the tokens file does
    not know, or a revoked one. ``reason`` is ``missing``, ``unknown`` or ``revoked`` (the
    label of ``headrace_auth_failures_total``); ``token_id`` is set when the id is known."""

    def __init__(self, reason: str, message: str, token_id: str | None = None) -> None:
        self.reason = reason
        self.token_id = token_id
        super().__init__(message)


class PermissionDeniedError(BrokerError):
    """Raised when a valid token has no grant of the role a call needs on its resource
    (``resource_kind`` is ``topic`` or ``subscription``; a subscription is ``topic/name``;
    ``role`` is one role, or several joined by `` or `` when any of them will do)."""

    def __init__(
        self, token_name: str, token_id: str, role: str, resource_kind: str, resource: str
    ) -> None:
        self.token_name = token_name
        self.token_id = token_id
        self.role = role
        self.resource_kind = resource_kind
        self.resource = resource
        first, *others = role.split(" or ")
        alternatives = "".join(f" or `--grant {other}:PATTERN`" for other in others)
        super().__init__(
            f"token {token_name!r} (hr_{token_id}_…) lacks role {role} on {resource_kind} "
            f"{shown(resource)}; ask an admin for a grant (`headrace tokens create ... --grant "
            f"{first}:PATTERN`{alternatives})"
        )


class UnlistedMethodError(PermissionDeniedError):
    """Raised when a call's method has no row in the authorization table: refused to every
    token (fail closed); a broker bug, since a test checks the table covers every RPC."""

    def __init__(self, token_name: str, token_id: str, method: str) -> None:
        BrokerError.__init__(
            self,
            f"method {method} has no authorization rule, so it is refused to every token; "
            "this is a broker bug: report it",
        )
        self.token_name = token_name
        self.token_id = token_id
        self.role = ""
        self.resource_kind = "method"
        self.resource = method


class TokensFileError(BrokerError):
    """Raised when the tokens file cannot be read or written, or holds something invalid;
    ``problem`` says what and where in the file."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"tokens file {path}: {problem}")


class TlsSetupError(BrokerError):
    """Raised at start when a ``[security]`` TLS file (or ``[cluster] peer_tls_ca``, the
    ``table``) cannot be used: unreadable, not PEM, an expired certificate, or a key that
    does not match it."""

    def __init__(self, setting: str, path: str, problem: str, table: str = "security") -> None:
        self.setting = setting
        self.path = path
        self.problem = problem
        super().__init__(f"[{table}] {setting} = {path}: {problem}")


class InsecureListenError(BrokerError):
    """Raised at start when the gRPC address is reachable from other hosts and the broker
    is not protected enough to serve there (see :mod:`broker.exposure`)."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"refusing to serve on {address}: {reason}")


class ConfigError(BrokerError, ValueError):
    """Raised when a setting is unknown, of the wrong type or out of range."""


class CertificateFormatError(BrokerError, ValueError):
    """Raised when bytes hold no PEM certificate or one whose encoding cannot be read."""


class TopicRefusedError(BrokerError):
    """Raised before anything is done for a topic-scoped call that this broker does not
    serve now (cluster mode: another broker owns the topic, its owner is offline, this
    broker's session may have expired...). ``refusal`` says why and where the owner is;
    the call ends ``ABORTED`` with its facts as trailing metadata
    (:mod:`broker.topic_guard`, ``docs/protocol.md``)."""

    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal
        super().__init__(refusal.message)


class PlacedCreateError(BrokerError):
    """Raised (cluster mode) by CreateTopic when the broker the topic was placed on can
    never make it as asked (its open-files budget, its partition limit, a local topic of
    that name): the create ended and the name is free again. The call ends with the
    status that broker's table gave (``code``, a ``grpc.StatusCode`` name), the one a
    single broker answers; the message names that broker."""

    def __init__(self, topic: str, owner_node: str, code: str, message: str) -> None:
        self.topic = topic
        self.owner_node = owner_node
        self.code = code
        super().__init__(message)


class TooFewBrokersError(BrokerError):
    """Raised (cluster mode) by CreateTopic when the replication factor asked for exceeds
    the live brokers: nothing was written. ``FAILED_PRECONDITION``: the request is sound
    and succeeds once enough brokers run."""

    def __init__(self, factor: int, live: int, message: str) -> None:
        self.factor = factor
        self.live = live
        super().__init__(message)


class ClusterJoinError(ConfigError):
    """Raised when a broker in cluster mode cannot join its cluster at start: a live broker
    holds its node id, or etcd does not answer. A ``ConfigError``, so ``headrace serve``
    prints it as one line: the fix is a setting (``--node-id``, ``--cluster-etcd``)."""


class ClusterUnavailableError(BrokerError):
    """Raised when a cluster-wide change (CreateTopic, DeleteTopic) cannot reach etcd: the
    call ends ``UNAVAILABLE`` (its outcome may be unknown; look before retrying)."""

    def __init__(self, operation: str, cause: str) -> None:
        self.operation = operation
        super().__init__(f"cannot {operation}: the cluster's etcd did not answer ({cause})")


class ReplicationOutcomeUnknownError(BrokerError, NotCommittedError):
    """Raised when a publish was appended by a topic's leader but its acknowledgement,
    waiting for the in-sync replicas, cannot be given: leadership was lost, the in-sync
    set fell below ``min_insync``, or the broker stops. The call ends ``UNAVAILABLE``,
    as a lost connection: the record may or may not be committed, and an idempotent
    producer's resend is deduplicated wherever it lands. A subscription-state save that
    meets it in a dispatch pass is retried (it is a dispatcher :class:`NotCommittedError`)."""

    def __init__(self, topic: str, partition: int, offset: int, why: str) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.why = why
        super().__init__(
            f"topic {topic} partition {partition}: offset {offset} was written on this "
            f"broker but {why} before the in-sync replicas had it, so whether it is "
            "committed is unknown; resend it (an idempotent producer's resend is not "
            "written twice)"
        )


class InternalCredentialError(PermissionDeniedError):
    """Raised when the brokers' internal credential is presented on a call it does not
    pass (any RPC but the Replication service's), or a user token on a Replication RPC,
    which only brokers may call with that credential."""

    def __init__(
        self, method: str, *, internal: bool, token_name: str = "", token_id: str = ""
    ) -> None:
        BrokerError.__init__(
            self,
            f"the brokers' internal credential may call only the Replication service, not {method}"
            if internal
            else f"{method} is broker-to-broker: only the cluster's internal credential may "
            "call it, never a user token",
        )
        self.token_name = token_name
        self.token_id = token_id
        self.role = "internal"
        self.resource_kind = "method"
        self.resource = method


class ReplicaLogUnknownError(BrokerError):
    """Raised when a replication request names a log id its topic does not have here
    (answered ``UNKNOWN_LOG`` in the response, not as a gRPC status)."""

    def __init__(self, topic: str, log: str) -> None:
        self.topic = topic
        self.log = log
        super().__init__(f"topic {topic} has no log {log!r} on this broker")
