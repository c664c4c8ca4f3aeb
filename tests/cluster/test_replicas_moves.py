"""The pure rules of reassign --cancel and the rebalance's replica moves
(:mod:`cluster.replicas`: ``cancel_step``, ``is_cancelling``, ``replica_moves``,
``is_movable``). No event loop, no disk, no etcd."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.records import TopicRecord, TopicState
from cluster.replicas import (
    StepKind,
    cancel_step,
    is_cancelling,
    is_movable,
    reassignment_step,
    replica_moves,
)

NODES = [f"b{i}" for i in range(1, 8)]


def _topic(
    owner: str,
    replicas: tuple[str, ...],
    isr: tuple[str, ...] | None = None,
    *,
    name: str = "t",
    min_insync: int = 1,
    reassign_to: tuple[str, ...] = (),
    reassign_from: tuple[str, ...] = (),
) -> TopicRecord:
    record = TopicRecord(name, "0" * 16, 1, 0, owner, 3, TopicState.READY)
    return record.replace(
        replicas=replicas,
        isr=replicas if isr is None else isr,
        min_insync=min_insync,
        reassign_to=reassign_to,
        reassign_from=reassign_from,
    )


# -- cancel -------------------------------------------------------------------------------


def test_cancel_moves_leadership_back_then_drops_the_added() -> None:
    """The docstring's example: (b1, b2) -> (b3, b4) cancelled with b3 added and leading,
    b4 catching up: leadership moves to b1 (the first original alive and in sync), then
    the replicas drop back to (b1, b2) with isr (b1, b2) and reassign_to cleared."""
    record = _topic(
        "b3", ("b3", "b4", "b1", "b2"), ("b3", "b1", "b2"),
        reassign_to=("b1", "b2"), reassign_from=("b1", "b2"),
    )  # fmt: skip
    assert is_cancelling(record)
    alive = {"b1", "b2", "b3", "b4"}
    move = cancel_step(record, alive)
    assert (move.kind, move.leader) == (StepKind.MOVE_LEADERSHIP, "b1")
    assert cancel_step(record, alive - {"b1"}).leader == "b2"
    record = record.replace(owner="b1", epoch=record.epoch + 1)
    drop = cancel_step(record, alive)
    assert (drop.kind, drop.replicas, drop.isr, drop.reassign_to) == (
        StepKind.DROP_REPLICAS,
        ("b1", "b2"),
        ("b1", "b2"),
        (),
    )


def test_cancel_does_not_wait_for_the_added_replicas() -> None:
    """(b1, b2) -> (b1, b3) cancelled while b3 still catches up (not in sync; the forward
    reassignment would wait for it): the cancel drops b3 at once."""
    record = _topic(
        "b1", ("b1", "b3", "b2"), ("b1", "b2"),
        reassign_to=("b1", "b2"), reassign_from=("b1", "b2"),
    )  # fmt: skip
    assert reassignment_step(
        record.replace(reassign_to=("b1", "b3")), ["b1", "b3"], NODES
    ).kind is (StepKind.WAIT_IN_SYNC)
    drop = cancel_step(record, set(NODES))
    assert (drop.kind, drop.replicas, drop.isr) == (
        StepKind.DROP_REPLICAS,
        ("b1", "b2"),
        ("b1", "b2"),
    )


@pytest.mark.parametrize(
    ("owner", "isr", "alive", "waiting_for"),
    [
        # the leader is an added replica and no original is alive and in sync
        ("b3", ("b3", "b2"), {"b1", "b3"}, ("b1", "b2")),
        # dropping b3 (in sync) would take isr 2 of min_insync 2 down to 1 (b2 lags)
        ("b1", ("b1", "b3"), {"b1", "b2", "b3"}, ("b2",)),
    ],
)
def test_cancel_waits_rather_than_lose_a_needed_copy(
    owner: str, isr: tuple[str, ...], alive: set[str], waiting_for: tuple[str, ...]
) -> None:
    """Boundaries where the cancel waits (WAIT_IN_SYNC, naming the originals it waits
    for): nobody to move leadership back to, and a drop that would take the in-sync set
    below min_insync from at it."""
    record = _topic(
        owner, ("b1", "b3", "b2"), isr, min_insync=2,
        reassign_to=("b1", "b2"), reassign_from=("b1", "b2"),
    )  # fmt: skip
    step = cancel_step(record, alive)
    assert (step.kind, step.waiting_for) == (StepKind.WAIT_IN_SYNC, waiting_for)


def test_is_cancelling_only_when_going_back() -> None:
    """A running reassignment is not a cancel; nor is a preferred-leader move (no
    reassign_from); going back to reassign_from is."""
    forward = _topic("b1", ("b1", "b2"), reassign_to=("b1", "b3"), reassign_from=("b1", "b2"))
    assert not is_cancelling(forward)
    assert not is_cancelling(_topic("b2", ("b1", "b2"), reassign_to=("b1", "b2")))
    assert is_cancelling(forward.replace(reassign_to=("b1", "b2")))


# -- replica balance ----------------------------------------------------------------------


def test_a_new_empty_broker_gets_a_replica() -> None:
    """The docstring's example: three factor-2 topics over b1-b3 (two replicas each), b4
    joins empty: one move, to b4, from b1 (most, then node id), of a topic b1 does not
    lead; planned again with the move done: nothing."""
    records = [
        _topic("b1", ("b1", "b2"), name="t1"),
        _topic("b2", ("b2", "b3"), name="t2"),
        _topic("b3", ("b3", "b1"), name="t3"),
    ]
    alive = {"b1", "b2", "b3", "b4"}
    (move,) = replica_moves(records, alive, max_moves=2)
    assert (move.topic, move.source, move.to, move.replicas) == ("t3", "b1", "b4", ("b3", "b4"))
    done = [
        r.replace(replicas=move.replicas, isr=move.replicas) if r.name == "t3" else r
        for r in records
    ]
    assert replica_moves(done, alive, max_moves=2) == []


def test_only_healthy_topics_move_and_running_ones_count() -> None:
    """Not movable: a replica out of sync, a replica down, a reassignment running, factor
    1. The running reassignment counts against max_moves: with 1, nothing is planned."""
    alive = {"b1", "b2", "b3"}
    assert not is_movable(_topic("b1", ("b1", "b2"), ("b1",)), alive)
    assert not is_movable(_topic("b1", ("b1", "b4")), alive)
    assert not is_movable(_topic("b1", ("b1", "b2"), reassign_to=("b1", "b3")), alive)
    assert not is_movable(_topic("b1", ("b1",)), alive)
    assert is_movable(_topic("b1", ("b1", "b2")), alive)
    records = [
        _topic("b1", ("b1", "b2"), name="t1"),
        _topic("b1", ("b1", "b2"), name="t2"),
        _topic("b1", ("b1", "b2"), name="t3", reassign_to=("b1", "b2")),
    ]
    assert replica_moves(records, alive, max_moves=1) == []
    assert len(replica_moves(records, alive, max_moves=2)) == 1


@given(
    brokers=st.integers(min_value=2, max_value=7),
    topics=st.lists(
        st.tuples(st.integers(min_value=2, max_value=3), st.integers(min_value=0, max_value=6)),
        min_size=1,
        max_size=24,
    ),
    joined=st.integers(min_value=0, max_value=3),
    max_moves=st.integers(min_value=1, max_value=4),
    min_insync=st.integers(min_value=1, max_value=2),
)
def test_replica_moves_converge_within_the_move_limit(
    brokers: int,
    topics: list[tuple[int, int]],
    joined: int,
    max_moves: int,
    min_insync: int,
) -> None:
    """PROPERTY: topics of factor 2-3 placed on a few of the brokers (skewed by the
    draws), ``joined`` more empty brokers alive: following the plans (each reassignment
    carried out by its steps, a wait ended by catching up) never has more than
    max_moves reassignments running, never takes an in-sync set below min_insync nor
    leaves the leader out of it, keeps every topic's factor, and ends with replica
    counts at most one apart; planning then finds nothing."""
    nodes = NODES[:brokers]
    alive = set(NODES[: min(brokers + joined, len(NODES))])
    records: dict[str, TopicRecord] = {}
    for i, (factor, first) in enumerate(topics):
        if factor > len(nodes):
            continue
        picked = tuple(nodes[(first + k) % len(nodes)] for k in range(factor))
        records[f"t{i:02}"] = _topic(picked[0], picked, name=f"t{i:02}", min_insync=min_insync)
    for _round in range(200):
        running = [r for r in records.values() if r.reassign_to]
        assert len(running) <= max_moves
        plan = replica_moves(records.values(), alive, max_moves)
        if not plan and not running:
            break
        for move in plan:
            record = records[move.topic]
            assert len(move.replicas) == len(record.replicas)
            records[move.topic] = record.replace(reassign_to=move.replicas)
        for name, record in records.items():
            if record.reassign_to:
                records[name] = _advance(record, alive)
    else:
        pytest.fail("the rebalance did not converge")
    counts = Counter(n for r in records.values() for n in r.replicas)
    assert max(counts[n] for n in alive) - min(counts[n] for n in alive) <= 1


def _advance(record: TopicRecord, alive: set[str]) -> TopicRecord:
    """One step of ``record``'s reassignment, checking the in-sync invariants."""
    step = reassignment_step(record, record.reassign_to, alive)
    if step.kind is StepKind.WAIT_IN_SYNC:
        members = set(record.isr) | set(step.waiting_for)
        after = record.replace(isr=tuple(n for n in record.replicas if n in members))
    elif step.kind is StepKind.MOVE_LEADERSHIP:
        after = record.replace(owner=step.leader, epoch=record.epoch + 1)
    elif step.kind.is_write():
        after = record.replace(replicas=step.replicas, isr=step.isr, reassign_to=step.reassign_to)
    else:
        after = record.replace(reassign_to=())
    assert len(after.isr) >= min(len(record.isr), record.min_insync)
    assert after.owner in after.isr
    return after
