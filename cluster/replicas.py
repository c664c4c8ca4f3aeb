"""Replication's rules (issue 37), pure: where a topic's replicas go, who may lead, what is
committed, who is in sync, and the steps of a reassignment and a rebalance.

Role: every decision of the replica group that does not need I/O, taken from a
:class:`~cluster.records.TopicRecord` and numbers the caller measured (offsets, times in
ms), returned as small frozen values. :mod:`cluster.replica_txn` writes the decisions to
etcd, each as one compare-and-set transaction.

Vocabulary: ``replicas`` is ordered, its first member the *preferred leader*; the leader
is the record's ``owner``; ``isr`` (the in-sync set) always holds the leader. A legacy
record (empty ``replicas``/``isr``) is factor 1: ``(owner,)`` (``effective_*``).

Invariants the rules keep (and the property tests check):

- a leader is chosen only from the alive members of the in-sync set, in preferred order,
  unless an unclean election is asked for AND no in-sync replica is alive;
- the high watermark is the least end over the in-sync set, the leader's own included;
- a reassignment never drops a replica before every replica of the target is in sync and
  the leader is one of them, so the in-sync set never loses a copy it needs.

Worked example: three live brokers with ``(replicas held, preferred leaderships)`` load
``b1: (2, 1), b2: (1, 1), b3: (1, 0)`` and factor 2: the two holding fewest replicas are
b2 and b3; of those b3 leads fewest, so it comes first: ``("b3", "b2")``. Its leader b3
dies; b2 is alive and in sync: ``choose_leader`` answers b2, clean. b2's lag: it fetched
up to the leader's end at t=1000 ms and not since; with ``replica_lag_time_max_ms`` 30000
it is in sync until t=31000 ms unless it catches up again.

One piece, though past 600 lines: every function is a small pure rule over the one
vocabulary above (the record's ordered replicas, its in-sync set, its leader), and the
invariants span the sections: a reassignment keeps the copies the in-sync rule needs,
and a preferred-leader move goes only to an alive in-sync replica, as the leadership
rule chooses. Should it grow, the seam is the change of a group's shape: the balance,
reassignment and replica balance sections (``rebalance_moves``, ``reassignment_step``,
``cancel_step``, ``replica_moves`` and their values: the pure half of
:mod:`cluster.moves`) go to a module of their own, over the placement, commit and
leadership rules that stay here.

Imports neither asyncio, os nor time.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from cluster.errors import NotEnoughBrokersError, NotEnoughReplicasError, ReplicationSettingsError
from cluster.records import TopicRecord, TopicState

ReplicaLoad = Mapping[str, tuple[int, int]]
"""``node_id -> (replicas held, topics it is preferred leader of)`` of every live broker."""


# -- placement ---------------------------------------------------------------------------


def replica_load(
    records: Iterable[TopicRecord], alive: Iterable[str]
) -> dict[str, tuple[int, int]]:
    """The :data:`ReplicaLoad` of each ``alive`` broker over ``records`` (placed topics)."""
    load = dict.fromkeys(alive, (0, 0))
    for record in records:
        replicas = record.effective_replicas()
        for position, node in enumerate(replicas):
            if node in load:
                held, leading = load[node]
                load[node] = (held + 1, leading + (position == 0))
    return load


def replication_settings(
    asked_factor: int | None,
    asked_min_insync: int | None,
    default_factor: int,
    default_min_insync: int,
    live: int,
) -> tuple[int, int]:
    """The ``(factor, min_insync)`` of a new topic.

    A factor asked for explicitly must fit the live brokers; the cluster default is clamped
    to them (a two-broker cluster with default 3 makes factor-2 topics). ``min_insync``
    asked explicitly must not exceed the factor; the default is clamped to it.

    Raises:
        NotEnoughBrokersError: an explicit factor above the live broker count (or none live).
        ReplicationSettingsError: a factor or min_insync below 1, or an explicit
            min_insync above the factor.
    """
    if live < 1:
        raise NotEnoughBrokersError(asked_factor or default_factor, live)
    for what, value in (("factor", asked_factor), ("min_insync", asked_min_insync)):
        if value is not None and value < 1:
            raise ReplicationSettingsError(f"{what} {value} is below 1")
    if asked_factor is not None and asked_factor > live:
        raise NotEnoughBrokersError(asked_factor, live)
    factor = asked_factor if asked_factor is not None else max(1, min(default_factor, live))
    if asked_min_insync is not None and asked_min_insync > factor:
        raise ReplicationSettingsError(
            f"min_insync {asked_min_insync} exceeds the replication factor {factor}: no "
            "publish could ever be accepted"
        )
    min_insync = asked_min_insync if asked_min_insync is not None else default_min_insync
    return factor, max(1, min(min_insync, factor))


def place_replicas(factor: int, load: ReplicaLoad) -> tuple[str, ...]:
    """The ordered replica set of a new topic of ``factor`` replicas.

    Rule (replicas first, then preferred leaders): let ``v`` be the replica count of the
    ``factor``-th least loaded broker. Every broker holding fewer than ``v`` is taken; the
    rest come from the brokers holding exactly ``v`` (the tier). The preferred leader is,
    among all of those, the one with the fewest preferred leaderships (then fewest
    replicas, then node id); the followers taken from the tier are those with the MOST
    preferred leaderships (then node id), which keeps the brokers that lead least free to
    lead the next topics.

    Placed one after another from idle brokers (1..7 brokers, any factor), replica counts
    and preferred leaderships each stay within one of each other after every topic; the
    plainer "fewest replicas, then fewest leaderships" breaks it at 3 brokers, factor 2,
    third topic (the property test). Deterministic: every controller decides alike.

    Raises:
        NotEnoughBrokersError: fewer live brokers than ``factor``.
    """
    if factor > len(load) or factor < 1:
        raise NotEnoughBrokersError(factor, len(load))
    order = sorted(load, key=lambda node: (load[node][0], node))
    boundary = load[order[factor - 1]][0]
    forced = [node for node in order if load[node][0] < boundary]
    tier = [node for node in order if load[node][0] == boundary]
    leader = min(forced + tier, key=lambda node: (load[node][1], load[node][0], node))
    followers = [node for node in forced if node != leader]
    spare = sorted((n for n in tier if n != leader), key=lambda node: (-load[node][1], node))
    return (leader, *followers, *spare[: factor - 1 - len(followers)])


def place_many(
    topics: Sequence[tuple[str, int]], load: ReplicaLoad
) -> list[tuple[str, tuple[str, ...]]]:
    """Replica sets for ``topics`` (``(name, factor)`` each, in order), counting each one
    placed toward the next choice.

    Raises:
        NotEnoughBrokersError: a topic's factor exceeds the live brokers.
    """
    current = dict(load)
    placed: list[tuple[str, tuple[str, ...]]] = []
    for name, factor in topics:
        replicas = place_replicas(factor, current)
        for position, node in enumerate(replicas):
            held, leading = current[node]
            current[node] = (held + 1, leading + (position == 0))
        placed.append((name, replicas))
    return placed


# -- commit and the in-sync rule ----------------------------------------------------------


def high_watermark(isr_fetch_offsets: Mapping[str, int], leader_end: int) -> int:
    """The committed end: the least of the leader's durable end and each other in-sync
    member's fetch offset (its durable end). Offsets below it are committed.

    The leader keeps the greatest value it has seen (a member joins the in-sync set only
    once it reached the high watermark, :func:`may_join_isr`, so the value does not fall
    while the set is unchanged).
    """
    return min([leader_end, *isr_fetch_offsets.values()])


@dataclass(frozen=True, slots=True)
class FollowerProgress:
    """What a leader knows of one follower, for Kafka's in-sync rule (times in ms).

    Attributes:
        fetch_offset: its durable end as last reported (a fetch's offset, or a progress
            report's durable offset): what the high watermark counts.
        last_fetch_ms: when that report arrived.
        leader_end_at_last_fetch: the leader's end when that report arrived.
        last_caught_up_ms: the last time it was known to have everything the leader had.
        earlier: ``(leader's end, ms)`` at the reports before the last, newest first (at
            most :data:`EARLIER_REPORTS`): a follower that fetches again before its last
            answer is durable reports that answer's end one report later.
    """

    fetch_offset: int
    last_fetch_ms: int
    leader_end_at_last_fetch: int
    last_caught_up_ms: int
    earlier: tuple[tuple[int, int], ...] = ()

    @classmethod
    def tracked(cls, now_ms: int, in_isr: bool) -> FollowerProgress:
        """A follower a new leader starts tracking: a member of the in-sync set gets a full
        ``replica_lag_time_max_ms`` to fetch (as Kafka does at a leader change)."""
        return cls(0, now_ms, 0, now_ms if in_isr else -(2**62))


#: How many reports before the last a follower's progress remembers the leader's end at.
EARLIER_REPORTS = 4


def follower_fetched(
    progress: FollowerProgress, fetch_offset: int, leader_end: int, now_ms: int
) -> FollowerProgress:
    """``progress`` after a report of durable end ``fetch_offset`` arrived at ``now_ms``
    while the leader's end was ``leader_end`` (Kafka's ``Replica.updateFetchState``,
    over the last few reports): caught up now when it has the leader's end; else caught
    up at the newest earlier report whose leader's end it has now.

    Kafka looks one fetch back, as a follower that syncs before it fetches again
    reports at its next fetch what it was sent after the last. A follower that fetches
    again as soon as it wrote the answer (``ReplicaStream``) reports the answer durable
    one message later still, so a few reports are kept: under a steady load its durable
    end never reaches the leader's current end, but always one it had a report or two
    ago, which keeps it in sync.

    Example: reports at 100 ms (leader's end 50) and 101 ms (end 60); at 102 ms a report
    of 55 (end now 70): caught up at 100 ms, when the leader had 50.
    """
    caught_up = progress.last_caught_up_ms
    samples = ((progress.leader_end_at_last_fetch, progress.last_fetch_ms), *progress.earlier)
    if fetch_offset >= leader_end:
        caught_up = max(caught_up, now_ms)
    else:
        for end, at in samples:
            if fetch_offset >= end:
                caught_up = max(caught_up, at)
                break
    return FollowerProgress(fetch_offset, now_ms, leader_end, caught_up, samples[:EARLIER_REPORTS])


def is_in_sync(progress: FollowerProgress, leader_end: int, now_ms: int, lag_max_ms: int) -> bool:
    """Kafka's rule: a follower is in sync when it has the leader's end, or was caught up
    to the leader's end within ``lag_max_ms`` (``replica_lag_time_max_ms``)."""
    return progress.fetch_offset >= leader_end or now_ms - progress.last_caught_up_ms <= lag_max_ms


def may_join_isr(fetch_offset: int, high_watermark: int, epoch_start_offset: int) -> bool:
    """A follower outside the in-sync set may join it once it has fetched up to the high
    watermark and past the start of the leader's epoch (Kafka's rule: it then has every
    committed record and nothing from an older leader that this one did not keep)."""
    return fetch_offset >= high_watermark and fetch_offset >= epoch_start_offset


def isr_to_shrink(
    record: TopicRecord,
    progress: Mapping[str, FollowerProgress],
    leader_end: int,
    now_ms: int,
    lag_max_ms: int,
) -> tuple[str, ...]:
    """The in-sync followers that fell out of sync (a follower never tracked counts as out)."""
    out: list[str] = []
    for node in record.effective_isr():
        if node == record.owner:
            continue
        seen = progress.get(node)
        if seen is None or not is_in_sync(seen, leader_end, now_ms, lag_max_ms):
            out.append(node)
    return tuple(out)


def isr_to_expand(
    record: TopicRecord, fetch_offsets: Mapping[str, int], high_watermark: int, epoch_start: int
) -> tuple[str, ...]:
    """The replicas outside the in-sync set that may join it now (:func:`may_join_isr`),
    in preferred order."""
    isr = record.effective_isr()
    return tuple(
        node
        for node in record.effective_replicas()
        if node not in isr
        and node in fetch_offsets
        and may_join_isr(fetch_offsets[node], high_watermark, epoch_start)
    )


# -- leadership ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaderChoice:
    """Who should lead, and whether taking it loses records (an out-of-sync winner)."""

    node: str
    unclean: bool


def choose_leader(
    record: TopicRecord, alive: Collection[str], unclean: bool = False
) -> LeaderChoice | None:
    """Who should lead ``record``'s topic given the ``alive`` brokers.

    The current leader while it is alive; else the first replica, in preferred order, that
    is alive and in sync; else, only when ``unclean`` and no in-sync replica is alive, the
    first alive replica (records it lacks are given up). None: nobody may lead (offline).
    """
    if record.owner and record.owner in alive:
        return LeaderChoice(record.owner, False)
    replicas = record.effective_replicas()
    isr = set(record.effective_isr())
    for node in replicas:
        if node in alive and node in isr:
            return LeaderChoice(node, False)
    if unclean and not isr.intersection(alive):
        for node in replicas:
            if node in alive:
                return LeaderChoice(node, True)
    return None


def election_rank(record: TopicRecord, node: str) -> int | None:
    """``node``'s place among the in-sync followers in preferred order (0 first), for the
    stagger before it tries an election (rank x step); None when it may not try."""
    eligible = [n for n in record.effective_replicas() if n in record.effective_isr()]
    eligible = [n for n in eligible if n != record.owner]
    return eligible.index(node) if node in eligible else None


def unclean_rank(record: TopicRecord, node: str, alive: Collection[str]) -> int | None:
    """``node``'s place among the candidates of an unclean election (0 first): the alive
    replicas outside the in-sync set, in preferred order, while no in-sync member (the
    old leader included) is alive; None when ``node`` may not try one (the same rule as
    :func:`choose_leader` with ``unclean``, which picks rank 0)."""
    isr = set(record.effective_isr())
    if isr.intersection(alive):
        return None
    candidates = [n for n in record.effective_replicas() if n in alive and n not in isr]
    return candidates.index(node) if node in candidates else None


def records_given_up(committed: Mapping[int, int], ends: Mapping[int, int]) -> dict[int, int]:
    """Per partition, how many records the old leader had committed (``committed``: its
    high watermark as it last published it) that an unclean winner lacks (``ends``: the
    winner's log end): ``committed - end`` where positive. A lower bound: the old leader
    may have committed more after it published, and records it appended but had not
    committed are given up too without being counted."""
    lost = {p: hw - ends.get(p, 0) for p, hw in committed.items()}
    return {p: n for p, n in sorted(lost.items()) if n > 0}


def has_min_insync(record: TopicRecord) -> bool:
    """Whether the topic has the in-sync replicas a publish needs."""
    return len(record.effective_isr()) >= record.min_insync


def check_min_insync(record: TopicRecord) -> None:
    """Refuse a publish, before anything is appended, when :func:`has_min_insync` fails.

    Raises:
        NotEnoughReplicasError: naming the in-sync count, the factor and the minimum.
    """
    if not has_min_insync(record):
        raise NotEnoughReplicasError(
            record.name,
            len(record.effective_isr()),
            len(record.effective_replicas()),
            record.min_insync,
        )


# -- balance ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaderMove:
    """Make ``to`` the preferred leader of ``topic`` (``replicas`` is the new order, ``to``
    first); the leader then hands over to it when it is alive and in sync."""

    topic: str
    to: str
    replicas: tuple[str, ...]


def preferred_leader_moves(
    records: Iterable[TopicRecord], alive: Collection[str]
) -> list[tuple[str, str]]:
    """``(topic, preferred leader)`` for each ready topic led by another broker while its
    preferred leader is alive and in sync: the handovers that restore preferred
    leadership (Kafka's preferred replica election), by topic name."""
    moves: list[tuple[str, str]] = []
    for record in sorted(records, key=lambda r: r.name):
        replicas = record.effective_replicas()
        if record.state is not TopicState.READY or not replicas:
            continue
        preferred = replicas[0]
        if preferred != record.owner and preferred in alive and preferred in record.effective_isr():
            moves.append((record.name, preferred))
    return moves


def rebalance_moves(records: Iterable[TopicRecord], alive: Collection[str]) -> list[LeaderMove]:
    """Reorders of replica sets that spread preferred leadership over the ``alive``
    brokers until no two differ by more than one where a topic allows it.

    Greedy and deterministic: repeatedly take the broker preferred for the most topics
    (then node id), and move one of its topics (by name) to the replica of that topic
    that is alive and preferred for the fewest, if that narrows the gap by two or more.
    Each move lowers the sum of squared counts, so it ends.
    """
    by_name = {r.name: r for r in records if r.state is TopicState.READY}
    order = {name: by_name[name].effective_replicas() for name in sorted(by_name)}
    counts = dict.fromkeys(alive, 0)
    for replicas in order.values():
        if replicas and replicas[0] in counts:
            counts[replicas[0]] += 1
    moves: dict[str, LeaderMove] = {}
    while True:
        move = _one_move(order, counts)
        if move is None:
            return [moves[name] for name in sorted(moves)]
        moves[move.topic] = move
        counts[order[move.topic][0]] -= 1
        counts[move.to] += 1
        order[move.topic] = move.replicas


def _one_move(order: Mapping[str, tuple[str, ...]], counts: Mapping[str, int]) -> LeaderMove | None:
    for busy in sorted(counts, key=lambda node: (-counts[node], node)):
        for name, replicas in order.items():
            if not replicas or replicas[0] != busy:
                continue
            others = [n for n in replicas[1:] if n in counts]
            if not others:
                continue
            to = min(others, key=lambda node: (counts[node], node))
            if counts[busy] - counts[to] >= 2:
                return LeaderMove(name, to, (to, *(n for n in replicas if n != to)))
    return None


# -- reassignment -------------------------------------------------------------------------


class StepKind(enum.Enum):
    """What a reassignment does next (:func:`reassignment_step`)."""

    ADD_REPLICAS = "add-replicas"
    WAIT_IN_SYNC = "wait-in-sync"
    MOVE_LEADERSHIP = "move-leadership"
    DROP_REPLICAS = "drop-replicas"
    DONE = "done"

    def is_write(self) -> bool:
        """The step is a write to the record (not a wait, not the end)."""
        return self in (StepKind.ADD_REPLICAS, StepKind.MOVE_LEADERSHIP, StepKind.DROP_REPLICAS)


@dataclass(frozen=True, slots=True)
class ReassignStep:
    """The next step of a reassignment.

    Attributes:
        kind: what to do.
        replicas: the replica set to write (ADD_REPLICAS, DROP_REPLICAS); else the current.
        isr: the in-sync set to write (DROP_REPLICAS); else the current.
        reassign_to: the record's ``reassign_to`` after the step.
        leader: the new leader (MOVE_LEADERSHIP); else the current.
        waiting_for: target replicas not yet in sync (WAIT_IN_SYNC), or in sync but none
            of them alive to take the leadership.
    """

    kind: StepKind
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    reassign_to: tuple[str, ...]
    leader: str
    waiting_for: tuple[str, ...] = ()


def check_target(target: Sequence[str]) -> tuple[str, ...]:
    """``target`` as a replica set.

    Raises:
        ReplicationSettingsError: empty, a blank name, or a name twice.
    """
    if not target or any(not node for node in target):
        raise ReplicationSettingsError(f"replica list {list(target)} is empty or has a blank name")
    if len(set(target)) != len(target):
        raise ReplicationSettingsError(f"replica list {list(target)} names a broker twice")
    return tuple(target)


def reassignment_step(
    record: TopicRecord, target: Sequence[str], alive: Collection[str]
) -> ReassignStep:
    """The next step moving ``record``'s replica set to ``target`` (Kafka's order): add the
    new replicas (target first, so the preferred leader is the target's) -> wait until
    every target replica is in sync -> move leadership into the target if the leader is
    leaving -> drop the replicas outside the target. Resumable: it reads only the record.

    Raises:
        ReplicationSettingsError: ``target`` is not a replica set (:func:`check_target`).
    """
    target = check_target(target)
    current, isr = record.effective_replicas(), record.effective_isr()
    same = ReassignStep(StepKind.DONE, current, isr, record.reassign_to, record.owner)
    if set(target) - set(current):
        added = (*target, *(n for n in current if n not in target))
        return replace(same, kind=StepKind.ADD_REPLICAS, replicas=added, reassign_to=target)
    lagging = tuple(n for n in target if n not in isr)
    if lagging:
        return replace(same, kind=StepKind.WAIT_IN_SYNC, waiting_for=lagging)
    if record.owner not in target:
        ready = [n for n in target if n in alive]
        if not ready:
            return replace(same, kind=StepKind.WAIT_IN_SYNC, waiting_for=target)
        return replace(same, kind=StepKind.MOVE_LEADERSHIP, leader=ready[0])
    if current != target or record.reassign_to:
        kept = tuple(n for n in isr if n in target)
        return replace(same, kind=StepKind.DROP_REPLICAS, replicas=target, isr=kept, reassign_to=())
    return same


def is_cancelling(record: TopicRecord) -> bool:
    """Whether ``record``'s reassignment was cancelled: it now goes back to the replica
    set it started from (``reassign_to == reassign_from``; :func:`cancel_step`)."""
    return bool(record.reassign_from) and record.reassign_to == record.reassign_from


def cancel_step(record: TopicRecord, alive: Collection[str]) -> ReassignStep:
    """The next step of a cancelled reassignment (Kafka's KIP-455 cancel): back to
    ``record.reassign_from``, the replica set it started from, without waiting for
    anything the reassignment was waiting for.

    - The leader is a replica the reassignment added: move leadership to the first
      original replica that is alive and in sync (MOVE_LEADERSHIP); none: WAIT_IN_SYNC
      for the originals.
    - Dropping the added replicas would take an in-sync set at or above ``min_insync``
      below it (an added replica in sync, an original not): WAIT_IN_SYNC for the
      originals out of sync.
    - Else DROP_REPLICAS: the originals (those still replicas), the in-sync set's
      members among them, ``reassign_to`` cleared.

    Worked example: from ``(b1, b2)`` to ``(b3, b4)``, b3 added and leading, b4 catching
    up, isr ``(b3, b1, b2)``: MOVE_LEADERSHIP to b1; then DROP_REPLICAS to ``(b1, b2)``
    with isr ``(b1, b2)``; b3 and b4 delete their copies.
    """
    original, current = record.reassign_from, record.effective_replicas()
    isr = record.effective_isr()
    same = ReassignStep(StepKind.DONE, current, isr, record.reassign_to, record.owner)
    if record.owner not in original:
        ready = [n for n in original if n in isr and n in alive]
        if not ready:
            return replace(same, kind=StepKind.WAIT_IN_SYNC, waiting_for=original)
        return replace(same, kind=StepKind.MOVE_LEADERSHIP, leader=ready[0])
    kept = tuple(n for n in isr if n in original)
    if len(isr) >= record.min_insync > len(kept):
        lagging = tuple(n for n in original if n not in isr)
        return replace(same, kind=StepKind.WAIT_IN_SYNC, waiting_for=lagging)
    back = tuple(n for n in original if n in current)
    return replace(same, kind=StepKind.DROP_REPLICAS, replicas=back, isr=kept, reassign_to=())


# -- replica balance ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaMove:
    """Move ``topic``'s replica on ``source`` to ``to``: a reassignment to ``replicas``
    (the set with ``to`` in ``source``'s place)."""

    topic: str
    source: str
    to: str
    replicas: tuple[str, ...]


def is_movable(record: TopicRecord, alive: Collection[str]) -> bool:
    """Whether a replica move may start on ``record``: a ready replicated topic with no
    reassignment running and every replica alive and in sync (so the move's in-sync set
    never falls below its size, ``min_insync`` included)."""
    replicas = record.effective_replicas()
    return (
        record.state is TopicState.READY
        and len(replicas) > 1
        and not record.reassign_to
        and all(n in alive for n in replicas)
        and set(record.effective_isr()) == set(replicas)
    )


def replica_moves(
    records: Iterable[TopicRecord], alive: Collection[str], max_moves: int
) -> list[ReplicaMove]:
    """Replica moves that spread the replicas of replicated topics over the ``alive``
    brokers until no two hold more than one apart (where the topics allow it), at most
    ``max_moves`` reassignments running at once (those running already count).

    Only :func:`is_movable` topics move, one replica each per plan. A move is a
    reassignment (:func:`reassignment_step`): the new replica is added, catches up and
    joins the in-sync set before the old one is dropped, so the in-sync set never falls
    below the topic's size. Greedy and deterministic: the broker holding the most (then
    node id) gives a replica to the one holding the fewest (then node id) while they
    differ by two or more, of the first topic by name that the first holds and the second
    does not, a topic it does not lead first (no leadership move). Each move lowers the
    sum of squared counts, so planning again after the moves end converges.

    Worked example: b1, b2, b3 each hold two of three factor-2 topics; b4 joins empty:
    counts 2, 2, 2, 0: one move, b1's replica of a topic b1 does not lead goes to b4
    (2 -> 1, 0 -> 1); then 1, 2, 2, 1: balanced.
    """
    held = list(records)
    budget = max_moves - sum(1 for r in held if r.reassign_to)
    counts = dict.fromkeys(alive, 0)
    replicated = [
        r for r in held if r.state is TopicState.READY and len(r.effective_replicas()) > 1
    ]
    for record in replicated:
        for node in record.effective_replicas():
            if node in counts:
                counts[node] += 1
    movable = {r.name: r for r in replicated if is_movable(r, counts)}
    moves: list[ReplicaMove] = []
    while len(moves) < budget:
        move = _one_replica_move(movable, counts)
        if move is None:
            break
        moves.append(move)
        del movable[move.topic]
        counts[move.source] -= 1
        counts[move.to] += 1
    return moves


def _one_replica_move(
    movable: Mapping[str, TopicRecord], counts: Mapping[str, int]
) -> ReplicaMove | None:
    by_most = sorted(counts, key=lambda node: (-counts[node], node))
    by_fewest = sorted(counts, key=lambda node: (counts[node], node))
    for busy in by_most:
        for idle in by_fewest:
            if counts[busy] - counts[idle] < 2:
                break
            holding = [
                r for name, r in sorted(movable.items())
                if busy in r.effective_replicas() and idle not in r.effective_replicas()
            ]  # fmt: skip
            if holding:
                record = min(holding, key=lambda r: r.effective_replicas()[0] == busy)
                target = tuple(idle if n == busy else n for n in record.effective_replicas())
                return ReplicaMove(record.name, busy, idle, target)
    return None
