"""The Replication gRPC service: followers fetch the logs of the topics this broker leads.

Role: thin (pb in, pb out): each call looks its topic's :class:`~broker.replica.leader.
LeaderTopic` up (``leaders(name)``, the replica manager's) and hands the request to it.
``ReplicaFetch`` answers serialized bytes (``LeaderTopic.fetch_raw``, registered as a raw
response): the batches are spliced into the answer, never copied into a message.
``ReplicaStream`` is the same fetches on one call per follower and topic: a reader task
takes the follower's messages as they come (a ``progress_only`` one is counted at once,
:meth:`LeaderTopic.note_progress`, while a fetch may be held), and the fetches are
answered one at a time, in order; a follower pipelining fetches has at most one queued
behind the one held (the reader waits), so a stream holds a bounded amount.
Errors travel in the response's ``ReplicaError`` (``docs/protocol.md``, "Replication
between brokers"), not as gRPC statuses: a topic this broker does not lead is
``NOT_LEADER``; only a request that does not parse (``INVALID_ARGUMENT``), a missing or
wrong credential (``UNAUTHENTICATED`` / ``PERMISSION_DENIED``, from the auth interceptor:
only the cluster's internal credential may call this service) end the call otherwise.

Broker to broker only; clients never call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import grpc

from broker.errors import ReplicaLogUnknownError
from broker.rpc_handlers import add_service, request_reader
from proto import replication_pb2 as _pb

if TYPE_CHECKING:  # the leader module and its cluster rules load only where a topic is led
    from broker.replica.leader import LeaderTopic

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Finds the leader of a topic this broker leads (None: it leads no topic of that name).
LeaderLookup = Callable[[str], "LeaderTopic | None"]


class ReplicationService:
    """Serves ReplicaFetch, ReplicaStream and OffsetForLeaderEpoch. Task-safe: no state
    of its own (a stream's is its call's)."""

    def __init__(self, leaders: LeaderLookup) -> None:
        self._leaders = leaders

    async def ReplicaFetch(  # noqa: N802 - the RPC's name
        self, request: _pb.ReplicaFetchRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> bytes:
        leader = self._leaders(request.topic)
        if leader is None:
            return _pb.ReplicaFetchResponse(
                error=_pb.NOT_LEADER, message=_not_leading(request.topic)
            ).SerializeToString()
        return await leader.fetch_raw(request)

    async def ReplicaStream(  # noqa: N802 - the RPC's name
        self,
        requests: AsyncIterator[_pb.ReplicaFetchRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[bytes]:
        """Answer each fetch of the stream as ``ReplicaFetch`` would, in order; count each
        ``progress_only`` report as it arrives (:func:`fetch_stream`)."""

        async def fetch(request: _pb.ReplicaFetchRequest) -> bytes:
            return await self.ReplicaFetch(request, context)

        def progress(request: _pb.ReplicaFetchRequest) -> None:
            leader = self._leaders(request.topic)
            if leader is not None:
                leader.note_progress(request)

        async with contextlib.aclosing(fetch_stream(requests, context, fetch, progress)) as out:
            async for answer in out:
                yield answer

    async def OffsetForLeaderEpoch(  # noqa: N802 - the RPC's name
        self,
        request: _pb.OffsetForLeaderEpochRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> _pb.OffsetForLeaderEpochResponse:
        leader = self._leaders(request.topic)
        if leader is None:
            return _pb.OffsetForLeaderEpochResponse(
                error=_pb.NOT_LEADER, epoch=-1, end_offset=-1, message=_not_leading(request.topic)
            )
        problem = leader.check_request(request.topic, request.topic_id, request.replica_node, None)
        if problem is not None:
            return _pb.OffsetForLeaderEpochResponse(
                error=problem[0], epoch=-1, end_offset=-1, message=problem[1]
            )
        try:
            epoch, end = leader.offset_for_epoch(request.log, request.epoch)
        except ReplicaLogUnknownError as exc:
            return _pb.OffsetForLeaderEpochResponse(
                error=_pb.UNKNOWN_LOG, epoch=-1, end_offset=-1, message=str(exc)
            )
        return _pb.OffsetForLeaderEpochResponse(epoch=epoch, end_offset=end)


async def fetch_stream(
    requests: AsyncIterator[_pb.ReplicaFetchRequest],
    context: grpc.aio.ServicerContext[object, object],
    fetch: Callable[[_pb.ReplicaFetchRequest], Awaitable[T]],
    progress: Callable[[_pb.ReplicaFetchRequest], None],
) -> AsyncGenerator[T, None]:
    """``ReplicaStream``'s shape over a unary ``fetch``: ``fetch``'s answer to each fetch
    of ``requests``, in order, while a reader task hands each ``progress_only`` request
    to ``progress`` as it arrives (a fetch may be held meanwhile). At most one fetch
    waits behind the one being answered (the reader waits), so a follower that sends
    fetches without waiting for answers holds a bounded amount here. Ends when the
    follower ends its side; a message that does not parse ends the call
    ``INVALID_ARGUMENT`` (after the fetches before it are answered)."""
    fetches: asyncio.Queue[_pb.ReplicaFetchRequest | None] = asyncio.Queue(maxsize=1)

    async def read_requests() -> None:
        try:
            async for request in requests:
                if request.progress_only:
                    progress(request)
                else:
                    await fetches.put(request)  # waits while one is queued: bounded
        finally:
            if not fetches.full():  # else the loop sees the reader done after that one
                fetches.put_nowait(None)

    async with request_reader(read_requests(), context) as reader:
        while (request := await fetches.get()) is not None:
            yield await fetch(request)
            if reader.done() and fetches.empty():
                break  # the follower ended its side and its last fetch is answered


def _not_leading(topic: str) -> str:
    return f"this broker does not lead topic {topic!r}; look its leader up again"


def add_to_server(
    servicer: ReplicationService,
    server: grpc.aio.Server,
    *,
    max_request_bytes: int | None = None,
) -> None:
    """Register the Replication service: every RPC of its descriptor, requests parsed by
    :mod:`broker.rpc_handlers`."""
    add_service(
        server,
        _pb.DESCRIPTOR.services_by_name["Replication"],
        servicer,
        raw_responses=("ReplicaFetch", "ReplicaStream"),  # LeaderTopic.fetch_raw: spliced
        max_request_bytes=max_request_bytes,
    )
