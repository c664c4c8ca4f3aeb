"""Where each topic is served, and why not, from one broker's view. Pure.

Role: the rules shared by the ownership check, the ``Lookup`` answer and the cluster
status, so that the three never disagree. :func:`topic_route` turns a topic record (and
what this broker knows of itself) into a :class:`~cluster.answers.Route`: owner, address,
epoch, state, whether it is online and, if not, the refusal reason. The answers' types
are :mod:`cluster.answers`' (the broker's single-broker source builds the same ones).

Rules, in order, for a topic whose record exists:

====================================  ==============  =================================
the record / this broker              online          reason
====================================  ==============  =================================
``placing`` or ``creating``           no              ``creating``
owner not among live brokers          no              ``offline``
``deleting``                          no              ``offline``
owner is another live broker, ready   yes             (``not-owner`` when asked here)
owner is me, local data missing       no              ``data-missing``
owner is me, epoch not claimed by me  no              ``no-session``
  in this session, or may not write
owner is me, claimed, may write       yes             --
====================================  ==============  =================================

A topic with no record is ``absent`` (not an error: a client asks about many at once).

A placed topic's route also carries its replica set, in-sync set and ``min_insync``
(``(owner,)`` for a topic of one replica); :func:`under_replicated_topics` lists the ready
ones whose in-sync set is smaller than their replica set, for the status.

Worked example: b1 restarted and its lease is new; ``orders`` says ``owner=b1, epoch=3,
ready``. Until b1's claim (epoch 3 -> 4) shows in its view, b1 answers ``no-session``
for ``orders``; b2 (whose view shows b1 alive) routes clients to b1 (online).

Imports neither asyncio, os nor time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from cluster.answers import BrokerEntry, LookupResult, OfflineTopic, Route, UnderReplicatedTopic
from cluster.records import TopicRecord, TopicState
from cluster.state import ClusterState, Topic


@dataclass(frozen=True, slots=True)
class Me:
    """What this broker knows of itself that the view does not say.

    Attributes:
        node_id: this broker.
        claimed: ``topic -> epoch`` this broker claimed in its current session.
        may_write: whether its session may write now.
        has_local: whether a topic's local data is present here.
    """

    node_id: str
    claimed: Mapping[str, int]
    may_write: bool
    has_local: Callable[[str], bool]


def topic_route(state: ClusterState, name: str, me: Me) -> Route:
    """The route of ``name`` as this broker sees it (module table)."""
    topic = state.topics.get(name)
    if topic is None:
        return Route(name)
    record = topic.record
    owner = state.brokers.get(record.owner)
    address = owner.record.address if owner is not None else ""
    base = Route(
        name, record.owner, address, record.epoch, record.state.value, False, record.partitions
    )
    if record.owner:
        replicas, isr = record.effective_replicas(), record.effective_isr()
        base = dataclasses.replace(base, replicas=replicas, isr=isr, min_insync=record.min_insync)
    reason, message = _why_not(topic, me, alive=owner is not None)
    if reason:
        return _with(base, reason, message)
    return _with(base, "", "", online=True)


def _why_not(topic: Topic, me: Me, *, alive: bool) -> tuple[str, str]:
    record = topic.record
    name = record.name
    if record.state is TopicState.CREATING and record.owner and not alive:
        return "offline", (
            f"topic {name!r} is placed on broker {record.owner}, which is not running: it "
            "is made when that broker returns"
        )
    if record.state in (TopicState.PLACING, TopicState.CREATING):
        where = f"on broker {record.owner}" if record.owner else "(no broker chosen yet)"
        return "creating", f"topic {name!r} is being created {where}; retry shortly"
    if not alive and record.owner != me.node_id:  # the owner itself still serves reads
        return "offline", (
            f"topic {name!r} is owned by broker {record.owner}, which is not running: "
            "it is offline until that broker returns"
        )
    if record.state is TopicState.DELETING:
        return "offline", f"topic {name!r} is being deleted on broker {record.owner}"
    if record.owner != me.node_id:
        return "", ""
    if not me.has_local(name):
        return "data-missing", (
            f"topic {name!r} is owned by broker {me.node_id}, but its data is missing on "
            f"{me.node_id}: restore the data directory (it is not recreated empty)"
        )
    if me.claimed.get(name) != record.epoch or not me.may_write:
        return "no-session", (
            f"broker {me.node_id} owns topic {name!r} but has no current etcd session to "
            "serve it with: retry shortly"
        )
    return "", ""


def _with(route: Route, reason: str, message: str, *, online: bool = False) -> Route:
    return dataclasses.replace(route, online=online, reason=reason, message=message)


def broker_entries(state: ClusterState, now_ms: int) -> list[BrokerEntry]:
    """Every live broker and every owner of a topic that is not live, by node id."""
    owned: dict[str, tuple[int, int]] = {}
    for topic in state.topics.values():
        record = topic.record
        if record.owner:
            partitions, count = owned.get(record.owner, (0, 0))
            owned[record.owner] = (partitions + record.partitions, count + 1)
    entries = []
    for node in sorted(set(owned) | set(state.brokers)):
        partitions, count = owned.get(node, (0, 0))
        broker = state.brokers.get(node)
        if broker is None:
            entries.append(BrokerEntry(node, "", False, count, partitions, 0.0))
            continue
        age = (
            max(0.0, (now_ms - broker.record.session_ms) / 1000)
            if broker.record.session_ms
            else 0.0
        )
        entries.append(BrokerEntry(node, broker.record.address, True, count, partitions, age))
    return entries


def lookup(state: ClusterState, names: list[str], me: Me, now_ms: int) -> LookupResult:
    """The Lookup answer, from ``me``: a route per name in order (every topic by name
    when none)."""
    asked = names or sorted(state.topics)
    routes = tuple(topic_route(state, name, me) for name in asked)
    controller = state.controller.record.node_id if state.controller else ""
    brokers = tuple(broker_entries(state, now_ms))
    return LookupResult(me.node_id, routes, brokers, controller, state.revision)


def offline_topics(state: ClusterState, me: Me) -> list[OfflineTopic]:
    """Every topic that is not online, by name, with its reason and message."""
    offline = []
    for name in sorted(state.topics):
        route = topic_route(state, name, me)
        if not route.online:
            offline.append(OfflineTopic(name, route.owner_node, route.reason, route.message))
    return offline


def under_replicated_topics(state: ClusterState) -> list[UnderReplicatedTopic]:
    """Every ready topic whose in-sync set is smaller than its replica set, by name, with
    what it means: still served while the set holds ``min_insync``, else every publish
    is refused (``not-enough-replicas``)."""
    found = []
    for name in sorted(state.topics):
        record = state.topics[name].record
        replicas, isr = record.effective_replicas(), record.effective_isr()
        if record.state is TopicState.READY and len(isr) < len(replicas):
            found.append(
                UnderReplicatedTopic(
                    name,
                    record.owner,
                    record.epoch,
                    replicas,
                    isr,
                    record.min_insync,
                    _under_replicated_message(record, state.brokers.keys()),
                )
            )
    return found


def _under_replicated_message(record: TopicRecord, alive: Collection[str]) -> str:
    replicas, isr = record.effective_replicas(), record.effective_isr()
    out = [node for node in replicas if node not in isr]
    down = [node for node in out if node not in alive]
    behind = [node for node in out if node in alive]
    parts = []
    if down:
        parts.append(f"{', '.join(down)} not running")
    if behind:
        parts.append(f"{', '.join(behind)} catching up")
    served = (
        "publishes are accepted"
        if len(isr) >= record.min_insync
        else "publishes are refused (not-enough-replicas)"
    )
    return (
        f"topic {record.name!r} has {len(isr)} of {len(replicas)} replicas in sync "
        f"({'; '.join(parts)}); min_insync is {record.min_insync}: {served}"
    )
