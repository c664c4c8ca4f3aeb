"""The route table, pure: each row of cluster.routes' table, from a state built by hand."""

from __future__ import annotations

import pytest

from cluster.records import BrokerRecord, Keys, TopicRecord, TopicState
from cluster.routes import Me, lookup, offline_topics, topic_route, under_replicated_topics
from cluster.state import Broker, ClusterState, Topic


def _state(owner: str, state: TopicState, live: tuple[str, ...] = ("b1", "b2")) -> ClusterState:
    cluster = ClusterState(Keys("/h/"))
    for node in live:
        cluster.brokers[node] = Broker(BrokerRecord(node, f"{node}:1", 1, 0, "v", 1_000), 1)
    record = TopicRecord("t", "0" * 16, 2, 0, owner, 3, state)
    cluster.topics["t"] = Topic(record, 10)
    cluster.revision = 10
    return cluster


def _me(claimed: int | None = 3, may_write: bool = True, local: bool = True) -> Me:
    return Me("b1", {} if claimed is None else {"t": claimed}, may_write, lambda _: local)


@pytest.mark.parametrize(
    ("owner", "state", "live", "me", "online", "reason"),
    [
        ("", TopicState.PLACING, ("b1",), _me(), False, "creating"),
        ("b2", TopicState.CREATING, ("b1", "b2"), _me(), False, "creating"),
        ("b2", TopicState.CREATING, ("b1",), _me(), False, "offline"),
        ("b2", TopicState.READY, ("b1",), _me(), False, "offline"),
        ("b2", TopicState.DELETING, ("b1", "b2"), _me(), False, "offline"),
        ("b2", TopicState.READY, ("b1", "b2"), _me(), True, ""),
        ("b1", TopicState.READY, ("b1",), _me(local=False), False, "data-missing"),
        ("b1", TopicState.READY, ("b1",), _me(claimed=None), False, "no-session"),
        ("b1", TopicState.READY, ("b1",), _me(claimed=2), False, "no-session"),
        ("b1", TopicState.READY, ("b1",), _me(may_write=False), False, "no-session"),
        ("b1", TopicState.READY, ("b1",), _me(), True, ""),
    ],
)
def test_route_table(  # noqa: PLR0917 - one argument per column of the table
    owner: str, state: TopicState, live: tuple[str, ...], me: Me, online: bool, reason: str
) -> None:
    """Each row: whether the topic is online as b1 sees it and, if not, the reason; a
    live owner's address is given, a dead one's is empty; an offline topic has a
    message for a person."""
    route = topic_route(_state(owner, state, live), "t", me)
    assert (route.online, route.reason) == (online, reason)
    assert route.owner_address == (f"{owner}:1" if owner in live else "")
    assert (route.epoch, route.partitions, route.state) == (3, 2, state.value)
    assert bool(route.message) == (not online)


def test_absent_topic_and_lookup_answer() -> None:
    """An unknown name is an absent route, not an error; the lookup lists asked names in
    order, every broker (a dead owner too, not alive), and offline topics with reasons."""
    cluster = _state("b3", TopicState.READY)  # b3 owns t but is not live
    answer = lookup(cluster, ["zzz", "t"], _me(), now_ms=3_000)
    assert [(r.topic, r.state) for r in answer.routes] == [("zzz", "absent"), ("t", "ready")]
    brokers = {b.node_id: b for b in answer.brokers}
    assert (brokers["b3"].alive, brokers["b3"].address, brokers["b3"].partitions) == (
        False,
        "",
        2,
    )
    assert brokers["b1"].alive
    assert brokers["b1"].session_age_s == pytest.approx(2.0)
    assert [(o.topic, o.owner_node, o.reason) for o in offline_topics(cluster, _me())] == [
        ("t", "b3", "offline")
    ]


def _replicated(cluster: ClusterState, name: str, **fields: object) -> None:
    record = TopicRecord(name, "1" * 16, 1, 0, "b1", 2, TopicState.READY).replace(**fields)
    cluster.topics[name] = Topic(record, 11)


def test_routes_carry_the_replica_sets_and_the_status_lists_under_replicated() -> None:
    """Scenario: b1 and b2 live, b3 dead; ``t`` of one replica (issue 36's record) on b2;
    ``low`` on b1,b2,b3 with isr b1 and min_insync 2; ``ok`` on b1,b2,b3 with isr b1,b2
    and min_insync 2; ``full`` with every replica in sync; ``new`` still creating with
    isr b1. Expected: routes carry the sets (``t``: its owner alone, min_insync 1); the
    under-replicated list is ``low`` then ``ok`` by name, each naming b3 as not running
    and (for ``low``) b2 as catching up, ``low`` refused and ``ok`` accepted; ``full``,
    ``t`` and the creating ``new`` are not listed; a placing topic's route has no sets."""
    cluster = _state("b2", TopicState.READY)
    three = ("b1", "b2", "b3")
    _replicated(cluster, "low", replicas=three, isr=("b1",), min_insync=2)
    _replicated(cluster, "ok", replicas=three, isr=("b1", "b2"), min_insync=2)
    _replicated(cluster, "full", replicas=("b1", "b2"), isr=("b2", "b1"))
    _replicated(cluster, "new", replicas=three, isr=("b1",), state=TopicState.CREATING)
    _replicated(cluster, "wait", owner="", epoch=0, state=TopicState.PLACING, factor=3)
    t = topic_route(cluster, "t", _me())
    assert (t.replicas, t.isr, t.min_insync) == (("b2",), ("b2",), 1)
    low = topic_route(cluster, "low", _me())
    assert (low.replicas, low.isr, low.min_insync) == (three, ("b1",), 2)
    wait = topic_route(cluster, "wait", _me())
    assert (wait.replicas, wait.isr, wait.min_insync) == ((), (), 0)
    listed = under_replicated_topics(cluster)
    assert [(u.topic, u.owner_node, u.epoch, u.isr) for u in listed] == [
        ("low", "b1", 2, ("b1",)),
        ("ok", "b1", 2, ("b1", "b2")),
    ]
    assert "1 of 3 replicas in sync (b3 not running; b2 catching up)" in listed[0].message
    assert "min_insync is 2: publishes are refused (not-enough-replicas)" in listed[0].message
    assert "2 of 3 replicas in sync (b3 not running)" in listed[1].message
    assert listed[1].message.endswith("publishes are accepted")
