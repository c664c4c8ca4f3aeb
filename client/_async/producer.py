"""AsyncProducer: batching, pipelined, retrying, idempotent publishing.

Role: turn ``send(topic, value, key=...)`` calls into record batches, one accumulator per
topic partition, and publish them. Work per record (encoding) happens here, in the client,
so the broker only checks and appends whole batches.

How a record travels: ``send`` picks the partition (``crc32c(key) % partitions`` for a
key; for no key, a sticky partition that moves on after each batch), adds the record to
that partition's accumulator and returns a :class:`~client._batching.RecordFuture` (the
batch and the record's index: no asyncio future or metadata per record until someone
asks). A record that fills a batch (``batch_max_bytes``) makes ``send`` yield once, so
the sender publishes it while a send loop that never waits goes on. The accumulator's
sender task waits up to ``linger_ms`` for more records (or until ``batch_max_bytes``),
encodes one batch with the producer id and the next sequence number, publishes it, and
settles the batch, which settles every record's future. With a linger (the default) each
partition has one batch in flight (a unary Publish), so records keep their order, and
records that arrive meanwhile form the next, larger batch. With ``linger_ms=0`` (records
go out at once, for latency) the one batch in flight goes on a PublishStream (below)
instead: a batch's trip to the broker is a stream write (about 0.3 ms here) rather than a
unary call (about 0.6 ms), and records that come while it is answered still form the
next batch, which a broker under load needs (see :data:`DEFAULT_WINDOW`).

Pipelining (``max_in_flight`` > 1; and the ``linger_ms=0`` default, whose window is what
each answer's ``in_flight_hint`` says, 1 or 2: see :data:`DEFAULT_WINDOW`): the
partition's sender keeps up to ``max_in_flight`` batches on one long-lived
PublishStream, taking the next batch as soon as the window has room; sequences are
stamped in send order and the broker answers in order, so answers are matched to batches
by position (each request has its own ``request_id`` too). The stream
opens with the first batch and again with the next batch after it breaks; closing the
producer half-closes it after the flush. Trouble inside a window stops new batches until
every batch written before it is answered, then
(:meth:`~client._async._accumulator.Accumulator._recover`):

- the stream broke, or a batch was answered UNAVAILABLE/DEADLINE_EXCEEDED: every batch
  not acknowledged goes again, in order, with the same bytes (same id and sequences), so
  the broker answers the ones it appended as duplicates; after the delivery timeout they
  fail with an unknown outcome. Not idempotent (``idempotent=False``), a re-sent batch
  that was appended before the break is appended again, as a retried unary publish is;
- a batch failed for good: it fails as below; batches behind it that the broker refused
  for the gap it left are re-stamped (:func:`proto.batch.restamp`: new id and sequences,
  CRC) under a fresh producer id from sequence 0 and sent again, in order. Batches behind
  it that the broker acknowledged anyway stay acknowledged.

Under a fixed ``producer_id`` a partition keeps one batch in flight whatever
``max_in_flight`` says, so the fixed-id rules below hold exactly.

The blocking :class:`~client.Producer` collects batches on its callers' threads and
queues them here whole (:meth:`AsyncProducer.enqueue`).

Retries: UNAVAILABLE and DEADLINE_EXCEEDED are retried with exponential backoff and full
jitter until ``delivery_timeout_s``; the same bytes are resent, so the broker's dedup turns
a retry of an appended batch into its original offsets. Other errors fail the batch's
records at once.

Routing (a cluster, ``broker`` a list of seeds; :mod:`client._async._routing`): each
topic's batches go to that topic's owner, found lazily: a topic not yet routed goes to
the seed in use, and a broker that does not serve it refuses the batch (``ABORTED``, or on
a PublishStream an answer with a ``redirect``), having written nothing. The batch is then
resent with the same producer id and sequence, at once to the owner the refusal names,
or after a backoff (at most 250 ms) and a Lookup; so a record is written once across a
redirect. A refusal never costs a producer id. A partition's stream to a broker that stopped
serving the topic is closed and a new one opened at the owner.

A failed batch's error says whether its records were written
(:attr:`ClientError.outcome <client.errors.ClientError.outcome>`, see
:func:`client.errors.publish_outcome`), and that decides how the partition goes on:

- ``REFUSED`` (the broker refused the batch before appending it: a bad or oversized
  batch, a missing topic, the backlog quota): its sequence numbers are free again, and
  the next batch reuses them under the same producer id;
- ``REFUSED`` with ``FAILED_PRECONDITION`` (a sequence gap: the broker's state of this
  producer id no longer matches ours, e.g. acknowledged data was cut from its log), and
  ``UNKNOWN`` (no answer, or ``UNKNOWN``/``INTERNAL``/``CANCELLED``, which can follow an
  append): the partition moves to a fresh producer id. An unknown outcome never lends
  its sequences to a later batch: were the batch in the log, the broker would answer the
  next batch of the same size as its duplicate, acknowledging records it never wrote.

Under a fixed ``producer_id`` the id cannot change, so any failure ends the partition's
batches instead: every later batch fails, unsent, with the first failure's error.

Why one module at about 640 lines (past the ~600 guideline): a fifth of it is this
docstring, the producer's rules told once where its users read them; the class is about
430 lines, and the per-partition half lives apart (:mod:`client._async._accumulator`).
What is left, the columnar ``send_many`` cut into batches (``_cut``, ``_take``,
``_slices``), is the producer's own sizing rule and stays beside ``send``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import operator
import random
import secrets
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate, repeat
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import grpc

from client._async._accumulator import Accumulator, Bulk
from client._async._routing import Link, Router
from client._batching import RECORD_OVERHEAD, BufferBudget, PendingBatch, RecordFuture
from client._connection import ConnectionOptions, ConnectionSettings
from client._types import (
    DEFAULT_BROKER,
    PublishedRange,
    RecordMetadata,
    SentRecords,
)
from client.errors import (
    ClientClosed,
    ClientError,
    NotFound,
    Refused,
    from_rpc_error,
    publish_failure,
    publish_outcome,
)
from proto import admin_pb2 as _admin
from proto import broker_pb2 as _pb
from proto.batch import Headers, partition_for

logger = logging.getLogger(__name__)

R = TypeVar("R")

#: ``max_in_flight`` left to the producer (``None``): :data:`DEFAULT_WINDOW`, on unary
#: Publish calls with a linger and on a PublishStream with ``linger_ms=0``.
DEFAULT_MAX_IN_FLIGHT: int | None = None
#: Batches a partition keeps in flight by default, with a linger or without. Records that
#: come while one is answered form the next, larger batch: a window of 2 cost the
#: per-record send rates ~10% (smaller batches) on ``bench pubsub --quick``. Without a
#: linger the one batch goes on a PublishStream (:attr:`AsyncProducer.streams`).
#: Measured on 2 cores, fsync always, the same minutes (load average ~2.7): the e2e phase
#: of ``bench pubsub`` alone (2,000 msg/s, 100 B) had a p50 of 2.39-2.82 ms with one batch
#: on a stream, 2.95-3.43 with one unary Publish, and 1.97-3.81 with two on a stream; and
#: ``bench dispatch``'s fan-out (a ``linger_ms=0`` publisher at 200 msg/s, 100
#: subscriptions) 24.9-28.2 ms with one (stream or unary) against 30.3-43.2 with two. A
#: broker that makes 100 deliveries per batch answers each one late; with one batch in
#: flight the records that come meanwhile share the next batch, with two each goes alone
#: and the broker falls further behind. Pipelining stays one argument away
#: (``max_in_flight``) for a producer whose broker has room to spare.
#:
#: Without a linger, the default window then follows the broker's ``in_flight_hint``
#: (:mod:`wal.commit_cost`): it starts at 1 and becomes 2 while the broker's fdatasync
#: outweighs its own work per commit (few subscriptions to deliver to), which is when a
#: second batch in flight only saves latency; it stays 1 for the fan-out above.
DEFAULT_WINDOW = 1
#: The broker's default ``[limits] max_publish_stream_in_flight``: a window beyond it
#: would only wait in HTTP/2 flow control.
MAX_IN_FLIGHT_LIMIT = 256


class AsyncProducer:
    """Publishes records; batches, pipelines per partition, retries, and is idempotent.

    Task-safe on one event loop; an async context manager (closing flushes).

    Args:
        broker: ``host:port`` of the broker, or seed brokers: ``"h1:p1,h2:p2"`` or a
            sequence of addresses (each topic's batches go to its owner).
        linger_ms: How long a partition's batch waits for more records. Default 5 ms.
        batch_max_bytes: Send a batch once its records reach this size. Default 1 MiB.
        delivery_timeout_s: Give up retrying a batch after this long. Default 30 s.
        buffer_max_bytes: Records waiting to be acknowledged, at most, in bytes; ``send``
            waits for room beyond it (backpressure). Default 64 MiB.
        idempotent: Stamp batches with a producer id and sequence numbers so the broker
            drops retried duplicates. Default on.
        max_in_flight: Batches each partition keeps in flight, 1 to 256 (the broker's
            default ``[limits] max_publish_stream_in_flight``). 1: one unary Publish at a
            time. More: pipelined on one PublishStream per partition, order and
            idempotence kept (see the module docstring); not with a fixed
            ``producer_id``, which keeps one. Default (``None``): 1, as a unary Publish
            with a linger and on a PublishStream with ``linger_ms=0`` (a stream write
            reaches the broker in half a unary call's time); without a linger the
            window then follows each answer's ``in_flight_hint``: 2 while the broker's
            fdatasync outweighs its own work per commit, else 1 (see
            :data:`DEFAULT_WINDOW`).
        producer_id: A fixed producer id (0 to 2**63 - 1) instead of a random one per
            partition; with ``idempotent`` only. Each partition's sequences start at 0. A
            caller that re-sends the same records in the same calls under the same id (a
            retried Spark task) gets them answered as duplicates, not appended again.
            Because the id cannot change, a failed batch fails every later batch of its
            partition: after an unknown outcome, a later batch under the same sequences
            could be taken for a duplicate. Default: random ids, one per partition,
            replaced by a fresh one after a failure whose outcome is unknown or a
            sequence gap (see the module docstring).
        channel: An existing channel to use for the first seed (not closed by the
            producer); ``reconnect_backoff_max_s`` then does not apply to it.
        **connection: The connection keywords, the same for every client class
            (:class:`~client.ConnectionOptions`): ``reconnect_backoff_max_s``,
            ``token``, ``tls_ca``, ``tls_cert`` and ``tls_key``. Unused with ``channel``
            (that channel's own settings apply); a bad one raises ``ValueError`` here.
    """

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
        channel: grpc.aio.Channel | None = None,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        #: Where the broker is and how to reach it (unused with ``channel``).
        self.connection = ConnectionSettings.of("AsyncProducer", broker, connection)
        _check_sizes(linger_ms, batch_max_bytes, delivery_timeout_s, buffer_max_bytes)
        if producer_id is not None and not (idempotent and 0 <= producer_id < 2**63):
            raise ValueError(
                "producer_id needs idempotent=True and must be in [0, 2**63), "
                f"not {producer_id!r} (idempotent={idempotent})"
            )
        self.fixed_producer_id = producer_id
        defaulted = max_in_flight is None
        if max_in_flight is None:
            max_in_flight = DEFAULT_WINDOW
        if (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or not 1 <= max_in_flight <= MAX_IN_FLIGHT_LIMIT
        ):
            raise ValueError(
                f"max_in_flight must be an integer from 1 to {MAX_IN_FLIGHT_LIMIT} (the "
                f"broker's default [limits] max_publish_stream_in_flight), got {max_in_flight!r}"
            )
        self.max_in_flight = max_in_flight
        #: Whether each partition publishes on a PublishStream (else unary Publish calls):
        #: with a window over 1, and by default without a linger.
        self.streams = max_in_flight > 1 or (defaulted and linger_ms == 0)
        #: Whether each partition's window follows the broker's ``in_flight_hint``
        #: (:data:`~client._async._accumulator.MAX_ADAPTIVE_WINDOW` at most): by default
        #: without a linger.
        self.adaptive_window = defaulted and linger_ms == 0
        self.buffer_max_bytes = buffer_max_bytes
        self.budget = BufferBudget(buffer_max_bytes)
        self._room = asyncio.Event()
        self._room.set()
        self.linger_s = linger_ms / 1000
        self.batch_max_bytes = batch_max_bytes
        self._timeout = self.delivery_timeout_s = delivery_timeout_s
        self._idempotent = idempotent
        #: Where each topic's batches go (the seeds, the owners found, a channel each).
        self.router = Router(self.connection, channel)
        self._partitions: dict[str, int] = {}
        self._sticky: dict[str, int] = {}
        self._accumulators: dict[tuple[str, int], Accumulator] = {}
        self._rng = self.rng = random.Random()
        self._closed = False

    def new_producer_id(self) -> int:
        """A fresh random producer id, the fixed one if given, or -1 when not idempotent."""
        if self.fixed_producer_id is not None:
            return self.fixed_producer_id
        return secrets.randbits(62) if self._idempotent else -1

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Queue one record; the future resolves once the broker acknowledged it.

        The future is a :class:`~client.RecordFuture`: awaitable, with the methods of an
        ``asyncio.Future``, and taken by ``asyncio.gather``, ``wait`` and ``wait_for``.

        The future fails with a :class:`ClientError` whose ``outcome`` says whether the
        record was written: ``REFUSED`` (not written; safe to resend) or ``UNKNOWN`` (may
        or may not have been written; resending may duplicate). The message ends with the
        same advice.

        ``headers`` is a mapping, or ``(name, value)`` pairs when a name repeats (order
        and duplicates are kept; a consumer reads them all from ``Message.header_list``).

        Raises:
            NotFound: the topic does not exist.
            ClientClosed: the producer is closed.
        """
        budget = self.budget
        if self._closed or budget.loop_used + budget.thread_used >= budget.limit:
            await self._wait_for_room()
        count = self._partitions.get(topic) or await self._partition_count(topic)
        if partition is None:
            if key is not None:
                partition = partition_for(key, count)
            else:
                sticky = self._sticky.get(topic)
                partition = sticky if sticky is not None else self._sticky_for(topic, count)
        elif not 0 <= partition < count:
            raise ValueError(f"topic {topic!r} has partitions 0-{count - 1}, not {partition}")
        acc = self._accumulators.get((topic, partition)) or self._accumulator(topic, partition)
        ts = timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000
        pending = acc.pending
        future = acc.add(value, key, headers, ts)
        if acc.pending is not pending:
            # The record filled a batch: let its sender encode and publish it now, so a
            # loop of sends that never waits keeps the broker busy instead of leaving
            # every batch to flush.
            await asyncio.sleep(0)
        return future

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """Send one record and wait for its acknowledgement (see :meth:`send`).

        Raises:
            ClientError: The record failed; its ``outcome`` says whether it was written.
        """
        future = await self.send(
            topic,
            value,
            key=key,
            headers=headers,
            partition=partition,
            timestamp_ms=timestamp_ms,
        )
        return await future

    async def send_many(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Headers] | None = None,
        partition: int | None = None,
        timestamps_ms: Sequence[int] | int | None = None,
    ) -> asyncio.Future[SentRecords]:
        """Queue many records at once: the columnar fast path.

        The columns are cut into batches of up to ``batch_max_bytes`` and each batch is
        encoded straight from them, so Python does no work per record beyond hashing keys.
        Records go where :meth:`send` would put them: to ``partition`` if given, else by
        key hash; records without a key go to the partitions in turn, one batch each, so a
        large call keeps every partition busy. Within a partition, records keep the order
        they were passed in, after everything sent before. Retries, idempotence and
        backpressure are those of :meth:`send`.

        Args:
            topic: The topic.
            values: One value per record.
            keys: One key (or ``None``) per record, or ``None`` for no keys.
            headers: Per record, a mapping or ``(name, value)`` pairs (a name may repeat),
                or ``None`` for no headers.
            partition: Send every record to this partition.
            timestamps_ms: One timestamp per record, or one for all (default: now).

        Returns:
            A future that resolves to :class:`SentRecords` (one :class:`RecordMetadata`
            per value, in order) once every batch is acknowledged, or fails with the first
            batch's error (its ``outcome`` says whether that batch was written). There is
            no atomicity across batches: batches acknowledged before a failure stay in
            the log.

        Raises:
            ValueError: A column's length differs from ``values``'s, or ``partition`` is
                not one of the topic's.
            NotFound: The topic does not exist.
            ClientClosed: The producer is closed.
        """
        if self._closed:
            raise ClientClosed("the producer is closed")
        n = len(values)
        for name, column in (
            ("keys", keys),
            ("headers", headers),
            ("timestamps_ms", timestamps_ms),
        ):
            if isinstance(column, Sequence) and len(column) != n:
                raise ValueError(f"{name} has {len(column)} entries but values has {n}")
        count = await self._partition_count(topic)
        if partition is not None and not 0 <= partition < count:
            raise ValueError(f"topic {topic!r} has partitions 0-{count - 1}, not {partition}")
        ts: Sequence[int] | int = (
            timestamps_ms if timestamps_ms is not None else time.time_ns() // 1_000_000
        )
        bulks = self._cut(
            topic, count, values, keys=keys, headers=headers, timestamps=ts, partition=partition
        )
        for target, bulk in bulks:
            await self._wait_for_room()
            self.budget.loop_used += bulk.size
            self._accumulator(topic, target).add_sealed(bulk)
        return asyncio.ensure_future(_sent(topic, [bulk.future for _, bulk in bulks]))

    def _cut(
        self,
        topic: str,
        count: int,
        values: Sequence[bytes],
        *,
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Headers] | None,
        timestamps: Sequence[int] | int,
        partition: int | None,
    ) -> list[tuple[int, Bulk]]:
        """Cut a ``send_many`` call into (partition, batch) pairs, in send order."""
        loop = asyncio.get_running_loop()
        out: list[tuple[int, Bulk]] = []
        groups: list[tuple[int | None, Sequence[int]]]
        if partition is not None or keys is None:
            groups = [(partition, range(len(values)))]  # contiguous: slice the columns
        else:
            by_partition: dict[int, list[int]] = {}
            for i, key in enumerate(keys):
                p = partition_for(key, count) if key is not None else self._sticky_for(topic, count)
                by_partition.setdefault(p, []).append(i)
            groups = list(by_partition.items())
        for target, indices in groups:
            vs, ks, hs, ts = _take(indices, values, keys, headers, timestamps)
            for a, b, size in _slices(vs, ks, self.batch_max_bytes):
                if target is None:  # unkeyed: one batch per partition in turn
                    p = self._sticky_for(topic, count)
                    self._sticky[topic] = (p + 1) % count
                else:
                    p = target
                bulk = Bulk(
                    vs[a:b],
                    None if ks is None else ks[a:b],
                    None if hs is None else hs[a:b],
                    ts if isinstance(ts, int) else ts[a:b],
                    indices[a:b],
                    size,
                    loop.create_future(),
                )
                out.append((p, bulk))
        return out

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (looked up once, then cached). Raises
        ``NotFound``."""
        return await self._partition_count(topic)

    async def flush(self) -> None:
        """Wait until every record sent so far is acknowledged or failed."""
        await asyncio.gather(*(acc.flush() for acc in list(self._accumulators.values())))

    async def close(self) -> None:
        """The same as :meth:`aclose`: the sync twin's name for it."""
        await self.aclose()

    async def aclose(self) -> None:
        """Flush, stop the sender tasks, close the channel (if the producer opened it)."""
        if self._closed:
            return
        self._closed = True
        self._room.set()  # a send waiting for room raises ClientClosed instead of adding
        for acc in list(self._accumulators.values()):
            await acc.aclose()
        await self.router.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- used by the accumulators and the blocking Producer -----------------------------

    def enqueue(self, topic: str, partition: int, batch: PendingBatch) -> None:
        """Queue a batch of records collected elsewhere (by the blocking producer), after
        everything queued for the partition before; its bytes are in :attr:`budget`."""
        self._accumulator(topic, partition).add_sealed(batch)

    def released(self, batch: PendingBatch | Bulk) -> None:
        """``batch`` left the buffers (acknowledged or failed): its bytes are free."""
        by_thread = isinstance(batch, PendingBatch) and batch.loop is None
        self.budget.release(batch.size, by_thread=by_thread)
        if not self.budget.full():
            self._room.set()

    def _open_publish_stream(
        self, topic: str
    ) -> tuple[str, grpc.aio.StreamStreamCall[_pb.PublishRequest, _pb.PublishResponse]]:
        """A new PublishStream call to the broker ``topic`` is routed to now, and its
        address (one per pipelining partition; written and read by its accumulator)."""
        link = self.router.link_for(topic)
        call: grpc.aio.StreamStreamCall[_pb.PublishRequest, _pb.PublishResponse]
        call = link.broker.PublishStream()
        return link.address, call

    def batch_sealed(self, topic: str, partition: int) -> None:
        """A batch of ``partition`` was sealed (it takes no more records): unkeyed records
        move to the next partition, if they were going to this one. Called once per
        batch, when it is sealed, never again when its sender takes it: by then the
        sticky partition may have come round to this one again, and a second move would
        put two batches in a row on the next."""
        if self._sticky.get(topic) == partition:
            self._sticky[topic] = (partition + 1) % self._partitions[topic]

    async def publish_batch(self, topic: str, partition: int, data: bytes) -> _pb.PublishResponse:
        """Publish one batch, retrying retryable errors until the delivery timeout.

        Raises:
            ClientError: The subclass for the last attempt's status, with ``outcome`` set
                (:func:`~client.errors.publish_outcome`) and the message saying whether the
                records were written.
        """
        request = _pb.PublishRequest(topic=topic, partition=partition, batch=data)
        # Attempts that may have appended: a refused one (ABORTED) did nothing.
        attempts = 0

        async def call(link: Link, timeout_s: float) -> _pb.PublishResponse:
            nonlocal attempts
            try:
                response: _pb.PublishResponse = await link.broker.Publish(
                    request, timeout=timeout_s
                )
            except grpc.RpcError as exc:
                if not isinstance(from_rpc_error(exc), Refused):
                    attempts += 1
                raise
            return response

        where = f"{topic}/{partition}"
        try:
            return await self.router.call(
                topic, call, timeout_s=self._timeout, what=f"publish to {where}"
            )
        except ClientError as exc:
            refused = isinstance(exc, Refused)
            outcome = publish_outcome(exc, attempts=attempts + refused)
            raise publish_failure(exc, outcome, where) from exc

    async def _retrying(self, topic: str, method: Callable[[Link], Any], request: object) -> Any:
        """Call ``method`` at ``topic``'s owner, following refusals and retrying
        retryable errors with backoff until the delivery timeout (a broker that restarts
        answers UNAVAILABLE for a moment)."""
        return await self.router.call(
            topic,
            lambda link, timeout: method(link)(request, timeout=timeout),
            timeout_s=self._timeout,
            what=f"looking up topic {topic}",
        )

    async def _partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            info = await self._retrying(
                topic,
                lambda link: link.admin.DescribeTopic,
                _admin.DescribeTopicRequest(name=topic),
            )
            count = len(info.partitions)
            if count == 0:
                raise NotFound(f"topic {topic!r} has no partitions")
            self._partitions[topic] = count
        return count

    async def _wait_for_room(self) -> None:
        """Return once there is room (backpressure: ``buffer_max_bytes`` are waiting for
        acks). Raise ``ClientClosed`` if the producer is closed before or while waiting:
        a record added after close would go to a stopped sender and never be settled."""
        while True:
            if self._closed:
                raise ClientClosed("the producer is closed")
            if not self.budget.full():
                return
            self._room.clear()
            await self._room.wait()

    def _accumulator(self, topic: str, partition: int) -> Accumulator:
        acc = self._accumulators.get((topic, partition))
        if acc is None:
            acc = self._accumulators[(topic, partition)] = Accumulator(self, topic, partition)
        return acc

    def _sticky_for(self, topic: str, count: int) -> int:
        if topic not in self._sticky:
            self._sticky[topic] = self._rng.randrange(count)
        return self._sticky[topic]


async def _sent(topic: str, futures: list[asyncio.Future[PublishedRange]]) -> SentRecords:
    return SentRecords(topic, await asyncio.gather(*futures))


def _check_sizes(
    linger_ms: float, batch_max_bytes: int, delivery_timeout_s: float, buffer_max_bytes: int
) -> None:
    """Raise ``ValueError`` naming the first of a producer's settings that is wrong."""
    if not (math.isfinite(linger_ms) and linger_ms >= 0):
        raise ValueError(f"linger_ms must be a number >= 0, not {linger_ms!r}")
    if batch_max_bytes < 1:
        raise ValueError(f"batch_max_bytes must be at least 1, not {batch_max_bytes!r}")
    if not (math.isfinite(delivery_timeout_s) and delivery_timeout_s > 0):
        raise ValueError(f"delivery_timeout_s must be a number > 0, not {delivery_timeout_s!r}")
    if buffer_max_bytes < batch_max_bytes:
        raise ValueError(
            f"buffer_max_bytes ({buffer_max_bytes:,}) must be at least batch_max_bytes "
            f"({batch_max_bytes:,})"
        )


def _take(
    indices: Sequence[int],
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None,
    headers: Sequence[Headers] | None,
    timestamps: Sequence[int] | int,
) -> tuple[
    Sequence[bytes],
    Sequence[bytes | None] | None,
    Sequence[Headers] | None,
    Sequence[int] | int,
]:
    """The columns' entries at ``indices``; a whole range is the columns themselves."""
    if isinstance(indices, range) and indices == range(len(values)):
        return values, keys, headers, timestamps
    return (
        [values[i] for i in indices],
        None if keys is None else [keys[i] for i in indices],
        None if headers is None else [headers[i] for i in indices],
        timestamps if isinstance(timestamps, int) else [timestamps[i] for i in indices],
    )


def _slices(
    values: Sequence[bytes], keys: Sequence[bytes | None] | None, limit: int
) -> Iterator[tuple[int, int, int]]:
    """``(start, stop, bytes)`` of consecutive batches, each closed by the record that
    makes it reach ``limit`` bytes (as :meth:`~client._async._accumulator.Accumulator.add`
    seals a batch).

    A record counts its value, its key and 16 bytes of overhead, as in ``send``.
    """
    sizes = map(operator.add, map(len, values), repeat(RECORD_OVERHEAD))
    if keys is not None:
        sizes = map(operator.add, sizes, map(_key_length, keys))
    cumulative = list(accumulate(sizes))
    start, before = 0, 0
    while start < len(cumulative):
        stop = min(bisect_left(cumulative, before + limit, lo=start) + 1, len(cumulative))
        yield start, stop, cumulative[stop - 1] - before
        start, before = stop, cumulative[stop - 1]


def _key_length(key: bytes | None) -> int:
    return 0 if key is None else len(key)
