"""The replica group's transactions (:mod:`cluster.replica_txn`) on a real 3-member etcd:
elections (one winner, only from the isr, never while the old leader lives), the leader's
fence (epoch and session) on isr changes and transfers, the controller's token on replica
set changes, and an election that rides over the etcd leader's SIGKILL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypedDict

import pytest

from cluster import replica_txn
from cluster.errors import EtcdUnavailableError
from cluster.etcd import Compare, EtcdStore, Op
from cluster.records import DefaultsRecord, Keys, TopicRecord, TopicState, decode, encode
from cluster.replica_txn import (
    ChangeResult,
    Outcome,
    elect,
    expand_isr,
    replicate_single,
    set_replicas,
    shrink_isr,
    transfer_leadership,
)
from tests.cluster.etcd_harness import EtcdCluster, Member

ALIVE_TTL = 30
"""Seconds of a test broker's lease that must outlive the test (nobody keeps it alive)."""


class _Fence(TypedDict):
    """A leader's fence, as keyword arguments of the leader's calls."""

    leader: str
    epoch: int
    leader_lease: int


def _record(name: str, owner: str = "b1", isr: tuple[str, ...] = ("b1", "b2", "b3")) -> TopicRecord:
    """``name`` led by ``owner`` at epoch 4 over (b1, b2, b3), in sync: ``isr``."""
    record = TopicRecord(name, "00112233aabbccdd", 2, 0, owner, 4, TopicState.READY)
    return record.replace(replicas=("b1", "b2", "b3"), isr=isr, min_insync=2)


async def _alive(store: EtcdStore, keys: Keys, node: str, ttl: int = ALIVE_TTL) -> int:
    """Register ``node``'s broker key under a new lease (a session); returns the lease."""
    lease, _ = await store.grant(ttl)
    key = keys.broker(node)
    written = await store.txn([Compare.absent(key)], [Op.put(key, b"{}", lease=lease)])
    assert written.succeeded
    return lease


async def _seed(store: EtcdStore, keys: Keys, record: TopicRecord) -> int:
    """Write ``record`` and return its mod_revision (what the callers read)."""
    return await store.put(keys.topic(record.name), encode(record))


async def _stored(store: EtcdStore, keys: Keys, name: str) -> tuple[TopicRecord, int]:
    held = await store.get(keys.topic(name))
    assert held is not None
    return decode(held.key, held.value, TopicRecord), held.mod_revision


@asynccontextmanager
async def _stores(
    endpoints: list[str], count: int, timeout_s: float = 3.0
) -> AsyncIterator[list[EtcdStore]]:
    """``count`` connections of their own (each broker has its own)."""
    opened = [await EtcdStore.connect(endpoints, timeout_s=timeout_s) for _ in range(count)]
    try:
        yield opened
    finally:
        for store in opened:
            await store.aclose()


# -- election -----------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("round_", range(4))
async def test_two_candidates_electing_at_once_exactly_one_wins(
    etcd: EtcdCluster, store: EtcdStore, prefix: str, round_: int
) -> None:
    """b1 led t at epoch 4 and its session ended (lease revoked: its broker key went). b2
    and b3, both in sync and alive, each on its own etcd connection, elect at the same
    moment from the same read: exactly one is WON, the other LOST_RACE; the record names
    the winner at epoch 5 with b1 out of the isr."""
    keys = Keys(prefix)
    await store.revoke(await _alive(store, keys, "b1"))
    leases = {node: await _alive(store, keys, node) for node in ("b2", "b3")}
    name = f"t{round_}"
    record, rev = _record(name), await _seed(store, keys, _record(name))
    async with _stores(etcd.endpoints, 2) as (s2, s3):
        results = await asyncio.gather(
            elect(s2, keys, name, record, rev, candidate="b2", candidate_lease=leases["b2"]),
            elect(s3, keys, name, record, rev, candidate="b3", candidate_lease=leases["b3"]),
        )
    outcomes = sorted(r.outcome.value for r in results)
    assert outcomes == ["lost-race", "won"]
    winner = ("b2", "b3")[[r.outcome for r in results].index(Outcome.WON)]
    stored, _ = await _stored(store, keys, name)
    assert (stored.owner, stored.epoch, stored.isr) == (winner, 5, ("b2", "b3"))
    loser = next(r for r in results if r.outcome is Outcome.LOST_RACE)
    assert loser.record == stored


@pytest.mark.asyncio
async def test_election_is_refused_while_the_old_leaders_broker_key_is_alive(
    store: EtcdStore, prefix: str
) -> None:
    """b1's session still holds (its broker key exists): b2's election is REFUSED naming
    b1, and the record is not written."""
    keys = Keys(prefix)
    await _alive(store, keys, "b1")
    lease = await _alive(store, keys, "b2")
    rev = await _seed(store, keys, _record("t"))
    result = await elect(store, keys, "t", _record("t"), rev, candidate="b2", candidate_lease=lease)
    assert result.outcome is Outcome.REFUSED
    assert "b1 is alive" in result.reason
    assert (await _stored(store, keys, "t"))[1] == rev


@pytest.mark.asyncio
async def test_a_candidate_outside_the_isr_cannot_win_unless_unclean_and_no_isr_alive(
    store: EtcdStore, prefix: str
) -> None:
    """isr (b1, b2); b1 dead. b3 (out of sync): REFUSED, nothing sent. Unclean (the
    cluster's switch on) while b2 (in sync) is alive: REFUSED by the guard on b2's key,
    nothing written. b2's session ends too: with the switch turned off, REFUSED (it is
    read from etcd, not trusted from the caller); on again: b3's unclean election is WON,
    isr (b3,), epoch 5."""
    keys = Keys(prefix)
    await store.revoke(await _alive(store, keys, "b1"))
    b2 = await _alive(store, keys, "b2")
    b3 = await _alive(store, keys, "b3")
    record = _record("t", isr=("b1", "b2"))
    rev = await _seed(store, keys, record)
    clean = await elect(store, keys, "t", record, rev, candidate="b3", candidate_lease=b3)
    assert clean.outcome is Outcome.REFUSED
    assert "not in the in-sync set" in clean.reason
    switch_on = encode(DefaultsRecord(unclean_leader_election=True))
    await store.put(keys.config_defaults, switch_on)
    unclean = await elect(
        store, keys, "t", record, rev, candidate="b3", candidate_lease=b3, unclean=True
    )
    assert unclean.outcome is Outcome.REFUSED
    assert "b2 is alive" in unclean.reason
    assert (await _stored(store, keys, "t"))[1] == rev
    await store.revoke(b2)
    await store.put(keys.config_defaults, encode(DefaultsRecord()))
    off = await elect(
        store, keys, "t", record, rev, candidate="b3", candidate_lease=b3, unclean=True
    )
    assert off.outcome is Outcome.REFUSED
    assert "unclean election is off" in off.reason
    assert (await _stored(store, keys, "t"))[1] == rev
    await store.put(keys.config_defaults, switch_on)
    won = await elect(
        store, keys, "t", record, rev, candidate="b3", candidate_lease=b3, unclean=True
    )
    assert won.outcome is Outcome.WON
    stored, _ = await _stored(store, keys, "t")
    assert (stored.owner, stored.epoch, stored.isr) == ("b3", 5, ("b3",))


@pytest.mark.asyncio
async def test_an_unclean_election_fails_when_the_switch_is_turned_off_while_it_runs(
    store: EtcdStore, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """isr (b1, b2), both dead; the cluster's defaults turn unclean election on; b3 (out of
    sync) reads the switch's revision, then an operator turns it off before b3's
    transaction runs (the read is made to return the revision from before the change).
    Expected: REFUSED, "turned off", the record unchanged: the switch is a guard the
    transaction compares, not a view that may lag."""
    keys = Keys(prefix)
    await store.revoke(await _alive(store, keys, "b1"))
    await store.revoke(await _alive(store, keys, "b2"))
    b3 = await _alive(store, keys, "b3")
    record = _record("t", isr=("b1", "b2"))
    rev = await _seed(store, keys, record)
    await store.put(keys.config_defaults, encode(DefaultsRecord(unclean_leader_election=True)))
    held = await store.get(keys.config_defaults)
    assert held is not None

    real = replica_txn._unclean_switch_revision
    calls: list[int] = []

    async def read_before_the_change(store_: EtcdStore, keys_: Keys) -> int | None:
        calls.append(1)
        if len(calls) > 1:  # the failed answer's classification reads it as it is
            return await real(store_, keys_)
        await store.put(keys.config_defaults, encode(DefaultsRecord()))  # the operator
        return held.mod_revision

    monkeypatch.setattr(replica_txn, "_unclean_switch_revision", read_before_the_change)
    result = await elect(
        store, keys, "t", record, rev, candidate="b3", candidate_lease=b3, unclean=True
    )
    assert result.outcome is Outcome.REFUSED
    assert "turned off" in result.reason
    assert (await _stored(store, keys, "t"))[1] == rev


@pytest.mark.asyncio
async def test_a_candidate_whose_session_lapsed_is_stale(store: EtcdStore, prefix: str) -> None:
    """b2 elects with a lease that no longer holds its broker key (its session ended and
    a new one began): STALE, nothing written."""
    keys = Keys(prefix)
    await store.revoke(await _alive(store, keys, "b1"))
    old = await _alive(store, keys, "b2")
    await store.revoke(old)
    await _alive(store, keys, "b2")
    rev = await _seed(store, keys, _record("t"))
    result = await elect(store, keys, "t", _record("t"), rev, candidate="b2", candidate_lease=old)
    assert result.outcome is Outcome.STALE
    assert (await _stored(store, keys, "t"))[1] == rev


@pytest.mark.asyncio
async def test_an_election_retried_after_it_applied_is_won_once(
    store: EtcdStore, prefix: str
) -> None:
    """etcd3aio's retry case: the election applied but its caller did not learn it (the
    reply lost; the call raised unavailable). The same call again, from the same read, is
    WON with the record of the first, and the epoch rose once."""
    keys = Keys(prefix)
    await store.revoke(await _alive(store, keys, "b1"))
    lease = await _alive(store, keys, "b2")
    rev = await _seed(store, keys, _record("t"))
    first = await elect(store, keys, "t", _record("t"), rev, candidate="b2", candidate_lease=lease)
    again = await elect(store, keys, "t", _record("t"), rev, candidate="b2", candidate_lease=lease)
    assert (first.outcome, again.outcome) == (Outcome.WON, Outcome.WON)
    assert again.mod_revision == first.mod_revision
    stored, mod_revision = await _stored(store, keys, "t")
    assert (stored.epoch, mod_revision) == (5, first.mod_revision)


# -- the leader's fence -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_stale_leader_cannot_shrink_the_isr(store: EtcdStore, prefix: str) -> None:
    """FENCE: b1 led at epoch 4 (read at revision R). Its session lapsed, b2 was elected
    (epoch 5), and b1 came back with a new session. b1 shrinks the isr from its old read:
    the record passes b1's own check (owner b1, epoch 4) but the transaction compares R
    and fails; the re-read shows b2 at epoch 5: STALE, and b2's record stands. The new
    leader's shrink goes through."""
    keys = Keys(prefix)
    old_session = await _alive(store, keys, "b1")
    b2 = await _alive(store, keys, "b2")
    record = _record("t")
    rev = await _seed(store, keys, record)
    await store.revoke(old_session)
    won = await elect(store, keys, "t", record, rev, candidate="b2", candidate_lease=b2)
    assert won.outcome is Outcome.WON
    b1 = await _alive(store, keys, "b1")
    stale = await shrink_isr(
        store, keys, "t", record, rev, leader="b1", epoch=4, leader_lease=b1, remove={"b3"}
    )
    assert stale.outcome is Outcome.STALE
    assert "no longer leads" in stale.reason
    assert await _stored(store, keys, "t") == (won.record, won.mod_revision)
    assert won.record is not None
    shrunk = await shrink_isr(
        store,
        keys,
        "t",
        won.record,
        won.mod_revision,
        leader="b2",
        epoch=5,
        leader_lease=b2,
        remove={"b3"},
    )
    assert shrunk.outcome is Outcome.WON
    assert (await _stored(store, keys, "t"))[0].isr == ("b2",)


@pytest.mark.asyncio
async def test_a_leader_whose_lease_expired_cannot_write(store: EtcdStore, prefix: str) -> None:
    """FENCE: b1 leads t at epoch 4 on a 2 s lease that nobody renews. Once etcd expired
    it (its broker key is gone), b1's isr shrink, isr expand and leadership transfer from
    the current record are each STALE, and the record is never written."""
    keys = Keys(prefix)
    lease = await _alive(store, keys, "b1", ttl=2)
    await _alive(store, keys, "b2")
    record = _record("t", isr=("b1", "b2"))
    rev = await _seed(store, keys, record)
    for _ in range(100):  # etcd expires it within the TTL and its expiry slack
        if await store.get(keys.broker("b1")) is None:
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("b1's 2 s lease did not expire within 10 s")
    fence = _Fence(leader="b1", epoch=4, leader_lease=lease)
    results = [
        await shrink_isr(store, keys, "t", record, rev, remove={"b2"}, **fence),
        await expand_isr(store, keys, "t", record, rev, add={"b3"}, **fence),
        await transfer_leadership(store, keys, "t", record, rev, to="b2", **fence),
    ]
    assert [r.outcome for r in results] == [Outcome.STALE] * 3
    assert all("session lapsed" in r.reason for r in results)
    assert (await _stored(store, keys, "t"))[1] == rev


@pytest.mark.asyncio
async def test_isr_changes_by_the_leader(store: EtcdStore, prefix: str) -> None:
    """The leader at its epoch adds a caught-up replica (the isr stays in preferred order),
    cannot add a broker that is no replica nor remove itself, and removing a member that
    is already out writes nothing."""
    keys = Keys(prefix)
    lease = await _alive(store, keys, "b2")
    record = _record("t", owner="b2", isr=("b2",))
    rev = await _seed(store, keys, record)
    fence = _Fence(leader="b2", epoch=4, leader_lease=lease)
    added = await expand_isr(store, keys, "t", record, rev, add={"b1"}, **fence)
    assert added.outcome is Outcome.WON
    assert added.record is not None
    assert added.record.isr == ("b1", "b2")
    stranger = await expand_isr(
        store, keys, "t", added.record, added.mod_revision, add={"b9"}, **fence
    )
    itself = await shrink_isr(
        store, keys, "t", added.record, added.mod_revision, remove={"b2"}, **fence
    )
    noop = await shrink_isr(
        store, keys, "t", added.record, added.mod_revision, remove={"b3"}, **fence
    )
    assert (stranger.outcome, itself.outcome, noop.outcome) == (
        Outcome.REFUSED,
        Outcome.REFUSED,
        Outcome.WON,
    )
    assert (await _stored(store, keys, "t"))[1] == added.mod_revision


@pytest.mark.asyncio
async def test_graceful_transfer_to_an_in_sync_follower(store: EtcdStore, prefix: str) -> None:
    """b1 hands t to b2 (alive, in sync): epoch 5, b1 leaves the isr (controlled shutdown).
    A transfer to an out-of-sync replica, or to a broker whose session is gone, is REFUSED
    and writes nothing."""
    keys = Keys(prefix)
    b1 = await _alive(store, keys, "b1")
    await _alive(store, keys, "b2")
    record = _record("t", isr=("b1", "b2", "b3"))
    rev = await _seed(store, keys, record)
    fence = _Fence(leader="b1", epoch=4, leader_lease=b1)
    dead = await transfer_leadership(store, keys, "t", record, rev, to="b3", **fence)
    assert dead.outcome is Outcome.REFUSED
    assert "not alive" in dead.reason
    lagging = record.replace(isr=("b1", "b2"))
    rev = await _seed(store, keys, lagging)
    await _alive(store, keys, "b3")
    out = await transfer_leadership(store, keys, "t", lagging, rev, to="b3", **fence)
    assert out.outcome is Outcome.REFUSED
    assert (await _stored(store, keys, "t"))[1] == rev
    moved = await transfer_leadership(
        store, keys, "t", lagging, rev, to="b2", leave_isr=True, **fence
    )
    assert moved.outcome is Outcome.WON
    stored, _ = await _stored(store, keys, "t")
    assert (stored.owner, stored.epoch, stored.isr) == ("b2", 5, ("b2",))


# -- the controller's replica set changes -------------------------------------------------


async def _controller(store: EtcdStore, keys: Keys) -> int:
    """Become controller (the key created under a lease); returns the fencing token."""
    lease, _ = await store.grant(ALIVE_TTL)
    await store.txn(
        [Compare.absent(keys.controller)], [Op.put(keys.controller, b"{}", lease=lease)]
    )
    held = await store.get(keys.controller)
    assert held is not None
    assert held.lease == lease
    return held.create_revision


@pytest.mark.asyncio
async def test_set_replicas_is_fenced_by_the_controller_token(
    store: EtcdStore, prefix: str
) -> None:
    """A controller adds b4 to t's replicas (reassign_to set): WON, b4 not yet in the isr.
    A controller deposed since (its key re-created: a new token) is STALE and writes
    nothing. Dropping the leader from the replicas is REFUSED: move leadership first."""
    keys = Keys(prefix)
    token = await _controller(store, keys)
    record = _record("t", isr=("b1", "b2"))
    rev = await _seed(store, keys, record)
    added = await set_replicas(
        store,
        keys,
        "t",
        record,
        rev,
        controller_token=token,
        replicas=("b4", "b1", "b2", "b3"),
        reassign_to=("b4", "b1", "b2"),
    )
    assert added.outcome is Outcome.WON
    stored, rev = await _stored(store, keys, "t")
    assert (stored.replicas, stored.isr, stored.reassign_to) == (
        ("b4", "b1", "b2", "b3"),
        ("b1", "b2"),
        ("b4", "b1", "b2"),
    )
    no_leader = await set_replicas(
        store, keys, "t", stored, rev, controller_token=token, replicas=("b2", "b3")
    )
    assert no_leader.outcome is Outcome.REFUSED
    await store.delete_prefix(keys.controller)
    new_token = await _controller(store, keys)
    stale = await set_replicas(
        store, keys, "t", stored, rev, controller_token=token, replicas=("b1", "b2")
    )
    assert stale.outcome is Outcome.STALE
    assert str(new_token) in stale.reason
    assert (await _stored(store, keys, "t"))[1] == rev


@pytest.mark.asyncio
async def test_replicate_single_is_fenced_and_only_for_a_topic_of_one_copy(
    store: EtcdStore, prefix: str
) -> None:
    """t is a factor-1 record owned by b1 at epoch 4. A deposed controller (stale token)
    is STALE and writes nothing; the current one WINS: replicas = isr = (b1,), epoch 5,
    reassign_to (b1, b2); called again with the same arguments (a lost reply) it is WON
    too and writes nothing more; on the now replicated record it is REFUSED."""
    keys = Keys(prefix)
    old_token = await _controller(store, keys)
    await store.delete_prefix(keys.controller)
    token = await _controller(store, keys)
    single = TopicRecord("t", "00112233aabbccdd", 2, 0, "b1", 4, TopicState.READY)
    rev = await _seed(store, keys, single)
    stale = await replicate_single(
        store, keys, "t", single, rev, controller_token=old_token, reassign_to=("b1", "b2")
    )
    assert stale.outcome is Outcome.STALE
    assert (await _stored(store, keys, "t")) == (single, rev)
    won = await replicate_single(
        store, keys, "t", single, rev, controller_token=token, reassign_to=("b1", "b2")
    )
    assert won.outcome is Outcome.WON
    stored, new_rev = await _stored(store, keys, "t")
    assert (stored.owner, stored.epoch, stored.replicas, stored.isr, stored.reassign_to) == (
        "b1",
        5,
        ("b1",),
        ("b1",),
        ("b1", "b2"),
    )
    again = await replicate_single(
        store, keys, "t", single, rev, controller_token=token, reassign_to=("b1", "b2")
    )
    assert again.outcome is Outcome.WON
    assert (await _stored(store, keys, "t"))[1] == new_rev
    refused = await replicate_single(
        store, keys, "t", stored, new_rev, controller_token=token, reassign_to=("b1", "b2")
    )
    assert refused.outcome is Outcome.REFUSED
    assert (await _stored(store, keys, "t"))[1] == new_rev


# -- the etcd leader SIGKILLed during an election ----------------------------------------


async def _elect_until_known(
    store: EtcdStore, keys: Keys, name: str, rev: int, *, node: str, lease: int
) -> tuple[ChangeResult, int, float]:
    """Elect, calling again with the same arguments while etcd's answer is unknown (the
    shell's rule); returns the result, how many calls were unknown, and the seconds taken."""
    unknown, started = 0, time.monotonic()
    while True:
        try:
            result = await elect(
                store, keys, name, _record(name), rev, candidate=node, candidate_lease=lease
            )
            return result, unknown, time.monotonic() - started
        except EtcdUnavailableError:
            unknown += 1
            await asyncio.sleep(0.05)


async def _kill_after(cluster: EtcdCluster, member: Member, delay_s: float | None) -> None:
    if delay_s is not None:
        await asyncio.sleep(delay_s)
        await asyncio.to_thread(cluster.kill, member)


@pytest.mark.asyncio
async def test_the_etcd_leader_killed_during_an_election_still_gives_one_leader(
    own_etcd: EtcdCluster, prefix: str
) -> None:
    """Three rounds: b1's session is gone; b2 and b3 (each on its own connection) elect at
    once while the etcd Raft leader is SIGKILLed (just before they start, then twice at the
    same moment); each calls again while etcd's answer is unknown (here: 0-1 such calls
    each, 1-1.6 s to a result). Exactly one ends
    WON, the other LOST_RACE, and the record names the winner at epoch 5 (one rise, not
    two). The killed member is restarted between rounds."""
    keys = Keys(prefix)
    async with (
        _stores(own_etcd.endpoints, 1, timeout_s=5.0) as (admin,),
        _stores(own_etcd.endpoints, 2, timeout_s=1.0) as (s2, s3),  # short: unknowns happen
    ):
        await admin.revoke(await _alive(admin, keys, "b1"))
        b2, b3 = await _alive(admin, keys, "b2"), await _alive(admin, keys, "b3")
        for round_, kill_after_s in enumerate((None, 0.0, 0.0)):
            name = f"t{round_}"
            rev = await _seed(admin, keys, _record(name))
            leader = own_etcd.leader()
            if kill_after_s is None:  # killed first: the elections meet etcd's own election
                await asyncio.to_thread(own_etcd.kill, leader)
            results = await asyncio.gather(
                _elect_until_known(s2, keys, name, rev, node="b2", lease=b2),
                _elect_until_known(s3, keys, name, rev, node="b3", lease=b3),
                _kill_after(own_etcd, leader, kill_after_s),
            )
            for node, (_, unknown, took_s) in zip(("b2", "b3"), results[:2], strict=False):
                print(f"round {round_}: {node} {unknown} unknown answers, {took_s:.2f} s")
            outcomes = sorted(r[0].outcome.value for r in results[:2])
            assert outcomes == ["lost-race", "won"], results
            winner = ("b2", "b3")[[r[0].outcome for r in results[:2]].index(Outcome.WON)]
            stored, _ = await _stored(admin, keys, name)
            assert (stored.owner, stored.epoch) == (winner, 5)
            await asyncio.to_thread(own_etcd.restart, leader)
