"""Tests of :class:`broker.replica.manager.ReplicaManager`: the order of a switch between
leading and following, over a real TopicRegistry on a tmp dir, with recording leader and
follower roles (the real LeaderTopic and FollowerTopic have their own tests; the end-to-end
tests run them under the manager in real brokers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from broker.replica.manager import ReplicaManager
from broker.topics import Topic, TopicRegistry
from cluster.local import ChangeIsr
from cluster.records import TopicRecord, TopicState
from wal import LogConfig

TOPIC_ID = "9f0c1d2e3a4b5c6d"


def _record(epoch: int, owner: str = "b1") -> TopicRecord:
    return TopicRecord(
        "orders",
        TOPIC_ID,
        2,
        0,
        owner,
        epoch,
        TopicState.READY,
        replicas=("b1", "b2", "b3"),
        isr=("b1", "b2", "b3"),
        min_insync=2,
    )


class Roles:
    """Recording roles: every start, update and close lands in ``events``; a follower's
    close waits for ``append_done`` (an append in flight)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.manager: ReplicaManager | None = None
        self.append_done = asyncio.Event()
        self.append_done.set()
        #: Set: the next ``leading`` raises it (a state-log replay that failed).
        self.leading_fails: Exception | None = None

    def leader(self, topic: Topic, record: TopicRecord, change_isr: ChangeIsr) -> _Leader:
        return _Leader(self, record.epoch)

    def follower(self, topic: Topic, record: TopicRecord, address: str) -> _Follower:
        return _Follower(self, record.epoch, address)

    async def leading(self, name: str) -> None:
        failure, self.leading_fails = self.leading_fails, None
        if failure is not None:
            self.events.append(f"subscriptions failed {name}")
            raise failure
        self.events.append(f"subscriptions opened {name}")

    async def not_leading(self, name: str) -> None:
        assert self.manager is not None
        found = self.manager.leader(name) is not None
        self.events.append(f"subscriptions closed {name} (findable {found})")


class _Leader:
    def __init__(self, roles: Roles, epoch: int) -> None:
        self.roles, self.epoch = roles, epoch

    async def start(self) -> None:
        assert self.roles.manager is not None
        found = self.roles.manager.leader("orders") is not None
        self.roles.events.append(f"leader {self.epoch} start (findable {found})")

    def update(self, record: TopicRecord) -> None:
        self.roles.events.append(f"leader {self.epoch} update isr {list(record.isr)}")

    async def aclose(self) -> None:
        self.roles.events.append(f"leader {self.epoch} closed")


class _Follower:
    def __init__(self, roles: Roles, epoch: int, address: str) -> None:
        self.roles, self.epoch, self.address = roles, epoch, address

    async def start(self) -> None:
        self.roles.events.append(f"follower {self.epoch} {self.address} start")

    def update(self, record: TopicRecord, leader_address: str) -> None:
        self.roles.events.append(f"follower update {record.epoch} {leader_address}")

    async def aclose(self) -> None:
        await self.roles.append_done.wait()
        self.roles.events.append(f"follower {self.epoch} closed")


@pytest_asyncio.fixture
async def manager(tmp_path: Path) -> AsyncIterator[tuple[ReplicaManager, Roles]]:
    topics = TopicRegistry(str(tmp_path), LogConfig())
    await topics.open()
    await topics.create("orders", 2, topic_id=TOPIC_ID)
    roles = Roles()
    made = ReplicaManager(
        topics,
        make_leader=roles.leader,
        make_follower=roles.follower,
        on_leading=roles.leading,
        on_not_leading=roles.not_leading,
    )
    roles.manager = made
    try:
        yield made, roles
    finally:
        await made.aclose()
        await topics.aclose()


@pytest.mark.asyncio
async def test_switches_run_in_the_documented_order(
    manager: tuple[ReplicaManager, Roles],
) -> None:
    """Follow b1 at epoch 1, then lead at epoch 2, then follow b3 at epoch 3. Expected:
    the follower is closed before the leader starts; the leader is findable only after its
    start and the subscriptions open after it; on the way back the subscriptions close
    while it is no longer findable, then the leader closes, then the follower starts."""
    made, roles = manager
    await made.follow("orders", _record(1), "h1:1")
    await made.lead("orders", _record(2, "b2"))
    assert made.leader("orders") is not None
    await made.follow("orders", _record(3, "b3"), "h3:3")
    assert made.leader("orders") is None
    assert roles.events == [
        "follower 1 h1:1 start",
        "follower 1 closed",
        "leader 2 start (findable False)",
        "subscriptions opened orders",
        "subscriptions closed orders (findable False)",
        "leader 2 closed",
        "follower 3 h3:3 start",
    ]
    assert made.roles() == {"orders": ("follower", 3)}


@pytest.mark.asyncio
async def test_a_new_record_of_the_same_role_is_passed_on(
    manager: tuple[ReplicaManager, Roles],
) -> None:
    """Lead at epoch 2, then the same epoch with a smaller isr, then epoch 3 (a claim in
    a new session); follow, then the same leader again, then a new address. Expected: the
    isr change is an update of the same leader; a new epoch replaces the leader; the same
    leader again does nothing; a new address replaces the follower (the old one closed
    first)."""
    made, roles = manager
    await made.lead("orders", _record(2))
    await made.lead("orders", _record(2).replace(isr=("b1", "b2")))
    await made.lead("orders", _record(3))
    roles.events.clear()
    await made.follow("orders", _record(4, "b2"), "h2:2")
    await made.follow("orders", _record(4, "b2"), "h2:2")
    await made.follow("orders", _record(4, "b2"), "h2:9")
    assert roles.events == [
        "subscriptions closed orders (findable False)",
        "leader 3 closed",
        "follower 4 h2:2 start",
        "follower 4 closed",
        "follower 4 h2:9 start",
    ]


@pytest.mark.asyncio
async def test_a_leader_starts_only_after_the_followers_append_in_flight(
    manager: tuple[ReplicaManager, Roles],
) -> None:
    """Following, with an append in flight (the follower's close waits for it); the broker
    is told to lead. Expected: the leader does not start (and is not findable) until the
    append finished and the follower closed."""
    made, roles = manager
    await made.follow("orders", _record(1), "h1:1")
    roles.append_done.clear()
    switch = asyncio.create_task(made.lead("orders", _record(2, "b2")))
    await asyncio.sleep(0.05)
    assert made.leader("orders") is None
    assert not any(e.startswith("leader") for e in roles.events)
    roles.append_done.set()
    await switch
    assert roles.events[-3:] == [
        "follower 1 closed",
        "leader 2 start (findable False)",
        "subscriptions opened orders",
    ]
    assert made.leader("orders") is not None


@pytest.mark.asyncio
async def test_stop_and_aclose_end_every_role(manager: tuple[ReplicaManager, Roles]) -> None:
    """Lead, stop twice, follow, aclose. Expected: each role closed once; nothing left."""
    made, roles = manager
    await made.lead("orders", _record(2))
    await made.stop("orders")
    await made.stop("orders")
    await made.follow("orders", _record(3, "b2"), "h2:2")
    await made.aclose()
    assert roles.events.count("leader 2 closed") == 1
    assert roles.events[-1] == "follower 3 closed"
    assert made.roles() == {}


@pytest.mark.asyncio
async def test_a_failed_takeover_leaves_nothing_half_led_and_a_retry_leads(
    manager: tuple[ReplicaManager, Roles],
) -> None:
    """Follow b1 at epoch 1, then lead at epoch 2 while ``on_leading`` raises (the state
    log's replay failed), then lead at epoch 3 (the member's retry). Expected: the lead
    raises that error; the leader started at 2 is no longer findable and is closed
    (its subscriptions hook called), no role is left (the same epoch asked again would
    otherwise be taken as led); the lead at 3 starts a new leader and opens the
    subscriptions."""
    made, roles = manager
    await made.follow("orders", _record(1), "h1:1")
    roles.leading_fails = OSError("replay failed (test)")
    with pytest.raises(OSError, match="replay failed"):
        await made.lead("orders", _record(2, "b2"))
    assert made.leader("orders") is None
    assert made.roles() == {}
    await made.lead("orders", _record(3, "b2"))
    assert made.leader("orders") is not None
    assert roles.events == [
        "follower 1 h1:1 start",
        "follower 1 closed",
        "leader 2 start (findable False)",
        "subscriptions failed orders",
        "subscriptions closed orders (findable False)",
        "leader 2 closed",
        "leader 3 start (findable False)",
        "subscriptions opened orders",
    ]
