"""The list+watch lifecycle every watched view shares (:class:`cluster.watched.WatchedPrefix`):
a compaction and a broken stream on a real three-member etcd, each followed by a listing
and a watch that goes on; a stuck watch, found by the check, with a scripted store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cluster.etcd import EtcdStore, EventKind, KeyValue, Listing, RelistNeeded, WatchBatch
from cluster.etcd import WatchEvent as Event
from cluster.watched import PrefixStore, WatchedPrefix
from tests._helpers import eventually
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = pytest.mark.asyncio


class Picture:
    """What an owner of a WatchedPrefix keeps: the keys it holds, and every call made."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.listings: list[Listing] = []
        self.batches: list[list[Event]] = []

    def replace(self, listing: Listing) -> None:
        self.listings.append(listing)
        self.keys = {kv.key for kv in listing.items}

    def apply(self, events: list[Event]) -> None:
        self.batches.append(events)
        for event in events:
            if event.kind is EventKind.PUT:
                self.keys.add(event.kv.key)
            else:
                self.keys.discard(event.kv.key)


def watched(
    store: PrefixStore, prefix: str, picture: Picture, check_s: float | None = None
) -> WatchedPrefix:
    """A WatchedPrefix of ``prefix`` that keeps ``picture``."""
    return WatchedPrefix(
        store, prefix, name="test-view", replace=picture.replace, apply=picture.apply,
        check_s=check_s,
    )  # fmt: skip


async def test_a_compaction_lists_again_and_the_watch_goes_on(own_etcd: EtcdCluster) -> None:
    """Scenario: a watcher starts from a listing of the past (key "gone" present) after
    "new" was put, "gone" deleted and the history compacted past that listing.
    Expected: etcd refuses the watch with the compaction; the watcher lists again once
    (relists 1): its picture is exactly {"new"} at that listing's revision. A put after
    it is applied, and a task woken by changed() already sees it in the picture; the
    revision is that put's."""
    async with await EtcdStore.connect(own_etcd.endpoints) as store:
        await store.put("/w/gone", b"1")
        past = await store.get_prefix("/w/")
        await store.put("/w/new", b"2")
        await store.delete_prefix("/w/gone")
        own_etcd.compact()
        picture = Picture()
        view = watched(store, "/w/", picture)
        await view.start(past)
        try:
            await eventually(lambda: view.relists == 1)
            assert picture.keys == {"/w/new"}
            assert view.revision == picture.listings[-1].revision > past.revision
            seen = view.version
            later = await store.put("/w/later", b"3")
            assert await view.changed(seen, timeout_s=5) > seen
            assert picture.keys == {"/w/new", "/w/later"}
            assert view.revision == later
            assert view.relists == 1
        finally:
            await view.aclose()


async def test_a_broken_stream_lists_again_once_etcd_answers(
    own_etcd: EtcdCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a watcher connected to one etcd member only; that member is SIGKILLed
    (the stream breaks), a key is put through the other two meanwhile, and the member is
    restarted a moment later.
    Expected: while the member is down the listing fails and is tried again (logged
    "cannot list"), the task does not end; once it answers, one listing holds the key
    put meanwhile, and the watch goes on (a later put is applied)."""
    alone = own_etcd.members[0]
    others = [m.endpoint for m in own_etcd.members[1:]]
    store = await EtcdStore.connect([alone.endpoint], timeout_s=1.0)
    picture = Picture()
    view = watched(store, "/b/", picture)
    try:
        async with await EtcdStore.connect(others) as writer:
            await view.start()
            own_etcd.kill(alone)
            await writer.put("/b/meanwhile", b"1")
            await eventually(lambda: "cannot list" in caplog.text, timeout_s=10)
            await asyncio.to_thread(own_etcd.restart, alone)
            await eventually(lambda: view.relists >= 1, timeout_s=30)
            assert picture.keys == {"/b/meanwhile"}
            await writer.put("/b/after", b"2")
            await eventually(lambda: "/b/after" in picture.keys, timeout_s=10)
    finally:
        await view.aclose()
        await store.aclose()


class ScriptedStore:
    """A store whose listings, watch batches and newest revision a test sets: the watch
    gives its batches, then hangs as a stream to a frozen etcd member does."""

    def __init__(self, listings: list[Listing], batch: WatchBatch) -> None:
        self.listings = listings
        self.batch = batch
        self.newest = 0
        self.starts: list[int] = []

    async def get_prefix(self, prefix: str) -> Listing:
        return self.listings.pop(0)

    async def watch_prefix(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[WatchBatch | RelistNeeded]:
        self.starts.append(start_revision)
        if len(self.starts) == 1:
            yield self.batch
        await asyncio.Event().wait()  # stuck: no event, no error

    async def newest_revision(self, prefix: str) -> int:
        return self.newest


def put(key: str, revision: int) -> Event:
    return Event(EventKind.PUT, KeyValue(key, b"", revision, revision, 0))


async def test_a_stuck_watch_is_found_by_the_newest_event_not_the_header() -> None:
    """Scenario: a listing at revision 40; the watch from 41 brings puts at 42 and 43
    under header revision 50, then hangs. The newest put under the prefix is 43 for a
    while, then a put at 44 that the watch never brings.
    Expected: revision 43 (the events', not the header's); no listing while nothing is
    missing (over ten checks); two checks after 44 exists the watch is called stuck and
    replaced: one listing (at 44), and the new watch starts at 45."""
    store = ScriptedStore(
        [Listing([], 40), Listing([KeyValue("/s/d", b"", 44, 44, 0)], 44)],
        WatchBatch([put("/s/b", 42), put("/s/c", 43)], 50),
    )
    store.newest = 43
    picture = Picture()
    view = watched(store, "/s/", picture, check_s=0.01)
    await view.start()
    try:
        await eventually(lambda: view.revision == 43)
        await asyncio.sleep(0.1)
        assert view.relists == 0
        store.newest = 44
        await eventually(lambda: view.relists == 1)
        assert picture.keys == {"/s/d"}
        await eventually(lambda: store.starts == [41, 45])
    finally:
        await view.aclose()
