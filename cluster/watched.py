"""WatchedPrefix: the list+watch lifecycle that every watched view of etcd shares.

Role: keep a picture of the keys under one prefix current. List the prefix, watch from
that listing's revision + 1, hand each batch of events over, and list again whenever the
watch can no longer be trusted:

- it asks (:class:`~cluster.etcd.RelistNeeded`: a compaction, a cancel, a stream that
  broke or ended; events may have been lost);
- it fails with an error;
- with ``check_s``, it is stuck: a put newer than the picture stayed unseen for two
  checks in a row (a stream to a frozen etcd member hangs without an error until gRPC's
  keepalive notices, many seconds later).

A listing that gets no answer is tried again every :data:`RELIST_RETRY_S` until one does.
What the picture is belongs to the owner, through two callbacks that run on the watch
task: ``replace(listing)`` (become exactly this listing) and ``apply(events)`` (patch).
The owners: :class:`cluster.view.View` (the cluster), :class:`cluster.tokens.TokenView`
and :class:`cluster.config_defaults.DefaultsView`.

Invariants:

- Every watch starts at the last listing's revision + 1: a watch that ended for any
  reason is followed by a listing, never resumed from a remembered revision.
- :attr:`WatchedPrefix.revision` is the last listing's revision, raised to the
  ``mod_revision`` of each event applied since: the revision the picture holds, which
  the stuck check compares with the newest put under the prefix. Never a watch
  response's header revision: etcd sends a catching-up watcher's events in chunks, each
  under the store's current revision, so a header can be ahead of events still to come.
- :attr:`WatchedPrefix.version` rises once per listing or batch, after its callback
  returned, so a task woken by :meth:`WatchedPrefix.changed` sees the change.

Worked example: a listing at revision 40 (``replace``, version 1), a watch from 41; a
batch of puts at 42 and 43 under header revision 50 (``apply``, version 2, revision 43:
a put at 44 that the watch does not bring is "newer", not hidden behind 50); the stream
breaks: a listing at revision 45 (``replace``, version 3, ``relists`` 1), a watch from 46.

Depends on :class:`PrefixStore`, the three calls of :class:`cluster.etcd.EtcdStore` it
uses (a test may give a fake); it imports :mod:`cluster.etcd` for its types only.

Task-safety: one task (started by :meth:`WatchedPrefix.start`) runs the callbacks; any
task on the same loop may read the attributes and wait on :meth:`WatchedPrefix.changed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from cluster.errors import EtcdUnavailableError
from cluster.etcd import Listing, RelistNeeded, WatchBatch, WatchEvent

log = logging.getLogger(__name__)

RELIST_RETRY_S = 0.2
"""Seconds between attempts to list the prefix while etcd does not answer."""

STUCK_CHECKS = 2
"""Checks in a row that must see a put newer than the picture before the watch is
called stuck and replaced."""


class PrefixStore(Protocol):
    """What :class:`WatchedPrefix` asks of etcd (:class:`cluster.etcd.EtcdStore` is one)."""

    async def get_prefix(self, prefix: str) -> Listing:
        """Every key under ``prefix`` and the revision read at; raises
        :class:`~cluster.errors.EtcdUnavailableError` when etcd does not answer."""
        ...

    def watch_prefix(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[WatchBatch | RelistNeeded]:
        """Events under ``prefix`` from ``start_revision``; ends with a
        :class:`~cluster.etcd.RelistNeeded`."""
        ...

    async def newest_revision(self, prefix: str) -> int:
        """The highest ``mod_revision`` under ``prefix`` (0 if none)."""
        ...


class WatchedPrefix:
    """List, then watch, one prefix; list again when the watch asks, fails or is stuck.

    Args:
        store: the etcd connection (:class:`cluster.etcd.EtcdStore`).
        prefix: the keys watched (every key that starts with it).
        name: names the task and every log line (``cluster-view``, ``token-view``...).
        replace: called with each listing: the picture becomes exactly that listing.
        apply: called with each batch of events (puts and deletes, in revision order).
        check_s: seconds between checks that the watch is not stuck, or None (default)
            for no such check: a stuck watch is then replaced only when gRPC notices.
    """

    def __init__(
        self,
        store: PrefixStore,
        prefix: str,
        *,
        name: str,
        replace: Callable[[Listing], None],
        apply: Callable[[list[WatchEvent]], None],
        check_s: float | None = None,
    ) -> None:
        self._store = store
        self.prefix = prefix
        self.name = name
        self._replace_with = replace
        self._apply_to = apply
        self._check_s = check_s
        self.revision = 0
        """The revision the picture is at (module invariants)."""
        self.relists = 0
        """How many times the prefix was listed again after a watch ended, asked or stuck."""
        self._version = 0
        self._bumped = asyncio.Event()  # set, then replaced, at each change
        self._task: asyncio.Task[None] | None = None

    @property
    def version(self) -> int:
        """Rises at each listing or batch applied: pass it to :meth:`changed`."""
        return self._version

    async def start(self, listing: Listing | None = None) -> None:
        """List the prefix (or start from ``listing``, a picture of the past) and start
        watching.

        Raises:
            EtcdUnavailableError: the first listing got no answer (nothing started).
        """
        self._replace(listing or await self._store.get_prefix(self.prefix))
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def aclose(self) -> None:
        """Stop watching; the picture stays as it was."""
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

    def _replace(self, listing: Listing) -> None:
        self._replace_with(listing)
        self.revision = listing.revision
        self._bump()

    def _apply(self, events: list[WatchEvent]) -> None:
        self._apply_to(events)
        self.revision = max([self.revision, *(e.kv.mod_revision for e in events)])
        self._bump()

    def _bump(self) -> None:
        """Wake every waiter of :meth:`changed` (they re-check the version)."""
        self._version += 1
        self._bumped.set()
        self._bumped = asyncio.Event()

    async def _run(self) -> None:
        """Watch, apply, list again when the watch ends or is stuck; until cancelled."""
        while True:
            watch = asyncio.create_task(self._watch(), name=f"{self.name}-watch")
            try:
                await self._watchdog(watch)
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            await self._relist()

    async def _watch(self) -> None:
        """Apply one watch stream's events; return when it asks for a listing."""
        async for item in self._store.watch_prefix(self.prefix, self.revision + 1):
            if isinstance(item, RelistNeeded):
                log.info("%s (%s): listing again (%s)", self.name, self.prefix, item.reason)
                return
            self._apply(item.events)

    async def _watchdog(self, watch: asyncio.Task[None]) -> None:
        """Return when ``watch`` ends or, with ``check_s``, when it is stuck: a put newer
        than the picture unseen for :data:`STUCK_CHECKS` checks in a row."""
        behind = 0
        while not watch.done():
            await asyncio.wait([watch], timeout=self._check_s)
            if watch.done():
                break
            try:
                newest = await self._store.newest_revision(self.prefix)
            except EtcdUnavailableError:
                continue
            behind = behind + 1 if newest > self.revision else 0
            if behind >= STUCK_CHECKS:
                log.warning(
                    "%s (%s): the watch is stuck at revision %d; listing again",
                    self.name,
                    self.prefix,
                    self.revision,
                )
                return
        if not watch.cancelled() and (error := watch.exception()) is not None:
            log.warning(
                "%s (%s): the watch failed (%r); listing again", self.name, self.prefix, error
            )

    async def _relist(self) -> None:
        while True:
            try:
                listing = await self._store.get_prefix(self.prefix)
            except EtcdUnavailableError as exc:
                log.warning("%s (%s): cannot list: %s", self.name, self.prefix, exc)
                await asyncio.sleep(RELIST_RETRY_S)
                continue
            self.relists += 1
            self._replace(listing)
            return
