"""Placement: which live brokers hold a new topic, and which of them leads it. Pure.

Rule for a topic of one replica (issue 36's, unchanged): the broker with the fewest
partitions, then the fewest topics, then the smallest node id (so every controller
decides alike). Topics placed in one pass count toward the load of the next, so a burst
of creations spreads.

Worked example: load ``{b1: (4 partitions, 2 topics), b2: (4, 1), b3: (6, 1)}``; a new
topic of 2 partitions goes to b2 (4 partitions ties with b1, fewer topics); the next goes
to b1 (b1 has 4, b2 now 6).

A replicated topic (``factor`` above 1, issue 37) gets its ordered replica set from
:func:`cluster.replicas.place_replicas` over the replicas each live broker holds and the
topics it is preferred leader of; its owner (leader) is the first replica. Both kinds
count toward each other's next choice in a pass: a replicated topic adds its partitions
and one topic to its leader's partition load, a topic of one replica adds one replica and
one preferred leadership to its owner's replica load. A factor above the live brokers is
:class:`Unplaceable` (the controller ends that create as ``failed``).

Worked example (replicated): brokers b1, b2, b3 holding no replicas; ``a`` (factor 3)
gets ``(b1, b2, b3)``, then ``b`` (factor 3) gets ``(b2, b1, b3)``: every broker holds two
replicas and the preferred leaderships are b1 and b2, one each; ``c`` (factor 4) is
Unplaceable (4 asked, 3 live).

Imports neither asyncio, os nor time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cluster.replicas import place_replicas

Load = Mapping[str, tuple[int, int]]
"""``node_id -> (partitions owned, topics owned)`` of every live broker."""


def choose_owner(load: Load) -> str | None:
    """The broker to own the next topic; None when no broker is live."""
    if not load:
        return None
    return min(load, key=lambda node: (load[node][0], load[node][1], node))


def place(topics: Sequence[tuple[str, int]], load: Load) -> list[tuple[str, str]]:
    """Owners for ``topics`` (``(name, partitions)`` each, in order), counting each one
    placed toward the next choice; ``(name, owner)`` pairs, empty when no broker is live."""
    current = dict(load)
    placed: list[tuple[str, str]] = []
    for name, partitions in topics:
        owner = choose_owner(current)
        if owner is None:
            return []
        held_partitions, held_topics = current[owner]
        current[owner] = (held_partitions + partitions, held_topics + 1)
        placed.append((name, owner))
    return placed


@dataclass(frozen=True, slots=True)
class Ask:
    """A topic waiting to be placed: its name, partitions and replication factor (0 or 1:
    one replica)."""

    name: str
    partitions: int
    factor: int = 1


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a topic goes: its owner and, when replicated, its ordered replica set
    (``replicas[0] == owner``); ``()`` for a topic of one replica (an issue-36 record)."""

    name: str
    owner: str
    replicas: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """A topic asking for more replicas than there are live brokers."""

    name: str
    factor: int
    live: int


def plan(
    asks: Sequence[Ask], load: Load, replica_load: Mapping[str, tuple[int, int]]
) -> list[Placement | Unplaceable]:
    """A decision for each of ``asks`` in order, each counted toward the next (module
    docstring). ``load`` and ``replica_load`` name the same live brokers
    (:meth:`cluster.state.ClusterState.load`, :func:`cluster.replicas.replica_load`);
    empty when none is live: every ask then waits."""
    partitions_of = dict(load)
    replicas_of = {node: replica_load.get(node, (0, 0)) for node in partitions_of}
    decided: list[Placement | Unplaceable] = []
    for ask in asks:
        if not partitions_of:
            return []
        if ask.factor > len(partitions_of):
            decided.append(Unplaceable(ask.name, ask.factor, len(partitions_of)))
            continue
        replicas = place_replicas(ask.factor, replicas_of) if ask.factor > 1 else ()
        owner = replicas[0] if replicas else choose_owner(partitions_of)
        assert owner is not None  # some broker is live
        for position, node in enumerate(replicas or (owner,)):
            held, leading = replicas_of[node]
            replicas_of[node] = (held + 1, leading + (position == 0))
        held_partitions, held_topics = partitions_of[owner]
        partitions_of[owner] = (held_partitions + ask.partitions, held_topics + 1)
        decided.append(Placement(ask.name, owner, replicas))
    return decided
