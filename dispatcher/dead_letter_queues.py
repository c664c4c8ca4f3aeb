"""Every subscription's dead-letter queue, their max_age expiry, and the dead-letter sink.

Owns :class:`DeadLetterQueues`: one :class:`~dispatcher.dead_letter_queue.DeadLetterQueue`
per subscription in ``<data dir>/dlq/<topic>/<subscription>/``, opened (and made) on first
use; the task that expires entries older than ``max_age`` every :data:`EXPIRY_INTERVAL_S`;
and :meth:`DeadLetterQueues.write`, the sink the dispatch tasks hand poison records to (a
:class:`~dispatcher.protocol.ToDeadLetter` becomes
:class:`~dispatcher.dead_letter_records.DeadLetter` entries). One queue's files and rules
are :mod:`dispatcher.dead_letter_queue`. DESIGN section 3.

Invariants:
- A queue is never made for a subscription that no longer exists: ``get`` asks ``exists``
  under the lock it opens queues with, so one deleted while a caller waited gets none.
- ``write`` returns only once the letters are durable or refused by the overflow policy;
  when it raises, the records stay unacknowledged and the subscription retries.

Imports ``wal`` and ``dispatcher.dead_letter_queue``, and the pure ``dispatcher.errors``,
``dispatcher.protocol``, ``dispatcher.dead_letter_records`` and
``dispatcher.dead_letter_config`` only.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from dispatcher.dead_letter_config import DlqConfig, PutOutcome
from dispatcher.dead_letter_queue import DeadLetterQueue
from dispatcher.dead_letter_records import DeadLetter
from dispatcher.errors import DlqFollowedError, SubscriptionNotFoundError
from dispatcher.protocol import ToDeadLetter
from wal import FileSystem

logger = logging.getLogger(__name__)

#: How often dead-letter queues drop entries older than their max_age, seconds.
EXPIRY_INTERVAL_S = 10.0


class DeadLetterQueues:
    """The dead-letter queues of every subscription, in ``<root>/<topic>/<subscription>/``,
    each opened (and made) when its subscription first dead-letters a record or an admin
    asks for it; and the sink that writes poison records to them (:meth:`write`). Use
    from one event loop.

    Args:
        root: ``<data dir>/dlq``.
        config: Every queue's settings.
        fs: File operations (tests pass a faulty one).
        clock: Wall-clock seconds (dead-letter times, max_age expiry).
        exists: Whether a subscription still exists (a queue is never made for one
            deleted while a caller waited).
    """

    def __init__(
        self,
        root: str,
        config: DlqConfig,
        *,
        fs: FileSystem,
        clock: Callable[[], float],
        exists: Callable[[str, str], bool],
    ) -> None:
        self.root = root
        self.config = config
        self._fs = fs
        self._clock = clock
        self._exists = exists
        self._queues: dict[tuple[str, str], DeadLetterQueue] = {}
        self._lock = asyncio.Lock()
        self._expiry: asyncio.Task[None] | None = None
        #: Called with each queue opened, before any caller gets it (a replicated
        #: topic's leader serves its log from then on); raising closes it again.
        self.on_open: Callable[[str, str, DeadLetterQueue], Awaitable[None]] | None = None
        #: Called with each queue about to be closed (its subscription or topic goes).
        self.on_close: Callable[[str, str, DeadLetterQueue], None] | None = None
        #: Topics whose queues this broker follows: none is opened for them here.
        self.followed: set[str] = set()

    def directory(self, topic: str, name: str) -> str:
        """Where subscription ``name`` of ``topic`` keeps its queue."""
        return os.path.join(self.root, topic, name)

    def start(self) -> None:
        """Start expiring entries older than ``max_age`` every :data:`EXPIRY_INTERVAL_S`."""
        self._expiry = asyncio.create_task(self._expiry_loop(), name="dead-letter expiry")

    async def aclose(self) -> None:
        """Stop expiring and close every queue. Idempotent."""
        task, self._expiry = self._expiry, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        queues, self._queues = list(self._queues.values()), {}
        for queue in queues:
            await queue.aclose()

    def opened(self, topic: str, name: str) -> DeadLetterQueue | None:
        """The queue of ``topic``/``name`` if it is open."""
        return self._queues.get((topic, name))

    async def get(self, topic: str, name: str, *, create: bool = True) -> DeadLetterQueue | None:
        """The queue of subscription ``name`` of ``topic``, opened (and made, with
        ``create``) on first use; ``None`` when it does not exist and ``create`` is off.

        Raises:
            SubscriptionNotFoundError: the subscription is gone (deleted while this waited).
        """
        key = (topic, name)
        async with self._lock:
            queue = self._queues.get(key)
            if queue is not None:
                return queue
            if topic in self.followed:
                raise DlqFollowedError(topic, name)
            if not self._exists(topic, name):
                raise SubscriptionNotFoundError(topic, name)
            directory = self.directory(topic, name)
            if not create and not await asyncio.to_thread(self._fs.exists, directory):
                return None
            queue = await DeadLetterQueue.open(
                directory, self.config, fs=self._fs, clock=self._clock, name=f"{topic}/{name}"
            )
            if self.on_open is not None:
                try:
                    await self.on_open(topic, name, queue)
                except BaseException:
                    await queue.aclose()
                    raise
            self._queues[key] = queue
            return queue

    async def close(self, topic: str, name: str) -> None:
        """Close and forget the queue of ``topic``/``name`` (its subscription is gone)."""
        async with self._lock:
            queue = self._queues.pop((topic, name), None)
        if queue is not None:
            if self.on_close is not None:
                self.on_close(topic, name, queue)
            await queue.aclose()

    async def close_topic(self, topic: str) -> None:
        """Close and forget every queue of ``topic`` (the topic is being deleted)."""
        async with self._lock:  # not while get() opens one of them
            keys = [key for key in list(self._queues) if key[0] == topic]
            queues = [(key, self._queues.pop(key)) for key in keys]
        for key, queue in queues:
            if self.on_close is not None:
                self.on_close(*key, queue)
            await queue.aclose()

    async def write(self, topic: str, name: str, action: ToDeadLetter) -> None:
        """Write ``action``'s poison records to the queue of subscription ``name`` of
        ``topic``: the subscriptions' dead-letter sink. Returns once they are stored,
        or rejected by the queue's overflow policy (logged); raises when they could not
        be written (the records then stay unacknowledged, and the subscription retries)."""
        queue = await self.get(topic, name)
        assert queue is not None
        batch = action.batch
        keys, values, headers = batch.keys(), batch.values(), batch.header_lists()
        stamps = batch.timestamps()
        letters = []
        for failure in action.failures:
            i = failure.offset - batch.base_offset
            letters.append(
                DeadLetter(
                    topic=topic,
                    partition=action.partition,
                    offset=failure.offset,
                    subscription=name,
                    key=keys[i],
                    value=values[i],
                    headers=tuple(headers[i]),
                    timestamp_ms=int(stamps[i]),
                    attempts=failure.deliveries,
                    reason=failure.reason or "delivery failed",
                    attempt_times_ms=failure.times_ms,
                )
            )
        outcome = await queue.put(letters)
        if outcome is PutOutcome.REJECTED:
            logger.warning(
                "%s/%s: the dead-letter queue is full and rejects new entries (overflow "
                "policy reject); dropped offsets %d..%d of partition %d",
                topic,
                name,
                action.begin,
                action.end - 1,
                action.partition,
            )

    async def expire(self) -> None:
        """Drop the entries older than ``max_age`` from every open queue."""
        for key, queue in list(self._queues.items()):
            try:
                removed = await queue.expire()
            except Exception:
                logger.exception("expiring the dead-letter queue of %s/%s failed", *key)
                continue
            if removed:
                logger.info("%s/%s: %d dead letters expired (max_age)", *key, removed)

    async def _expiry_loop(self) -> None:
        while True:
            await self.expire()
            await asyncio.sleep(EXPIRY_INTERVAL_S)
