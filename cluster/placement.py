"""Placement: which live broker owns a new topic. Pure.

Rule: the broker with the fewest partitions, then the fewest topics, then the smallest
node id (so every controller decides alike). Topics placed in one pass count toward the
load of the next, so a burst of creations spreads.

Worked example: load ``{b1: (4 partitions, 2 topics), b2: (4, 1), b3: (6, 1)}``; a new
topic of 2 partitions goes to b2 (4 partitions ties with b1, fewer topics); the next goes
to b1 (b1 has 4, b2 now 6).

Imports neither asyncio, os nor time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
