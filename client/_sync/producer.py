"""Producer: the blocking twin of :class:`~client._async.producer.AsyncProducer`.

Role: the same batching, pipelining, retries and idempotence, for code without an event
loop. The :class:`AsyncProducer` on the producer's own loop thread
(:mod:`client._sync._bridge`) publishes every batch, so the two classes cannot differ in
how batches are published, retried and made idempotent.

``send`` does not cross to the loop thread per record. It appends the record, under one
lock, to a per-partition :class:`~client._batching.PendingBatch` on the caller's thread,
and returns its :class:`~client._batching.ThreadRecordFuture` at once. The loop is woken
once per batch, not per record: when a batch reaches ``batch_max_bytes``, when a batch
opens with no linger timer armed (the timer then takes every batch whose ``linger_ms``
is over), and by ``flush``, ``close`` and ``send_many``, which first hand over every open
batch, so what a thread sent before comes first. Batches are handed over in the order
they were closed, so records keep their order per partition. The buffered bytes count
against the same ``buffer_max_bytes`` as the async producer's
(:class:`~client._batching.BufferBudget`).

Blocking equivalents:

* ``send`` blocks only while ``buffer_max_bytes`` are waiting for acknowledgements, not
  until the record is acknowledged. It returns a
  ``concurrent.futures.Future[RecordMetadata]``. The first send to a topic also looks up
  its partition count, which is one RPC.
* ``send_many`` blocks until the records are queued on the loop and returns a
  ``concurrent.futures.Future[SentRecords]``.
* ``publish`` is ``send`` and then the future's ``result()``: it blocks until the record
  is acknowledged or has failed.
* ``flush`` blocks until every record sent so far is acknowledged or has failed.
* ``close`` replaces ``aclose``, and the class is a context manager in place of an async one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, Unpack

from client._async.producer import DEFAULT_MAX_IN_FLIGHT, AsyncProducer
from client._batching import PendingBatch, ThreadRecordFuture
from client._connection import ConnectionOptions
from client._sync._bridge import Blocking, LoopThread, to_concurrent
from client._types import DEFAULT_BROKER, RecordMetadata, SentRecords
from client.errors import ClientClosed
from proto.batch import Headers, partition_for

T = TypeVar("T")


class Producer(Blocking):
    """Publishes records, blocking. It batches, pipelines per partition, retries, and is
    idempotent.

    Thread-safe: any number of threads may share one producer. Their records meet in
    per-partition batches under one lock, and the batches go to its loop, where
    :class:`AsyncProducer` is task-safe. Records sent from one thread keep their order
    within a partition. Calling it from a thread that runs an event loop raises
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
        max_in_flight: Batches each partition keeps in flight (1 to 256), as for
            :class:`AsyncProducer`. Default: 1; with ``linger_ms=0``, on a PublishStream
            and following the broker's ``in_flight_hint`` (1 or 2).
        **connection: The connection keywords, the same for every client class
            (:class:`~client.ConnectionOptions`): ``reconnect_backoff_max_s``,
            ``token``, ``tls_ca``, ``tls_cert`` and ``tls_key``; a bad one raises
            ``ValueError`` here.

    Unlike :class:`AsyncProducer`, there is no ``channel`` argument. A ``grpc.aio`` channel
    is bound to the loop it was made on, and this producer's loop is private.

    Raises:
        ValueError: An argument is out of range. No thread is left running.
    """

    # -- generated from AsyncProducer by `python -m client._sync._generate`; do not edit --
    def __init__(
        self,
        broker: str | Sequence[str] = DEFAULT_BROKER,
        *,
        linger_ms: float = 5.0,
        batch_max_bytes: int = 1 << 20,
        delivery_timeout_s: float = 30.0,
        buffer_max_bytes: int = 64 << 20,
        idempotent: bool = True,
        producer_id: int | None = None,
        max_in_flight: int | None = DEFAULT_MAX_IN_FLIGHT,
        **connection: Unpack[ConnectionOptions],
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
            max_in_flight=max_in_flight,
            **connection,
        )
        self._created()

    # -- end of generated code --

    def _created(self) -> None:
        """The callers' side of the producer (run by ``__init__``, once the async producer
        is made on the loop thread)."""
        self._loop = self._bridge.call(asyncio.get_running_loop)
        self._linger_s = self._producer.linger_s
        self._batch_max_bytes = self._producer.batch_max_bytes
        self._rng = random.Random()
        # Guarded by the async producer's budget lock (self._producer.budget.lock):
        self._partitions: dict[str, int] = {}  # written once per topic; read without it
        self._sticky: dict[str, int] = {}
        self._open: dict[tuple[str, int], PendingBatch] = {}  # filling, oldest first
        self._ready: list[tuple[tuple[str, int], PendingBatch]] = []  # sealed, in order
        self._wake_pending = False  # an _on_wake is scheduled on the loop
        self._timer = False  # an _on_linger is scheduled on the loop
        self._closed = False

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
        """Queue one record. Block only while the buffers are full, not until it is
        acknowledged.

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
        if sys.get_asyncgen_hooks().firstiter is not None:  # see check_caller
            self._bridge.check_caller()  # raises: this thread runs an event loop
        if self._closed:  # checked again under the lock, where it counts
            raise ClientClosed("the Producer is closed")
        count = self._partitions.get(topic) or self._partition_count(topic)
        if partition is not None and not 0 <= partition < count:
            raise ValueError(f"topic {topic!r} has partitions 0-{count - 1}, not {partition}")
        ts = timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000
        budget = self._producer.budget
        with budget.lock:
            if budget.loop_used + budget.thread_used >= budget.limit:
                budget.wait_for_room(self._is_closed)  # backpressure: the buffers are full
            if self._closed:
                raise ClientClosed("the Producer is closed")
            if partition is None:
                if key is not None:
                    partition = partition_for(key, count)
                else:
                    partition = self._sticky.get(topic)
                    if partition is None:
                        partition = self._sticky[topic] = self._rng.randrange(count)
            where = (topic, partition)
            batch = self._open.get(where)
            if batch is None:
                batch = self._open[where] = PendingBatch(topic, None)
                batch.opened = time.monotonic()
                wake = not self._timer
            else:
                wake = False
            index = len(batch.values)
            size = batch.add(value, key, headers, ts)
            budget.thread_used += size
            if batch.size >= self._batch_max_bytes:
                self._seal(where)
                wake = True
            if wake and not self._wake_pending:
                self._wake_pending = True
                self._loop.call_soon_threadsafe(self._on_wake)
        return ThreadRecordFuture(batch, index)

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
        future = self.send(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        return future.result()

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
        return self._bridge.run(self._handed_off(functools.partial(_queued, send_many)))

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has: see :meth:`AsyncProducer.partition_count`."""
        return self._partitions.get(topic) or self._partition_count(topic)

    def flush(self) -> None:
        """Block until every record sent so far is acknowledged or has failed.

        Raises:
            ClientClosed: The producer is closed.
        """
        self._bridge.run(self._handed_off(self._producer.flush))

    def close(self) -> None:
        """Flush, stop the sender tasks, close the channel, and join the loop thread.

        Idempotent. Later calls to other methods raise ``ClientClosed``.
        """
        self._bridge.check_caller()  # from a loop thread: RuntimeError, nothing closed
        with self._producer.budget.lock:
            self._closed = True
        self._producer.budget.wake_all()  # senders waiting for room give up
        self._bridge.close(self._handed_off(self._producer.aclose))

    # -- the accumulator: callers' threads fill batches, the loop takes them ----------

    def _is_closed(self) -> bool:
        return self._closed

    def _partition_count(self, topic: str) -> int:
        """Look the topic up on the loop (one RPC, once per topic)."""
        count = self._bridge.run(self._producer.partition_count(topic))
        self._partitions[topic] = count
        return count

    def _seal(self, where: tuple[str, int]) -> None:
        """Close the open batch of ``where`` for the loop to take. Hold the lock."""
        self._ready.append((where, self._open.pop(where)))
        topic, partition = where
        if self._sticky.get(topic) == partition:  # unkeyed records move on after a batch
            self._sticky[topic] = (partition + 1) % self._partitions[topic]

    def _take_ready(self, *, everything: bool) -> list[tuple[tuple[str, int], PendingBatch]]:
        """Seal the batches whose linger is over (all of them with ``everything``), take
        every sealed batch, and arm the linger timer for the rest. Hold the lock; on the
        loop thread."""
        if self._open:
            deadline = time.monotonic() - self._linger_s
            for where, batch in list(self._open.items()):  # oldest first
                if not everything and batch.opened > deadline:
                    break
                self._seal(where)
        if self._open and not self._timer:
            first = next(iter(self._open.values()))
            delay = max(0.0, first.opened + self._linger_s - time.monotonic())
            self._loop.call_later(delay, self._on_linger)
            self._timer = True
        ready, self._ready = self._ready, []
        return ready

    def _hand_off(self, ready: list[tuple[tuple[str, int], PendingBatch]]) -> None:
        """Queue sealed batches on the async producer, in the order they were sealed."""
        for (topic, partition), batch in ready:
            self._producer.enqueue(topic, partition, batch)

    def _on_wake(self) -> None:
        """On the loop: a batch is full, or a batch opened with no linger timer armed."""
        with self._producer.budget.lock:
            self._wake_pending = False
            ready = self._take_ready(everything=False)
        self._hand_off(ready)

    def _on_linger(self) -> None:
        """On the loop: the oldest open batch has lingered long enough."""
        with self._producer.budget.lock:
            self._timer = False
            ready = self._take_ready(everything=False)
        self._hand_off(ready)

    async def _handed_off(self, then: Callable[[], Awaitable[T]]) -> T:
        """Queue every open batch on the async producer, then call and await ``then``:
        what was sent before comes first (``flush``, ``close``, ``send_many``). It takes
        the call, not its coroutine, so a refused call leaves no coroutine unawaited."""
        with self._producer.budget.lock:
            ready = self._take_ready(everything=True)
        self._hand_off(ready)
        return await then()


async def _queued(
    send: Callable[[], Awaitable[asyncio.Future[T]]],
) -> concurrent.futures.Future[T]:
    """Call ``AsyncProducer.send_many`` on the loop and hand its future across threads.

    It takes the call, not the coroutine, so a refused ``_queued`` leaves no inner
    coroutine behind unawaited.
    """
    return to_concurrent(await send())
