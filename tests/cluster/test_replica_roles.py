"""cluster.replica_roles: a replica's next step, one row of the module's table each (pure:
no loop, no etcd)."""

from __future__ import annotations

import pytest

from cluster.records import TopicRecord, TopicState
from cluster.replica_roles import Decision, Step, decide, is_replicated

ALIVE = {"b1": "h1:1", "b2": "h2:2", "b3": "h3:3"}


def _record(
    state: TopicState = TopicState.READY,
    owner: str = "b1",
    epoch: int = 4,
    isr: tuple[str, ...] = ("b1", "b2", "b3"),
) -> TopicRecord:
    return TopicRecord(
        "t", "0123456789abcdef", 2, 0, owner, epoch, state, ("b1", "b2", "b3"), isr, 2
    )


@pytest.mark.parametrize(
    ("record", "me", "alive", "claimed", "holds", "fresh", "wanted"),
    [
        (_record(), "b9", ALIVE, None, True, False, Decision(Step.STOP)),
        (_record(TopicState.DELETING), "b2", ALIVE, None, True, False, Decision(Step.DELETE)),
        (_record(TopicState.PLACING, ""), "b2", ALIVE, None, False, False, Decision(Step.WAIT)),
        (
            _record(TopicState.CREATING, epoch=0),
            "b1",
            ALIVE,
            None,
            False,
            False,
            Decision(Step.CREATE, then_claim=True),
        ),
        (
            _record(TopicState.CREATING, epoch=0),
            "b2",
            ALIVE,
            None,
            False,
            False,
            Decision(Step.CREATE),
        ),
        (
            _record(TopicState.CREATING, epoch=0),
            "b1",
            ALIVE,
            None,
            True,
            False,
            Decision(Step.CLAIM),
        ),
        (
            _record(TopicState.CREATING, epoch=0),
            "b2",
            ALIVE,
            None,
            True,
            False,
            Decision(Step.WAIT),
        ),
        (_record(), "b1", ALIVE, 4, True, False, Decision(Step.LEAD)),
        (_record(), "b1", ALIVE, None, False, False, Decision(Step.MISSING)),
        (_record(), "b1", ALIVE, 3, True, False, Decision(Step.CLAIM)),
        (_record(), "b2", ALIVE, None, False, False, Decision(Step.CREATE)),
        (_record(), "b2", ALIVE, None, True, False, Decision(Step.FOLLOW, address="h1:1")),
        (_record(), "b3", {"b2": "h2:2"}, None, True, False, Decision(Step.ELECT, rank=1)),
        (_record(), "b2", {"b3": "h3:3"}, None, True, False, Decision(Step.ELECT, rank=0)),
        (
            _record(isr=("b1", "b3")),
            "b2",
            {"b2": "h2:2"},
            None,
            True,
            False,
            Decision(Step.WAIT),
        ),
        (_record(), "b2", {"b2": "h2:2"}, None, True, True, Decision(Step.WAIT)),
        # a deposed leader (claimed an older epoch; the record names another): follow it
        (
            _record(owner="b2", epoch=5),
            "b1",
            ALIVE,
            4,
            True,
            False,
            Decision(Step.FOLLOW, address="h2:2"),
        ),
    ],
)
def test_decide_follows_the_table(  # noqa: PLR0917 - one parameter per table column
    record: TopicRecord,
    me: str,
    alive: dict[str, str],
    claimed: int | None,
    holds: bool,
    fresh: bool,
    wanted: Decision,
) -> None:
    """Each row of the module's table: the record as the view holds it and what this broker
    knows of itself. Expected: exactly that row's decision (a STOP for a non-replica; a
    claim only by the leader in the isr; a follower elects only in the isr, ranked in
    preferred order among the in-sync followers, and never while fresh)."""
    assert decide(record, me, alive=alive, claimed=claimed, holds=holds, fresh=fresh) == wanted


def test_factor_one_records_are_not_replicated() -> None:
    """A factor-1 record (no replicas: how a topic of one copy is created and placed) is
    issue 36's path; three replicas are replicated, and so is a replicated topic
    reassigned down to one replica (its record names it: its leader keeps committing on
    this path). Expected: is_replicated False, True, True."""
    legacy = TopicRecord("t", "0123456789abcdef", 1, 0, "b1", 1, TopicState.READY)
    single = legacy.replace(replicas=("b1",), isr=("b1",))
    assert not is_replicated(legacy)
    assert is_replicated(_record())
    assert is_replicated(single)


@pytest.mark.parametrize("step", list(Step))
def test_only_claims_elections_and_deletes_write_etcd(step: Step) -> None:
    """Every step. Expected: CLAIM, ELECT and DELETE need a session that may write (the
    shell skips them without one); the rest are local."""
    assert step.is_write() is (step in (Step.CLAIM, Step.ELECT, Step.DELETE))


@pytest.mark.parametrize(
    ("record", "me", "alive", "unclean", "fresh", "wanted"),
    [
        # isr shrank to the leader b1, which is gone: b2 first, b3 second, when allowed
        (_record(isr=("b1",)), "b2", {"b2": "h2:2", "b3": "h3:3"}, True, False,
         Decision(Step.ELECT, rank=0, unclean=True)),
        (_record(isr=("b1",)), "b3", {"b2": "h2:2", "b3": "h3:3"}, True, False,
         Decision(Step.ELECT, rank=1, unclean=True)),
        (_record(isr=("b1",)), "b3", {"b3": "h3:3"}, True, False,
         Decision(Step.ELECT, rank=0, unclean=True)),
        # off (the default): the topic stays without a leader
        (_record(isr=("b1",)), "b2", {"b2": "h2:2", "b3": "h3:3"}, False, False,
         Decision(Step.WAIT)),
        # an in-sync member alive: it elects cleanly, the out-of-sync one waits
        (_record(isr=("b1", "b3")), "b2", {"b2": "h2:2", "b3": "h3:3"}, True, False,
         Decision(Step.WAIT)),
        (_record(isr=("b1", "b3")), "b3", {"b2": "h2:2", "b3": "h3:3"}, True, False,
         Decision(Step.ELECT, rank=0)),
        # a fresh (emptied) replica never elects
        (_record(isr=("b1",)), "b2", {"b2": "h2:2"}, True, True, Decision(Step.WAIT)),
        # the old leader alive: follow it, whatever the switch says
        (_record(isr=("b1",)), "b2", ALIVE, True, False, Decision(Step.FOLLOW, address="h1:1")),
    ],
)  # fmt: skip
def test_unclean_election_is_decided_only_when_allowed_and_no_isr_member_lives(  # noqa: PLR0917
    record: TopicRecord,
    me: str,
    alive: dict[str, str],
    unclean: bool,
    fresh: bool,
    wanted: Decision,
) -> None:
    """The unclean row of the module's table: a follower outside the isr, the leader gone.
    Expected: ELECT unclean at its rank among the alive out-of-sync replicas only when the
    switch is on and no isr member is alive; WAIT when off, while an isr member lives
    (which elects cleanly), or when fresh; FOLLOW while the leader lives."""
    got = decide(record, me, alive=alive, claimed=None, holds=True, fresh=fresh, unclean=unclean)
    assert got == wanted
