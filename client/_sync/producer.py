"""Producer: the blocking twin of :class:`~client._async.producer.AsyncProducer`.

Role: the same batching, pipelining, retries and idempotence, for code without an event
loop. Every call runs the :class:`AsyncProducer` method on the producer's own loop thread
(:mod:`client._sync._bridge`), so the two classes cannot differ in behaviour.

Blocking equivalents:

* ``send`` blocks until the record is queued, not until it is acknowledged. It returns a
  ``concurrent.futures.Future[RecordMetadata]``. The first send to a topic also looks up
  its partition count, which is one RPC.
* ``send_many`` likewise blocks until the records are queued and returns a
  ``concurrent.futures.Future[SentRecords]``.
* ``publish`` blocks until the record is acknowledged or has failed.
* ``flush`` blocks until every record sent so far is acknowledged or has failed.
* ``close`` replaces ``aclose``, and the class is a context manager in place of an async one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self, TypeVar

from client._async.producer import AsyncProducer
from client._channel import DEFAULT_RECONNECT_BACKOFF_MAX_S
from client._sync._bridge import LoopThread, to_concurrent
from client._types import DEFAULT_BROKER, RecordMetadata, SentRecords
from proto.batch import Headers

T = TypeVar("T")


class Producer:
    """Publishes records, blocking. It batches, pipelines per partition, retries, and is
    idempotent.

    Thread-safe: any number of threads may share one producer. Their calls meet on its
    loop, where :class:`AsyncProducer` is task-safe. Records sent from one thread keep
    their order within a partition. Calling it from a thread that runs an event loop raises
    ``RuntimeError``: use :class:`AsyncProducer` there.

    Args:
        broker: ``host:port`` of the broker. Default ``127.0.0.1:50051``.
        linger_ms: How long a partition's batch waits for more records, ms. Default 5.
        batch_max_bytes: Send a batch once its records reach this size, bytes. Default 1 MiB.
        delivery_timeout_s: Give up retrying a batch after this long, seconds. Default 30.
            It also bounds the retries behind ``publish`` and ``flush``, so they do not
            block forever on a broker that cannot be reached.
        buffer_max_bytes: Records waiting to be acknowledged, at most, in bytes; ``send``
            blocks for room beyond it (backpressure). Default 64 MiB.
        idempotent: Stamp batches with a producer id and sequence numbers, so the broker
            drops retried duplicates. Default on.
        producer_id: A fixed producer id, for callers that re-send the same records after a
            failure (a retried Spark task): see :class:`AsyncProducer`. Default: random.
        reconnect_backoff_max_s: The longest pause between reconnect attempts while the
            broker is unreachable, seconds. Default 1.
        token, tls_ca, tls_cert, tls_key: The bearer token and the TLS files, as for
            :class:`AsyncProducer` (``ValueError`` at construction when one is bad).

    Unlike :class:`AsyncProducer`, there is no ``channel`` argument. A ``grpc.aio`` channel
    is bound to the loop it was made on, and this producer's loop is private.

    Raises:
        ValueError: An argument is out of range. No thread is left running.
    """

    def __init__(
        self,
        broker: str = DEFAULT_BROKER,
        *,
        linger_ms: float = 5.0,
        batch_max_bytes: int = 1 << 20,
        delivery_timeout_s: float = 30.0,
        buffer_max_bytes: int = 64 << 20,
        idempotent: bool = True,
        producer_id: int | None = None,
        reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        self._bridge = LoopThread("Producer", "AsyncProducer")
        self._producer = self._bridge.create(
            AsyncProducer,
            broker,
            linger_ms=linger_ms,
            batch_max_bytes=batch_max_bytes,
            delivery_timeout_s=delivery_timeout_s,
            buffer_max_bytes=buffer_max_bytes,
            idempotent=idempotent,
            producer_id=producer_id,
            reconnect_backoff_max_s=reconnect_backoff_max_s,
            token=token,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )

    def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record. Block until it is queued, not until it is acknowledged.

        Returns:
            A future holding the record's :class:`RecordMetadata` once the broker has
            acknowledged it, or the :class:`~client.errors.ClientError` that failed it,
            whose ``outcome`` says whether the record was written (``REFUSED``: not
            written, safe to resend; ``UNKNOWN``: may or may not have been written,
            resending may duplicate), as with :class:`AsyncProducer`. Use
            ``.result(timeout)`` to wait. The future is already running, so ``cancel()``
            returns False and does not withdraw the record. Done callbacks run on the
            producer's loop thread. Keep them short, and do not call the producer from them
            (that raises ``RuntimeError``).

        Raises:
            NotFound: The topic does not exist.
            ValueError: ``partition`` is not one of the topic's.
            ClientClosed: The producer is closed.
        """
        send = functools.partial(
            self._producer.send,
            topic,
            value,
            key=key,
            headers=headers,
            partition=partition,
            timestamp_ms=timestamp_ms,
        )
        return self._bridge.run(_queued(send))

    def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """Send one record and block until the broker acknowledges it (see :meth:`send`).

        Raises:
            ClientError: The subclass for the cause, e.g. ``ResourceExhausted`` for an
                oversized record or ``Unavailable`` after ``delivery_timeout_s``; its
                ``outcome`` says whether the record was written.
        """
        return self._bridge.run(
            self._producer.publish(
                topic,
                value,
                key=key,
                headers=headers,
                partition=partition,
                timestamp_ms=timestamp_ms,
            )
        )

    def send_many(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Headers] | None = None,
        partition: int | None = None,
        timestamps_ms: Sequence[int] | int | None = None,
    ) -> concurrent.futures.Future[SentRecords]:
        """Queue many records at once, the columnar fast path (see
        :meth:`AsyncProducer.send_many <client._async.producer.AsyncProducer.send_many>`).
        Block until they are queued, not until they are acknowledged.

        Returns:
            A future holding :class:`SentRecords` (one :class:`RecordMetadata` per value, in
            order) once every batch is acknowledged, or the first failed batch's error
            (with its ``outcome``).

        Raises:
            ValueError: A column's length differs from ``values``'s, or ``partition`` is
                not one of the topic's.
            NotFound: The topic does not exist.
            ClientClosed: The producer is closed.
        """
        send_many = functools.partial(
            self._producer.send_many,
            topic,
            values,
            keys=keys,
            headers=headers,
            partition=partition,
            timestamps_ms=timestamps_ms,
        )
        return self._bridge.run(_queued(send_many))

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has: see :meth:`AsyncProducer.partition_count`."""
        return self._bridge.run(self._producer.partition_count(topic))

    def flush(self) -> None:
        """Block until every record sent so far is acknowledged or has failed.

        Raises:
            ClientClosed: The producer is closed.
        """
        self._bridge.run(self._producer.flush())

    def close(self) -> None:
        """Flush, stop the sender tasks, close the channel, and join the loop thread.

        Idempotent. Later calls to other methods raise ``ClientClosed``.
        """
        self._bridge.close(self._producer.aclose())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


async def _queued(
    send: Callable[[], Awaitable[asyncio.Future[T]]],
) -> concurrent.futures.Future[T]:
    """Call ``AsyncProducer.send`` on the loop and hand its future across threads.

    It takes the call, not the coroutine, so a refused ``_queued`` leaves no inner
    coroutine behind unawaited.
    """
    return to_concurrent(await send())
