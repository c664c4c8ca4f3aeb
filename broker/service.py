"""The data-plane servicer: Publish, PublishStream, Subscribe, Fetch and AckUpTo.

Role: thin. Each RPC turns the request into calls on the topic registry and the partition's
``LogWriter``, and errors into status codes through :mod:`broker.error_status`. A batch is
validated as a whole (size, CRC, layout) by the log and appended without per-record work.

Invariants:
- A publish is answered only after the log acknowledged it (durable under the topic's
  fsync policy).
- Fetch returns only batches below the high-water mark (durable data).
- The simple path: a Publish may carry plain ``records`` instead of an encoded ``batch``
  (exactly one of the two); the broker encodes them into one batch (producer id -1) and
  appends it like any other. A Subscribe opened with ``decoded`` and a Fetch with
  ``decoded`` answer ``DecodedRecord`` messages instead of batch bytes. The binary path
  stays the fast default.
- A publish the client stops waiting for (deadline, cancellation, dropped connection) still
  runs to its end (:mod:`broker.ingest`); a PublishStream cut short leaves its queued
  publishes running, unanswered, and logs nothing for them.
- A Subscribe stream is one consumer session: it ends when the client half-closes, when a
  request is bad (with that request's status), when the broker shuts down
  (``UNAVAILABLE``), or when its subscription is deleted (``NOT_FOUND``). Whatever it did
  not acknowledge goes to the next consumer: as a failed delivery, except what the client
  released (``Acks.releases``, after ``drain`` is answered ``drained``: records it never
  handed to its application).
- Every call that names a topic asks :class:`~broker.topic_guard.TopicGuard` first (each
  request of a PublishStream, the ``open`` of a Subscribe); a refused one did nothing
  and ends ``ABORTED`` with the owner in its trailers (a PublishStream request: its
  response carries ``error_code`` ABORTED and a ``Redirect``; the stream stays open).
  The credits and acks of a Subscribe already open are not asked again.
- Auto-create in cluster mode (``auto_create_topics`` of the cluster's defaults, else of
  this broker's file; :class:`~broker.cluster_node.ClusterNode`): a publish to a topic
  the cluster does not hold creates it cluster-wide, as CreateTopic does (placed on any
  broker); then it is served here or refused with its new owner, nothing written. Its
  partitions are the cluster's ``default_partitions``, else this broker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import grpc

from broker.convert import (
    batch_path_partition,
    committer_name,
    consumer_name,
    decoded_records,
    delivery,
    delivery_mode,
    encode_simple,
    fetch_response_bytes,
    initial_position,
    publish_response,
    simple_path_key,
    simple_path_sequence,
    subscription_type,
)
from broker.error_status import Context, abort_for, rpc, status_for
from broker.errors import (
    InvalidRequestError,
    LimitExceededError,
    ShuttingDownError,
    TopicExistsError,
    TopicRefusedError,
)
from broker.ingest import append_batch
from broker.limits import LimitsConfig, StreamSlots
from broker.load_monitor import LoadMonitor
from broker.metrics import BrokerMetrics
from broker.retention import RetentionService
from broker.rpc_handlers import add_service, request_reader
from broker.topic_guard import TopicGuard, redirect_message
from broker.topics import Topic, TopicRegistry, check_topic_name
from broker.turns import Turnstile
from dispatcher import ConsumerSession, Subscription, SubscriptionRegistry
from dispatcher.session import DRAINED
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _grpc
from proto.batch import partition_for
from wal import LogWriter
from wal.errors import WalClosedError
from wal.log import Clock, wall_clock_ms

if TYPE_CHECKING:  # imported by cluster mode only: a single broker never loads etcd
    from broker.cluster_node import ClusterNode

logger = logging.getLogger(__name__)

_MAX_FETCH_BYTES = 16 << 20
_DRAINED = _pb.SubscribeResponse(drained=_pb.Drained())
_MAX_WAIT_MS = 30_000


class BrokerService(_grpc.BrokerServicer):
    """The data plane over a :class:`TopicRegistry` and a :class:`SubscriptionRegistry`.
    Task-safe (no state of its own)."""

    def __init__(
        self,
        topics: TopicRegistry,
        subscriptions: SubscriptionRegistry,
        metrics: BrokerMetrics,
        *,
        auto_create: bool = False,
        default_partitions: int = 1,
        retention: RetentionService | None = None,
        limits: LimitsConfig | None = None,
        clock: Clock | None = None,
        load: LoadMonitor | None = None,
        guard: TopicGuard | None = None,
        cluster: ClusterNode | None = None,
    ) -> None:
        #: Cluster mode: an auto-created topic is created cluster-wide (None: a single broker).
        self._cluster = cluster
        #: Asked first by every call that names a topic (cluster mode; see topic_guard).
        self._guard = guard or TopicGuard()
        self._clock = clock or wall_clock_ms  # stamps simple-path records sent without a time
        #: Whether the process is too busy for producers to pipeline (its own, if none).
        self._load = load or LoadMonitor()
        self._limits = limits or LimitsConfig()
        self._streams = StreamSlots(self._limits.max_streams_per_connection)
        self._topics = topics
        self._retention = retention  # applies the backlog quota; None: no quota
        self._subscriptions = subscriptions
        self._metrics = metrics
        self._auto_create = auto_create
        self._default_partitions = default_partitions

    async def _topic(self, name: str) -> Topic:
        if self._cluster is not None:  # the cluster's defaults over this broker's file
            if self._cluster.defaults.auto_create_topics:
                return await self._cluster_topic(self._cluster, name)
            return self._topics.get(name)
        if self._auto_create:
            return await self._topics.get_or_create(name, self._default_partitions)
        return self._topics.get(name)

    async def _cluster_topic(self, cluster: ClusterNode, name: str) -> Topic:
        """Auto-create in cluster mode: a topic the cluster does not hold is created
        cluster-wide (placed on any broker, as CreateTopic); then it is served here, or
        refused with its owner (nothing published)."""
        if not cluster.knows(name):
            check_topic_name(name)
            with contextlib.suppress(TopicExistsError):  # another creator won: same topic
                await cluster.create_topic(name, 0, cluster.auto_create_timeout_s)
            self._guard.check(name, write=True)
        return self._topics.get(name)

    async def _publish(
        self, request: _pb.PublishRequest, *, turns: Turnstile | None = None
    ) -> _pb.PublishResponse:
        """Publish one request; on a stream, in its turn (see :meth:`PublishStream`):
        taken before anything else, given up once the batch is queued in the log or the
        request ended."""
        me = asyncio.current_task() if turns is not None else None  # this request's key
        if turns is not None and not turns.take(me):
            await turns.wait(me)  # an earlier request of the stream is not queued yet
        try:
            self._guard.check(request.topic, write=True)
            data = self._batch_of(request)
            topic = await self._topic(request.topic)
            index = request.partition
            if index == -1 and (key := simple_path_key(request.records)) is not None:
                index = partition_for(key, len(topic.partitions))
            partition = topic.partition(index)
            with self._closed_as(topic):
                result, duplicate = await append_batch(
                    topic.name,
                    partition,
                    data,
                    retention=self._retention,
                    metrics=self._metrics,
                    on_queued=None if turns is None else turns.on_queued,
                )
        finally:
            if turns is not None:
                turns.release(me)  # a no-op if it was queued (and handed the turn on)
        return publish_response(
            request.request_id,
            partition.index,
            result,
            duplicate=duplicate,
            in_flight_hint=self._load.hint(partition.in_flight_hint),
        )

    @contextlib.contextmanager
    def _closed_as(self, topic: Topic) -> Iterator[None]:
        """Answer a log of ``topic`` closed under the request with why it closed: the
        topic was deleted (``NOT_FOUND``) or the broker shuts down (``UNAVAILABLE``),
        not with the log's own error, which names a server path."""
        try:
            yield
        except WalClosedError as exc:
            why = self._topics.closed_under(topic)
            if why is None:
                raise
            raise why from exc

    def _batch_of(self, request: _pb.PublishRequest) -> bytes:
        """The request's batch: ``batch`` as sent, or ``records`` encoded into one."""
        if request.batch and request.records:
            raise InvalidRequestError(
                "batch, records",
                "both are set; set exactly one: `batch` (one encoded record batch) or "
                "`records` (plain records the broker encodes)",
            )
        if request.batch:
            if request.HasField("producer_id") or request.HasField("base_sequence"):
                raise InvalidRequestError(
                    "producer_id, base_sequence",
                    "are for `records` only; a `batch` carries its producer id and sequence "
                    "in its header",
                )
            batch_path_partition(request)
            return request.batch
        if request.records:
            producer_id, base_sequence = simple_path_sequence(request)
            return encode_simple(request.records, self._clock(), producer_id, base_sequence)
        raise InvalidRequestError(
            "batch, records",
            "both are empty; set exactly one: `batch` (one encoded record batch) or "
            "`records` (at least one plain record)",
        )

    @rpc
    async def Publish(  # noqa: N802 - gRPC method name
        self,
        request: _pb.PublishRequest,
        context: Context,
    ) -> _pb.PublishResponse:
        """Append one batch; answer after it is durable."""
        return await self._publish(request)

    async def PublishStream(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[_pb.PublishRequest],
        context: Context,
    ) -> AsyncIterator[_pb.PublishResponse]:
        """Pipeline publishes: up to ``[limits] max_publish_stream_in_flight`` read and not
        yet answered, answered in order, each with its own status, so one bad batch does
        not end the stream. At the limit the broker stops reading the stream until the
        oldest is answered: backpressure (HTTP/2 flow control stalls the client), not an
        error.

        Order: a stream's batches are appended in the order they were read. A request
        goes to the backlog quota and the log writer's queue only once the one before it
        is queued there (or ended: refused, failed, a duplicate), so one waiting under
        ``block_producer`` or for room in the writer holds back the requests after it,
        whatever their topic. It does not wait for the previous one's ``fdatasync``: the
        pipeline stays full."""
        peer = await self._open_stream(context)
        try:
            async for response in self._publish_stream(request_iterator, context):
                yield response
        finally:
            self._streams.release(peer)

    async def _publish_stream(
        self, request_iterator: AsyncIterator[_pb.PublishRequest], context: Context
    ) -> AsyncIterator[_pb.PublishResponse]:
        window = asyncio.Semaphore(self._limits.max_publish_stream_in_flight)
        pending: asyncio.Queue[tuple[asyncio.Task[_pb.PublishResponse], int] | None] = (
            asyncio.Queue()
        )

        async def read_requests() -> None:
            requests = aiter(request_iterator)
            turns = Turnstile()  # this stream's admission order, see above
            try:
                while True:
                    await window.acquire()  # released once a response is sent
                    if (request := await anext(requests, None)) is None:
                        return
                    task = asyncio.create_task(self._publish(request, turns=turns))
                    task.add_done_callback(_retrieve_failure)
                    pending.put_nowait((task, request.request_id))
            finally:
                pending.put_nowait(None)

        async with request_reader(read_requests(), context):
            while (queued := await pending.get()) is not None:
                yield await _stream_response(*queued)
                window.release()

    async def _open_stream(self, context: Context) -> str:
        """Count a new stream on the caller's connection; end the call with
        ``RESOURCE_EXHAUSTED`` if it has ``[limits] max_streams_per_connection`` open."""
        peer = context.peer()
        try:
            self._streams.acquire(peer)
        except LimitExceededError as exc:
            await abort_for(exc, context)
        return peer

    async def Subscribe(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[_pb.SubscribeRequest],
        context: Context,
    ) -> AsyncIterator[_pb.SubscribeResponse]:
        """One consumer session: ``open`` first, then credits and acks in, deliveries out."""
        peer = await self._open_stream(context)
        try:
            async for response in self._subscribe(request_iterator, context):
                yield response
        finally:
            self._streams.release(peer)

    async def _subscribe(
        self,
        request_iterator: AsyncIterator[_pb.SubscribeRequest],
        context: Context,
    ) -> AsyncIterator[_pb.SubscribeResponse]:
        requests = aiter(request_iterator)
        try:
            first = await anext(requests, None)
            if first is None:
                return
            sub, session = await self._open(first)
        except Exception as exc:
            await abort_for(exc, context)
        decoded = first.open.decoded
        reader = asyncio.create_task(_read_subscribe(requests, sub, session))
        try:
            yield _pb.SubscribeResponse(
                subscribed=_pb.Subscribed(
                    topic=sub.topic,
                    subscription=sub.name,
                    partitions=sub.partition_count,
                    consumer_id=session.consumer_id,
                    max_unacked=sub.max_unacked,
                )
            )
            while (item := await session.next()) is not None:
                if item is DRAINED:
                    yield _DRAINED
                else:
                    yield delivery(sub.topic, item, decoded=decoded)
        finally:
            sub.detach(session)
            reader.cancel()
            await asyncio.wait([reader])  # its failure, if any, is reported below
        if reader.done() and not reader.cancelled() and reader.exception() is None:
            return  # the client half-closed
        failure = reader.exception() if reader.done() and not reader.cancelled() else None
        await abort_for(failure or session.ended_by or ShuttingDownError(), context)

    async def _open(self, request: _pb.SubscribeRequest) -> tuple[Subscription, ConsumerSession]:
        if request.WhichOneof("kind") != "open":
            raise InvalidRequestError("open", "the first request on a stream must open it")
        o = request.open
        self._guard.check(o.topic, write=True)  # opening creates or changes the subscription
        name = consumer_name(o.consumer_name)  # before anything is created
        topic = self._topics.get(o.topic)
        sub = await self._subscriptions.subscribe(
            topic.name,
            o.subscription,
            [p.writer for p in topic.partitions],
            initial=initial_position(o.initial_position),
            type_=subscription_type(o.type),
            mode=delivery_mode(o.mode),
        )
        return sub, sub.attach(name, o.initial_credit, force=o.force)

    @rpc
    async def AckUpTo(  # noqa: N802 - gRPC method name
        self,
        request: _pb.AckUpToRequest,
        context: Context,
    ) -> _pb.AckUpToResponse:
        """Commit a reader's position: the cursor becomes max(cursor, offset), saved."""
        self._guard.check(request.topic, write=True)
        committer = committer_name(request.committer)  # before anything is created
        topic = self._topics.get(request.topic)
        sub = await self._subscriptions.subscribe(
            topic.name, request.subscription, [p.writer for p in topic.partitions], any_type=True
        )
        cursor = await sub.commit(request.partition, request.offset, committer=committer)
        await self._subscriptions.save(sub)
        return _pb.AckUpToResponse(cursor=cursor)

    @rpc
    async def Fetch(  # noqa: N802 - gRPC method name
        self,
        request: _pb.FetchRequest,
        context: Context,
    ) -> bytes:
        """Batches from ``offset`` (waiting up to ``max_wait_ms`` for data), as a
        serialized ``FetchResponse`` (see :func:`add_to_server`); with ``decoded``, the
        records of those batches at or above ``offset`` (and below ``end_offset`` if set)
        as ``DecodedRecord`` messages instead, ``max_bytes`` bounding the batches read."""
        self._guard.check(request.topic, write=False)
        topic = self._topics.get(request.topic)
        writer = topic.partition(_fetch_partition(request)).writer
        max_bytes = min(request.max_bytes or 1 << 20, _MAX_FETCH_BYTES)
        with self._closed_as(topic):
            await _wait_for_data(writer, request.offset, request.max_wait_ms)
            batches = await writer.aread(request.offset, max_bytes)  # cold: off the loop
        if request.end_offset > 0:
            batches = [b for b in batches if b.base_offset < request.end_offset]
        if request.decoded:
            return _pb.FetchResponse(
                records=decoded_records(batches, request.offset, request.end_offset or None),
                high_water_mark=writer.high_water_mark,
                first_offset=writer.first_offset,
            ).SerializeToString()
        return fetch_response_bytes(
            [b.buffer for b in batches], writer.high_water_mark, writer.first_offset
        )


def add_to_server(
    servicer: BrokerService, server: grpc.aio.Server, *, max_request_bytes: int | None = None
) -> None:
    """Register the Broker service (every RPC of its descriptor, requests parsed by
    :mod:`broker.rpc_handlers`), except that Fetch answers bytes it serialized itself
    (:func:`~broker.convert.fetch_response_bytes`): building a protobuf message copies
    every batch twice more, a third of the broker's time per Fetch. The wire is the same.
    A request over ``max_request_bytes`` gets ``RESOURCE_EXHAUSTED`` naming the setting
    (see :mod:`broker.rpc_handlers`).
    """
    add_service(
        server,
        _pb.DESCRIPTOR.services_by_name["Broker"],
        servicer,
        raw_responses={"Fetch"},
        max_request_bytes=max_request_bytes,
    )


async def _read_subscribe(
    requests: AsyncIterator[_pb.SubscribeRequest], sub: Subscription, session: ConsumerSession
) -> None:
    """Apply a session's credits and acks; on the stream's end or a bad request, let the
    session go (the exception, if any, stays on this task for the caller to report)."""
    try:
        async for request in requests:
            kind = request.WhichOneof("kind")
            if kind == "credit":
                await sub.grant(session, request.credit)
            elif kind == "ack":
                for r in request.ack.ranges:
                    await sub.ack(r.partition, r.begin, r.end)
                for u in request.ack.up_to:
                    await sub.ack_up_to(u.partition, u.offset)
                for n in request.ack.nacks:
                    delay = n.delay_ms / 1000 if n.HasField("delay_ms") else None
                    await sub.nack(
                        n.partition,
                        n.begin,
                        n.end,
                        delay_s=delay,
                        reason=n.reason,
                        dead_letter=n.dead_letter,
                    )
                for r in request.ack.releases:
                    await sub.release(session, r.partition, r.begin, r.end)
            elif kind == "drain":
                sub.drain(session)
            elif kind == "open":
                raise InvalidRequestError("open", "this stream's subscription is already open")
            else:
                raise InvalidRequestError("kind", "empty request; send credit, ack or drain")
    finally:
        session.outbox.put_nowait(None)


def _retrieve_failure(task: asyncio.Task[_pb.PublishResponse]) -> None:
    """Mark a stream's publish failure as retrieved. A stream the client cancelled leaves
    its queued publishes running to their end, unanswered: their failures (a sequence
    gap, say) have no one to go to, and must not be logged as a task exception never
    retrieved (a traceback at ERROR for a client's cancellation)."""
    if not task.cancelled():
        task.exception()


async def _stream_response(
    task: asyncio.Task[_pb.PublishResponse], request_id: int
) -> _pb.PublishResponse:
    """The response to one stream publish; a failure's response echoes its ``request_id``
    too, so a pipelining client can match it; a cluster refusal's carries a ``Redirect``
    (the stream stays open)."""
    try:
        return await task
    except Exception as exc:
        code, message = status_for(exc)
        response = _pb.PublishResponse(
            request_id=request_id, error_code=code.value[0], error_message=message
        )
        if isinstance(exc, TopicRefusedError):
            response.redirect.CopyFrom(redirect_message(exc.refusal))
        return response


def _fetch_partition(request: _pb.FetchRequest) -> int:
    if request.partition < 0:
        raise InvalidRequestError("partition", f"must be >= 0, got {request.partition}")
    if request.offset < 0:
        raise InvalidRequestError("offset", f"must be >= 0, got {request.offset}")
    if request.end_offset < 0:
        raise InvalidRequestError(
            "end_offset", f"must be >= 0 (0: no limit), got {request.end_offset}"
        )
    if request.max_wait_ms > _MAX_WAIT_MS:
        raise InvalidRequestError("max_wait_ms", f"must be at most {_MAX_WAIT_MS}")
    return request.partition


async def _wait_for_data(writer: LogWriter, offset: int, max_wait_ms: int) -> None:
    """Wait until the high-water mark passes ``offset``, or ``max_wait_ms`` elapses."""
    if max_wait_ms <= 0 or writer.high_water_mark > offset:
        return
    arrived = asyncio.Event()

    def on_advance(hwm: int) -> None:
        if hwm > offset:
            arrived.set()

    writer.add_listener(on_advance)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrived.wait(), max_wait_ms / 1000)
    finally:
        writer.remove_listener(on_advance)
