"""The Cluster servicer: Lookup (where is each topic served?) and ClusterStatus.

Role: thin, like :mod:`broker.service`: pb -> :class:`ClusterSource` -> pb. Every broker
serves it, a single broker too, so a client can always call Lookup before anything else.
Where the answers come from is a :class:`ClusterSource`:

- :class:`SingleBrokerSource` (here): no cluster, no etcd. The broker is node ``local``,
  the controller, and the owner of every topic it holds (epoch 0, state ``ready``,
  online); an unknown topic is a route with state ``absent``.
- ``cluster.member.ClusterMember``: the running cluster node, answering from its watch
  of etcd.

Both answer with the one set of answer types, :mod:`cluster.answers` (pure, below both
layers: ``cluster`` may not import :mod:`broker`, and the module imports no etcd, so a
single broker still never loads the etcd client).

Lookup rules (docs/protocol.md, section "Cluster: finding a topic's owner"): one route per
asked topic, in the order asked; every topic, by name, when none is asked; an unknown
topic is a route with state ``absent``, not an error (a client asks about many at once);
an invalid name is ``INVALID_ARGUMENT`` naming ``topics[i]``.

Imports :mod:`broker`, :mod:`proto` and :mod:`cluster.answers` only; no etcd.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from broker.error_status import Context, rpc
from broker.errors import InvalidRequestError, TopicNotFoundError
from broker.rpc_handlers import add_service
from broker.topics import TopicRegistry
from cluster.answers import BrokerEntry, LookupResult, Route, StatusResult
from proto import cluster_pb2 as _cluster
from proto.names import NAME_RULE, is_valid_name
from proto.shown import shown

#: The node id of a broker that runs without a cluster.
LOCAL_NODE = "local"


class ClusterSource(Protocol):
    """Where the Cluster service's answers come from."""

    async def lookup(self, topics: Sequence[str]) -> LookupResult:
        """The routes of ``topics`` (valid names, maybe repeated), one each in order, or of
        every topic by name when ``topics`` is empty; unknown ones with state
        ``absent``. Never raises for an unknown topic."""
        ...

    async def status(self) -> StatusResult:
        """The cluster's health (may ask each etcd endpoint; bounded by the caller's
        deadline)."""
        ...


class SingleBrokerSource:
    """The :class:`ClusterSource` of a broker with no cluster: node ``local``, owner of
    every topic it holds. Task-safe: reads the registry only.

    Args:
        topics: The broker's topics.
        address: This broker's ``host:port`` as clients reach it (the bound port), asked
            at each call (the port is known only once the server listens).
        monotonic: Monotonic seconds, for the session age (time since construction).
    """

    def __init__(
        self,
        topics: TopicRegistry,
        address: Callable[[], str],
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._topics = topics
        self._address = address
        self._monotonic = monotonic
        self._started = monotonic()

    async def lookup(self, topics: Sequence[str]) -> LookupResult:
        address = self._address()
        names = list(topics) or self._topics.names()
        routes = tuple(self._route(name, address) for name in names)
        return LookupResult(LOCAL_NODE, routes, (self._me(address),), LOCAL_NODE, 0)

    async def status(self) -> StatusResult:
        return StatusResult(LOCAL_NODE, "", (self._me(self._address()),), LOCAL_NODE)

    def _route(self, name: str, address: str) -> Route:
        try:
            topic = self._topics.get(name)
        except TopicNotFoundError:
            return Route(name)
        partitions = len(topic.partitions)
        return Route(
            name,
            LOCAL_NODE,
            address,
            0,
            "ready",
            True,
            partitions,
            replicas=(LOCAL_NODE,),
            isr=(LOCAL_NODE,),
            min_insync=1,
        )

    def _me(self, address: str) -> BrokerEntry:
        names = self._topics.names()
        partitions = 0
        for name in names:
            try:
                partitions += len(self._topics.get(name).partitions)
            except TopicNotFoundError:
                continue  # deleted between names() and get(): not ours any more
        age = max(0.0, self._monotonic() - self._started)
        return BrokerEntry(LOCAL_NODE, address, True, len(names), partitions, age)


class ClusterService:
    """The ``headrace.v1.Cluster`` servicer over a :class:`ClusterSource`. Task-safe (no
    state of its own). Not a subclass of the generated servicer: :func:`add_to_server`
    registers every RPC of the descriptor by name."""

    def __init__(self, source: ClusterSource) -> None:
        self._source = source

    @rpc
    async def Lookup(  # noqa: N802 - gRPC method name
        self,
        request: _cluster.LookupRequest,
        context: Context,
    ) -> _cluster.LookupResponse:
        """The route of each asked topic (of every topic when none is asked)."""
        topics = list(request.topics)
        for i, name in enumerate(topics):
            if not is_valid_name(name):
                raise InvalidRequestError(
                    f"topics[{i}]", f"{shown(name)} is not a valid topic name: {NAME_RULE}"
                )
        return lookup_response(await self._source.lookup(topics))

    @rpc
    async def ClusterStatus(  # noqa: N802 - gRPC method name
        self,
        request: _cluster.ClusterStatusRequest,
        context: Context,
    ) -> _cluster.ClusterStatusResponse:
        """Brokers, controller, etcd endpoints' health, offline and under-replicated
        topics."""
        return status_response(await self._source.status())


def route_message(r: Route) -> _cluster.TopicRoute:
    """A route as its protobuf message."""
    return _cluster.TopicRoute(
        topic=r.topic,
        owner_node=r.owner_node,
        owner_address=r.owner_address,
        epoch=r.epoch,
        state=r.state,
        online=r.online,
        partitions=r.partitions,
        reason=r.reason,
        replicas=r.replicas,
        isr=r.isr,
        min_insync=r.min_insync,
    )


def broker_message(b: BrokerEntry) -> _cluster.BrokerInfo:
    """A broker as its protobuf message."""
    return _cluster.BrokerInfo(
        node_id=b.node_id,
        address=b.address,
        alive=b.alive,
        topics=b.topics,
        partitions=b.partitions,
        session_age_s=b.session_age_s,
    )


def lookup_response(view: LookupResult) -> _cluster.LookupResponse:
    """A Lookup answer as its protobuf message."""
    return _cluster.LookupResponse(
        routes=[route_message(r) for r in view.routes],
        brokers=[broker_message(b) for b in view.brokers],
        controller=view.controller,
        revision=view.revision,
        node_id=view.node_id,
    )


def status_response(view: StatusResult) -> _cluster.ClusterStatusResponse:
    """A ClusterStatus answer as its protobuf message."""
    return _cluster.ClusterStatusResponse(
        node_id=view.node_id,
        cluster_id=view.cluster_id,
        brokers=[broker_message(b) for b in view.brokers],
        controller=view.controller,
        etcd=[
            _cluster.EtcdEndpoint(endpoint=e.endpoint, healthy=e.healthy, error=e.error)
            for e in view.etcd
        ],
        offline_topics=[
            _cluster.OfflineTopic(
                topic=t.topic, owner_node=t.owner_node, reason=t.reason, message=t.message
            )
            for t in view.offline_topics
        ],
        revision=view.revision,
        strays=[
            _cluster.StrayTopic(
                topic=s.topic,
                local_id=s.local_id,
                cluster_id=s.cluster_id,
                owner_node=s.owner_node,
                path=s.path,
                message=s.message,
            )
            for s in view.strays
        ],
        under_replicated=[
            _cluster.UnderReplicatedTopic(
                topic=u.topic,
                owner_node=u.owner_node,
                epoch=u.epoch,
                replicas=u.replicas,
                isr=u.isr,
                min_insync=u.min_insync,
                message=u.message,
            )
            for u in view.under_replicated
        ],
    )


def add_to_server(
    servicer: ClusterService, server: grpc.aio.Server, *, max_request_bytes: int | None = None
) -> None:
    """Register the Cluster service: every RPC of its descriptor, requests parsed by
    :mod:`broker.rpc_handlers`."""
    add_service(
        server,
        _cluster.DESCRIPTOR.services_by_name["Cluster"],
        servicer,
        max_request_bytes=max_request_bytes,
    )
