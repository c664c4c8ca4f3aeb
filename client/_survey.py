"""Survey: which broker to ask for which topics in a cluster-wide admin listing.

Role: the pure half of the admin client's listings of no topic (``list_topics``,
``list_subscriptions``; docs/protocol.md section 11.5). In a cluster each broker knows
every topic's name, but only the owner knows a topic's heads, sizes and subscriptions.
The listing goes:

1. the list call to the seed in use, as on a single broker; its answer carries the
   answering broker's ``node_id``. ``local`` (or ``""``, a broker before issue 36) means
   a single broker: its answer is the whole answer, one call and no Lookup, as before;
2. otherwise one ``Lookup`` of every topic, and :func:`plan`: the topics the answering
   broker owns (its answer covers them), the other owners that serve theirs now (each
   asked once, at once), and the topics no owner can be asked of (offline, creating...);
3. the shell asks each owner and keeps, of each answer, only the topics that owner owns
   (an owner's answer is authoritative for its topics, and only for them).

Example: ``b1`` answers ``node_id = "b1"``; Lookup says ``a -> b1``, ``b -> b2 at h:2``,
``c -> b3`` (offline). The plan: mine ``{a}``, ask ``b2`` at ``h:2`` for ``{b}``, and
``c`` offline (owner ``b3``, reason ``offline``). If ``b2`` does not answer, ``b`` is
listed as ``unreachable``: the listing still shows every topic and says which it could
not read.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

from dataclasses import dataclass

from client._types import OfflineTopic, PartitionInfo, TopicInfo
from proto import cluster_pb2 as _cluster

#: The node id of a broker that runs alone (docs/protocol.md 11.1).
LOCAL_NODE = "local"
#: The reason of a topic whose owner is registered but did not answer the listing.
UNREACHABLE = "unreachable"

_WHY = {
    "offline": "its owner {owner} is offline (its topics wait for it to return)",
    "creating": "it is being created on {owner}",
    "no-session": "its owner {owner} may not write now (its etcd session may have expired)",
    "data-missing": "its files are missing on its owner {owner}; an operator must act",
    "placing": "it has no owner yet",
    UNREACHABLE: "its owner {owner} did not answer: {error}",
}


def is_cluster(node_id: str) -> bool:
    """Whether a list answer's ``node_id`` is a cluster member's (so other brokers own
    topics too) rather than a single broker's (``local``, or ``""`` before issue 36)."""
    return node_id not in ("", LOCAL_NODE)


def offline_topic(topic: str, owner: str, reason: str, error: str = "") -> OfflineTopic:
    """The :class:`OfflineTopic` of ``topic``, with a message for a person."""
    why = _WHY.get(reason, "its owner {owner} does not serve it now ({reason})")
    text = why.format(owner=owner or "(none)", reason=reason, error=error)
    return OfflineTopic(topic, owner, reason, f"topic {topic}: {text}")


@dataclass(frozen=True, slots=True)
class Owner:
    """Another broker to ask, and the topics whose answer is its."""

    node: str
    address: str
    topics: frozenset[str]


@dataclass(frozen=True, slots=True)
class Plan:
    """Who answers for which topic in one listing (module docstring).

    Attributes:
        node: The answering broker's node id.
        mine: The topics it owns: its own answer covers them.
        owners: The other brokers to ask, each for the topics it owns.
        offline: The topics no owner can be asked of now.
        partitions: Every existing topic's partition count (from the Lookup).
    """

    node: str
    mine: frozenset[str]
    owners: tuple[Owner, ...]
    offline: tuple[OfflineTopic, ...]
    partitions: dict[str, int]


def plan(node: str, found: _cluster.LookupResponse) -> Plan:
    """The :class:`Plan` of a listing answered by ``node``, from a Lookup of every topic
    (``found``). Absent topics (deleted meanwhile) are left out."""
    mine: set[str] = set()
    others: dict[tuple[str, str], set[str]] = {}
    offline: list[OfflineTopic] = []
    partitions: dict[str, int] = {}
    for route in found.routes:
        if route.state == "absent":
            continue
        partitions[route.topic] = route.partitions
        if not (route.online and route.owner_address):
            reason = route.reason or ("placing" if route.state == "placing" else "offline")
            offline.append(offline_topic(route.topic, route.owner_node, reason))
        elif route.owner_node == node:
            mine.add(route.topic)
        else:
            others.setdefault((route.owner_node, route.owner_address), set()).add(route.topic)
    owners = tuple(Owner(n, a, frozenset(t)) for (n, a), t in sorted(others.items()))
    return Plan(node, frozenset(mine), owners, tuple(offline), partitions)


def unread_topic(name: str, partitions: int, topic_id: str, gone: OfflineTopic) -> TopicInfo:
    """A topic whose owner could not be asked: its partitions with zero figures, its
    owner, and why in ``offline``."""
    blank = tuple(PartitionInfo(i, 0, 0, 0, 0) for i in range(partitions))
    return TopicInfo(name, blank, "", topic_id, owner=gone.owner, offline=gone.reason)
