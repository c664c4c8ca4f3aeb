"""AdminClient: the blocking twin of :class:`~client._async.admin.AsyncAdminClient`.

Role: topic, subscription and dead-letter queue administration for code without an event
loop (the CLI, the Spark driver). Each method runs the :class:`AsyncAdminClient` method of
the same name on the client's own loop thread (:mod:`client._sync._bridge`). The results
and errors are the async ones unchanged.

The class body is generated (``python -m client._sync._generate``): this twin has no
difference of its own from the async class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Unpack

from client._async.admin import AsyncAdminClient
from client._connection import ConnectionOptions
from client._sync._bridge import Blocking, LoopThread
from client._types import (
    DEFAULT_BROKER,
    DeadLetterEntry,
    ReplayResult,
    SubscriptionInfo,
    SubscriptionListing,
    TopicInfo,
)


class AdminClient(Blocking):
    """Topic, subscription and dead-letter queue administration, blocking. Thread-safe; a
    context manager.

    Calling it from a thread that runs an event loop raises ``RuntimeError``: use
    :class:`AsyncAdminClient` there.

    Args:
        broker: ``host:port`` of the broker. Default ``127.0.0.1:50051``.
        timeout_s: Deadline of each call, seconds. Default 10.
        **connection: The connection keywords, the same for every client class
            (:class:`~client.ConnectionOptions`): ``reconnect_backoff_max_s``,
            ``token``, ``tls_ca``, ``tls_cert`` and ``tls_key``; a bad one raises
            ``ValueError`` here.

    Unlike :class:`AsyncAdminClient`, there is no ``channel`` argument. A ``grpc.aio``
    channel is bound to the loop it was made on, and this client's loop is private.
    """

    # -- generated from AsyncAdminClient by `python -m client._sync._generate`; do not edit --
    def __init__(
        self,
        broker: str | Sequence[str] = DEFAULT_BROKER,
        *,
        timeout_s: float = 10.0,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        self._bridge = LoopThread("AdminClient", "AsyncAdminClient")
        self._admin = self._bridge.create(
            AsyncAdminClient, broker, timeout_s=timeout_s, **connection
        )

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        *,
        exist_ok: bool = False,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
    ) -> TopicInfo:
        """Create a topic.

        As :meth:`AsyncAdminClient.create_topic`, blocking.
        """
        return self._bridge.run(
            self._admin.create_topic(
                name,
                partitions,
                exist_ok=exist_ok,
                replication_factor=replication_factor,
                min_insync_replicas=min_insync_replicas,
            )
        )

    def list_topics(self) -> list[TopicInfo]:
        """Every topic, by name. In a cluster, every broker's topics, each with its
        owner's figures (``owner`` set); a topic whose owner cannot be asked now is
        listed with its partitions, zero figures and ``offline`` saying why.

        As :meth:`AsyncAdminClient.list_topics`, blocking.
        """
        return self._bridge.run(self._admin.list_topics())

    def describe_topic(self, name: str) -> TopicInfo:
        """One topic. Raises ``NotFound``."""
        return self._bridge.run(self._admin.describe_topic(name))

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its data and its subscriptions. Raises ``NotFound``."""
        self._bridge.run(self._admin.delete_topic(name))

    def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionInfo]:
        """Every subscription (of ``topic``, when given) with its lag: in a cluster, of
        every broker's topics. Topics whose owner cannot be asked now are left out:
        :meth:`subscription_listing` names them.

        As :meth:`AsyncAdminClient.list_subscriptions`, blocking.
        """
        return self._bridge.run(self._admin.list_subscriptions(topic))

    def subscription_listing(self, topic: str | None = None) -> SubscriptionListing:
        """Every subscription (of ``topic``, when given) with its lag, by topic and name,
        and, in a cluster, the topics whose owner could not be asked (their
        subscriptions are unknown). With ``topic`` the call goes to its owner.

        As :meth:`AsyncAdminClient.subscription_listing`, blocking.
        """
        return self._bridge.run(self._admin.subscription_listing(topic))

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
        """Move a subscription's cursors to the earliest or latest retained offsets, to one
        offset on every partition, to the first record at or after a time (ms since
        the epoch), or to one offset per partition (``offsets``: partition -> offset;
        partitions not named keep their cursors). Offsets are clamped to what the log
        holds. Give exactly one target.
        """
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
        """Per partition, in partition order, the first offset whose record time is at or
        after ``timestamp_ms`` (ms since the epoch), or the head where every record is
        older. Moves nothing. Raises ``NotFound`` or ``InvalidArgument``.
        """
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
        """Entries of a subscription's dead-letter queue, oldest first; removes nothing.

        As :meth:`AsyncAdminClient.peek_dead_letters`, blocking.
        """
        return self._bridge.run(
            self._admin.peek_dead_letters(
                topic, subscription, from_sequence=from_sequence, limit=limit, reason=reason
            )
        )

    def count_dead_letters(self, topic: str, subscription: str) -> int:
        """How many entries a subscription's dead-letter queue holds. Raises ``NotFound``."""
        return self._bridge.run(self._admin.count_dead_letters(topic, subscription))

    def ack_dead_letters(self, topic: str, subscription: str, up_to_sequence: int) -> int:
        """Remove every entry with a sequence at or below ``up_to_sequence`` (inclusive);
        return how many. Raises ``NotFound`` or ``InvalidArgument`` (a negative sequence).
        """
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
        """Publish entries back to their original topic and partition, oldest first, and
        remove them from the queue once that is durable.

        As :meth:`AsyncAdminClient.replay_dead_letters`, blocking.
        """
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
        """Delete a subscription: its cursors, delivery-attempt counts and dead-letter
        queue. A consumer that subscribes with the name later starts a new subscription at
        its initial position. Returns the names of the consumers ``force`` detached (their
        streams end with ``NotFound``).

        As :meth:`AsyncAdminClient.delete_subscription`, blocking.
        """
        return self._bridge.run(self._admin.delete_subscription(topic, subscription, force))

    def close(self) -> None:
        """Close the async client on the loop, then stop the loop thread.
        Idempotent; later calls raise ``ClientClosed``."""
        self._bridge.close(self._admin.aclose())

    # -- end of generated code --
