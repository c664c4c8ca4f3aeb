"""Where subscriptions' cursors are kept on disk, and the flusher that saves them.

Owns :class:`CursorStore`: one file per subscription,
``<data dir>/subscriptions/<topic>/<subscription>.json``, replaced atomically (temp file,
fsync, rename, fsync of the directory: DESIGN section 2, invariants 3 and 4). Its format is
:mod:`dispatcher.state_file`'s: the cursor (the first unacknowledged offset), the
acknowledged ranges above it (so a restart does not resend what was acked out of order),
the highest offset ever sent, and the failure history of offsets whose delivery failed
(so max-deliveries holds across restarts). A damaged file is kept as ``.corrupt`` and the
subscription restarts at the earliest retained offset: duplicates, never a skip.

Saves are coalesced. A subscription whose state changed is marked dirty; a flush writes
every dirty subscription in one hop to the store's own writer thread
(``FileSystem.atomic_write_many``: each file is replaced atomically, and each topic's
directory is fsynced once per flush, not once per subscription). At most one flush is in
flight. A save that must be durable before its caller goes on (a new subscription, a
seek or commit before its reply, a redelivery's ``Persist`` before it goes out:
:meth:`CursorStore.save`) marks the subscription dirty and waits for the next flush to
begin and end; many such saves that arrive during one flush share the next one. Acks are
saved by the background flush every ``flush_interval_s`` (acks not yet saved may be
redelivered after a crash; nothing is skipped), and everything at shutdown.

The writes run on one thread of the store's own, never on the loop, and never in the
default executor the log's appends may use: cursor fsyncs compete with the log's
fdatasync for the disk, so they are few (one flush per interval, or per burst of
redeliveries) and never queue ahead of an append's thread.

The store also keeps the cursors last written (:meth:`CursorStore.saved_floor`: retention
never deletes at or past them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import weakref
from collections.abc import Callable, Iterable, Sequence

from dispatcher import state_file
from dispatcher.errors import DispatcherClosedError
from dispatcher.subscription import Subscription
from wal import FileSystem, run_to_end

logger = logging.getLogger(__name__)

Key = tuple[str, str]


class CursorStore:
    """The state files of every subscription, and their flusher. Use from one event loop.

    Args:
        root: ``<data dir>/subscriptions``.
        fs: File operations (tests pass a faulty one).
        flush_interval_s: How often dirty subscriptions are saved in the background.
        lookup: The live subscription of a key, or ``None`` once it is gone.
    """

    def __init__(
        self,
        root: str,
        fs: FileSystem,
        *,
        flush_interval_s: float,
        lookup: Callable[[Key], Subscription | None],
    ) -> None:
        self.root = root
        self._fs = fs
        self._flush_interval_s = flush_interval_s
        self._lookup = lookup
        self._dirty: set[Key] = set()
        #: Dirty subscriptions a caller waits for, in the order asked: written first, so
        #: a failing write (a full disk) names the file its caller asked for.
        self._urgent: dict[Key, None] = {}
        #: Held while a flush writes, and by a delete's commit point: one writer per file.
        self.lock = asyncio.Lock()
        #: Deleted subscriptions whose state must never be saved again.
        self._doomed: weakref.WeakSet[Subscription] = weakref.WeakSet()
        #: The cursors last written to disk, per subscription: the retention floor.
        self._saved: dict[Key, tuple[int, ...]] = {}
        self._requested = 0  # flushes asked for (the numbers of the flushes waited on)
        self._started = 0  # flushes begun
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="cursor-store"
        )
        #: Flushes written since open (each one thread hop, one fsync per directory).
        self.flushes = 0
        #: Set once :meth:`aclose` made its final save: later saves are refused.
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the background flush loop."""
        self._loop_task = asyncio.create_task(self._flush_loop(), name="cursor flusher")

    async def aclose(self, subs: Sequence[Subscription]) -> None:
        """Stop flushing, then save every one of ``subs`` (shutdown). Idempotent: a
        second call saves nothing. Once closed, :meth:`save` and :meth:`flush` raise
        :class:`~dispatcher.errors.DispatcherClosedError`."""
        if self._closed:
            return
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        try:
            await self.save_all(subs)
        finally:
            self._closed = True
            self._dirty.clear()
            self._executor.shutdown(wait=False)

    # -- saving -----------------------------------------------------------------------

    def mark_dirty(self, sub: Subscription) -> None:
        """``sub``'s persisted state changed: the next flush saves it."""
        self._dirty.add((sub.topic, sub.name))

    def forget(self, key: Key, *, doomed: Subscription | None = None) -> None:
        """Drop what the store keeps of ``key``; ``doomed``: never save it again."""
        self._dirty.discard(key)
        self._urgent.pop(key, None)
        self._saved.pop(key, None)
        if doomed is not None:
            self._doomed.add(doomed)

    def doom(self, sub: Subscription) -> None:
        """Never save ``sub`` again (a delete began); :meth:`undoom` if it failed."""
        self._dirty.discard((sub.topic, sub.name))
        self._doomed.add(sub)

    def undoom(self, sub: Subscription) -> None:
        """A delete failed before its commit point: ``sub`` is saved again."""
        self._doomed.discard(sub)
        self._dirty.add((sub.topic, sub.name))

    def restored(self, key: Key, cursors: Iterable[int]) -> None:
        """``key``'s cursors as loaded from disk."""
        self._saved[key] = tuple(cursors)

    async def save(self, sub: Subscription) -> None:
        """Make ``sub``'s current state durable: return once a flush that began after
        this call (and so holds this state) has ended. Coalesced with every other save
        and dirty subscription.

        Raises:
            OSError, WalIOError: the flush failed (the subscription stays dirty).
            DispatcherClosedError: the store is closed (the broker is shutting down); its
                final save has already been made.
        """
        key = (sub.topic, sub.name)
        self._dirty.add(key)
        self._urgent[key] = None
        await self.flush()

    async def flush(self) -> None:
        """Return once a flush that began after this call ended (see :meth:`save`)."""
        if self._closed:
            raise DispatcherClosedError()
        wanted = self._started + 1  # not one under way: it may hold an older state
        self._requested = max(self._requested, wanted)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((wanted, waiter))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flushes(), name="cursor flush")
        await waiter

    async def _flushes(self) -> None:
        """Run flushes, one at a time, while any is asked for."""
        while self._started < self._requested:
            self._started += 1
            number = self._started
            dirty, self._dirty = self._dirty, set()
            urgent, self._urgent = [k for k in self._urgent if k in dirty], {}
            order = urgent + sorted(dirty.difference(urgent))
            subs = [s for key in order if (s := self._lookup(key)) is not None]
            error: BaseException | None = None
            try:
                await self.save_all(subs)
            except Exception as exc:  # the waiters get it; the state stays dirty
                error = exc
                self._dirty |= dirty
            waiters, self._waiters = self._waiters, []
            for wanted, waiter in waiters:
                if wanted > number:
                    self._waiters.append((wanted, waiter))
                elif not waiter.done():
                    if error is None:
                        waiter.set_result(None)
                    else:
                        waiter.set_exception(error)

    async def save_all(self, subs: Sequence[Subscription]) -> None:
        """Save every one of ``subs`` in one thread hop: each file is replaced atomically,
        and each topic's directory is fsynced once for all of them."""
        if not subs:
            return
        async with self.lock:  # one writer per file; the newest state wins
            if self._closed:  # the executor is gone; the final save has been made
                raise DispatcherClosedError()
            subs = [sub for sub in subs if sub not in self._doomed]
            if not subs:
                return
            docs = []
            for sub in subs:
                docs.append(
                    state_file.StateDoc(
                        version=state_file.VERSION,
                        topic=sub.topic,
                        subscription=sub.name,
                        type=sub.type.value,
                        mode=sub.policy.mode.value,
                        partitions=[state_file.partition_doc(snap) for snap in sub.snapshot()],
                    )
                )
            # Cancelled, it still holds the lock until the thread is done, so that the next
            # save never races it on the same temp files.
            files = [(d.topic, d.subscription, state_file.encode(d)) for d in docs]
            loop = asyncio.get_running_loop()
            await run_to_end(loop.run_in_executor(self._executor, self._write, files))
            self.flushes += 1
            for doc in docs:
                key = (doc.topic, doc.subscription)
                if self._lookup(key) is not None:
                    self._saved[key] = tuple(p.cursor for p in doc.partitions)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval_s)
            if not self._dirty:
                continue
            count = len(self._dirty)
            try:
                await self.flush()
            except Exception:
                logger.exception("saving the cursors of %d subscriptions failed; will retry", count)

    def _write(self, files: Sequence[tuple[str, str, bytes]]) -> None:
        for directory in dict.fromkeys(os.path.join(self.root, topic) for topic, _, _ in files):
            if not self._fs.exists(directory):
                self._fs.makedirs(directory)  # fsyncs the root too
        self._fs.atomic_write_many([(self.path(topic, name), data) for topic, name, data in files])

    # -- reading and removing -----------------------------------------------------------

    def path(self, topic: str, name: str) -> str:
        """The state file of subscription ``name`` of ``topic``."""
        return os.path.join(self.root, topic, name + state_file.SUFFIX)

    def saved_floor(self, topic: str) -> list[int] | None:
        """Per partition of ``topic``, the lowest cursor any of its subscriptions has on
        disk; ``None`` when it has no subscription. Retention never deletes at or past it,
        so a restart never finds a saved cursor below the log's first offset."""
        floors: list[int] | None = None
        for (t, _name), cursors in self._saved.items():
            if t != topic:
                continue
            floors = (
                list(cursors)
                if floors is None
                else [min(a, b) for a, b in zip(floors, cursors, strict=False)]
            )
        return floors

    def load_all(self, topics: set[str]) -> list[tuple[str, str, state_file.StateDoc | None]]:
        """``(topic, name, doc)`` of every saved subscription of ``topics`` (``doc`` None
        when damaged); the files of other topics are removed. Blocking: run in a thread."""
        self._fs.makedirs(self.root)
        found: list[tuple[str, str, state_file.StateDoc | None]] = []
        for topic in sorted(self._fs.listdir(self.root)):
            if topic not in topics:
                logger.warning("dropping the subscriptions of deleted topic %r", topic)
                self.remove_topic(topic)
                continue
            directory = os.path.join(self.root, topic)
            for entry in sorted(self._fs.listdir(directory)):
                if entry.endswith(state_file.SUFFIX):
                    name = entry[: -len(state_file.SUFFIX)]
                    found.append((topic, name, self._load(os.path.join(directory, entry))))
        return found

    def _load(self, path: str) -> state_file.StateDoc | None:
        try:
            doc = state_file.decode(self._fs.read_file(path))
        except ValueError as exc:
            logger.error(
                "%s is damaged (%s); kept as %s.corrupt, the subscription restarts at the "
                "earliest offset",
                path,
                exc,
                path,
            )
            self._fs.rename(path, path + ".corrupt")
            return None
        return doc

    def remove_topic(self, topic: str) -> None:
        """Remove every state file of ``topic``, durably. Blocking: run in a thread."""
        remove_dir(self._fs, os.path.join(self.root, topic))


def remove_dir(fs: FileSystem, directory: str) -> None:
    """Remove ``directory`` and everything in it, durably (its parent is fsynced)."""
    if fs.exists(directory):
        shutil.rmtree(directory)
        fs.fsync_dir(os.path.dirname(directory))
