"""Where subscriptions' states are kept on disk, and the flusher that saves them.

Owns :class:`CursorStore`. A subscription's state (the cursor, the first unacknowledged
offset; the acknowledged ranges above it, so a restart does not resend what was acked out
of order; the highest offset ever sent; and the failure history of offsets whose delivery
failed, so max-deliveries holds across restarts: :mod:`dispatcher.state_file`) is kept
under ``<data dir>/subscriptions/<topic>/`` in two places (:mod:`dispatcher.cursor_journal`):

- ``cursors.journal``: every flush appends the states it saves, for all the topic's
  subscriptions at once, as one write and one fdatasync (DESIGN section 2, invariant 3:
  "an equivalent log"). With a hundred subscriptions acking, a flush is one write where
  atomic file replacement would be a hundred files of six syscalls each.
- ``<subscription>.json``: the checkpoint. When a topic's journal outgrows
  ``checkpoint_bytes`` (and eight times its last checkpoint), a flush writes every
  subscription of the topic to its file instead (atomically: temp, fsync, rename, one
  fsync of the directory), removes the files of subscriptions that no longer exist, and
  empties the journal. A clean shutdown does the same, so a stopped broker's states are
  all in the files; an open after a crash writes next to nothing (see
  :meth:`CursorStore.load_all`), so a restart stays quick.

The newest state of a subscription wins on open, by sequence number; a deleted
subscription's tombstone in the journal is the commit point of its delete
(:meth:`CursorStore.commit_delete`). A damaged checkpoint is kept as ``.corrupt`` and the
subscription restarts at the earliest retained offset; damage inside a journal does the
same to every subscription whose newest state it may have taken: duplicates, never a
skip. A torn last write of the journal is dropped (it was never reported saved).

Saves are coalesced. A subscription whose state changed is marked dirty; a flush writes
every dirty subscription in one hop to the store's own writer thread. At most one flush is
in flight. A save that must be durable before its caller goes on (a new subscription, a
seek or commit before its reply, a redelivery's ``Persist`` before it goes out:
:meth:`CursorStore.save`) marks the subscription dirty and waits for the next flush to
begin and end; many such saves that arrive during one flush share the next one. Acks are
saved by the background flush every ``flush_interval_s`` (acks not yet saved may be
redelivered after a crash; nothing is skipped), and everything at shutdown.

The writes run on one thread of the store's own, never on the loop, and never in the
default executor the log's appends may use: cursor syncs compete with the log's
fdatasync for the disk, so they are few (one per topic a flush) and never queue ahead of
an append's thread. Few syscalls matter as much as few syncs: each one a thread makes
gives up the GIL and takes it back from a loop that may be busy.

The store also keeps the cursors last written (:meth:`CursorStore.saved_floor`: retention
never deletes at or past them). What an open finds in a topic's files, and how damage is
kept and reported, is :mod:`dispatcher.cursor_recovery`; the store then repairs it.

Replicated topics (issue 37). A topic given a :class:`~dispatcher.state_log.StateSink`
(:meth:`CursorStore.set_sink`, while this broker leads it) has every flush of its
states also appended to its replica group's ``state`` log, after the local write and
under the same lock (so the log's order is the store's save order): a journal append
as delta records, a checkpoint as a snapshot (one record, or chunks of at most
``dispatcher.state_log.RECORD_BYTES`` each), after which the log's segments wholly
before the snapshot are deleted, and a delete's tombstone as one delta. A durable
save (:meth:`CursorStore.save`) and a delete's commit point return only once that record
is committed (below the state log's high watermark): a follower that becomes leader
replays it (:mod:`dispatcher.state_log`). Background flushes (acks) do not wait: acks
not yet committed may be redelivered after a failover, as after a crash.

Why the rest is one piece (:class:`CursorStore`, about 500 lines): the flusher, the
journal appends, the checkpoints and a delete's commit point share one lock, one
sequence of state numbers, the open journal descriptors and the dirty sets, and each
write must see the others' (a checkpoint empties the journal an append would extend; a
tombstone is ordered against both). Split, they would share all of that across modules.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import shutil
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import msgspec

from dispatcher import cursor_journal, state_file
from dispatcher.cursor_recovery import Loaded, load_topic
from dispatcher.errors import DispatcherClosedError
from dispatcher.state_log import StateSink, record_value, record_values, snapshot_keys
from dispatcher.subscription import Subscription
from wal import FileSystem, run_to_end

logger = logging.getLogger(__name__)

Key = tuple[str, str]

#: A topic's journal is checkpointed once it holds this many bytes (and eight times its
#: last checkpoint): at 100 subscriptions acking ten times a second, every half minute.
CHECKPOINT_BYTES = 4 * 1024 * 1024
#: The journal may grow to this many times the bytes of its topic's last checkpoint.
CHECKPOINT_RATIO = 8
#: Named points of a checkpoint where tests crash (``crash_point`` argument), in order.
CRASH_POINTS = (
    "checkpoint.after_files",  # every file written and renamed; stale ones still there
    "checkpoint.after_stale",  # stale files removed and synced; journal not yet emptied
)


@dataclass(frozen=True, slots=True)
class CursorStats:
    """What the cursor store has done since open, for the metrics (read from any thread)."""

    #: Flushes that saved what they held (journal appends, or checkpoints).
    flushes: int
    #: Flushes that failed (an I/O error; their subscriptions stay dirty and are retried).
    failed_flushes: int
    #: Checkpoints written (every subscription of a topic to its file, the journal emptied).
    checkpoints: int
    #: Bytes in each topic's journal as of the last write.
    journal_bytes: dict[str, int]


@dataclass
class _Journal:
    """A topic's open journal (used under the store's lock only)."""

    fd: int
    #: Bytes of whole batches: where the next one is written.
    size: int
    #: A failed write may have left bytes past :attr:`size`: cut them before the next.
    unclean: bool = False


@dataclass
class _Plan:
    """What one flush writes for one topic."""

    topic: str
    docs: list[state_file.StateDoc]
    #: Write ``docs`` as checkpoint files and empty the journal (else append them).
    checkpoint: bool
    #: With :attr:`checkpoint`: the subscriptions whose files stay (the others go).
    keep: frozenset[str] = frozenset()


class CursorStore:
    """The saved states of every subscription, and their flusher. Use from one event loop.

    Args:
        root: ``<data dir>/subscriptions``.
        fs: File operations (tests pass a faulty one).
        flush_interval_s: How often dirty subscriptions are saved in the background.
        lookup: The live subscription of a key, or ``None`` once it is gone.
        members: The live subscriptions of a topic (a checkpoint writes them all).
        checkpoint_bytes: The journal size past which a topic is checkpointed.
        crash_point: Called with each name of :data:`CRASH_POINTS` as a checkpoint passes
            it (on the writer thread). Default: nothing; tests raise there.
        on_flush: Called on the loop with the seconds each flush that saved took.
    """

    def __init__(
        self,
        root: str,
        fs: FileSystem,
        *,
        flush_interval_s: float,
        lookup: Callable[[Key], Subscription | None],
        members: Callable[[str], Iterable[Subscription]],
        checkpoint_bytes: int = CHECKPOINT_BYTES,
        crash_point: Callable[[str], None] = lambda _point: None,
        on_flush: Callable[[float], None] | None = None,
    ) -> None:
        self.root = root
        self._crash_point = crash_point
        self._on_flush = on_flush
        self._fs = fs
        self._flush_interval_s = flush_interval_s
        self._lookup = lookup
        self._members = members
        self._checkpoint_bytes = checkpoint_bytes
        self._dirty: set[Key] = set()
        #: Dirty subscriptions a caller waits for, in the order asked: written first.
        self._urgent: dict[Key, None] = {}
        #: Held while a flush writes, and by a delete's commit point: one writer per file.
        self.lock = asyncio.Lock()
        #: Deleted subscriptions whose state must never be saved again.
        self._doomed: weakref.WeakSet[Subscription] = weakref.WeakSet()
        #: Deletes begun and not yet committed or undone: their topic is not checkpointed
        #: (that would empty a journal holding a state no file has yet).
        self._deleting: set[Key] = set()
        #: Deletes whose tombstone may be on disk although the commit raised.
        self._maybe_deleted: set[Key] = set()
        #: The cursors last written to disk, per subscription: the retention floor.
        self._saved: dict[Key, tuple[int, ...]] = {}
        #: The last sequence number given to a saved state.
        self._seq = 0
        #: Open journals, by topic; and the bytes of each topic's last checkpoint.
        self._journals: dict[str, _Journal] = {}
        self._checkpointed: dict[str, int] = {}
        self._requested = 0  # flushes asked for (the numbers of the flushes waited on)
        self._started = 0  # flushes begun
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="cursor-store"
        )
        #: Flushes written since open (each one thread hop, one sync per topic).
        self.flushes = 0
        #: Flushes that raised since open.
        self.failed_flushes = 0
        #: Checkpoints written since open (each one file per subscription of a topic).
        self.checkpoints = 0
        #: The bytes of each topic's journal, replaced whole after each write (the metrics
        #: exporter's thread reads it).
        self._journal_bytes: dict[str, int] = {}
        #: Set once :meth:`aclose` made its final save: later saves are refused.
        self._closed = False
        #: The replicated topics' state logs (while this broker leads them).
        self._sinks: dict[str, StateSink] = {}
        #: Per replicated topic, the offset of the last record appended to its state log.
        self._appended: dict[str, int] = {}

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the background flush loop."""
        self._loop_task = asyncio.create_task(self._flush_loop(), name="cursor flusher")

    async def aclose(self, subs: Sequence[Subscription]) -> None:
        """Stop flushing, then checkpoint every topic of ``subs`` (shutdown), leaving every
        state in its file and the journals empty. Idempotent: a second call saves
        nothing. Once closed, :meth:`save` and :meth:`flush` raise
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
            await self.save_all(subs, checkpoint=True)
        finally:
            self._closed = True
            self._dirty.clear()
            async with self.lock:
                journals, self._journals = list(self._journals.values()), {}
                for journal in journals:
                    self._fs.close(journal.fd)
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
        self._deleting.discard(key)
        self._maybe_deleted.discard(key)
        if doomed is not None:
            self._doomed.add(doomed)

    def release(self, key: Key) -> None:
        """``key`` leaves memory (its topic is followed here): it is not saved again,
        and its cursors on disk still hold retention back (:meth:`saved_floor`)."""
        self._dirty.discard(key)
        self._urgent.pop(key, None)

    def forget_topic(self, topic: str) -> None:
        """Forget the saved cursors of every subscription of ``topic`` (a promotion
        replaces them with the replicated states)."""
        for key in [k for k in self._saved if k[0] == topic]:
            del self._saved[key]

    def held_states(self, topic: str) -> dict[str, state_file.StateDoc]:
        """The states ``topic``'s files hold, by subscription (a replicated topic whose
        subscriptions were released; blocking: run in a thread)."""
        if not self._fs.exists(os.path.join(self.root, topic)):
            return {}
        return dict(load_topic(self._fs, self.root, topic).merged.states)

    def doom(self, sub: Subscription) -> None:
        """Never save ``sub`` again (a delete began); :meth:`undoom` if it failed."""
        self._dirty.discard((sub.topic, sub.name))
        self._doomed.add(sub)
        self._deleting.add((sub.topic, sub.name))

    def undoom(self, sub: Subscription) -> None:
        """A delete failed before its commit point: ``sub`` is saved again."""
        self._doomed.discard(sub)
        self._deleting.discard((sub.topic, sub.name))
        self._dirty.add((sub.topic, sub.name))

    def set_sink(self, topic: str, sink: StateSink | None) -> None:
        """Append ``topic``'s saves to ``sink`` from now on (this broker leads the
        replicated topic); ``None``: no more (it stopped leading)."""
        self._appended.pop(topic, None)
        if sink is None:
            self._sinks.pop(topic, None)
        else:
            self._sinks[topic] = sink

    async def _wait_committed(self, topic: str) -> None:
        """Return once the last record appended to ``topic``'s state log is committed
        (at once for a topic that is not replicated)."""
        sink, offset = self._sinks.get(topic), self._appended.get(topic)
        if sink is not None and offset is not None:
            await sink.committed(offset)

    def restored(self, key: Key, cursors: Iterable[int]) -> None:
        """``key``'s cursors as loaded from disk."""
        self._saved[key] = tuple(cursors)

    async def save(self, sub: Subscription) -> None:
        """Make ``sub``'s current state durable: return once a flush that began after
        this call (and so holds this state) has ended. Coalesced with every other save
        and dirty subscription.

        A replicated topic's save returns once its record is committed in the topic's
        state log as well (see the module docstring).

        Raises:
            OSError, WalIOError: the flush failed (the subscription stays dirty).
            DispatcherClosedError: the store is closed (the broker is shutting down); its
                final save has already been made.
            Exception: what the state log's sink raises when the save may never be
                committed (this broker stopped leading; too few in-sync replicas).
        """
        key = (sub.topic, sub.name)
        self._dirty.add(key)
        self._urgent[key] = None
        await self.flush()
        await self._wait_committed(sub.topic)

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
                self.failed_flushes += 1
            waiters, self._waiters = self._waiters, []
            for wanted, waiter in waiters:
                if wanted > number:
                    self._waiters.append((wanted, waiter))
                elif not waiter.done():
                    if error is None:
                        waiter.set_result(None)
                    else:
                        waiter.set_exception(error)

    async def save_all(
        self,
        subs: Sequence[Subscription],
        *,
        checkpoint: bool = False,
        topics: Iterable[str] = (),
    ) -> None:
        """Save every one of ``subs`` in one thread hop: one journal append and fdatasync
        per topic, or a checkpoint of the topic when its journal is due for one (always
        with ``checkpoint``, unless a delete in it is under way). With ``checkpoint``,
        ``topics`` are checkpointed too, even with no subscription (their files go).
        A replicated topic's records are then appended to its state log."""
        topics = tuple(topics) if checkpoint else ()
        if not subs and not topics:
            return
        async with self.lock:  # one writer per file; the newest state wins
            if self._closed:  # the executor is gone; the final save has been made
                raise DispatcherClosedError()
            by_topic: dict[str, list[Subscription]] = {topic: [] for topic in topics}
            for sub in subs:
                if sub not in self._doomed:
                    by_topic.setdefault(sub.topic, []).append(sub)
            plans = []
            for topic, topic_subs in by_topic.items():
                if self._checkpoint_due(topic, checkpoint):
                    live = [s for s in self._members(topic) if s not in self._doomed]
                    names = {s.name for s in live}
                    live += [s for s in topic_subs if s.name not in names]
                    docs = [self._doc(s) for s in live]
                    plans.append(_Plan(topic, docs, True, frozenset(d.subscription for d in docs)))
                else:
                    plans.append(_Plan(topic, [self._doc(s) for s in topic_subs], False))
            if not plans:
                return
            # Cancelled, it still holds the lock until the thread is done, so that the next
            # save never races it on the same files.
            loop = asyncio.get_running_loop()
            started = time.perf_counter()
            try:
                await run_to_end(loop.run_in_executor(self._executor, self._write, plans))
            finally:
                self._journal_bytes = {t: j.size for t, j in self._journals.items()}
            await self._replicate(plans)
            self.flushes += 1
            if self._on_flush is not None:
                self._on_flush(time.perf_counter() - started)
            for plan in plans:
                for doc in plan.docs:
                    key = (doc.topic, doc.subscription)
                    if self._lookup(key) is not None:
                        self._saved[key] = tuple(p.cursor for p in doc.partitions)

    async def _replicate(self, plans: Sequence[_Plan]) -> None:
        """Append each replicated topic's plan to its state log (under :attr:`lock`): a
        checkpoint as a snapshot, after which the log before it is deleted."""
        for plan in plans:
            sink = self._sinks.get(plan.topic)
            if sink is None or not (plan.docs or plan.checkpoint):
                continue
            entries = [cursor_journal.Entry(d.seq, d.subscription, d) for d in plan.docs]
            values = record_values(entries, sink.record_bytes)
            keys: list[bytes | None] = [None] * len(values)
            if plan.checkpoint:
                keys = list(snapshot_keys(secrets.token_hex(8), len(values)))
            first = -1
            for key, value in zip(keys, values, strict=True):
                offset = await sink.append(value, key=key)
                first = offset if first < 0 else first
                self._appended[plan.topic] = offset
            if plan.checkpoint:
                await sink.trim_before(first)

    def _checkpoint_due(self, topic: str, asked: bool) -> bool:
        if any(key[0] == topic for key in self._deleting):
            return False
        if asked:
            return True
        journal = self._journals.get(topic)
        limit = max(self._checkpoint_bytes, CHECKPOINT_RATIO * self._checkpointed.get(topic, 0))
        return journal is not None and journal.size > limit

    def _doc(self, sub: Subscription) -> state_file.StateDoc:
        self._seq += 1
        return state_file.StateDoc(
            version=state_file.VERSION,
            seq=self._seq,
            topic=sub.topic,
            subscription=sub.name,
            type=sub.type.value,
            mode=sub.policy.mode.value,
            partitions=[state_file.partition_doc(snap) for snap in sub.snapshot()],
            committer=sub.committer,
            dlq_first=sub.dlq_first,
        )

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

    # -- the writer thread ---------------------------------------------------------------

    def _write(self, plans: Sequence[_Plan]) -> None:
        for plan in plans:
            directory = os.path.join(self.root, plan.topic)
            if not self._fs.exists(directory):
                self._fs.makedirs(directory)  # fsyncs the root too
            if plan.checkpoint:
                self._checkpoint(plan.topic, plan.docs, plan.keep)
            else:
                entries = [cursor_journal.Entry(d.seq, d.subscription, d) for d in plan.docs]
                self._append(plan.topic, entries)

    def _journal(self, topic: str) -> _Journal:
        """``topic``'s journal, opened (and created, durably) if need be."""
        journal = self._journals.get(topic)
        if journal is None:
            path = self.journal_path(topic)
            existed = self._fs.exists(path)
            fd = self._fs.open(path, create=True)
            try:
                size = self._fs.size(fd)
                if not existed:
                    self._fs.fsync_dir(os.path.dirname(path))
            except BaseException:
                self._fs.close(fd)
                if not existed:  # made again, and its directory synced, next time
                    with contextlib.suppress(OSError):
                        self._fs.remove(path)
                raise
            journal = self._journals[topic] = _Journal(fd, size)
        return journal

    def _append(self, topic: str, entries: Sequence[cursor_journal.Entry]) -> None:
        """Append one batch to ``topic``'s journal and fdatasync it.

        A failed write leaves part of a batch past the journal's good bytes: it is cut
        before the next write (a part never reads as a batch anyway). A batch written
        whole stays even if its sync fails: its states are real ones with their sequence
        numbers, so the next sync making them durable can only save newer states; the
        caller still hears that this save failed."""
        journal = self._journal(topic)
        if journal.unclean:
            self._fs.truncate(journal.fd, journal.size)
            journal.unclean = False
        data = cursor_journal.frame(entries)
        try:
            self._fs.write_all(journal.fd, [data], journal.size)
        except BaseException:
            journal.unclean = True
            raise
        journal.size += len(data)
        self._fs.fdatasync(journal.fd)

    def _checkpoint(
        self, topic: str, docs: Sequence[state_file.StateDoc], keep: frozenset[str]
    ) -> None:
        """Write ``docs`` to their files, remove the files not in ``keep``, then empty the
        journal: in that order, so a crash anywhere leaves the newest states on disk."""
        directory = os.path.join(self.root, topic)
        files = [(self.path(topic, d.subscription), state_file.encode(d)) for d in docs]
        if files:
            self._fs.atomic_write_many(files)
        self._crash_point("checkpoint.after_files")
        stale = [
            entry
            for entry in self._fs.listdir(directory)
            if entry.endswith(state_file.SUFFIX) and entry[: -len(state_file.SUFFIX)] not in keep
        ]
        for entry in stale:
            self._fs.remove(os.path.join(directory, entry))
        if stale:
            self._fs.fsync_dir(directory)
        self._crash_point("checkpoint.after_stale")
        journal = self._journal(topic)
        if journal.size or journal.unclean:
            journal.unclean = True
            self._fs.truncate(journal.fd, 0)
            self._fs.fdatasync(journal.fd)
            journal.size, journal.unclean = 0, False
        self._checkpointed[topic] = sum(len(data) for _, data in files)
        self.checkpoints += 1

    # -- deleting ---------------------------------------------------------------------

    async def commit_delete(self, sub: Subscription, crash_point: Callable[[str], None]) -> None:
        """The commit point of ``sub``'s delete: a tombstone appended to its topic's
        journal and synced. Its checkpoint file is removed after (a file left by a
        failure there is older than the tombstone, and the next checkpoint removes it).

        Raises:
            OSError: the tombstone could not be written and synced; :meth:`may_be_deleted`
                tells whether it may be on disk all the same (written whole, its sync
                failed: it stays, and the next sync of the journal makes it durable).
        """
        key = (sub.topic, sub.name)
        async with self.lock:
            if self._closed:
                raise DispatcherClosedError()
            self._seq += 1
            self._maybe_deleted.add(key)
            loop = asyncio.get_running_loop()
            seq = self._seq
            await run_to_end(
                loop.run_in_executor(self._executor, self._tombstone, key, seq, crash_point)
            )
            sink = self._sinks.get(sub.topic)
            if sink is not None:
                value = record_value([cursor_journal.Entry(seq, sub.name, None)])
                self._appended[sub.topic] = await sink.append(value, key=None)
            self._deleting.discard(key)
        await self._wait_committed(sub.topic)

    def stats(self) -> CursorStats:
        """Counts since open and the journals' sizes; safe from any thread."""
        return CursorStats(self.flushes, self.failed_flushes, self.checkpoints, self._journal_bytes)

    def may_be_deleted(self, key: Key) -> bool:
        """Whether a delete of ``key`` whose commit raised may be on disk all the same."""
        return key in self._maybe_deleted

    def _tombstone(self, key: Key, seq: int, crash_point: Callable[[str], None]) -> None:
        topic, name = key
        directory = os.path.join(self.root, topic)
        if not self._fs.exists(directory):
            self._fs.makedirs(directory)
        journal: _Journal | None = None
        size = 0
        try:
            journal = self._journal(topic)
            size = journal.size
            self._append(topic, [cursor_journal.Entry(seq, name, None)])
        except BaseException:
            if journal is None or journal.size == size:  # not written whole: no tombstone
                self._maybe_deleted.discard(key)
            raise
        path = self.path(topic, name)
        try:
            if self._fs.exists(path):
                self._fs.remove(path)
                self._fs.fsync_dir(directory)
        except OSError:
            logger.exception(
                "%s/%s is deleted, but removing its old checkpoint %s failed; the next "
                "checkpoint of the topic removes it",
                topic,
                name,
                path,
            )
        crash_point("delete.after_commit")

    # -- reading and removing -----------------------------------------------------------

    def path(self, topic: str, name: str) -> str:
        """The checkpoint file of subscription ``name`` of ``topic``."""
        return os.path.join(self.root, topic, name + state_file.SUFFIX)

    def journal_path(self, topic: str) -> str:
        """The cursor journal of ``topic``."""
        return os.path.join(self.root, topic, cursor_journal.NAME)

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

    def load_all(self, topics: set[str]) -> list[tuple[str, str, state_file.StateDoc]]:
        """``(topic, name, doc)`` of every saved subscription of ``topics``: its newest
        state, checkpoint and journal merged. The files of other topics are removed.
        Blocking: run in a thread before :meth:`start`.

        An open writes little, so a restart after a crash stays quick however many
        subscriptions there are: a torn last journal write is cut; a damaged checkpoint's
        reset state is appended to the journal; the file of a subscription the journal
        says was deleted is removed. Only a journal with damage or foreign entries inside
        is checkpointed (every subscription of the topic to its file), so that the next
        open does not meet them again."""
        self._fs.makedirs(self.root)
        found: list[tuple[str, str, state_file.StateDoc]] = []
        loaded: list[tuple[str, Loaded]] = []
        for topic in sorted(self._fs.listdir(self.root)):
            if not os.path.isdir(os.path.join(self.root, topic)):
                logger.warning(
                    "removing %s: not a topic's directory (nothing else belongs there)",
                    os.path.join(self.root, topic),
                )
                self._fs.remove(os.path.join(self.root, topic))
            elif topic not in topics:
                logger.warning("dropping the subscriptions of deleted topic %r", topic)
                self.remove_topic(topic)
            else:
                loaded.append((topic, load_topic(self._fs, self.root, topic)))
        self._seq = max((got.merged.top_seq for _, got in loaded), default=0)
        for topic, got in loaded:
            states = got.merged.states
            if got.rewrite:
                docs = [
                    msgspec.structs.replace(doc, seq=self._next_seq()) for doc in states.values()
                ]
                self._checkpoint(topic, docs, frozenset(states))
                states = {d.subscription: d for d in docs}
            else:
                self._resume_journal(topic, got.parsed)
                reset = [
                    msgspec.structs.replace(states[name], seq=self._next_seq())
                    for name in got.reset
                ]
                if reset:
                    self._append(
                        topic, [cursor_journal.Entry(d.seq, d.subscription, d) for d in reset]
                    )
                    states.update((d.subscription, d) for d in reset)
                directory = os.path.join(self.root, topic)
                for name in got.deleted:
                    self._fs.remove(self.path(topic, name))
                if got.deleted:
                    self._fs.fsync_dir(directory)
            found.extend((topic, name, doc) for name, doc in sorted(states.items()))
        self._journal_bytes = {t: j.size for t, j in self._journals.items()}
        return found

    def _resume_journal(self, topic: str, parsed: cursor_journal.Parsed) -> None:
        """Open ``topic``'s journal, if it has one, where its last good batch ends: a torn
        last write is cut (and the cut synced) before anything is appended after it."""
        path = self.journal_path(topic)
        if not self._fs.exists(path):
            return
        fd = self._fs.open(path)
        try:
            if parsed.torn_bytes:
                self._fs.truncate(fd, parsed.good_bytes)
                self._fs.fdatasync(fd)
        except BaseException:
            self._fs.close(fd)
            raise
        self._journals[topic] = _Journal(fd, parsed.good_bytes)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def remove_topic(self, topic: str) -> None:
        """Remove every saved state of ``topic``, durably. Blocking: run in a thread,
        under :attr:`lock` once the store is open."""
        journal = self._journals.pop(topic, None)
        if journal is not None:
            self._fs.close(journal.fd)
        self._checkpointed.pop(topic, None)
        self._journal_bytes = {t: n for t, n in self._journal_bytes.items() if t != topic}
        remove_dir(self._fs, os.path.join(self.root, topic))


def remove_dir(fs: FileSystem, directory: str) -> None:
    """Remove ``directory`` and everything in it, durably (its parent is fsynced)."""
    if fs.exists(directory):
        shutil.rmtree(directory)
        fs.fsync_dir(os.path.dirname(directory))
