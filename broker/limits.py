"""The broker's ``[limits]``: what one client may ask of it, each with a config key.

Role: one frozen, validated value (:class:`LimitsConfig`) holding every limit that bounds
what an untrusted client can make the broker hold, and :class:`StreamSlots`, the count of
open streams per client connection. Breaking a limit raises
:class:`~broker.errors.LimitExceededError` (``RESOURCE_EXHAUSTED``) or, for a record's
headers, :class:`~wal.HeaderLimitError` (``INVALID_ARGUMENT``); each message names the
limit and its key, e.g. ``record 3 has 80 headers; the limit is 64 ([limits]
max_headers_per_record)``.

Where each limit is applied:

==================================  ===============================================
``max_headers_per_record``,         batch validation (:mod:`wal.validate`), through
``max_header_bytes``,               the partitions' :class:`wal.LogConfig`
``max_header_name_bytes``
``max_partitions_per_topic``        topic create and auto-create (:mod:`broker.topics`)
``max_subscriptions_per_topic``,    the subscription registry (:mod:`dispatcher`)
``max_consumers_per_subscription``,
``max_credit_per_consumer``
``max_streams_per_connection``      Subscribe and PublishStream (:mod:`broker.service`)
``max_publish_stream_in_flight``    PublishStream: backpressure, not an error
``max_producers_per_partition``     the producer table (:mod:`broker.producers`): the
                                    least recently active idle producer is forgotten
==================================  ===============================================

Worked example: with ``max_streams_per_connection = 2``, a client connection
(``context.peer()``, e.g. ``ipv4:10.0.0.7:53122``) opens two Subscribe streams; a third
Subscribe or PublishStream on that connection ends at once with ``RESOURCE_EXHAUSTED``
("connection ipv4:10.0.0.7:53122 has 2 open streams; the limit is 2 ([limits]
max_streams_per_connection) ..."). When one of the two ends, a new one is accepted.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.errors import LimitExceededError
from dispatcher import DispatchLimits

KIB = 1024


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """The ``[limits]`` table. Every field is an integer count or size.

    Attributes:
        max_headers_per_record: Headers one record may carry. Default 64; 0 to 100,000.
        max_header_bytes: Bytes of one record's header names and values together. Default
            16 KiB; 0 to 256 MiB (``[wal] max_record_bytes`` still bounds the whole record).
        max_header_name_bytes: Bytes of one header name (UTF-8). Default 256; 1 to 65,536.
        max_partitions_per_topic: Partitions one topic may have (create and auto-create).
            Default 10,000; 1 to 100,000 (each open partition holds file descriptors).
        max_subscriptions_per_topic: Subscriptions one topic may have. Default 1,000; 1 to
            1,000,000.
        max_consumers_per_subscription: Consumers attached to one subscription at once.
            Default 1,000; 1 to 1,000,000.
        max_streams_per_connection: Subscribe and PublishStream streams open at once on
            one client connection (keyed by the peer address). Default 100; 1 to 100,000.
        max_credit_per_consumer: Records of credit a consumer may hold at once (granted
            and not yet used). Default 100,000; 1 to 10,000,000. At-least-once
            subscriptions are also capped by ``[broker] max_unacked``.
        max_publish_stream_in_flight: Publishes of one PublishStream being processed at
            once. Beyond it the broker stops reading the stream (backpressure through
            HTTP/2 flow control), it does not fail it. Default 256; 1 to 10,000.
        max_producers_per_partition: Idempotent producer ids one partition remembers
            (about 2 KiB each). Past it, admitting a new producer forgets the least
            recently active idle one, whose retries would then be appended again (see
            :mod:`broker.producers`). Default 10,000; 16 to 10,000,000.
    """

    max_headers_per_record: int = 64
    max_header_bytes: int = 16 * KIB
    max_header_name_bytes: int = 256
    max_partitions_per_topic: int = 10_000
    max_subscriptions_per_topic: int = 1_000
    max_consumers_per_subscription: int = 1_000
    max_streams_per_connection: int = 100
    max_credit_per_consumer: int = 100_000
    max_publish_stream_in_flight: int = 256
    max_producers_per_partition: int = 10_000

    def __post_init__(self) -> None:
        for name, (lo, hi) in RANGES.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ValueError(
                    f"[limits] {name} = {value!r}: must be an integer from {lo} to {hi}"
                )

    def dispatch_limits(self) -> DispatchLimits:
        """The limits the subscription registry applies."""
        return DispatchLimits(
            max_subscriptions_per_topic=self.max_subscriptions_per_topic,
            max_consumers_per_subscription=self.max_consumers_per_subscription,
            max_credit_per_consumer=self.max_credit_per_consumer,
        )


#: Allowed range of each ``[limits]`` key, inclusive.
RANGES: dict[str, tuple[int, int]] = {
    "max_headers_per_record": (0, 100_000),
    "max_header_bytes": (0, 256 << 20),
    "max_header_name_bytes": (1, 65_536),
    "max_partitions_per_topic": (1, 100_000),
    "max_subscriptions_per_topic": (1, 1_000_000),
    "max_consumers_per_subscription": (1, 1_000_000),
    "max_streams_per_connection": (1, 100_000),
    "max_credit_per_consumer": (1, 10_000_000),
    "max_publish_stream_in_flight": (1, 10_000),
    "max_producers_per_partition": (16, 10_000_000),
}


@dataclass(slots=True)
class StreamSlots:
    """Open streams per client connection, at most ``limit`` each. Not task-safe: used
    from the server's one event loop, where ``acquire`` and ``release`` do not await.

    Example: ``slots = StreamSlots(2)``; ``acquire("ipv4:1.2.3.4:5")`` twice succeeds, a
    third raises :class:`LimitExceededError`; after one ``release`` it succeeds again.
    """

    limit: int
    _open: dict[str, int] = field(default_factory=dict)

    def acquire(self, peer: str) -> None:
        """Count one more stream on ``peer``'s connection.

        Raises:
            LimitExceededError: ``peer`` already has ``limit`` open streams.
        """
        count = self._open.get(peer, 0)
        if count >= self.limit:
            raise LimitExceededError(
                "max_streams_per_connection",
                self.limit,
                f"connection {peer} has {count} open streams",
                "end a Subscribe or PublishStream first, or open another connection",
            )
        self._open[peer] = count + 1

    def release(self, peer: str) -> None:
        """Count one stream fewer on ``peer``'s connection."""
        count = self._open.get(peer, 0) - 1
        if count > 0:
            self._open[peer] = count
        else:
            self._open.pop(peer, None)

    def open_streams(self, peer: str) -> int:
        """Streams open on ``peer``'s connection now."""
        return self._open.get(peer, 0)
