"""The data-plane servicer: Publish, PublishStream and Fetch.

Role: thin. Each RPC turns the request into calls on the topic registry and the partition's
``LogWriter``, and errors into status codes through :mod:`broker.status`. A batch is
validated as a whole (size, CRC, layout) by the log and appended without per-record work.

Invariants:
- A publish is answered only after the log acknowledged it (durable under the topic's
  fsync policy).
- Fetch returns only batches below the high-water mark (durable data).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from broker.convert import publish_response
from broker.errors import InvalidRequestError
from broker.metrics import BrokerMetrics
from broker.status import Context, rpc, status_for
from broker.topics import Topic, TopicRegistry
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc as _grpc
from wal import LogWriter

logger = logging.getLogger(__name__)

_MAX_FETCH_BYTES = 16 << 20
_MAX_WAIT_MS = 30_000
_STREAM_WINDOW = 256  # publishes in flight per PublishStream


class BrokerService(_grpc.BrokerServicer):
    """Publish and Fetch over a :class:`TopicRegistry`. Task-safe (no state of its own)."""

    def __init__(
        self,
        topics: TopicRegistry,
        metrics: BrokerMetrics,
        *,
        auto_create: bool = False,
        default_partitions: int = 1,
    ) -> None:
        self._topics = topics
        self._metrics = metrics
        self._auto_create = auto_create
        self._default_partitions = default_partitions

    async def _topic(self, name: str) -> Topic:
        if self._auto_create:
            return await self._topics.get_or_create(name, self._default_partitions)
        return self._topics.get(name)

    async def _publish(self, request: _pb.PublishRequest) -> _pb.PublishResponse:
        if not request.batch:
            raise InvalidRequestError("batch", "is empty; send one encoded record batch")
        topic = await self._topic(request.topic)
        partition = topic.partition(request.partition)
        result, duplicate = await partition.append(request.batch)
        if not duplicate:
            self._metrics.published(request.topic, partition.index, result, len(request.batch))
        return publish_response(request.request_id, partition.index, result, duplicate=duplicate)

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
        """Pipeline publishes: up to ``_STREAM_WINDOW`` in flight, answered in order, each
        with its own status, so one bad batch does not end the stream."""
        pending: asyncio.Queue[asyncio.Task[_pb.PublishResponse] | None] = asyncio.Queue(
            _STREAM_WINDOW
        )

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    await pending.put(asyncio.create_task(self._publish(request)))
            finally:
                await pending.put(None)

        reader = asyncio.create_task(read_requests())
        try:
            while (task := await pending.get()) is not None:
                yield await _stream_response(task)
            await reader
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    @rpc
    async def Fetch(  # noqa: N802 - gRPC method name
        self,
        request: _pb.FetchRequest,
        context: Context,
    ) -> _pb.FetchResponse:
        """Batches from ``offset`` (waiting up to ``max_wait_ms`` for data)."""
        partition = self._topics.get(request.topic).partition(_fetch_partition(request))
        writer = partition.writer
        await _wait_for_data(writer, request.offset, request.max_wait_ms)
        max_bytes = min(request.max_bytes or 1 << 20, _MAX_FETCH_BYTES)
        batches = writer.read(request.offset, max_bytes)
        if request.end_offset > 0:
            batches = [b for b in batches if b.base_offset < request.end_offset]
        return _pb.FetchResponse(
            batches=[bytes(b.buffer) for b in batches],
            high_water_mark=writer.high_water_mark,
            first_offset=writer.first_offset,
        )


async def _stream_response(task: asyncio.Task[_pb.PublishResponse]) -> _pb.PublishResponse:
    try:
        return await task
    except Exception as exc:
        code, message = status_for(exc)
        return _pb.PublishResponse(error_code=code.value[0], error_message=message)


def _fetch_partition(request: _pb.FetchRequest) -> int:
    if request.partition < 0:
        raise InvalidRequestError("partition", f"must be >= 0, got {request.partition}")
    if request.offset < 0:
        raise InvalidRequestError("offset", f"must be >= 0, got {request.offset}")
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
