"""EtcdStore against a real three-member etcd: reads, compare-and-set, leases, the watch
and its relist signal, endpoint health, and errors translated to cluster.errors."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from cluster.errors import EtcdUnavailableError
from cluster.etcd import (
    Compare,
    EtcdStore,
    EventKind,
    Op,
    RelistNeeded,
    TlsFiles,
    WatchBatch,
)
from tests._certs import Pki
from tests.cluster.etcd_harness import EtcdCluster, ServerTls, etcd_binary


@pytest.mark.asyncio
async def test_get_and_get_prefix_give_revisions_and_lease(store: EtcdStore, prefix: str) -> None:
    """Two keys put (one with a lease): get gives value, create/mod revisions and lease;
    get_prefix lists both sorted by key at a revision no lower than the last write; a
    missing key is None."""
    lease, ttl = await store.grant(5)
    assert ttl == 5
    first = await store.put(prefix + "b", b"1")
    second = await store.put(prefix + "a", b"2", lease=lease)
    a = await store.get(prefix + "a")
    assert a is not None
    assert (a.value, a.create_revision, a.mod_revision, a.lease) == (b"2", second, second, lease)
    listing = await store.get_prefix(prefix)
    assert [kv.key for kv in listing.items] == [prefix + "a", prefix + "b"]
    assert listing.items[1].create_revision == first
    assert listing.revision >= second
    assert await store.get(prefix + "missing") is None
    await store.revoke(lease)
    assert await store.get(prefix + "a") is None


@pytest.mark.asyncio
async def test_txn_guards(store: EtcdStore, prefix: str) -> None:
    """Create-on-absence succeeds once and fails the second time; a put guarded by a stale
    mod_revision fails and changes nothing; a guard on the key's lease holds only for
    that lease; the failure branch runs when a guard fails."""
    key = prefix + "k"
    created = await store.txn([Compare.absent(key)], [Op.put(key, b"v1")])
    assert created.succeeded
    again = await store.txn([Compare.absent(key)], [Op.put(key, b"v2")])
    assert not again.succeeded
    kv = await store.get(key)
    assert kv is not None
    assert kv.value == b"v1"
    assert (
        await store.txn([Compare.modified_at(key, kv.mod_revision)], [Op.put(key, b"v3")])
    ).succeeded
    stale = await store.txn([Compare.modified_at(key, kv.mod_revision)], [Op.put(key, b"v4")])
    assert not stale.succeeded
    assert (await store.txn([Compare.created_at(key, kv.create_revision)], [])).succeeded
    lease, _ = await store.grant(5)
    other, _ = await store.grant(5)
    await store.put(key, b"leased", lease=lease)
    assert not (await store.txn([Compare.leased_by(key, other)], [Op.delete(key)])).succeeded
    failed = await store.txn(
        [Compare.leased_by(key, other)], [], [Op.put(prefix + "fallback", b"x")]
    )
    assert not failed.succeeded
    assert await store.get(prefix + "fallback") is not None
    assert (await store.txn([Compare.leased_by(key, lease)], [Op.delete(key)])).succeeded
    assert await store.get(key) is None
    for held in (lease, other):
        await store.revoke(held)


@pytest.mark.asyncio
async def test_keepalive_renews_then_reports_a_revoked_lease(store: EtcdStore) -> None:
    """A keepalive on a live lease answers its full TTL; after a revoke it answers a TTL
    <= 0 (the lease is gone); revoking it again is not an error."""
    lease, ttl = await store.grant(4)
    assert await store.keepalive_once(lease, timeout_s=2.0) == ttl
    await store.revoke(lease)
    assert await store.keepalive_once(lease, timeout_s=2.0) <= 0
    await store.revoke(lease)


async def _next(watch: object) -> WatchBatch | RelistNeeded:
    return await asyncio.wait_for(watch.__anext__(), 5.0)  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_watch_prefix_gives_puts_and_deletes(store: EtcdStore, prefix: str) -> None:
    """A watch from the listing's revision + 1 sees a put and a delete under the prefix,
    and nothing written outside it."""
    listing = await store.get_prefix(prefix)
    watch = store.watch_prefix(prefix, listing.revision + 1)
    await store.put(prefix + "x", b"1")
    await store.put("/elsewhere-" + prefix, b"no")
    batch = await _next(watch)
    assert isinstance(batch, WatchBatch)
    assert [(e.kind, e.kv.key, e.kv.value) for e in batch.events] == [
        (EventKind.PUT, prefix + "x", b"1")
    ]
    await store.txn([], [Op.delete(prefix + "x")])
    batch = await _next(watch)
    assert isinstance(batch, WatchBatch)
    assert [(e.kind, e.kv.key) for e in batch.events] == [(EventKind.DELETE, prefix + "x")]
    await watch.aclose()
    await store.txn([], [Op.delete("/elsewhere-" + prefix)])


@pytest.mark.asyncio
async def test_watch_from_a_compacted_revision_asks_for_a_relist(own_etcd: EtcdCluster) -> None:
    """History compacted past the watch's start: the watch yields RelistNeeded (naming the
    compaction) and ends, instead of skipping the lost events silently."""
    async with await EtcdStore.connect(own_etcd.endpoints) as store:
        start = await store.put("/p/a", b"1")
        await store.put("/p/a", b"2")
        own_etcd.compact()
        watch = store.watch_prefix("/p/", start)
        signal = await _next(watch)
        assert isinstance(signal, RelistNeeded)
        assert "compacted" in signal.reason
        with pytest.raises(StopAsyncIteration):
            await _next(watch)


@pytest.mark.asyncio
async def test_endpoint_health_names_the_dead_member(own_etcd: EtcdCluster) -> None:
    """Three members, a follower SIGKILLed: endpoint_health reports the two live ones
    healthy (one of them the leader, with its version) and the dead one unhealthy with a
    reason."""
    leader = own_etcd.leader()
    dead = next(m for m in own_etcd.members if m is not leader)
    own_etcd.kill(dead)
    async with await EtcdStore.connect(own_etcd.endpoints) as store:
        health = {h.endpoint: h for h in await store.endpoint_health(timeout_s=1.0)}
    assert not health[dead.endpoint].healthy
    assert health[dead.endpoint].error
    live = [health[m.endpoint] for m in own_etcd.members if m is not dead]
    assert all(h.healthy and h.version.startswith("3.") for h in live)
    assert sum(h.is_leader for h in live) == 1


@pytest.mark.asyncio
async def test_no_quorum_is_unavailable_not_a_hang(own_etcd: EtcdCluster) -> None:
    """Every member frozen: a read raises EtcdUnavailableError (with the endpoints and the
    operation in its message) within its timeout, rather than hanging."""
    async with await EtcdStore.connect(own_etcd.endpoints, timeout_s=1.0) as store:
        for member in own_etcd.members:
            own_etcd.freeze(member)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(EtcdUnavailableError, match="get_prefix") as caught:
            await store.get_prefix("/p/")
        assert loop.time() - started < 2.5
        assert own_etcd.endpoints[0] in str(caught.value)


@pytest.mark.asyncio
async def test_tls_with_a_client_certificate(tmp_path: Path, pki: Pki) -> None:
    """A single etcd member that serves TLS and requires a client certificate: a store
    with the CA, certificate and key reads and writes; one with the CA only (no client
    certificate) gets EtcdUnavailableError within its timeout, not a hang (gRPC reports
    the refused handshake as UNAVAILABLE; its detail is in the message)."""
    etcd_binary()
    tls = ServerTls(pki.server.cert, pki.server.key, pki.ca, pki.client.cert, pki.client.key)
    cluster = EtcdCluster(tmp_path / "etcd", size=1, tls=tls)
    cluster.start()
    try:
        files = TlsFiles(Path(pki.ca), Path(pki.client.cert), Path(pki.client.key))
        async with await EtcdStore.connect(cluster.endpoints, tls=files, timeout_s=2.0) as store:
            await store.put("/tls/k", b"v")
            kv = await store.get("/tls/k")
            assert kv is not None
            assert kv.value == b"v"
        anonymous = TlsFiles(Path(pki.ca))
        async with await EtcdStore.connect(
            cluster.endpoints, tls=anonymous, timeout_s=1.0
        ) as store:
            with pytest.raises(EtcdUnavailableError, match="get"):
                await store.get("/tls/k")
    finally:
        cluster.stop()


@pytest.mark.asyncio
async def test_a_broken_watch_asks_for_a_relist_and_leaves_no_task(
    own_etcd: EtcdCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a store connected to one etcd member watches a prefix; that member is
    SIGKILLed (the stream breaks), restarted, and a garbage collection runs.
    Expected: the watch ends with one RelistNeeded (the caller lists again); no task that
    fed the broken stream is left pending, and asyncio logs no "Task was destroyed but it
    is pending" (etcd3aio 0.3.0's own watch left one per broken stream)."""
    member = own_etcd.members[0]
    store = await EtcdStore.connect([member.endpoint], timeout_s=2.0)
    items: list[object] = []

    async def watch() -> None:
        async for item in store.watch_prefix("/leak/", 1):
            items.append(item)

    task = asyncio.create_task(watch())
    try:
        await asyncio.sleep(0.5)
        own_etcd.kill(member)
        await asyncio.wait_for(task, 10)
        assert [type(i) for i in items] == [RelistNeeded]
        own_etcd.restart(member)
        feeders = [t for t in asyncio.all_tasks() if "_consume_request_iterator" in repr(t)]
        assert feeders == []
        gc.collect()
        await asyncio.sleep(0.1)
        assert "Task was destroyed but it is pending" not in caplog.text
    finally:
        task.cancel()
        await store.aclose()
