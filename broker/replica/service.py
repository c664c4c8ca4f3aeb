"""The Replication gRPC service: followers fetch the logs of the topics this broker leads.

Role: thin (pb in, pb out): each call looks its topic's :class:`~broker.replica.leader.
LeaderTopic` up (``leaders(name)``, the replica manager's) and hands the request to it.
``ReplicaFetch`` answers serialized bytes (``LeaderTopic.fetch_raw``, registered as a raw
response): the batches are spliced into the answer, never copied into a message.
Errors travel in the response's ``ReplicaError`` (``docs/protocol.md``, "Replication
between brokers"), not as gRPC statuses: a topic this broker does not lead is
``NOT_LEADER``; only a request that does not parse (``INVALID_ARGUMENT``), a missing or
wrong credential (``UNAUTHENTICATED`` / ``PERMISSION_DENIED``, from the auth interceptor:
only the cluster's internal credential may call this service) end the call otherwise.

Broker to broker only; clients never call it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from broker.errors import ReplicaLogUnknownError
from broker.rpc_handlers import add_service
from proto import replication_pb2 as _pb

if TYPE_CHECKING:  # the leader module and its cluster rules load only where a topic is led
    from broker.replica.leader import LeaderTopic

logger = logging.getLogger(__name__)

#: Finds the leader of a topic this broker leads (None: it leads no topic of that name).
LeaderLookup = Callable[[str], "LeaderTopic | None"]


class ReplicationService:
    """Serves ReplicaFetch and OffsetForLeaderEpoch. Task-safe: no state of its own."""

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
        raw_responses=("ReplicaFetch",),  # LeaderTopic.fetch_raw: batches spliced in
        max_request_bytes=max_request_bytes,
    )
