"""Replication's pure rules (:mod:`cluster.replicas`): placement, the high watermark, Kafka's
in-sync rule, leader choice, the min_insync refusal, balance and the reassignment steps.
No event loop, no disk, no etcd."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.errors import NotEnoughBrokersError, NotEnoughReplicasError, ReplicationSettingsError
from cluster.records import TopicRecord, TopicState
from cluster.replicas import (
    EARLIER_REPORTS,
    FollowerProgress,
    LeaderChoice,
    StepKind,
    check_min_insync,
    choose_leader,
    election_rank,
    follower_fetched,
    has_min_insync,
    high_watermark,
    is_in_sync,
    isr_to_expand,
    isr_to_shrink,
    may_join_isr,
    place_many,
    place_replicas,
    preferred_leader_moves,
    reassignment_step,
    rebalance_moves,
    records_given_up,
    replica_load,
    replication_settings,
    unclean_rank,
)

NODES = [f"b{i}" for i in range(1, 8)]


def _topic(
    owner: str,
    replicas: tuple[str, ...],
    isr: tuple[str, ...] | None = None,
    *,
    name: str = "t",
    min_insync: int = 1,
    state: TopicState = TopicState.READY,
) -> TopicRecord:
    record = TopicRecord(name, "0" * 16, 1, 0, owner, 3, state)
    return record.replace(
        replicas=replicas, isr=replicas if isr is None else isr, min_insync=min_insync
    )


# -- placement ----------------------------------------------------------------------------


def test_placement_takes_the_least_loaded_and_the_fewest_leaderships_lead() -> None:
    """The module docstring's example: b2 and b3 hold fewest replicas; b3 leads fewest, so
    it is the preferred leader."""
    load = {"b1": (2, 1), "b2": (1, 1), "b3": (1, 0)}
    assert place_replicas(2, load) == ("b3", "b2")


def test_placement_asks_for_no_more_brokers_than_are_live() -> None:
    """Factor 3 over two live brokers: an error naming both numbers."""
    with pytest.raises(NotEnoughBrokersError, match="factor 3 needs 3 live brokers and 2 are up"):
        place_replicas(3, {"b1": (0, 0), "b2": (0, 0)})


@given(
    brokers=st.integers(min_value=1, max_value=7),
    factor=st.integers(min_value=1, max_value=7),
    topics=st.integers(min_value=1, max_value=40),
)
def test_placement_from_empty_spreads_replicas_and_leaders(
    brokers: int, factor: int, topics: int
) -> None:
    """PROPERTY: placing topics one after another on idle brokers gives distinct replicas
    of the asked factor, replica counts that differ by at most one, and preferred
    leaderships that differ by at most one; the same view gives the same answer."""
    if factor > brokers:
        return
    load = dict.fromkeys(NODES[:brokers], (0, 0))
    names = [(f"t{i}", factor) for i in range(topics)]
    placed = place_many(names, load)
    assert placed == place_many(names, load)
    held = Counter(node for _, replicas in placed for node in replicas)
    leading = Counter(replicas[0] for _, replicas in placed)
    for _, replicas in placed:
        assert len(replicas) == factor == len(set(replicas))
    assert max(held[n] for n in load) - min(held[n] for n in load) <= 1
    assert max(leading[n] for n in load) - min(leading[n] for n in load) <= 1


@given(
    loads=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=7),
    data=st.data(),
)
def test_placement_on_any_load_takes_the_least_loaded(
    loads: list[tuple[int, int]], data: st.DataObject
) -> None:
    """PROPERTY: on any load, the replicas are distinct, of the asked factor, and no broker
    left out holds fewer replicas than one taken."""
    load = {NODES[i]: (held, min(held, leading)) for i, (held, leading) in enumerate(loads)}
    factor = data.draw(st.integers(1, len(load)))
    replicas = place_replicas(factor, load)
    assert len(replicas) == factor == len(set(replicas))
    left = [n for n in load if n not in replicas]
    if left:
        assert max(load[n][0] for n in replicas) <= min(load[n][0] for n in left)


def test_replica_load_counts_replicas_and_preferred_leaders_of_live_brokers() -> None:
    """A dead broker (b9) is not in the load; a legacy record counts its owner."""
    records = [
        _topic("b1", ("b1", "b2")),
        _topic("b2", ("b2", "b9", "b1")),
        TopicRecord("old", "0" * 16, 1, 0, "b3", 1, TopicState.READY),
    ]
    assert replica_load(records, ["b1", "b2", "b3"]) == {"b1": (2, 1), "b2": (2, 1), "b3": (1, 1)}


@pytest.mark.parametrize(
    ("asked", "asked_min", "live", "expected"),
    [
        (None, None, 5, (3, 2)),  # the cluster defaults
        (None, None, 2, (2, 2)),  # default factor clamped to the live brokers
        (None, None, 1, (1, 1)),  # and min_insync to the factor
        (1, None, 5, (1, 1)),  # factor 1 asked: min_insync clamped to it
        (3, 3, 3, (3, 3)),
    ],
)
def test_replication_settings_defaults_clamp(
    asked: int | None, asked_min: int | None, live: int, expected: tuple[int, int]
) -> None:
    """Defaults (factor 3, min_insync 2) are clamped to what the cluster can hold."""
    assert replication_settings(asked, asked_min, 3, 2, live) == expected


def test_replication_settings_refuse_what_was_asked_and_cannot_hold() -> None:
    """An explicit factor above the live brokers, or min_insync above the factor: a clear
    error, not a silent clamp."""
    with pytest.raises(NotEnoughBrokersError, match="factor 4"):
        replication_settings(4, None, 3, 2, 3)
    with pytest.raises(ReplicationSettingsError, match="min_insync 3 exceeds"):
        replication_settings(2, 3, 3, 2, 3)
    with pytest.raises(ReplicationSettingsError, match="below 1"):
        replication_settings(0, None, 3, 2, 3)


# -- high watermark and the in-sync rule --------------------------------------------------


@pytest.mark.parametrize(
    ("followers", "leader_end", "expected"),
    [
        ({}, 10, 10),  # factor 1: the leader's own durable end
        ({"b2": 7, "b3": 9}, 10, 7),
        ({"b2": 10, "b3": 10}, 10, 10),
        ({"b2": 12}, 10, 10),  # never past the leader's durable end
    ],
)
def test_high_watermark_is_the_least_end_over_the_isr(
    followers: dict[str, int], leader_end: int, expected: int
) -> None:
    """The committed end is the least durable end over the in-sync set."""
    assert high_watermark(followers, leader_end) == expected


def test_a_follower_fetching_the_leaders_end_is_caught_up_now() -> None:
    """Kafka's rule: a fetch from the leader's end marks the follower caught up at once; a
    fetch from where the leader's end was at the previous fetch marks it caught up at the
    previous fetch's time; behind both, the time stays."""
    progress = FollowerProgress.tracked(0, in_isr=False)
    progress = follower_fetched(progress, fetch_offset=10, leader_end=10, now_ms=1000)
    assert progress.last_caught_up_ms == 1000
    progress = follower_fetched(progress, fetch_offset=10, leader_end=15, now_ms=1500)
    assert progress.last_caught_up_ms == 1000  # asked from the old end at the old fetch
    progress = follower_fetched(progress, fetch_offset=15, leader_end=20, now_ms=1800)
    assert progress.last_caught_up_ms == 1500  # it had what the leader had at 1500
    progress = follower_fetched(progress, fetch_offset=16, leader_end=25, now_ms=2000)
    assert progress.last_caught_up_ms == 1500  # behind the end of the previous fetch


def test_a_pipelined_follower_reporting_an_answer_late_stays_caught_up() -> None:
    """A follower that fetches again before its last answer is durable (ReplicaStream)
    reports each answer's end one report later, while the leader's end keeps moving
    (a steady load): reports at 100 ms (leader's end 50) and 101 ms (end 60), then a
    report of 55 at 102 ms (end 70). Expected: caught up at 100 ms, when the leader had
    50; and over 40 s of such reports, each durable end the leader's end of two reports
    before, it stays in sync (lag max 10 s) though it never has the current end."""
    progress = FollowerProgress.tracked(0, True)
    progress = follower_fetched(progress, fetch_offset=40, leader_end=50, now_ms=100)
    progress = follower_fetched(progress, fetch_offset=45, leader_end=60, now_ms=101)
    progress = follower_fetched(progress, fetch_offset=55, leader_end=70, now_ms=102)
    assert progress.last_caught_up_ms == 100
    ends = [10 * i for i in range(4000)]
    for i in range(2, len(ends)):
        now = 1000 + 10 * i
        progress = follower_fetched(progress, ends[i - 2], ends[i], now)
        assert progress.fetch_offset < ends[i]
        assert is_in_sync(progress, ends[i], now, 10_000)
    assert now - progress.last_caught_up_ms == 20
    assert len(progress.earlier) <= EARLIER_REPORTS


@pytest.mark.parametrize(
    ("now_ms", "leader_end", "in_sync"),
    [
        (31000, 20, True),  # exactly lag_max after it last caught up
        (31001, 20, False),  # one ms later
        (99000, 10, True),  # idle topic: it has the leader's end, however long ago
    ],
)
def test_in_sync_within_replica_lag_time_max(now_ms: int, leader_end: int, in_sync: bool) -> None:
    """A follower last caught up at 1000 ms, fetched up to 10: in sync until 1000 + 30000
    unless it holds the leader's end."""
    progress = FollowerProgress(10, 1000, 10, 1000)
    assert is_in_sync(progress, leader_end, now_ms, 30000) is in_sync


def test_isr_to_shrink_names_laggards_and_never_the_leader() -> None:
    """b2 caught up recently, b3 long ago, b4 never fetched: b3 and b4 go, the leader stays."""
    record = _topic("b1", ("b1", "b2", "b3", "b4"))
    progress = {"b2": FollowerProgress(5, 9000, 8, 9000), "b3": FollowerProgress(5, 100, 8, 100)}
    assert isr_to_shrink(record, progress, 8, 10000, 5000) == ("b3", "b4")


def test_joining_the_isr_needs_the_high_watermark_and_the_epoch_start() -> None:
    """A follower rejoins once at the high watermark and past the leader epoch's start."""
    assert may_join_isr(10, 10, 4)
    assert not may_join_isr(9, 10, 4)
    assert not may_join_isr(10, 8, 12)
    record = _topic("b1", ("b1", "b2", "b3"), ("b1",))
    assert isr_to_expand(record, {"b2": 10, "b3": 9}, 10, 4) == ("b2",)


# -- leadership ---------------------------------------------------------------------------


def test_choose_leader_in_preferred_order_among_alive_in_sync() -> None:
    """The leader while alive; else the first replica alive and in sync; an out-of-sync
    replica never wins a clean election."""
    record = _topic("b1", ("b1", "b2", "b3"), ("b1", "b3"))
    assert choose_leader(record, {"b1", "b2", "b3"}) == LeaderChoice("b1", False)
    assert choose_leader(record, {"b2", "b3"}) == LeaderChoice("b3", False)
    assert choose_leader(record, {"b2"}) is None


def test_unclean_election_only_when_no_in_sync_replica_is_alive() -> None:
    """With unclean on, b2 (out of sync) wins only when b1 and b3 are both gone, and the
    choice says it is unclean; an alive in-sync replica still wins cleanly."""
    record = _topic("b1", ("b1", "b2", "b3"), ("b1", "b3"))
    assert choose_leader(record, {"b2"}, unclean=True) == LeaderChoice("b2", True)
    assert choose_leader(record, {"b2", "b3"}, unclean=True) == LeaderChoice("b3", False)


def test_unclean_rank_orders_the_alive_out_of_sync_replicas_while_no_isr_member_lives() -> None:
    """(b1, b2, b3, b4) with isr (b1, b3); b1 and b3 gone. Expected: b2 rank 0, b4 rank 1
    (preferred order among the alive out-of-sync replicas); none while b3 (in sync) is
    alive; b4 rank 0 when b2 is gone too; an in-sync replica has no unclean rank."""
    record = _topic("b1", ("b1", "b2", "b3", "b4"), ("b1", "b3"))
    assert unclean_rank(record, "b2", {"b2", "b4"}) == 0
    assert unclean_rank(record, "b4", {"b2", "b4"}) == 1
    assert unclean_rank(record, "b2", {"b2", "b3", "b4"}) is None
    assert unclean_rank(record, "b4", {"b4"}) == 0
    assert unclean_rank(record, "b3", {"b3"}) is None


@given(
    replicas=st.lists(st.sampled_from(NODES), min_size=1, max_size=5, unique=True),
    data=st.data(),
)
def test_unclean_rank_zero_is_the_unclean_choice(replicas: list[str], data: st.DataObject) -> None:
    """PROPERTY: any record, any alive set: the node of unclean rank 0 is exactly
    choose_leader's unclean choice (one rule, two callers)."""
    isr = data.draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
    alive = set(data.draw(st.lists(st.sampled_from(NODES), unique=True)))
    record = _topic(isr[0], tuple(replicas), tuple(isr))
    choice = choose_leader(record, alive, unclean=True)
    first = [n for n in replicas if unclean_rank(record, n, alive) == 0]
    if choice is not None and choice.unclean:
        assert first == [choice.node]
    else:
        assert first == []


def test_records_given_up_is_the_old_committed_mark_over_the_winners_end() -> None:
    """Marks {0: 100, 1: 50, 2: 7} against ends {0: 80, 1: 60} (partition 2 empty here).
    Expected: {0: 20, 2: 7}: partition 1 holds more than was committed, nothing lost."""
    assert records_given_up({0: 100, 1: 50, 2: 7}, {0: 80, 1: 60}) == {0: 20, 2: 7}
    assert records_given_up({}, {0: 5}) == {}


@given(
    replicas=st.lists(st.sampled_from(NODES), min_size=1, max_size=5, unique=True),
    data=st.data(),
)
def test_a_clean_choice_is_alive_and_in_sync(replicas: list[str], data: st.DataObject) -> None:
    """PROPERTY: any record, any alive set: a clean choice is alive and in sync (or the
    alive leader); an unclean one happens only with no in-sync replica alive."""
    isr = data.draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
    owner = isr[0]
    alive = set(data.draw(st.lists(st.sampled_from(NODES), unique=True)))
    unclean = data.draw(st.booleans())
    record = _topic(owner, tuple(replicas), tuple(isr))
    choice = choose_leader(record, alive, unclean)
    if choice is None:
        assert not (set(isr) & alive)
        return
    assert choice.node in alive
    if choice.unclean:
        assert unclean
        assert not (set(isr) & alive)
    else:
        assert choice.node in isr


def test_election_rank_staggers_in_sync_followers_in_preferred_order() -> None:
    """The dead leader b1 does not count; b2 is out of sync: b3 tries first, then b4."""
    record = _topic("b1", ("b1", "b2", "b3", "b4"), ("b1", "b3", "b4"))
    assert [election_rank(record, n) for n in ("b1", "b2", "b3", "b4")] == [None, None, 0, 1]


def test_min_insync_refusal_names_both_numbers() -> None:
    """One in-sync replica of three, two needed: refused with Kafka's NOT_ENOUGH_REPLICAS
    facts in words; with two in sync it passes."""
    record = _topic("b1", ("b1", "b2", "b3"), ("b1",), min_insync=2)
    assert not has_min_insync(record)
    with pytest.raises(NotEnoughReplicasError) as refused:
        check_min_insync(record)
    assert str(refused.value).startswith(
        "topic t has 1 in-sync replica of 3; at least 2 are needed (min_insync_replicas)"
    )
    assert (refused.value.in_sync, refused.value.replicas, refused.value.needed) == (1, 3, 2)
    check_min_insync(record.replace(isr=("b1", "b2")))


def test_a_legacy_record_has_its_one_copy() -> None:
    """An issue-36 record (no replicas, no isr) is factor 1: min_insync 1 holds."""
    legacy = TopicRecord("t", "0" * 16, 1, 0, "b1", 2, TopicState.READY)
    check_min_insync(legacy)
    assert choose_leader(legacy, {"b2"}) is None


# -- balance ------------------------------------------------------------------------------


def test_preferred_leader_moves_back_when_alive_and_in_sync() -> None:
    """t1 is led by b2 but prefers b1 (alive, in sync): move. t2 prefers b3, out of sync:
    stay. t3 is led by its preferred leader: nothing."""
    records = [
        _topic("b2", ("b1", "b2"), name="t1"),
        _topic("b1", ("b3", "b1"), ("b1",), name="t2"),
        _topic("b1", ("b1", "b2"), name="t3"),
    ]
    assert preferred_leader_moves(records, {"b1", "b2", "b3"}) == [("t1", "b1")]


@given(
    brokers=st.integers(min_value=2, max_value=6),
    picks=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=30),
)
def test_rebalance_spreads_preferred_leaders(brokers: int, picks: list[int]) -> None:
    """PROPERTY: every topic replicated on all brokers but preferred by whichever pick says
    (skewed): after the moves, preferred leaderships differ by at most one, each move
    keeps the same replicas, and running it again finds nothing to do."""
    nodes = NODES[:brokers]
    records = []
    for i, pick in enumerate(picks):
        first = nodes[pick % brokers]
        records.append(_topic(first, (first, *(n for n in nodes if n != first)), name=f"t{i:02}"))
    moves = rebalance_moves(records, set(nodes))
    after = {r.name: r.replicas for r in records}
    for move in moves:
        assert set(move.replicas) == set(after[move.topic])
        assert move.replicas[0] == move.to
        after[move.topic] = move.replicas
    leading = Counter(replicas[0] for replicas in after.values())
    assert max(leading[n] for n in nodes) - min(leading[n] for n in nodes) <= 1
    moved = [r.replace(replicas=after[r.name]) for r in records]
    assert rebalance_moves(moved, set(nodes)) == []


# -- reassignment -------------------------------------------------------------------------


@given(
    current=st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True),
    target=st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True),
    data=st.data(),
)
def test_reassignment_reaches_the_target_without_losing_a_needed_copy(
    current: list[str], target: list[str], data: st.DataObject
) -> None:
    """PROPERTY: from any replicated record to any target, following the steps (a wait is
    ended by the waited-for replicas catching up) ends DONE within five writes with
    replicas == target and the leader in it; at every point the leader is in sync and
    the isr within the replicas, and replicas are dropped only once every target replica
    is in sync and the leader is one of them."""
    owner = data.draw(st.sampled_from(current))
    record = _topic(owner, tuple(current), (owner,))
    alive = set(NODES)
    for _ in range(12):
        step = reassignment_step(record, target, alive)
        if step.kind is StepKind.DONE:
            break
        if step.kind is StepKind.WAIT_IN_SYNC:
            members = set(record.effective_isr()) | set(step.waiting_for)
            record = record.replace(isr=tuple(n for n in record.replicas if n in members))
        elif step.kind is StepKind.MOVE_LEADERSHIP:
            assert step.leader in record.isr
            assert step.leader in target
            record = record.replace(owner=step.leader, epoch=record.epoch + 1)
        else:
            if step.kind is StepKind.DROP_REPLICAS:
                assert set(target) <= set(record.isr)
                assert record.owner in target
            record = record.replace(
                replicas=step.replicas, isr=step.isr, reassign_to=step.reassign_to
            )
        assert record.owner in record.isr
        assert set(record.isr) <= set(record.replicas)
    else:
        pytest.fail("the reassignment did not finish")
    assert record.replicas == tuple(target)
    assert record.owner in target
    assert record.reassign_to == ()


def test_reassignment_steps_in_order() -> None:
    """(b1, b2) -> (b2, b3): add b3 (target first), wait for b3, then (b1 leading) move
    leadership to b2, then drop b1; with b1 not leading, no move is needed."""
    record = _topic("b1", ("b1", "b2"))
    add = reassignment_step(record, ["b2", "b3"], {"b1", "b2", "b3"})
    assert (add.kind, add.replicas, add.reassign_to) == (
        StepKind.ADD_REPLICAS,
        ("b2", "b3", "b1"),
        ("b2", "b3"),
    )
    record = record.replace(replicas=add.replicas, reassign_to=add.reassign_to)
    wait = reassignment_step(record, ["b2", "b3"], {"b1", "b2", "b3"})
    assert (wait.kind, wait.waiting_for) == (StepKind.WAIT_IN_SYNC, ("b3",))
    record = record.replace(isr=("b2", "b3", "b1"))
    move = reassignment_step(record, ["b2", "b3"], {"b1", "b3"})  # b2 is down: b3 takes it
    assert (move.kind, move.leader) == (StepKind.MOVE_LEADERSHIP, "b3")
    record = record.replace(owner="b3")
    drop = reassignment_step(record, ["b2", "b3"], {"b1", "b3"})
    assert (drop.kind, drop.replicas, drop.isr, drop.reassign_to) == (
        StepKind.DROP_REPLICAS,
        ("b2", "b3"),
        ("b2", "b3"),
        (),
    )
    assert drop.kind.is_write()
    assert not StepKind.WAIT_IN_SYNC.is_write()


@pytest.mark.parametrize("target", [[], ["b1", "b1"], ["b1", ""]])
def test_a_bad_target_is_refused(target: list[str]) -> None:
    """An empty list, a name twice or a blank name is not a replica set."""
    with pytest.raises(ReplicationSettingsError):
        reassignment_step(_topic("b1", ("b1",)), target, {"b1"})
