"""The replicated topics' dead-letter queues on this broker (issue 37).

Role: each subscription's dead-letter queue of a replicated topic is one more log of the
topic, id ``dlq/<subscription>``: the leader serves it in ``ReplicaFetch`` and commits it
as a partition (its high watermark over the in-sync set); a follower appends it byte for
byte, with divergence and truncation as for a partition, and its start follows the
leader's (segments the leader deleted after acks, purges or expiry).

- On the leader the log is the :class:`~dispatcher.dead_letter_queue.DeadLetterQueue`'s
  own writer: every queue of the topic opened while leading (those on disk when leading
  starts, and each one made later) is added to the
  :class:`~broker.replica.leader.LeaderTopic` (``add_log``), and its ``put`` returns only
  once the letters are committed (``DeadLetterQueue.replicate``); a queue closed (its
  subscription deleted) leaves it (``remove_log``).
- On a follower no queue of the topic is open: the registry refuses to open one
  (``DeadLetterQueues.followed``), and each ``dlq/<subscription>`` log the leader names
  in its answers' ``log_ids`` is opened here as a plain writer on the queue's log
  directory (:meth:`DlqReplication.open_follower_log`), written by the fetcher only.
- When the follower is promoted its plain writers are closed, and the queues open from
  the same directories, so PeekDeadLetters shows what was fetched.

A queue's ``first_sequence`` (what acks, purges, expiry and evictions removed) travels
with its subscription's replicated state (``StateDoc.dlq_first``, in the ``state`` log):
on the leader a removal returns only once that save is committed, before any segment is
deleted; a promoted replica's queue opens at its own ``state.json`` and is then raised
to the replayed ``dlq_first`` (``DeadLetterQueue.restore_first``), so an acknowledged
ack holds after a failover. A removal that failed 'outcome unknown' may hold or not.

Task-safety: one event loop (the replica manager's role calls and the registry's).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import cast

from broker.partition import Partition
from broker.replica.leader import LeaderTopic
from dispatcher import SubscriptionRegistry
from dispatcher.dead_letter_queue import DeadLetterQueue, default_log_config
from dispatcher.errors import InvalidSubscriptionError, SubscriptionNotFoundError
from dispatcher.settings import check_subscription_name
from dispatcher.subscription import Subscription
from wal import LogWriter

logger = logging.getLogger(__name__)

#: The log id prefix of a subscription's dead-letter queue.
PREFIX = "dlq/"


def dlq_log_id(subscription: str) -> str:
    """The log id of ``subscription``'s dead-letter queue: ``dlq/<subscription>``."""
    return PREFIX + subscription


class ReplicaDlqLog:
    """A dead-letter queue's log as the leader and follower handle a partition.
    Task-safety: the writer's (one event loop).

    Args:
        writer: The queue's log.
        index: Where it stands among the topic's logs in a leader's commit waits: a
            negative number of its own (the partitions are 0.., the state log -1).
    """

    def __init__(self, writer: LogWriter, index: int) -> None:
        self.writer = writer
        self.index = index
        #: Set by a leader (a partition's publish gate); nothing publishes here.
        self.gate: object | None = None

    def note_replicated(self, _batches: Iterable[tuple[int, int, int, int]]) -> None:
        """No producer table: nothing to note."""

    async def reload_producers(self) -> None:
        """No producer table: nothing to rebuild."""


class DlqReplication:
    """The dead-letter side of a replicated topic's roles here (module docstring).

    Args:
        subscriptions: The broker's subscriptions (their dead-letter queues).
        leader: The started leader of a topic here (``ReplicaManager.leader``).
    """

    def __init__(
        self,
        subscriptions: SubscriptionRegistry,
        leader: Callable[[str], object | None],
    ) -> None:
        self._subscriptions = subscriptions
        self._dlqs = subscriptions.dead_letters
        self._leader = leader
        self._indices = itertools.count(-2, -1)
        #: Follower side: (topic, subscription) -> the plain writer the fetcher appends to.
        self._plain: dict[tuple[str, str], ReplicaDlqLog] = {}
        #: Leader side: (topic, subscription) -> the queue's log as its leader has it.
        self._led: dict[tuple[str, str], ReplicaDlqLog] = {}
        self._dlqs.on_open = self._opened
        self._dlqs.on_close = self._closing

    # -- the leader ------------------------------------------------------------------------

    def _leading(self, topic: str) -> LeaderTopic | None:
        leader = self._leader(topic)
        return leader if isinstance(leader, LeaderTopic) else None

    async def _opened(self, topic: str, name: str, queue: DeadLetterQueue) -> None:
        """The registry opened ``topic``/``name``'s queue: led here, its log is led too."""
        leader = self._leading(topic)
        if leader is None:
            return
        sub = self._subscription(topic, name)
        if sub is not None and sub.dlq_first > queue.first_sequence:
            await queue.restore_first(sub.dlq_first)  # removed before a failover
        log = ReplicaDlqLog(queue.writer, next(self._indices))
        await leader.add_log(dlq_log_id(name), cast(Partition, log))
        self._led[(topic, name)] = log
        queue.replicate(
            functools.partial(leader.committed, log.index),
            functools.partial(self._save_first, topic, name),
        )

    def _subscription(self, topic: str, name: str) -> Subscription | None:
        try:
            return self._subscriptions.get(topic, name)
        except (SubscriptionNotFoundError, InvalidSubscriptionError):
            return None

    async def _save_first(self, topic: str, name: str, first: int) -> None:
        """A led queue's removal: its new first sequence is saved with the subscription's
        state, and so committed in the topic's state log, before the call returns.

        Raises:
            SubscriptionNotFoundError: the subscription is gone (deleted meanwhile).
            Exception: what the state log's commit raises (outcome unknown).
        """
        sub = self._subscriptions.get(topic, name)
        sub.dlq_first = max(sub.dlq_first, first)
        await self._subscriptions.save(sub)

    def _closing(self, topic: str, name: str, queue: DeadLetterQueue) -> None:
        """The registry closes ``topic``/``name``'s queue: its log is led no more (a put
        waiting for its commit fails 'outcome unknown' first, so the close proceeds)."""
        log = self._led.pop((topic, name), None)
        queue.replicate(None)
        leader = self._leading(topic)
        if log is not None and leader is not None:
            leader.remove_log(dlq_log_id(name))

    async def leading(self, name: str) -> None:
        """``name``'s leader started and its subscriptions are taken over (after
        ``StateReplication.leading``): the follower's plain writers close, and every
        queue of the topic on disk opens, its log led from now on.

        A queue open already (a topic of one copy switching to the replicated path:
        its queues stayed open, so no open event comes) is led the same way, and its
        ``first_sequence`` (what acks, purges and expiry removed while it had one copy,
        when ``dlq_first`` stays 0) is saved into the subscription's replicated state
        before this returns, so a replica promoted later does not show those entries
        again.

        Raises:
            WalError: a queue could not be opened.
            Exception: what the state log's commit of a ``first_sequence`` raises.
        """
        await self._close_plain(name)
        self._dlqs.followed.discard(name)
        for sub in self._subscriptions.subscriptions(name):
            led = (name, sub.name) in self._led
            queue = await self._subscriptions.dead_letter_queue(name, sub.name, create=False)
            if queue is None or led or (name, sub.name) in self._led:
                continue
            await self._opened(name, sub.name, queue)
            if sub.dlq_first < queue.first_sequence:
                await self._save_first(name, sub.name, queue.first_sequence)

    async def not_leading(self, name: str) -> None:
        """``name`` stops being led here: its queues close (their waiting puts fail
        first) and none opens again while it is followed."""
        self._dlqs.followed.add(name)
        await self._dlqs.close_topic(name)

    # -- the follower ----------------------------------------------------------------------

    async def open_follower_log(self, topic: str, log: str) -> ReplicaDlqLog | None:
        """The fetcher's ``open_log``: the plain writer of ``log`` (``dlq/<subscription>``)
        of ``topic``, which this broker follows; ``None`` for another log id or a name
        that is not a subscription's.

        Raises:
            WalError: the log could not be opened.
        """
        if not log.startswith(PREFIX):
            return None
        name = log[len(PREFIX) :]
        try:
            check_subscription_name(name)
        except InvalidSubscriptionError:
            logger.warning("topic %s: the leader names a log %r; not followed", topic, log)
            return None
        key = (topic, name)
        found = self._plain.get(key)
        if found is not None:
            return found
        self._dlqs.followed.add(topic)
        await self._dlqs.close(topic, name)  # opened when this broker started, say
        directory = os.path.join(self._dlqs.directory(topic, name), "log")
        writer = await LogWriter.open(directory, default_log_config())
        plain = self._plain[key] = ReplicaDlqLog(writer, next(self._indices))
        return plain

    def opener(self, topic: str) -> Callable[[str], Awaitable[Partition | None]]:
        """``open_follower_log`` for ``topic`` (a follower's ``open_log``)."""
        opened = functools.partial(self.open_follower_log, topic)
        return cast(Callable[[str], Awaitable[Partition | None]], opened)

    async def _close_plain(self, topic: str) -> None:
        for key in [k for k in self._plain if k[0] == topic]:
            await self._plain.pop(key).writer.aclose()

    async def close(self, name: str) -> None:
        """``name``'s role ended (stopped or deleted): the plain writers close, and its
        queues may open again (as a factor-1 topic's)."""
        await self._close_plain(name)
        self._dlqs.followed.discard(name)

    async def aclose(self) -> None:
        """Close every plain writer (after every role ended)."""
        for topic in {k[0] for k in self._plain}:
            await self._close_plain(topic)
