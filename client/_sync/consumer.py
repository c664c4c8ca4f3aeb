"""Consumer: the blocking twin of :class:`~client._async.consumer.AsyncConsumer`.

Role: the same credits, batched acks and reconnects, for code without an event loop. Each
call runs the :class:`AsyncConsumer` method of the same name on the consumer's own loop
thread (:mod:`client._sync._bridge`); acks are applied there too, because they touch state
that the loop owns. ``for message in consumer`` fetches one message per step and never
reads ahead; leaving the loop keeps the consumer open, as ``async for`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Self

from client._async.consumer import AsyncConsumer
from client._channel import DEFAULT_RECONNECT_BACKOFF_MAX_S
from client._message import Message
from client._sync._bridge import LoopThread
from client._types import DEFAULT_BROKER


class Consumer:
    """Receives a subscription's messages, blocking; ``for message in consumer``.

    Thread-safe; a context manager (closing sends pending acks). Calling it from a thread
    that runs an event loop raises ``RuntimeError``: use :class:`AsyncConsumer` there.

    Args: as :class:`AsyncConsumer`, except that there is no ``channel`` argument (a
    ``grpc.aio`` channel is bound to the loop it was made on, and this loop is private).
    """

    def __init__(
        self,
        topic: str,
        subscription: str,
        *,
        broker: str = DEFAULT_BROKER,
        type: str = "exclusive",  # the name DESIGN gives it
        initial_position: str = "earliest",
        mode: str = "at_least_once",
        consumer_name: str = "",
        receive_queue: int = 1_000,
        ack_interval_ms: float = 20.0,
        connect_timeout: float = 30.0,
        reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        self._bridge = LoopThread("Consumer", "AsyncConsumer")
        self._consumer = self._bridge.create(
            AsyncConsumer,
            topic,
            subscription,
            broker=broker,
            type=type,
            initial_position=initial_position,
            mode=mode,
            consumer_name=consumer_name,
            receive_queue=receive_queue,
            ack_interval_ms=ack_interval_ms,
            connect_timeout=connect_timeout,
            reconnect_backoff_max_s=reconnect_backoff_max_s,
            token=token,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )

    def start(self) -> None:
        """Open the subscription (done by the first receive, too). Idempotent."""
        self._bridge.run(self._consumer.start())

    def receive(self, timeout: float | None = None) -> Message:
        """The next message, waiting up to ``timeout`` seconds (None: as long as it takes).
        Raises ``TimeoutError`` when none arrived in time."""
        return self._bridge.run(self._consumer.receive(timeout))

    def receive_batch(
        self, max_messages: int = 1_000, timeout: float | None = None
    ) -> list[Message]:
        """The messages that are ready: at least one, at most ``max_messages``."""
        return self._bridge.run(self._consumer.receive_batch(max_messages, timeout))

    def __iter__(self) -> Iterator[Message]:
        return self._bridge.iterate(self._consumer)

    def ack(self, message: Message) -> None:
        """Acknowledge one message (sent in a batch shortly)."""
        self._bridge.call(self._consumer.ack, message)

    def ack_many(self, messages: Iterable[Message]) -> None:
        """Acknowledge messages, e.g. a whole ``receive_batch`` (sent in a batch shortly).
        One call is much cheaper than one :meth:`ack` per message."""
        if not isinstance(messages, list | tuple):
            messages = list(messages)  # iterate the caller's iterable on the caller's thread
        self._bridge.call(self._consumer.ack_many, messages)

    def ack_cumulative(self, message: Message) -> None:
        """Acknowledge ``message`` and every earlier message of its partition."""
        self._bridge.call(self._consumer.ack_cumulative, message)

    def nack(self, message: Message, *, delay: float | None = None, reason: str = "") -> None:
        """Report that ``message`` failed; it comes again after ``delay`` seconds (``None``:
        the subscription's backoff). See :meth:`AsyncConsumer.nack`."""
        self._bridge.call(self._consumer.nack, message, delay=delay, reason=reason)

    def close(self) -> None:
        """Send pending acks, end the session, stop the loop thread. Idempotent."""
        self._bridge.close(self._consumer.aclose())

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
