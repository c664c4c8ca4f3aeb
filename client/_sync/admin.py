"""AdminClient: the blocking twin of :class:`~client._async.admin.AsyncAdminClient`.

Role: topic, subscription and dead-letter queue administration for code without an event
loop (the CLI, the Spark driver). Each method runs the :class:`AsyncAdminClient` method of
the same name on the client's own loop thread (:mod:`client._sync._bridge`). The results
and errors are the async ones unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Self

from client._async.admin import AsyncAdminClient
from client._channel import DEFAULT_RECONNECT_BACKOFF_MAX_S
from client._sync._bridge import LoopThread
from client._types import (
    DEFAULT_BROKER,
    DeadLetterEntry,
    ReplayResult,
    SubscriptionInfo,
    TopicInfo,
)


class AdminClient:
    """Topic, subscription and dead-letter queue administration, blocking. Thread-safe; a
    context manager.

    Calling it from a thread that runs an event loop raises ``RuntimeError``: use
    :class:`AsyncAdminClient` there.

    Args:
        broker: ``host:port`` of the broker. Default ``127.0.0.1:50051``.
        timeout_s: Deadline of each call, seconds. Default 10.
        reconnect_backoff_max_s: Longest pause between reconnect attempts while the broker
            is unreachable, seconds. Default 1.
        token: The bearer token, as for :class:`AsyncAdminClient` (``ValueError`` at
            construction when it, or one of the TLS files below, is bad).
        tls_ca: A PEM CA bundle file; giving it turns TLS on.
        tls_cert: A PEM client certificate file for mutual TLS (with ``tls_key``).
        tls_key: The PEM key file of ``tls_cert``.

    Unlike :class:`AsyncAdminClient`, there is no ``channel`` argument. A ``grpc.aio``
    channel is bound to the loop it was made on, and this client's loop is private.
    """

    def __init__(
        self,
        broker: str = DEFAULT_BROKER,
        *,
        timeout_s: float = 10.0,
        reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        self._bridge = LoopThread("AdminClient", "AsyncAdminClient")
        self._admin = self._bridge.create(
            AsyncAdminClient,
            broker,
            timeout_s=timeout_s,
            reconnect_backoff_max_s=reconnect_backoff_max_s,
            token=token,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )

    def create_topic(self, name: str, partitions: int = 1, *, exist_ok: bool = False) -> TopicInfo:
        """Create a topic; with ``exist_ok``, an existing one with ``partitions`` partitions
        is returned instead (:meth:`AsyncAdminClient.create_topic`). Raises
        ``AlreadyExists`` or ``InvalidArgument``."""
        return self._bridge.run(self._admin.create_topic(name, partitions, exist_ok=exist_ok))

    def list_topics(self) -> list[TopicInfo]:
        """Every topic, by name."""
        return self._bridge.run(self._admin.list_topics())

    def describe_topic(self, name: str) -> TopicInfo:
        """One topic. Raises ``NotFound``."""
        return self._bridge.run(self._admin.describe_topic(name))

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data. Raises ``NotFound``."""
        self._bridge.run(self._admin.delete_topic(name))

    def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionInfo]:
        """Every subscription (of ``topic``, when given) with its lag."""
        return self._bridge.run(self._admin.list_subscriptions(topic))

    def describe_subscription(self, topic: str, subscription: str) -> SubscriptionInfo:
        """One subscription's cursors, heads, lag and consumers. Raises ``NotFound``."""
        return self._bridge.run(self._admin.describe_subscription(topic, subscription))

    def seek(
        self,
        topic: str,
        subscription: str,
        *,
        earliest: bool = False,
        latest: bool = False,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        offsets: Mapping[int, int] | None = None,
    ) -> SubscriptionInfo:
        """Move a subscription's cursors: see :meth:`AsyncAdminClient.seek`. Give exactly
        one target (else ``ValueError``)."""
        return self._bridge.run(
            self._admin.seek(
                topic,
                subscription,
                earliest=earliest,
                latest=latest,
                offset=offset,
                timestamp_ms=timestamp_ms,
                offsets=offsets,
            )
        )

    def offsets_for_time(self, topic: str, timestamp_ms: int) -> list[int]:
        """Per partition, the first offset at or after a time: see
        :meth:`AsyncAdminClient.offsets_for_time`."""
        return self._bridge.run(self._admin.offsets_for_time(topic, timestamp_ms))

    def peek_dead_letters(
        self,
        topic: str,
        subscription: str,
        *,
        from_sequence: int | None = None,
        limit: int = 100,
        reason: str | None = None,
    ) -> list[DeadLetterEntry]:
        """Entries of a subscription's dead-letter queue, oldest first: see
        :meth:`AsyncAdminClient.peek_dead_letters`."""
        return self._bridge.run(
            self._admin.peek_dead_letters(
                topic, subscription, from_sequence=from_sequence, limit=limit, reason=reason
            )
        )

    def count_dead_letters(self, topic: str, subscription: str) -> int:
        """How many entries a subscription's dead-letter queue holds. Raises ``NotFound``."""
        return self._bridge.run(self._admin.count_dead_letters(topic, subscription))

    def ack_dead_letters(self, topic: str, subscription: str, up_to_sequence: int) -> int:
        """Remove every entry at or below ``up_to_sequence`` (inclusive); return how many."""
        return self._bridge.run(self._admin.ack_dead_letters(topic, subscription, up_to_sequence))

    def purge_dead_letters(self, topic: str, subscription: str) -> int:
        """Remove every entry; return how many. Raises ``NotFound``."""
        return self._bridge.run(self._admin.purge_dead_letters(topic, subscription))

    def replay_dead_letters(
        self,
        topic: str,
        subscription: str,
        *,
        limit: int | None = None,
        up_to_sequence: int | None = None,
        rate_per_s: int | None = None,
        timeout_s: float | None = None,
    ) -> ReplayResult:
        """Publish entries back to their original topic, rate limited, and remove them: see
        :meth:`AsyncAdminClient.replay_dead_letters`."""
        return self._bridge.run(
            self._admin.replay_dead_letters(
                topic,
                subscription,
                limit=limit,
                up_to_sequence=up_to_sequence,
                rate_per_s=rate_per_s,
                timeout_s=timeout_s,
            )
        )

    def delete_subscription(self, topic: str, subscription: str, force: bool = False) -> list[str]:
        """Delete a subscription and its dead-letter queue; return the consumers ``force``
        detached: see :meth:`AsyncAdminClient.delete_subscription`."""
        return self._bridge.run(self._admin.delete_subscription(topic, subscription, force=force))

    def close(self) -> None:
        """Close the channel and join the loop thread. Idempotent; later calls raise
        ``ClientClosed``."""
        self._bridge.close(self._admin.aclose())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
