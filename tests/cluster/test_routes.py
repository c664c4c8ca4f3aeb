"""The route table, pure: each row of cluster.routes' table, from a state built by hand."""

from __future__ import annotations

import pytest

from cluster.records import BrokerRecord, Keys, TopicRecord, TopicState
from cluster.routes import Me, lookup, offline_topics, topic_route
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
