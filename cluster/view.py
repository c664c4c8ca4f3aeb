"""The cluster as this broker sees it: a list+watch cache of every key under the prefix.

Role: :class:`View` keeps a :class:`~cluster.state.ClusterState` current: list the
prefix, watch from that listing's revision + 1, apply each batch of events, and list
again whenever the watch asks (:class:`~cluster.etcd.RelistNeeded`: a compaction, or a
stream restart, may have lost events). Other tasks read :attr:`View.state` and wait for
it to change (:meth:`View.changed`, :meth:`View.wait_for`, :meth:`View.wait_topic`).

Invariants: those of :class:`~cluster.state.ClusterState`; and :attr:`View.version` rises
once per listing or batch applied, after the state changed, so a waiter woken by it sees
the change.

Task-safety: one task (started by :meth:`View.start`) writes the state; any task on the
same loop may read it between awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TypeVar

from cluster.errors import EtcdUnavailableError
from cluster.etcd import EtcdStore, EventKind, Listing, RelistNeeded, WatchEvent
from cluster.records import Keys, TopicState
from cluster.state import ClusterState, Topic

log = logging.getLogger(__name__)

T = TypeVar("T")

RELIST_RETRY_S = 0.2
"""Seconds between attempts to list the prefix while etcd does not answer."""


class View:
    """The list+watch shell that keeps a :class:`ClusterState` current.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        check_s: seconds between checks that the watch is not stuck (default 1): a stuck
            watch is replaced within about two checks.
    """

    def __init__(self, store: EtcdStore, keys: Keys, *, check_s: float = 1.0) -> None:
        self._store = store
        self._check_s = check_s
        self.state = ClusterState(keys)
        self.relists = 0
        """How many times the view listed again after a watch asked it to."""
        self._version = 0
        self._bumped = asyncio.Event()  # set, then replaced, at each change
        self._task: asyncio.Task[None] | None = None

    @property
    def version(self) -> int:
        """Rises at each change applied: pass it to :meth:`changed`."""
        return self._version

    async def start(self, listing: Listing | None = None) -> None:
        """List the prefix (or start from ``listing``, a view of the past) and start
        watching.

        Raises:
            EtcdUnavailableError: the first listing got no answer.
        """
        first = listing or await self._store.get_prefix(self.state.keys.prefix)
        self._replace(first)
        self._task = asyncio.create_task(self._run(), name="cluster-view")

    async def aclose(self) -> None:
        """Stop watching; the state stays as it was."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def changed(self, after: int, timeout_s: float | None = None) -> int:
        """Wait until :attr:`version` is above ``after`` (or the timeout); returns it."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._version <= after:
                    await self._bumped.wait()
        return self._version

    async def wait_for(
        self, check: Callable[[ClusterState], T | None], timeout_s: float
    ) -> T | None:
        """Wait until ``check(state)`` returns something other than None; that value, or
        None after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        seen = self._version
        while (found := check(self.state)) is None:
            left = deadline - loop.time()
            if left <= 0:
                return None
            seen = await self.changed(seen, left)
        return found

    async def wait_topic(
        self, name: str, states: frozenset[TopicState], timeout_s: float
    ) -> Topic | None:
        """Wait until topic ``name`` is in one of ``states``; the topic, or None on timeout."""

        def check(state: ClusterState) -> Topic | None:
            topic = state.topics.get(name)
            return topic if topic is not None and topic.record.state in states else None

        return await self.wait_for(check, timeout_s)

    def _replace(self, listing: Listing) -> None:
        self.state.replace(listing)
        self._bump()

    def _patch(self, events: list[WatchEvent]) -> None:
        for event in events:
            if event.kind is EventKind.PUT:
                self.state.put(event.kv)
            else:
                self.state.delete(event.kv.key, event.kv.mod_revision)
        self._bump()

    def _bump(self) -> None:
        """Wake every waiter of :meth:`changed` (they re-check the version)."""
        self._version += 1
        self._bumped.set()
        self._bumped = asyncio.Event()

    async def _run(self) -> None:
        """Watch, apply, relist when asked or when the watch is stuck; until cancelled."""
        while True:
            watch = asyncio.create_task(self._watch(), name="cluster-view-watch")
            try:
                await self._watchdog(watch)
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            await self._relist()

    async def _watch(self) -> None:
        """Apply one watch stream's events; return when it asks for a relist."""
        start = self.state.revision + 1
        async for item in self._store.watch_prefix(self.state.keys.prefix, start):
            if isinstance(item, RelistNeeded):
                log.info("cluster view: listing again (%s)", item.reason)
                return
            self._patch(item.events)

    async def _watchdog(self, watch: asyncio.Task[None]) -> None:
        """Return when ``watch`` ends, or when it is stuck: a put newer than the view
        stayed unseen for two checks in a row (a stream to a frozen etcd member hangs
        without an error until gRPC's keepalive notices, many seconds later)."""
        behind = 0
        while not watch.done():
            await asyncio.wait([watch], timeout=self._check_s)
            if watch.done():
                break
            try:
                newest = await self._store.newest_revision(self.state.keys.prefix)
            except EtcdUnavailableError:
                continue
            behind = behind + 1 if newest > self.state.revision else 0
            if behind >= 2:
                log.warning(
                    "cluster view: the watch is stuck at revision %d; listing again",
                    self.state.revision,
                )
                return
        if not watch.cancelled() and (error := watch.exception()) is not None:
            log.warning("cluster view: the watch failed (%r); listing again", error)

    async def _relist(self) -> None:
        while True:
            try:
                listing = await self._store.get_prefix(self.state.keys.prefix)
            except EtcdUnavailableError as exc:
                log.warning("cluster view: cannot list: %s", exc)
                await asyncio.sleep(RELIST_RETRY_S)
                continue
            self.relists += 1
            self._replace(listing)
            return
