"""Every subscription of the broker: creating, finding, listing, deleting and expiring.

Owns :class:`SubscriptionRegistry`, which ties together the parts each subscription needs:
its saved state (:mod:`dispatcher.cursor_store`: a journal per topic and a checkpoint file
per subscription, saves coalesced by a flusher), its dead-letter queue
(:class:`dispatcher.dead_letter_queues.DeadLetterQueues`, opened when a subscription first
dead-letters a record or an admin asks for one; the sink the dispatch tasks write poison
records to) and the heartbeat with the metrics samples (:mod:`dispatcher.heartbeat`). Its
settings (:class:`~dispatcher.settings.DispatchConfig`,
:class:`~dispatcher.settings.InitialPosition`) are :mod:`dispatcher.settings`.

When saved: a new subscription before its consumer gets an answer; a seek or a commit
(``AckUpTo``) before the reply (:meth:`SubscriptionRegistry.save` waits for the command
to be applied by the subscription's dispatch task, then for a flush); a redelivery's new
delivery count before it goes out; acks in the background every ``flush_interval_s``
(acks not yet saved may be redelivered after a crash; nothing is skipped); everything at
shutdown.

Deleting a subscription (:meth:`SubscriptionRegistry.delete`, the ``DeleteSubscription``
RPC and inactivity expiry): refused while consumers are attached unless forced. Once begun
it runs to its end whatever happens to its caller (:func:`wal.run_to_end`): the
subscription leaves the registry (a Subscribe of the same name waits for the delete, then
creates a new one), a tombstone is appended to its topic's cursor journal (the commit
point; if that fails, the subscription carries on unchanged), its consumers are let go with
:class:`SubscriptionDeletedError`, and its dead-letter queue is removed. The on-disk steps
and why a crash leaves all or nothing are :mod:`dispatcher.removal`'s. Its cursors stop
holding retention back at once (they leave :meth:`SubscriptionRegistry.saved_floor`), and
its metric series leave :meth:`samples`.

Inactivity expiry (``inactive_expiry_s``, off by default): the registry runs an expiry task
that deletes a subscription with no consumer and no ack, commit or seek for that long, by
the monotonic clock (the rule, and why a restart restarts every idle clock, are
:mod:`dispatcher.expiry`'s).

One piece, though past 600 lines: the rules it applies already live beside it (when a
subscription is idle, :mod:`dispatcher.expiry`; the delete's on-disk steps,
:mod:`dispatcher.removal`; names and per-subscription settings, :mod:`dispatcher.settings`;
a saved state read back, :mod:`dispatcher.state_file`; the ticks and samples,
:mod:`dispatcher.heartbeat`). What is left is the one map of subscriptions and the moves
that change it (create, delete, expire, drop a topic, release and take over a replicated
topic), and each move must keep the map, the cursor store, the heartbeat, the idle
tracker, the dead-letter queues and the deletes under way in step, with no await between
its lookup and its change (a Subscribe waits on a delete under way; a failed commit point
puts the subscription back). Split by move, each piece would reach into the same fields.
The seam to cut should it grow: the inactivity-expiry task
(:meth:`SubscriptionRegistry.expire_idle`, ``_expire``, ``_expiry_loop``), which only
reads the subscriptions (consumers, activity) and calls :meth:`SubscriptionRegistry.delete`,
could become a shell of its own beside :mod:`dispatcher.expiry`, handed the map, the clock
and ``delete``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence

from dispatcher import state_file
from dispatcher.cursor_store import CursorStats, CursorStore, remove_dir
from dispatcher.dead_letter_queue import DeadLetterQueue
from dispatcher.dead_letter_queues import DeadLetterQueues
from dispatcher.errors import (
    DispatcherClosedError,
    InvalidSubscriptionError,
    SubscriptionDeletedError,
    SubscriptionInUseError,
    SubscriptionLimitError,
    SubscriptionNotFoundError,
)
from dispatcher.expiry import IdleTracker
from dispatcher.heartbeat import SAMPLES_WAIT_S, Heartbeat, SubscriptionSample
from dispatcher.lag import HeartbeatConfig
from dispatcher.protocol import (
    DeliveryMode,
    DispatchLimits,
    PartitionSnapshot,
    SubscriptionType,
    ToDeadLetter,
)
from dispatcher.removal import prune_queues, remove_queue
from dispatcher.settings import DispatchConfig, InitialPosition, check_subscription_name
from dispatcher.state_log import StateSink
from dispatcher.subscription import Subscription
from wal import FileSystem, LogWriter, run_to_end

logger = logging.getLogger(__name__)

__all__ = ["SubscriptionRegistry"]


class SubscriptionRegistry:
    """The broker's subscriptions. Use from one event loop.

    Args:
        data_dir: The broker's data directory.
        fs: File operations (tests pass a faulty one).
        max_unacked: Records in flight per subscription, at most (replaces the one in
            ``dispatch``'s policies).
        dispatch: Redelivery, poison and dead-letter settings.
        flush_interval_s: How often acknowledged state is saved in the background.
        heartbeat: Heartbeat intervals and the stall timeout.
        monotonic: Monotonic seconds (tests pass a manual clock).
        clock: Wall-clock seconds (ack timeouts, nack delays, dead-letter times).
        on_dispatch: Called with a topic once per subscription of it; returns what the
            subscription calls with the seconds from publish to each first delivery.
        limits: Subscriptions per topic, consumers and credit, at most. Default: none.
        inactive_expiry_s: Delete a subscription with no consumer and no ack, commit or
            seek for this long, seconds (monotonic). Default ``None``: never.
        on_expired: Called with the topic of each subscription that expiry deleted (for
            the metric).
        crash_point: Called with each name of :data:`dispatcher.removal.CRASH_POINTS` as
            a delete passes it, and of :data:`dispatcher.cursor_store.CRASH_POINTS` as a
            checkpoint does. Default: nothing; tests raise there.
        on_cursor_flush: Called with the seconds each cursor flush took (for the metrics).
    """

    def __init__(
        self,
        data_dir: str,
        *,
        fs: FileSystem | None = None,
        max_unacked: int | None = None,
        dispatch: DispatchConfig | None = None,
        flush_interval_s: float = 0.1,
        heartbeat: HeartbeatConfig | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        on_dispatch: Callable[[str], Callable[[float], None]] | None = None,
        limits: DispatchLimits | None = None,
        inactive_expiry_s: float | None = None,
        on_expired: Callable[[str], None] = lambda _topic: None,
        crash_point: Callable[[str], None] = lambda _point: None,
        on_cursor_flush: Callable[[float], None] | None = None,
    ) -> None:
        self._limits = limits or DispatchLimits()
        self._idle: IdleTracker[tuple[str, str]] | None = (
            IdleTracker(inactive_expiry_s) if inactive_expiry_s is not None else None
        )
        self._on_expired = on_expired
        self._crash_point = crash_point
        #: Deletes under way, by subscription: a Subscribe of that name waits for it.
        self._deletions: dict[tuple[str, str], asyncio.Task[None]] = {}
        #: Deleted subscriptions whose queue directory could not be removed: removed
        #: before a subscription of the same name is created.
        self._orphan_queues: set[tuple[str, str]] = set()
        self._expiry_task: asyncio.Task[None] | None = None
        #: Replicated topics followed here: their subscriptions are not in memory
        #: (:meth:`release`) until :meth:`take_over`.
        self._released: set[str] = set()
        self._fs = fs or FileSystem()
        self._max_unacked = max_unacked
        self._dispatch = dispatch or DispatchConfig()
        self._clock = clock
        self._on_dispatch = on_dispatch
        self._subs: dict[tuple[str, str], Subscription] = {}
        self._monotonic = monotonic
        self._closed = False
        self._store = CursorStore(
            os.path.join(data_dir, "subscriptions"),
            self._fs,
            flush_interval_s=flush_interval_s,
            lookup=self._subs.get,
            members=self.subscriptions,
            crash_point=crash_point,
            on_flush=on_cursor_flush,
        )
        self._dlqs = DeadLetterQueues(
            os.path.join(data_dir, "dlq"),
            self._dispatch.dlq,
            fs=self._fs,
            clock=clock,
            exists=lambda topic, name: (topic, name) in self._subs,
        )
        self._heartbeat = Heartbeat(
            heartbeat or HeartbeatConfig(),
            monotonic,
            lambda: self._subs,
            lambda key: self._dlqs.opened(*key),
        )

    @property
    def root(self) -> str:
        """``<data dir>/subscriptions``: where the states are kept."""
        return self._store.root

    def cursor_stats(self) -> CursorStats:
        """What the cursor store did since open; safe from the metrics exporter's thread."""
        return self._store.stats()

    def samples(self, wait_s: float = SAMPLES_WAIT_S) -> tuple[SubscriptionSample, ...]:
        """Counters and lag of every subscription, built now. The metrics exporter's
        thread may call this too: see :meth:`Heartbeat.samples` for ``wait_s``."""
        return self._heartbeat.samples(wait_s)

    # -- lifecycle --------------------------------------------------------------------

    async def open(self, topics: Mapping[str, Sequence[LogWriter]]) -> None:
        """Load every saved subscription of ``topics``; drop those of topics now gone."""
        docs = await asyncio.to_thread(self._load_all, set(topics))
        for topic, name, doc in docs:
            snaps = state_file.restore(doc, topics[topic], topic, name)
            type_, mode = SubscriptionType(doc.type), DeliveryMode(doc.mode)
            sub = self._add(topic, name, topics[topic], snaps, type_, mode)
            sub.committer = doc.committer
            sub.dlq_first = doc.dlq_first
            self._store.restored((topic, name), (s.cursor for s in snaps))
        for topic, name, _doc in docs:
            if await asyncio.to_thread(self._fs.exists, self._dlqs.directory(topic, name)):
                await self.dead_letter_queue(topic, name)
        self._store.start()
        self._heartbeat.start()
        self._dlqs.start()
        if self._idle is not None:
            self._expiry_task = asyncio.create_task(self._expiry_loop(), name="expiry")
        logger.info("opened %d subscriptions under %s", len(self._subs), self._store.root)

    async def aclose(self) -> None:
        """Stop every subscription and save its state. Idempotent."""
        self._closed = True
        await self._heartbeat.aclose()
        task, self._expiry_task = self._expiry_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._deletions:  # they run to their end; the state they leave is then saved
            await asyncio.wait(list(self._deletions.values()))
        subs = list(self._subs.values())
        for sub in subs:
            await sub.aclose()
        try:
            await self._store.aclose(subs)
        finally:
            self._subs.clear()
            await self._dlqs.aclose()

    # -- replicated topics ---------------------------------------------------------------

    @property
    def dead_letters(self) -> DeadLetterQueues:
        """Every subscription's dead-letter queue (a replicated topic's roles hook in)."""
        return self._dlqs

    def set_state_sink(self, topic: str, sink: StateSink | None) -> None:
        """Append ``topic``'s saves to its replicated state log through ``sink`` (this
        broker leads it), or no more (``None``): see :mod:`dispatcher.cursor_store`."""
        self._store.set_sink(topic, sink)

    async def drop_state_sink(self, topic: str) -> None:
        """No more appends to ``topic``'s state log (this broker stops leading it):
        returns once a flush that may still be appending to it has ended, so that the
        follower that takes the log over next is its only writer."""
        self._store.set_sink(topic, None)
        async with self._store.lock:
            pass

    async def release(self, topic: str) -> int:
        """This broker follows replicated ``topic``: its subscriptions stop and leave
        memory (no dispatch task, no listener on the partitions, no heartbeat tick, no
        inactivity expiry, no metric series, no dead-letter queue open); a follower
        serves none of them (every call naming the topic is refused), and a promotion
        rebuilds them from the replicated state (:meth:`take_over`). Their files stay,
        and so do the cursors retention's floor keeps (:meth:`saved_floor`), as they
        were. Idempotent; returns how many were released.
        """
        self._released.add(topic)
        keys = [key for key in self._subs if key[0] == topic]
        for key in keys:
            sub = self._subs.pop(key)
            self._store.release(key)
            self._heartbeat.forget(key)
            if self._idle is not None:
                self._idle.forget(key)
            await sub.aclose()
            await self._dlqs.close(*key)
        if keys:
            logger.info(
                "released the %d subscriptions of replicated topic %s (followed here)",
                len(keys),
                topic,
            )
        return len(keys)

    async def take_over(
        self,
        topic: str,
        writers: Sequence[LogWriter],
        states: Mapping[str, state_file.StateDoc] | None,
    ) -> None:
        """This broker now leads replicated ``topic``: its subscriptions become
        ``states`` (replayed from the topic's state log, :func:`dispatcher.state_log.replay`),
        replacing whatever this broker held of them (a copy from an older term as leader).
        Their files are rewritten as a checkpoint, and, with the sink set first, that
        checkpoint is the new term's first snapshot record. ``None`` (the log never held
        a save): the subscriptions held here stay (read back from their files if
        :meth:`release` took them out of memory), and are snapshotted likewise.

        Cursors are fitted to the logs' durable ends, not their marks: the promoted
        replica's tail is committed in its epoch, and a committed ack must not be undone.
        """
        if states is None and topic in self._released:
            states = await asyncio.to_thread(self._store.held_states, topic)
        self._released.discard(topic)
        if states is not None:
            self._store.forget_topic(topic)  # released cursors: the states replace them
            for key in [k for k in self._subs if k[0] == topic]:
                sub = self._subs.pop(key)
                self._store.forget(key)
                self._heartbeat.forget(key)
                await sub.aclose()
                await self._dlqs.close(*key)
            ends = [w.durable_end for w in writers]
            for name, doc in sorted(states.items()):
                snaps = state_file.restore(doc, writers, topic, name, ends=ends)
                type_, mode = SubscriptionType(doc.type), DeliveryMode(doc.mode)
                sub = self._add(topic, name, writers, snaps, type_, mode)
                sub.committer = doc.committer
                sub.dlq_first = doc.dlq_first
        await self._store.save_all(self.subscriptions(topic), checkpoint=True, topics=[topic])
        logger.info(
            "took over the %d subscriptions of replicated topic %s%s",
            len(self.subscriptions(topic)),
            topic,
            "" if states is not None else " (held here; its state log was empty)",
        )

    # -- finding and creating -----------------------------------------------------------

    async def subscribe(
        self,
        topic: str,
        name: str,
        writers: Sequence[LogWriter],
        *,
        initial: InitialPosition = InitialPosition.EARLIEST,
        type_: SubscriptionType = SubscriptionType.EXCLUSIVE,
        mode: DeliveryMode = DeliveryMode.AT_LEAST_ONCE,
        any_type: bool = False,
    ) -> Subscription:
        """The subscription ``name`` of ``topic``, created at ``initial`` (and saved) if new.

        ``any_type`` accepts an existing subscription whatever its type and mode (a reader
        that only commits offsets, like Spark).

        Raises:
            InvalidSubscriptionError: a bad name, or it exists with another type or mode.
            SubscriptionLimitError: it is new and the topic has
                ``max_subscriptions_per_topic`` subscriptions already.
            DispatcherClosedError: the registry is closed (the broker is shutting down).
        """
        if self._closed:
            raise DispatcherClosedError()
        check_subscription_name(name)
        pending = self._deletions.get((topic, name))
        if pending is not None:
            await asyncio.wait([pending])  # then new, or back if the delete failed
        sub = self._subs.get((topic, name))
        if sub is not None:
            if any_type:
                return sub
            for what, have, want in (("type", sub.type, type_), ("mode", sub.policy.mode, mode)):
                if have is not want:
                    raise InvalidSubscriptionError(
                        what,
                        f"subscription {name!r} on topic {topic!r} is {have.value}, not "
                        f"{want.value}; use its {what} or another subscription name",
                    )
            return sub
        self._check_room(topic)
        if (topic, name) in self._orphan_queues:  # an old queue must not be inherited
            await asyncio.to_thread(self._remove_queue, topic, name)
            self._orphan_queues.discard((topic, name))
        if initial is InitialPosition.LATEST:
            snaps = [PartitionSnapshot(w.high_water_mark) for w in writers]
        else:
            snaps = [PartitionSnapshot(w.first_offset) for w in writers]
        sub = self._add(topic, name, writers, snaps, type_, mode)
        await self._store.save(sub)
        logger.info("created subscription %s/%s at %s", topic, name, initial.value)
        return sub

    def _check_room(self, topic: str) -> None:
        """Raise unless ``topic`` may have one more subscription."""
        most = self._limits.max_subscriptions_per_topic
        if most is None:
            return
        count = sum(1 for t, _name in self._subs if t == topic)
        if count >= most:
            raise SubscriptionLimitError(
                "max_subscriptions_per_topic",
                most,
                f"topic {topic!r} has {count} subscriptions",
                "reuse an existing subscription of the topic, or raise the limit",
            )

    def get(self, topic: str, name: str) -> Subscription:
        """The subscription.

        Raises:
            InvalidSubscriptionError: there is none, and ``name`` is not a valid
                subscription name (none can exist, so the advice to create it would be
                wrong).
            SubscriptionNotFoundError: there is none.
        """
        sub = self._subs.get((topic, name))
        if sub is None:
            check_subscription_name(name)
            raise SubscriptionNotFoundError(topic, name)
        return sub

    def subscriptions(self, topic: str | None = None) -> list[Subscription]:
        """Every subscription (of ``topic`` when given), sorted by topic and name."""
        return [s for key, s in sorted(self._subs.items()) if topic in (None, key[0])]

    async def drop_topic(self, topic: str) -> None:
        """Stop and forget every subscription of ``topic`` (the topic is being deleted).

        The dead-letter queues go first, on disk too: a crash halfway leaves subscription
        files without queues (pruned at the next open with the topic gone), never queues
        that a later subscription of the same name would inherit."""
        pending = [task for key, task in self._deletions.items() if key[0] == topic]
        if pending:
            await asyncio.wait(pending)
        self._orphan_queues = {key for key in self._orphan_queues if key[0] != topic}
        for key in [k for k in self._subs if k[0] == topic]:
            await self._subs.pop(key).aclose(SubscriptionDeletedError(*key, "topic deleted"))
            self._store.forget(key)
            self._heartbeat.forget(key)
        await self._dlqs.close_topic(topic)
        async with self._store.lock:
            await asyncio.to_thread(remove_dir, self._fs, os.path.join(self._dlqs.root, topic))
            await asyncio.to_thread(self._store.remove_topic, topic)

    # -- deleting -------------------------------------------------------------------------

    async def delete(
        self, topic: str, name: str, *, force: bool = False, why: str = "deleted by an admin"
    ) -> tuple[str, ...]:
        """Delete subscription ``name`` of ``topic``: its state and its dead-letter queue.

        Once begun it runs to its end even if the caller is cancelled (see the module
        docstring for the steps). Returns the names of the consumers it detached.

        Args:
            topic: The subscription's topic.
            name: The subscription.
            force: Detach attached consumers; without it they make the delete fail.
            why: Why, in words: for the log and the detached consumers' streams.

        Raises:
            InvalidSubscriptionError: a bad name.
            SubscriptionNotFoundError: there is no such subscription (or it was deleted
                while this call waited for another delete of it).
            SubscriptionInUseError: consumers are attached and ``force`` is off; nothing
                was changed.
            OSError, WalIOError: the state file could not be removed; nothing was changed.
        """
        check_subscription_name(name)
        key = (topic, name)
        pending = self._deletions.get(key)
        if pending is not None:
            await asyncio.wait([pending])
        sub = self.get(topic, name)
        consumers = sub.consumers()
        if consumers and not force:
            raise SubscriptionInUseError(topic, name, consumers)
        # No await from the lookup to here: nothing attaches or saves in between.
        del self._subs[key]
        self._store.doom(sub)
        task = asyncio.ensure_future(self._delete(key, sub, why))
        self._deletions[key] = task
        task.add_done_callback(functools.partial(self._deleted, key))
        await run_to_end(task)
        logger.info(
            "deleted subscription %s/%s (%s)%s",
            topic,
            name,
            why,
            f"; detached consumers {', '.join(consumers)}" if consumers else "",
        )
        return consumers

    def _deleted(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._deletions.get(key) is task:
            del self._deletions[key]

    async def _delete(self, key: tuple[str, str], sub: Subscription, why: str) -> None:
        """The delete's steps, from the commit point on (see :mod:`dispatcher.removal`)."""
        topic, name = key
        try:
            await self._store.commit_delete(sub, self._crash_point)
        except BaseException:
            if not self._store.may_be_deleted(key):  # nothing changed
                self._subs[key] = sub
                self._store.undoom(sub)
                raise
            self._orphan_queues.add(key)  # gone, but whether durably is unknown
            await self._forget(key, sub, why)
            raise
        await self._forget(key, sub, why)
        try:
            await asyncio.to_thread(self._remove_queue, topic, name)
        except OSError:
            self._orphan_queues.add(key)
            logger.exception(
                "%s/%s: the subscription is deleted, but its dead-letter queue %s could not "
                "be removed; it goes at the next start, or before the name is used again",
                topic,
                name,
                self._dlqs.directory(topic, name),
            )
        except BaseException:
            self._orphan_queues.add(key)
            raise

    async def _forget(self, key: tuple[str, str], sub: Subscription, why: str) -> None:
        """Drop everything the registry held for a deleted subscription; let its consumers
        go, their streams ending with ``SubscriptionDeletedError``; close its queue."""
        self._store.forget(key)
        self._heartbeat.forget(key)
        if self._idle is not None:
            self._idle.forget(key)
        await sub.aclose(SubscriptionDeletedError(*key, why))
        await self._dlqs.close(*key)

    def _remove_queue(self, topic: str, name: str) -> None:
        remove_queue(self._fs, self._dlqs.directory(topic, name), self._crash_point)

    async def expire_idle(self) -> list[tuple[str, str]]:
        """Delete every subscription inactive for ``inactive_expiry_s`` (see
        :mod:`dispatcher.expiry`); return which. The expiry task calls this in a loop; tests
        call it directly with a manual clock."""
        idle = self._idle
        if idle is None or self._closed:
            return []
        now = self._monotonic()
        for key, sub in self._subs.items():
            idle.observe(key, attached=bool(sub.consumers()), activity=sub.activity, now=now)
        idle.retain(set(self._subs))
        deleted = []
        for expired in idle.expired(now):
            found = self._subs.get(expired.key)
            if found is None:
                continue
            # Look again: a consumer may have come, or a commit, while a delete ran.
            idle_s = idle.observe(
                expired.key,
                attached=bool(found.consumers()),
                activity=found.activity,
                now=self._monotonic(),
            )
            if idle_s < idle.expiry_s:
                continue
            if await self._expire(expired.key, idle_s):
                deleted.append(expired.key)
        return deleted

    async def _expire(self, key: tuple[str, str], idle_s: float) -> bool:
        """Delete one expired subscription (never forced); log and count it."""
        topic, name = key
        assert self._idle is not None
        why = f"no consumer and no ack, commit or seek for {idle_s:.1f} s"
        try:
            await self.delete(topic, name, why=f"expired: {why}")
        except (SubscriptionInUseError, SubscriptionNotFoundError):
            return False  # a consumer came in time, or someone else deleted it
        except Exception:
            logger.exception("%s/%s: deleting the expired subscription failed", topic, name)
            return False
        logger.info(
            "%s/%s: subscription expired and deleted: %s (inactive_expiry_ms = %d)",
            topic,
            name,
            why,
            round(self._idle.expiry_s * 1000),
        )
        self._on_expired(topic)
        return True

    async def _expiry_loop(self) -> None:
        assert self._idle is not None
        pause = min(self._heartbeat.config.interval_s, self._idle.expiry_s)
        while True:
            await asyncio.sleep(pause)
            try:
                await self.expire_idle()
            except Exception:  # keep expiring the others
                logger.exception("inactivity expiry failed; trying again")

    async def save(self, sub: Subscription) -> None:
        """Save ``sub``'s acknowledged state now (before answering a seek or a commit),
        once every command queued to it so far (that seek or commit) is applied."""
        await sub.applied()
        await self._persist(sub)

    async def _persist(self, sub: Subscription) -> None:
        """Save ``sub``'s state now: a pass awaits this before a redelivery goes out."""
        await self._store.save(sub)

    # -- dead-letter queues and the heartbeat --------------------------------------------

    async def dead_letter_queue(
        self, topic: str, name: str, *, create: bool = True
    ) -> DeadLetterQueue | None:
        """The dead-letter queue of subscription ``name`` of ``topic``, opened (and made,
        with ``create``) on first use; ``None`` when it does not exist and ``create`` is
        off.

        Raises:
            SubscriptionNotFoundError: no such subscription.
        """
        return await self._dlqs.get(topic, name, create=create)

    async def _dead_letter(self, sub: Subscription, action: ToDeadLetter) -> None:
        """Write poison records to ``sub``'s dead-letter queue (the subscription's sink)."""
        await self._dlqs.write(sub.topic, sub.name, action)

    def saved_floor(self, topic: str) -> list[int] | None:
        """Per partition of ``topic``, the lowest cursor any of its subscriptions has on
        disk; ``None`` when it has no subscription. Retention never deletes at or past it,
        so a restart never finds a saved cursor below the log's first offset."""
        return self._store.saved_floor(topic)

    def heartbeat_round(self) -> float:
        """Tick every subscription that is due; return the seconds until the next is.

        The heartbeat task calls this in a loop; tests call it directly with a manual clock.
        """
        return self._heartbeat.round()

    # -- internals --------------------------------------------------------------------

    def _add(  # noqa: PLR0917 - two private callers
        self,
        topic: str,
        name: str,
        writers: Sequence[LogWriter],
        snaps: Sequence[PartitionSnapshot],
        type_: SubscriptionType,
        mode: DeliveryMode,
    ) -> Subscription:
        policy = self._dispatch.policy_for(topic, name, type_, mode)
        if self._max_unacked is not None:
            policy = dataclasses.replace(policy, max_unacked=self._max_unacked)
        sub = Subscription(
            topic,
            name,
            writers,
            snaps,
            policy=policy,
            on_change=self._store.mark_dirty,
            persist=self._persist,
            dead_letters=self._dead_letter,
            clock=self._monotonic,
            wall_clock=self._clock,
            heartbeat_interval_s=self._heartbeat.config.interval_for(topic, name),
            stall_timeout_s=self._heartbeat.config.stall_timeout_s,
            limits=self._limits,
        )
        if self._on_dispatch is not None:
            sub.on_dispatch = self._on_dispatch(topic)
        self._subs[(topic, name)] = sub
        sub.start()
        return sub

    def _load_all(self, topics: set[str]) -> list[tuple[str, str, state_file.StateDoc]]:
        """``(topic, name, doc)`` of every saved subscription (see ``CursorStore.load_all``).
        The files and queues of topics not in ``topics`` are removed, and queues without
        a subscription pruned."""
        dlq_root = self._dlqs.root
        if self._fs.exists(dlq_root):
            for topic in sorted(set(self._fs.listdir(dlq_root)) - topics):
                logger.warning("dropping the dead-letter queues of deleted topic %r", topic)
                remove_dir(self._fs, os.path.join(dlq_root, topic))
        found = self._store.load_all(topics)
        prune_queues(self._fs, dlq_root, {(topic, name) for topic, name, _ in found})
        return found
