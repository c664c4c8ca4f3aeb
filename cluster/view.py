"""The cluster as this broker sees it: a list+watch cache of every key under the prefix.

Role: :class:`View` keeps a :class:`~cluster.state.ClusterState` current over a
:class:`~cluster.watched.WatchedPrefix` of the whole prefix (list, watch from that
listing's revision + 1, list again when the watch asks, fails or is stuck). Other tasks
read :attr:`View.state` and wait for it to change (:meth:`View.changed`,
:meth:`View.wait_for`, :meth:`View.wait_topic`).

Invariants: those of :class:`~cluster.state.ClusterState`; and :attr:`View.version` rises
once per listing or batch applied, after the state changed, so a waiter woken by it sees
the change.

Task-safety: one task (started by :meth:`View.start`) writes the state; any task on the
same loop may read it between awaits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from cluster.etcd import EtcdStore, EventKind, Listing, WatchEvent
from cluster.records import Keys, TopicState
from cluster.state import ClusterState, Topic
from cluster.watched import WatchedPrefix

T = TypeVar("T")


class View:
    """The list+watch shell that keeps a :class:`ClusterState` current.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        check_s: seconds between checks that the watch is not stuck (default 1): a stuck
            watch is replaced within about two checks.
    """

    def __init__(self, store: EtcdStore, keys: Keys, *, check_s: float = 1.0) -> None:
        self.state = ClusterState(keys)
        self._watched = WatchedPrefix(
            store,
            keys.prefix,
            name="cluster-view",
            replace=self.state.replace,
            apply=self._patch,
            check_s=check_s,
        )

    @property
    def version(self) -> int:
        """Rises at each change applied: pass it to :meth:`changed`."""
        return self._watched.version

    @property
    def relists(self) -> int:
        """How many times the view listed again after a watch asked, failed or stuck."""
        return self._watched.relists

    async def start(self, listing: Listing | None = None) -> None:
        """List the prefix (or start from ``listing``, a view of the past) and start
        watching.

        Raises:
            EtcdUnavailableError: the first listing got no answer.
        """
        await self._watched.start(listing)

    async def aclose(self) -> None:
        """Stop watching; the state stays as it was."""
        await self._watched.aclose()

    async def changed(self, after: int, timeout_s: float | None = None) -> int:
        """Wait until :attr:`version` is above ``after`` (or the timeout); returns it."""
        return await self._watched.changed(after, timeout_s)

    async def wait_for(
        self, check: Callable[[ClusterState], T | None], timeout_s: float
    ) -> T | None:
        """Wait until ``check(state)`` returns something other than None; that value, or
        None after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        seen = self.version
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

    def _patch(self, events: list[WatchEvent]) -> None:
        for event in events:
            if event.kind is EventKind.PUT:
                self.state.put(event.kv)
            else:
                self.state.delete(event.kv.key, event.kv.mod_revision)
