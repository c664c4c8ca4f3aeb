"""The session: the write window's arithmetic (pure), registration and the duplicate
node id rule, re-session on a lost lease, and the write deadline by the broker's own clock
when etcd stops answering (fake clock, then real time with every etcd member frozen)."""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster.errors import DuplicateNodeError
from cluster.etcd import EtcdStore
from cluster.records import BrokerRecord, Keys, decode
from cluster.session import EXPIRY_SLACK_S, Session, WriteWindow, margin_for
from tests._helpers import ManualClock, eventually
from tests.cluster.etcd_harness import EtcdCluster

TTL = 2


def _broker(node: str = "b1", address: str = "127.0.0.1:7001") -> BrokerRecord:
    return BrokerRecord(node, address, 1, 0, "test")


@pytest.mark.parametrize(("ttl", "margin"), [(2, 0.5), (2.5, 0.5), (3, 0.6), (10, 2.0), (60, 12.0)])
def test_margin(ttl: float, margin: float) -> None:
    """The margin is max(0.5 s, TTL/5)."""
    assert margin_for(ttl) == pytest.approx(margin)


def test_write_window_counts_from_the_send_time() -> None:
    """TTL 2 s, margin 0.5 s: a keepalive sent at 10.0 (answered later) allows writes up
    to, not including, 11.5; an older reply arriving late never shortens the window; a
    lost lease ends it at once."""
    window = WriteWindow(margin_s=0.5)
    assert not window.may_write(0.0)
    window.renewed(sent_at=10.0, granted_ttl_s=2)
    assert window.may_write(11.499)
    assert not window.may_write(11.5)
    window.renewed(sent_at=9.0, granted_ttl_s=2)  # a stale reply
    assert window.may_write(11.4)
    window.lost()
    assert not window.may_write(10.1)


@pytest.mark.asyncio
async def test_registration_and_a_live_duplicate(store: EtcdStore, prefix: str) -> None:
    """b1 registers under its lease; a second process claiming node id b1 while the
    first is alive waits one TTL, then fails with DuplicateNodeError naming the live
    broker's address; the first stays registered."""
    keys = Keys(prefix)
    first = Session(store, keys, _broker(), TTL)
    await first.start()
    try:
        held = await store.get(keys.broker("b1"))
        assert held is not None
        assert held.lease == first.lease
        assert decode(held.key, held.value, BrokerRecord).session_ms > 0
        second = Session(store, keys, _broker(address="127.0.0.1:7999"), TTL)
        started = time.monotonic()
        with pytest.raises(DuplicateNodeError, match=r"127\.0\.0\.1:7001"):
            await second.start()
        assert TTL + EXPIRY_SLACK_S - 0.1 <= time.monotonic() - started < TTL + 3
        again = await store.get(keys.broker("b1"))
        assert again is not None
        assert again.lease == first.lease
    finally:
        await first.aclose()
    assert await store.get(keys.broker("b1")) is None


@pytest.mark.asyncio
async def test_restart_after_a_crash_waits_out_the_old_lease(store: EtcdStore, prefix: str) -> None:
    """A crashed b1 (keepalives stop, lease not revoked) is replaced by a new b1 process:
    its registration waits until the old lease expires (within one TTL and the slack),
    then succeeds."""
    keys = Keys(prefix)
    crashed = Session(store, keys, _broker(), TTL)
    await crashed.start()
    await crashed.abandon()
    started = time.monotonic()
    restarted = Session(store, keys, _broker(), TTL)
    await restarted.start()
    assert time.monotonic() - started < TTL + EXPIRY_SLACK_S
    try:
        held = await store.get(keys.broker("b1"))
        assert held is not None
        assert held.lease == restarted.lease != crashed.lease
    finally:
        await restarted.aclose()


@pytest.mark.asyncio
async def test_a_lost_lease_makes_a_new_session(store: EtcdStore, prefix: str) -> None:
    """The lease is revoked behind the session's back: the next keepalive hears TTL <= 0,
    writes stop, and a new session (generation 2, a new lease) registers b1 again."""
    keys = Keys(prefix)
    session = Session(store, keys, _broker(), TTL)
    await session.start()
    try:
        old = session.lease
        assert session.generation == 1
        await store.revoke(old)
        assert await asyncio.wait_for(session.wait_generation(1), TTL * 2) == 2
        assert session.lease != old
        assert session.may_write()
        held = await store.get(keys.broker("b1"))
        assert held is not None
        assert held.lease == session.lease
    finally:
        await session.aclose()


@pytest.mark.asyncio
async def test_may_write_ends_by_the_brokers_own_clock(own_etcd: EtcdCluster) -> None:
    """Fake clock: every etcd member frozen, so no keepalive is answered. The session may
    write until TTL - margin after the last acknowledged send (by ITS clock), and not
    one tick later, while far less real time has passed than the TTL."""
    clock = ManualClock(1000.0)
    async with await EtcdStore.connect(own_etcd.endpoints, timeout_s=1.0) as store:
        session = Session(store, Keys("/h/"), _broker(), TTL, clock=clock)
        real_start = time.monotonic()
        await session.start()  # grant sent at 1000.0 by the fake clock
        for member in own_etcd.members:
            own_etcd.freeze(member)
        try:
            clock.advance(TTL - margin_for(TTL) - 0.01)
            assert session.may_write()
            clock.advance(0.02)
            assert not session.may_write()
            assert time.monotonic() - real_start < TTL
        finally:
            for member in own_etcd.members:
                own_etcd.thaw(member)
            await session.abandon()


@pytest.mark.asyncio
async def test_etcd_frozen_past_the_ttl_stops_writes_in_time(own_etcd: EtcdCluster) -> None:
    """Real time: every etcd member SIGSTOPped for longer than the TTL. may_write turns
    false within TTL - margin of the freeze (+ one keepalive interval of slack at most
    counted from the last acknowledged send), i.e. before the lease can expire in etcd.
    After the thaw the session writes again."""
    async with await EtcdStore.connect(own_etcd.endpoints, timeout_s=1.0) as store:
        session = Session(store, Keys("/h/"), _broker(), TTL)
        await session.start()
        try:
            await asyncio.sleep(0.1)
            frozen_at = time.monotonic()
            for member in own_etcd.members:
                own_etcd.freeze(member)
            await eventually(lambda: not session.may_write(), timeout_s=TTL + 1)
            stopped_after = time.monotonic() - frozen_at
            assert stopped_after <= TTL - margin_for(TTL) + 0.05
            await asyncio.sleep(TTL + 0.5 - stopped_after)  # frozen past the TTL
            assert not session.may_write()
        finally:
            for member in own_etcd.members:
                own_etcd.thaw(member)
        await eventually(session.may_write, timeout_s=10)
        await session.aclose()
