"""The Lookup and ClusterStatus answers as plain values: one set for every source. Pure.

Role: the frozen types the ``headrace.v1.Cluster`` service turns into its protobuf
messages (``broker.cluster_service``), whichever source answers: a cluster member from
its view of etcd (:mod:`cluster.routes` builds them) or a broker with no cluster
(``broker.cluster_service.SingleBrokerSource``, node ``local``). They live here, below
both, because ``cluster`` may not import ``broker``; ``broker`` imports them.

Each type is one message of ``proto/cluster.proto``, field for field, with two
differences: :attr:`LookupResult.node_id` comes first here (field 5 of
``LookupResponse``, added last), and :attr:`Route.message`, words for a person that a
refusal carries and the status lists, is never part of a ``TopicRoute``.

Invariant: a topic with no record anywhere has a route with state :data:`ABSENT` and
nothing else set (``Route("orders")``); that is an answer, not an error, since a client
asks about many topics at once.

Imports nothing of etcd (a broker with no cluster imports this module), nor asyncio, os
or time.
"""

from __future__ import annotations

from dataclasses import dataclass

ABSENT = "absent"
"""The state of the route of a topic that exists nowhere."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where one topic is served (a ``TopicRoute`` on the wire), and why not when it is
    not online: ``reason`` is a refusal reason, ``message`` words for a person. A placed
    topic's ``replicas`` and ``isr`` are never empty (a topic of one replica: its owner);
    ``min_insync`` is 0 only while none is placed."""

    topic: str
    owner_node: str = ""
    owner_address: str = ""
    epoch: int = 0
    state: str = ABSENT
    online: bool = False
    partitions: int = 0
    reason: str = ""
    message: str = ""
    replicas: tuple[str, ...] = ()
    isr: tuple[str, ...] = ()
    min_insync: int = 0


@dataclass(frozen=True, slots=True)
class BrokerEntry:
    """One broker (a ``BrokerInfo`` on the wire). A dead owner is listed with
    ``alive=False`` and no address, so its offline topics have a name to point at."""

    node_id: str
    address: str
    alive: bool
    topics: int
    partitions: int
    session_age_s: float


@dataclass(frozen=True, slots=True)
class LookupResult:
    """A ``LookupResponse``: the node that answered, a route per topic asked, the
    brokers, the controller's node id and the answering view's etcd revision."""

    node_id: str
    routes: tuple[Route, ...]
    brokers: tuple[BrokerEntry, ...]
    controller: str
    revision: int


@dataclass(frozen=True, slots=True)
class EndpointEntry:
    """One configured etcd endpoint's health (an ``EtcdEndpoint`` on the wire)."""

    endpoint: str
    healthy: bool
    error: str


@dataclass(frozen=True, slots=True)
class OfflineTopic:
    """A topic that is not online, and why (an ``OfflineTopic`` on the wire)."""

    topic: str
    owner_node: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class UnderReplicatedTopic:
    """A ready topic whose in-sync set is smaller than its replica set (an
    ``UnderReplicatedTopic`` on the wire)."""

    topic: str
    owner_node: str
    epoch: int
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    min_insync: int
    message: str


@dataclass(frozen=True, slots=True)
class StrayTopic:
    """A local topic the answering broker does not serve (a ``StrayTopic`` on the wire):
    the cluster holds the name with another id or owner, or not at all."""

    topic: str
    local_id: str
    cluster_id: str
    owner_node: str
    path: str
    message: str


@dataclass(frozen=True, slots=True)
class StatusResult:
    """A ``ClusterStatusResponse``. A broker with no cluster has no etcd endpoint, no
    offline or under-replicated topic and revision 0: the defaults."""

    node_id: str
    cluster_id: str
    brokers: tuple[BrokerEntry, ...]
    controller: str
    etcd: tuple[EndpointEntry, ...] = ()
    offline_topics: tuple[OfflineTopic, ...] = ()
    revision: int = 0
    strays: tuple[StrayTopic, ...] = ()
    under_replicated: tuple[UnderReplicatedTopic, ...] = ()
