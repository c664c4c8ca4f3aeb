"""AdminClient: the blocking twin of :class:`~client._async.admin.AsyncAdminClient`.

Role: topic and subscription administration for code without an event loop (the CLI, the
Spark driver). Each method runs the :class:`AsyncAdminClient` method of the same name on
the client's own loop thread (:mod:`client._sync._bridge`). The results and errors are the
async ones unchanged.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from client._async.admin import AsyncAdminClient
from client._sync._bridge import LoopThread
from client._types import DEFAULT_BROKER, SubscriptionInfo, TopicInfo


class AdminClient:
    """Topic and subscription administration, blocking. Thread-safe; a context manager.

    Calling it from a thread that runs an event loop raises ``RuntimeError``: use
    :class:`AsyncAdminClient` there.

    Args:
        broker: ``host:port`` of the broker. Default ``127.0.0.1:50051``.
        timeout_s: Deadline of each call, seconds. Default 10.

    Unlike :class:`AsyncAdminClient`, there is no ``channel`` argument. A ``grpc.aio``
    channel is bound to the loop it was made on, and this client's loop is private.
    """

    def __init__(self, broker: str = DEFAULT_BROKER, *, timeout_s: float = 10.0) -> None:
        self._bridge = LoopThread("AdminClient", "AsyncAdminClient")
        self._admin = self._bridge.create(AsyncAdminClient, broker, timeout_s=timeout_s)

    def create_topic(self, name: str, partitions: int = 1) -> TopicInfo:
        """Create a topic. Raises ``AlreadyExists`` or ``InvalidArgument``."""
        return self._bridge.run(self._admin.create_topic(name, partitions))

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
            )
        )

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
