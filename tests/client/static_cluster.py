"""A cluster of real brokers without etcd, for the client's routing tests.

Role: :class:`StaticCluster` starts two or three in-process :class:`broker.app.Broker`
on loopback, each with :class:`StaticOwnership` (refuses, ``not-owner`` with the owner's
address, every topic :class:`StaticMap` gives to another broker) and
:class:`StaticSource` (answers ``Lookup`` from the same map). Moving a topic is one
assignment (``cluster.map.owners[topic] = "b2"``), so a client's cached route goes stale
at a point the test picks. Topics are made on each broker that may own them
(:meth:`StaticCluster.create`), by address: ``CreateTopic`` is not topic-guarded.

Every broker runs the real gRPC server, topic guard, refusal trailers and Cluster
service: only the source of truth (etcd, in production) is a dict. Each answers ListTopics
and ListSubscriptions with its node id, as a cluster member does, so admin listings
fan out over the owners; ``cluster.map.offline`` makes a node's topics offline in the
Lookup answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from broker.app import Broker
from client import AsyncAdminClient
from cluster.answers import BrokerEntry, LookupResult, Route, StatusResult
from cluster.ownership import Refusal
from tests.broker.conftest import broker_config


@dataclass
class StaticMap:
    """Which node owns each topic, and where each node listens."""

    owners: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    #: Lookups answered, by node.
    lookups: dict[str, int] = field(default_factory=dict)
    #: Nodes the Lookup answers call offline (no live session): their topics' routes
    #: are not online, reason ``offline``.
    offline: set[str] = field(default_factory=set)


@dataclass
class StaticOwnership:
    """The :class:`cluster.ownership.Ownership` of ``node``: serves the topics the map
    gives it and topics it does not name; refuses the others, naming their owner."""

    map: StaticMap
    node: str

    def refusal(self, topic: str, *, write: bool) -> Refusal | None:
        del write
        owner = self.map.owners.get(topic)
        if owner is None or owner == self.node:
            return None
        return Refusal(
            "not-owner",
            topic,
            owner,
            self.map.addresses[owner],
            1,
            f"topic {topic} is served by {owner}",
        )


@dataclass
class StaticSource:
    """The :class:`broker.cluster_service.ClusterSource` of ``node``: routes from the map."""

    map: StaticMap
    node: str

    async def lookup(self, topics: Sequence[str]) -> LookupResult:
        self.map.lookups[self.node] = self.map.lookups.get(self.node, 0) + 1
        names = list(topics) or sorted(self.map.owners)
        routes = tuple(self._route(t) for t in names)
        return LookupResult(self.node, routes, self._brokers(), "b1", 1)

    def _route(self, topic: str) -> Route:
        owner = self.map.owners.get(topic)
        if owner is None:
            return Route(topic)
        if owner in self.map.offline:
            return Route(topic, owner, self.map.addresses[owner], 1, "ready", False, 1, "offline")
        return Route(topic, owner, self.map.addresses[owner], 1, "ready", True, 1)

    def _brokers(self) -> tuple[BrokerEntry, ...]:
        return tuple(
            BrokerEntry(node, address, node not in self.map.offline, 0, 0, 1.0)
            for node, address in sorted(self.map.addresses.items())
        )

    async def status(self) -> StatusResult:
        return StatusResult(self.node, "static", self._brokers(), "b1")


@dataclass
class StaticCluster:
    """Running brokers by node id (``b1``, ``b2``, ...) sharing one :class:`StaticMap`."""

    map: StaticMap
    brokers: dict[str, Broker]

    def address(self, node: str) -> str:
        """Where ``node`` listens."""
        return self.map.addresses[node]

    async def create(self, topic: str, owner: str, *, also: Sequence[str] = ()) -> None:
        """Make ``topic`` (one partition) on ``owner`` and on the nodes ``also``, and
        give it to ``owner`` in the map."""
        for node in (owner, *also):
            async with AsyncAdminClient(self.address(node)) as admin:
                await admin.create_topic(topic)
        self.map.owners[topic] = owner


@contextlib.asynccontextmanager
async def static_cluster(tmp_path: Path, count: int = 2) -> AsyncIterator[StaticCluster]:
    """``count`` brokers ``b1``... on loopback, data under ``tmp_path``."""
    shared = StaticMap()
    async with contextlib.AsyncExitStack() as stack:
        brokers: dict[str, Broker] = {}
        for i in range(1, count + 1):
            node = f"b{i}"
            broker = Broker(
                broker_config(tmp_path / node),
                ownership=StaticOwnership(shared, node),
                cluster=StaticSource(shared, node),
                node_id=node,
            )
            brokers[node] = await stack.enter_async_context(broker)
            shared.addresses[node] = f"127.0.0.1:{broker.port}"
        yield StaticCluster(shared, brokers)
