"""The controller's moves (:mod:`cluster.moves`) and its leadership move
(:func:`cluster.replica_txn.move_leadership`) on a real 3-member etcd: a reassignment
driven pass by pass to its end, fenced by the controller token; the automatic
preferred-leader move and replica move; an operator's request and cancel."""

from __future__ import annotations

import pytest

from cluster.errors import ReplicationSettingsError
from cluster.etcd import Compare, EtcdStore, Op
from cluster.moves import AUTO_MAX_MOVES, REBALANCE_THROTTLE, Mover, cancel, request
from cluster.records import (
    BrokerRecord,
    ControllerRecord,
    Keys,
    TopicRecord,
    TopicState,
    decode,
    encode,
)
from cluster.replica_txn import Outcome, move_leadership
from cluster.state import ClusterState
from cluster.view import View

pytestmark = pytest.mark.asyncio

TTL = 30
"""Seconds of the test leases (nobody keeps them alive; they must outlive the test)."""


async def _alive(store: EtcdStore, keys: Keys, *nodes: str) -> None:
    for node in nodes:
        lease, _ = await store.grant(TTL)
        record = BrokerRecord(node, f"127.0.0.1:{1000 + int(node[1:])}", 1, 0, "test")
        await store.put(keys.broker(node), encode(record), lease=lease)


async def _controller(store: EtcdStore, keys: Keys) -> int:
    lease, _ = await store.grant(TTL)
    record = encode(ControllerRecord("b1", "127.0.0.1:1001"))
    await store.txn(
        [Compare.absent(keys.controller)], [Op.put(keys.controller, record, lease=lease)]
    )
    held = await store.get(keys.controller)
    assert held is not None
    return held.create_revision


def _record(owner: str, replicas: tuple[str, ...], isr: tuple[str, ...]) -> TopicRecord:
    record = TopicRecord("t", "00112233aabbccdd", 2, 0, owner, 4, TopicState.READY)
    return record.replace(replicas=replicas, isr=isr, min_insync=2)


async def _stored(store: EtcdStore, keys: Keys) -> tuple[TopicRecord, int]:
    held = await store.get(keys.topic("t"))
    assert held is not None
    return decode(held.key, held.value, TopicRecord), held.mod_revision


async def _state(store: EtcdStore, keys: Keys) -> ClusterState:
    view = View(store, keys)
    await view.start()
    try:
        return view.state
    finally:
        await view.aclose()


async def test_move_leadership_is_fenced_and_only_to_an_alive_in_sync_replica(
    store: EtcdStore, prefix: str
) -> None:
    """t led by b1 at epoch 4, isr (b1, b2), b3 out of sync, all alive. Expected:
    a move to b3 is REFUSED (not in sync); a move to b2 is WON (owner b2, epoch 5, isr
    unchanged); with a stale token (the controller key re-created) a move back is STALE
    and writes nothing."""
    keys = Keys(prefix)
    await _alive(store, keys, "b1", "b2", "b3")
    token = await _controller(store, keys)
    record = _record("b1", ("b1", "b2", "b3"), ("b1", "b2"))
    rev = await store.put(keys.topic("t"), encode(record))
    out_of_sync = await move_leadership(
        store, keys, "t", record, rev, controller_token=token, to="b3"
    )
    assert out_of_sync.outcome is Outcome.REFUSED
    moved = await move_leadership(store, keys, "t", record, rev, controller_token=token, to="b2")
    assert moved.outcome is Outcome.WON
    stored, rev = await _stored(store, keys)
    assert (stored.owner, stored.epoch, stored.isr) == ("b2", 5, ("b1", "b2"))
    await store.delete_prefix(keys.controller)
    await _controller(store, keys)
    stale = await move_leadership(store, keys, "t", stored, rev, controller_token=token, to="b1")
    assert stale.outcome is Outcome.STALE, stale
    assert (await _stored(store, keys))[1] == rev


async def test_a_reassignment_is_driven_to_its_end_one_step_a_pass(
    store: EtcdStore, prefix: str
) -> None:
    """t on (b1, b2), b1 leading, asked to move to (b2, b3) with a throttle; b1..b3
    alive. Expected, pass by pass: b3 added (replicas (b2, b3, b1)); nothing while b3 is
    not in sync; once the leader has let b3 in: leadership to b2 (epoch 5); then b1
    dropped (replicas and isr (b2, b3)), reassign_to and the throttle cleared; then
    nothing more. A pass with a stale token returns False and writes nothing."""
    keys = Keys(prefix)
    await _alive(store, keys, "b1", "b2", "b3")
    token = await _controller(store, keys)
    await store.put(keys.topic("t"), encode(_record("b1", ("b1", "b2"), ("b1", "b2"))))
    before, _ = await request(store, keys, "t", ["b2", "b3"], throttle=5000)
    assert before.reassign_to == ()
    mover = Mover(store, keys)
    assert await mover.run_pass(await _state(store, keys), token)
    added, rev = await _stored(store, keys)
    assert (added.replicas, added.isr, added.reassign_to, added.reassign_throttle) == (
        ("b2", "b3", "b1"),
        ("b1", "b2"),
        ("b2", "b3"),
        5000,
    )
    assert await mover.run_pass(await _state(store, keys), token)
    assert (await _stored(store, keys))[1] == rev, "wrote while b3 was not in sync"
    await store.put(keys.topic("t"), encode(added.replace(isr=("b2", "b3", "b1"))))
    assert await mover.run_pass(await _state(store, keys), token)
    moved, _ = await _stored(store, keys)
    assert (moved.owner, moved.epoch) == ("b2", 5)
    assert await mover.run_pass(await _state(store, keys), token)
    done, rev = await _stored(store, keys)
    assert (done.owner, done.replicas, done.isr, done.reassign_to, done.reassign_throttle) == (
        "b2",
        ("b2", "b3"),
        ("b2", "b3"),
        (),
        0,
    )
    assert await mover.run_pass(await _state(store, keys), token)
    assert (await _stored(store, keys))[1] == rev
    await store.put(keys.topic("t"), encode(done.replace(reassign_to=("b3", "b2"))))
    _, rev = await _stored(store, keys)
    assert not await Mover(store, keys).run_pass(await _state(store, keys), token + 1000)
    assert (await _stored(store, keys))[1] == rev


async def test_auto_rebalance_moves_leadership_to_the_preferred_leader(
    store: EtcdStore, prefix: str
) -> None:
    """t's preferred leader b1 is alive and in sync while b2 leads. Expected: a mover
    without auto_rebalance leaves it; with auto_rebalance (interval 0) one pass makes b1
    the leader at epoch 5."""
    keys = Keys(prefix)
    await _alive(store, keys, "b1", "b2", "b3")
    token = await _controller(store, keys)
    rev = await store.put(
        keys.topic("t"), encode(_record("b2", ("b1", "b2", "b3"), ("b1", "b2", "b3")))
    )
    assert await Mover(store, keys, interval_s=0).run_pass(await _state(store, keys), token)
    assert (await _stored(store, keys))[1] == rev
    auto = Mover(store, keys, auto_rebalance=True, interval_s=0)
    assert await auto.run_pass(await _state(store, keys), token)
    moved, _ = await _stored(store, keys)
    assert (moved.owner, moved.epoch) == ("b1", 5)


async def test_a_request_is_refused_for_a_missing_topic_or_another_running_target(
    store: EtcdStore, prefix: str
) -> None:
    """Expected: a request for a missing topic, a target naming a broker twice or a
    broker not alive, or a second target while one runs raises ReplicationSettingsError
    and writes nothing; asking the running target again is accepted."""
    keys = Keys(prefix)
    await _alive(store, keys, "b1", "b2", "b3")
    with pytest.raises(ReplicationSettingsError, match="does not exist"):
        await request(store, keys, "t", ["b1", "b2"])
    assert await store.get(keys.topic("t")) is None
    await store.put(keys.topic("t"), encode(_record("b1", ("b1", "b2"), ("b1", "b2"))))
    with pytest.raises(ReplicationSettingsError, match="twice"):
        await request(store, keys, "t", ["b2", "b2"])
    with pytest.raises(ReplicationSettingsError, match="b9 not alive"):
        await request(store, keys, "t", ["b2", "b9"])
    await request(store, keys, "t", ["b2", "b3"])
    with pytest.raises(ReplicationSettingsError, match="being reassigned"):
        await request(store, keys, "t", ["b1", "b3"])
    _, after = await request(store, keys, "t", ["b2", "b3"])
    assert after.reassign_to == ("b2", "b3")


async def test_a_topic_of_one_copy_is_replicated_first_then_reassigned(
    store: EtcdStore, prefix: str
) -> None:
    """t is a factor-1 record (no replicas) owned by b1 at epoch 4; ``request`` to
    (b1, b2). Expected: the request is accepted (reassign_to (b1, b2), reassign_from
    (b1,)), the record still has no replicas; the first pass writes replicas = isr =
    (b1,) at epoch 5, reassign_to kept (owner b1); the second adds b2: replicas (b1, b2),
    isr (b1,). A cancel before the first pass clears the request and leaves the record
    of one copy (no replicas, epoch 4); a pass then writes nothing."""
    keys = Keys(prefix)
    await _alive(store, keys, "b1", "b2")
    token = await _controller(store, keys)
    single = TopicRecord("t", "00112233aabbccdd", 2, 0, "b1", 4, TopicState.READY)
    await store.put(keys.topic("t"), encode(single))
    _, asked = await request(store, keys, "t", ["b1", "b2"])
    assert (asked.replicas, asked.reassign_to, asked.reassign_from) == (
        (),
        ("b1", "b2"),
        ("b1",),
    )
    _, undone = await cancel(store, keys, "t")
    assert undone == single
    mover = Mover(store, keys)
    _, rev = await _stored(store, keys)
    assert await mover.run_pass(await _state(store, keys), token)
    assert await _stored(store, keys) == (single, rev)
    await request(store, keys, "t", ["b1", "b2"])
    assert await mover.run_pass(await _state(store, keys), token)
    one, _ = await _stored(store, keys)
    assert (one.owner, one.epoch, one.replicas, one.isr, one.reassign_to) == (
        "b1",
        5,
        ("b1",),
        ("b1",),
        ("b1", "b2"),
    )
    assert await mover.run_pass(await _state(store, keys), token)
    added, _ = await _stored(store, keys)
    assert (added.owner, added.epoch, added.replicas, added.isr) == ("b1", 5, ("b1", "b2"), ("b1",))


async def test_a_cancel_goes_back_to_the_original_replicas(store: EtcdStore, prefix: str) -> None:
    """t on (b1, b2) asked to move to (b3, b4) with a throttle; the mover adds b3, b4;
    b3 catches up and (the test writes what the move step would) takes the leadership;
    then ``cancel``. Expected: the cancel writes reassign_to (b1, b2) (reassign_from),
    throttle 0; a second cancel changes nothing; the next pass moves leadership back to
    b1 (epoch + 1) without waiting for b4; the next drops b3 and b4: replicas and isr
    (b1, b2), reassign_to and reassign_from empty; then nothing more, and a cancel is
    refused (none running)."""
    keys = Keys(prefix)
    await _alive(store, keys, "b1", "b2", "b3", "b4")
    token = await _controller(store, keys)
    await store.put(keys.topic("t"), encode(_record("b1", ("b1", "b2"), ("b1", "b2"))))
    await request(store, keys, "t", ["b3", "b4"], throttle=5000)
    mover = Mover(store, keys)
    assert await mover.run_pass(await _state(store, keys), token)
    added, _ = await _stored(store, keys)
    assert (added.replicas, added.reassign_from) == (("b3", "b4", "b1", "b2"), ("b1", "b2"))
    await store.put(
        keys.topic("t"), encode(added.replace(owner="b3", epoch=6, isr=("b3", "b1", "b2")))
    )
    _, asked = await cancel(store, keys, "t")
    assert (asked.reassign_to, asked.reassign_from, asked.reassign_throttle) == (
        ("b1", "b2"),
        ("b1", "b2"),
        0,
    )
    _, rev = await _stored(store, keys)
    await cancel(store, keys, "t")
    assert (await _stored(store, keys))[1] == rev
    assert await mover.run_pass(await _state(store, keys), token)
    back, _ = await _stored(store, keys)
    assert (back.owner, back.epoch, back.replicas) == ("b1", 7, ("b3", "b4", "b1", "b2"))
    assert await mover.run_pass(await _state(store, keys), token)
    done, rev = await _stored(store, keys)
    assert (done.owner, done.replicas, done.isr, done.reassign_to, done.reassign_from) == (
        "b1",
        ("b1", "b2"),
        ("b1", "b2"),
        (),
        (),
    )
    assert await mover.run_pass(await _state(store, keys), token)
    assert (await _stored(store, keys))[1] == rev
    with pytest.raises(ReplicationSettingsError, match="no reassignment"):
        await cancel(store, keys, "t")


async def test_auto_rebalance_starts_one_replica_move_to_an_empty_broker(
    store: EtcdStore, prefix: str
) -> None:
    """Three factor-2 topics over b1..b3 (two replicas each), b4 alive and empty.
    Expected: a mover with auto_rebalance (interval 0) starts one reassignment (at most
    AUTO_MAX_MOVES running): t3's replica on b1 to b4, with reassign_from its replicas
    and the rebalance throttle; the next pass (one running) starts no other."""
    keys = Keys(prefix)
    await _alive(store, keys, "b1", "b2", "b3", "b4")
    token = await _controller(store, keys)
    for name, replicas in (("t1", ("b1", "b2")), ("t2", ("b2", "b3")), ("t3", ("b3", "b1"))):
        record = _record(replicas[0], replicas, replicas).replace(name=name)
        await store.put(keys.topic(name), encode(record))
    auto = Mover(store, keys, auto_rebalance=True, interval_s=0)
    assert await auto.run_pass(await _state(store, keys), token)
    state = await _state(store, keys)
    moving = {n: t.record for n, t in state.topics.items() if t.record.reassign_to}
    assert list(moving) == ["t3"]
    assert (moving["t3"].reassign_to, moving["t3"].reassign_from) == (("b3", "b4"), ("b3", "b1"))
    assert moving["t3"].reassign_throttle == REBALANCE_THROTTLE
    assert AUTO_MAX_MOVES == 1
    assert await auto.run_pass(state, token)
    state = await _state(store, keys)
    assert sorted(n for n, t in state.topics.items() if t.record.reassign_to) == ["t3"]


async def test_a_request_below_min_insync_is_refused_and_one_replica_may_be_asked(
    store: EtcdStore, prefix: str
) -> None:
    """t on (b1, b2, b3), min_insync 2. Expected: a target of one replica is refused
    (below min_insync: every publish would be refused) and writes nothing; with
    min_insync 1 the same target is accepted (reassign_to (b1,), reassign_from the three)."""
    keys = Keys(prefix)
    await _alive(store, keys, "b1", "b2", "b3")
    record = _record("b1", ("b1", "b2", "b3"), ("b1", "b2", "b3"))
    rev = await store.put(keys.topic("t"), encode(record))
    with pytest.raises(ReplicationSettingsError, match="below its min_insync 2"):
        await request(store, keys, "t", ["b1"])
    assert (await _stored(store, keys))[1] == rev
    await store.put(keys.topic("t"), encode(record.replace(min_insync=1)))
    _, after = await request(store, keys, "t", ["b1"])
    assert (after.reassign_to, after.reassign_from) == (("b1",), ("b1", "b2", "b3"))
