"""The authorization table: for every RPC, the role it needs and the resource it acts on.

Role: one table (:data:`RULES`), keyed by full gRPC method name, and the check that applies
it. Pure: no I/O. ``tests/broker/auth/test_rules.py`` walks every service's descriptor and
fails if any RPC has no row, so no RPC can be added without deciding who may call it.
The standard health and reflection services (:data:`OPEN_SERVICES`) need no token: load
balancers probe health, and reflection tells only what the public ``.proto`` files do.

=====================  =========  ========================================================
RPC                    role       resource (from the request)
=====================  =========  ========================================================
Publish                produce    topic
PublishStream          produce    topic of every request (a stream may mix topics)
Subscribe              consume    topic and subscription of the ``open`` request
Fetch                  consume    topic (any subscription pattern: a read by offset)
AckUpTo                consume    topic and subscription
CreateTopic            admin      topic
DeleteTopic            admin      topic
DescribeTopic          any role   topic (producers and readers need its partitions)
ListTopics             any token  none; the answer lists only topics the token has a
                                  grant on
ListSubscriptions      any token  the topic, if the request names one (any role on it);
                                  the answer lists only subscriptions the token may
                                  consume (``headrace lag`` over every topic)
DescribeSubscription   consume    topic and subscription
Seek                   consume    topic and subscription
OffsetsForTime         consume    topic
Peek/CountDeadLetters  consume    topic and subscription
AckDeadLetters         consume    topic and subscription
PurgeDeadLetters       admin      topic and subscription
ReplayDeadLetters      admin      topic and subscription (it publishes to the topic)
DeleteSubscription     admin      topic and subscription
Lookup                 any token  none; the answer keeps only the routes of topics the
                                  token has a grant on (and every broker)
ClusterStatus          any token  none; the answer keeps only offline topics the token has
                                  a grant on
ReplicaFetch,          internal   none: only the cluster's internal credential
OffsetForLeaderEpoch              (:mod:`cluster.internal_credential`), never a user token
=====================  =========  ========================================================

The internal credential, in turn, passes only the ``internal`` rows: brokers use it to
fetch from each other, and it opens nothing a client calls.

``admin`` implies ``produce`` and ``consume`` (:mod:`broker.auth.grants`). List RPCs filter
rather than refuse, so one CLI works for every role; they show nothing a token may not see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.auth.grants import Role
from broker.auth.tokens import TokenEntry
from broker.errors import PermissionDeniedError
from proto import admin_pb2 as _admin
from proto import cluster_pb2 as _cluster
from proto import replication_pb2 as _replication

#: Services every caller may use without a token.
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)


@dataclass(frozen=True, slots=True)
class Resource:
    """What a request acts on: a topic, or a topic's subscription."""

    topic: str
    subscription: str | None = None

    @property
    def kind(self) -> str:
        return "topic" if self.subscription is None else "subscription"

    def __str__(self) -> str:
        return self.topic if self.subscription is None else f"{self.topic}/{self.subscription}"


@dataclass(frozen=True, slots=True)
class Rule:
    """How one RPC is authorized.

    Attributes:
        role: The role needed on the resource; ``None``: any role.
        resource: The resource of one request; ``None`` when the request names none (a
            Subscribe credit, a ListTopics), which needs only a valid token.
        visible: For list RPCs, the answer with what the token may not see removed.
        internal: Broker to broker: only the internal credential passes (and it passes
            no other row).
    """

    role: Role | None
    resource: Callable[[Any], Resource | None]
    visible: Callable[[Any, TokenEntry], Any] | None = None
    internal: bool = False


def authorize(rule: Rule, entry: TokenEntry, request: Any) -> None:
    """Check one request against its rule.

    Raises:
        PermissionDeniedError: The token has no grant of the role on the resource.
    """
    resource = rule.resource(request)
    if resource is None:
        return
    if rule.role is None:
        allowed = entry.may_see(resource.topic)
    else:
        allowed = entry.allows(rule.role, resource.topic, resource.subscription)
    if not allowed:
        role = "produce or consume" if rule.role is None else rule.role.value
        raise PermissionDeniedError(entry.name, entry.id, role, resource.kind, str(resource))


def _none(request: Any) -> None:
    return None


def _topic(request: Any) -> Resource:
    return Resource(request.topic)


def _named(request: Any) -> Resource:
    return Resource(request.name)


def _topic_if_named(request: Any) -> Resource | None:
    return Resource(request.topic) if request.topic else None


def _subscription(request: Any) -> Resource:
    return Resource(request.topic, request.subscription)


def _subscribe(request: Any) -> Resource | None:
    if request.WhichOneof("kind") != "open":
        return None  # credits and acks act on the subscription the open named
    return Resource(request.open.topic, request.open.subscription)


def _visible_topics(response: _admin.ListTopicsResponse, entry: TokenEntry) -> Any:
    visible = _admin.ListTopicsResponse()
    visible.CopyFrom(response)  # every other field (node_id: a client's cluster listing)
    del visible.topics[:]
    visible.topics.extend(t for t in response.topics if entry.may_see(t.name))
    return visible


def _visible_routes(response: _cluster.LookupResponse, entry: TokenEntry) -> Any:
    visible = _cluster.LookupResponse()
    visible.CopyFrom(response)
    del visible.routes[:]
    visible.routes.extend(r for r in response.routes if entry.may_see(r.topic))
    return visible


def _visible_offline(response: _cluster.ClusterStatusResponse, entry: TokenEntry) -> Any:
    visible = _cluster.ClusterStatusResponse()
    visible.CopyFrom(response)
    del visible.offline_topics[:]
    visible.offline_topics.extend(t for t in response.offline_topics if entry.may_see(t.topic))
    return visible


def _visible_subscriptions(response: _admin.ListSubscriptionsResponse, entry: TokenEntry) -> Any:
    visible = _admin.ListSubscriptionsResponse()
    visible.CopyFrom(response)  # as _visible_topics
    del visible.subscriptions[:]
    visible.subscriptions.extend(
        s for s in response.subscriptions if entry.allows(Role.CONSUME, s.topic, s.subscription)
    )
    return visible


_B = "/headrace.v1.Broker/"
_A = "/headrace.v1.Admin/"
_C = "/headrace.v1.Cluster/"
_R = f"/{_replication.DESCRIPTOR.services_by_name['Replication'].full_name}/"

#: Every RPC of the Broker, Admin, Cluster and Replication services, by full method name.
RULES: dict[str, Rule] = {
    _B + "Publish": Rule(Role.PRODUCE, _topic),
    _B + "PublishStream": Rule(Role.PRODUCE, _topic),
    _B + "Subscribe": Rule(Role.CONSUME, _subscribe),
    _B + "Fetch": Rule(Role.CONSUME, _topic),
    _B + "AckUpTo": Rule(Role.CONSUME, _subscription),
    _A + "CreateTopic": Rule(Role.ADMIN, _named),
    _A + "DeleteTopic": Rule(Role.ADMIN, _named),
    _A + "DescribeTopic": Rule(None, _named),
    _A + "ListTopics": Rule(None, _none, _visible_topics),
    _A + "ListSubscriptions": Rule(None, _topic_if_named, _visible_subscriptions),
    _A + "DescribeSubscription": Rule(Role.CONSUME, _subscription),
    _A + "Seek": Rule(Role.CONSUME, _subscription),
    _A + "OffsetsForTime": Rule(Role.CONSUME, _topic),
    _A + "PeekDeadLetters": Rule(Role.CONSUME, _subscription),
    _A + "CountDeadLetters": Rule(Role.CONSUME, _subscription),
    _A + "AckDeadLetters": Rule(Role.CONSUME, _subscription),
    _A + "PurgeDeadLetters": Rule(Role.ADMIN, _subscription),
    _A + "ReplayDeadLetters": Rule(Role.ADMIN, _subscription),
    _A + "DeleteSubscription": Rule(Role.ADMIN, _subscription),
    _C + "Lookup": Rule(None, _none, _visible_routes),
    _C + "ClusterStatus": Rule(None, _none, _visible_offline),
    _R + "ReplicaFetch": Rule(None, _none, internal=True),
    _R + "ReplicaStream": Rule(None, _none, internal=True),
    _R + "OffsetForLeaderEpoch": Rule(None, _none, internal=True),
}


def service_of(method: str) -> str:
    """The service of a full method name: ``/pkg.Service/Method`` -> ``pkg.Service``."""
    return method.lstrip("/").partition("/")[0]
