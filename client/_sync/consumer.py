"""Consumer: the blocking twin of :class:`~client._async.consumer.AsyncConsumer`.

Role: the same credits, batched acks and reconnects, for code without an event loop. The
:class:`AsyncConsumer` on the consumer's own loop thread (:mod:`client._sync._bridge`)
runs the subscription, so the two classes cannot differ in how messages arrive, acks are
sent and sessions come back.

The everyday calls do not cross to the loop thread per message:

* ``receive`` and ``for message in consumer`` take from a read-ahead on the caller's
  side. When it is empty, one trip to the loop takes the messages the consumer holds
  (at least one, waiting for it; at most ``receive_queue // 4``, from 1 to 256). So a
  consumer holds at most ``receive_queue`` plus that many. What was read ahead and not
  yet handed out is released to the broker at ``close``, with the buffered messages;
  what was read ahead in a session that has since broken is dropped, not handed out
  (the broker delivers it again, as the async consumer's buffer has it).
* ``ack`` and ``ack_many`` queue the messages on the caller's side and return. The loop
  is woken once per run of acks, not per ack, and hands them to the async consumer, which
  sends them in batches as usual. ``nack``, ``ack_cumulative`` and ``receive_batch``
  (with nothing read ahead) still wait for the loop; the queued acks go first.

Leaving a ``for`` loop keeps the consumer open, as ``async for`` does.

The constructor and ``start`` are generated (``python -m client._sync._generate``); the
methods written here are this twin's one difference from the async class, the
caller's-side read-ahead and ack queue above, kept for speed: a trip to the loop thread
per message would cost more than the message (``sync_consume_per_record_msgs_s`` of
``bench pubsub``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Self, Unpack

from client._async.consumer import AsyncConsumer, check_receive_batch, check_timeout
from client._connection import ConnectionOptions
from client._message import Message
from client._sync._bridge import Blocking, LoopThread
from client._types import DEFAULT_BROKER
from client.errors import ClientClosed

#: The most messages one trip to the loop thread takes for ``receive`` and iteration.
MAX_READ_AHEAD = 256


class Consumer(Blocking):
    """Receives a subscription's messages, blocking; ``for message in consumer``.

    Thread-safe; a context manager (closing sends pending acks). Calling it from a thread
    that runs an event loop raises ``RuntimeError``: use :class:`AsyncConsumer` there.
    Threads that share one consumer share its read-ahead: each message goes to one of
    them.

    Args: as :class:`AsyncConsumer`, except that there is no ``channel`` argument (a
    ``grpc.aio`` channel is bound to the loop it was made on, and this loop is private).
    """

    # -- generated from AsyncConsumer by `python -m client._sync._generate`; do not edit --
    def __init__(
        self,
        topic: str,
        subscription: str,
        *,
        broker: str | Sequence[str] = DEFAULT_BROKER,
        type: str = "exclusive",
        initial_position: str = "earliest",
        mode: str = "at_least_once",
        consumer_name: str = "",
        receive_queue: int = 1_000,
        ack_interval_ms: float = 20.0,
        connect_timeout: float = 30.0,
        force: bool = False,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        self._bridge = LoopThread("Consumer", "AsyncConsumer")
        self._consumer = self._bridge.create(
            AsyncConsumer,
            topic,
            subscription,
            broker=broker,
            type=type,
            initial_position=initial_position,
            mode=mode,
            consumer_name=consumer_name,
            receive_queue=receive_queue,
            ack_interval_ms=ack_interval_ms,
            connect_timeout=connect_timeout,
            force=force,
            **connection,
        )
        self._created()

    def start(self) -> None:
        """Open the subscription (done by the first receive, too). Idempotent.

        As :meth:`AsyncConsumer.start`, blocking.
        """
        self._bridge.run(self._consumer.start())

    # -- end of generated code --

    def _created(self) -> None:
        """The caller's side of the consumer (run by ``__init__``, once the async consumer
        is made on the loop thread)."""
        self._loop = self._bridge.call(asyncio.get_running_loop)
        self._read_ahead = max(1, min(MAX_READ_AHEAD, self._consumer.receive_queue // 4))
        self._ahead: collections.deque[Message] = collections.deque()
        self._acks: collections.deque[Message] = collections.deque()
        self._acks_woken = False  # a hand-over of the queued acks is scheduled on the loop
        self._closing = False

    def receive(self, timeout: float | None = None) -> Message:
        """The next message, waiting up to ``timeout`` seconds (None: as long as it takes).
        Raises ``TimeoutError`` when none arrived in time, ``ValueError`` for a negative or
        NaN ``timeout``."""
        self._check_open()
        if timeout is not None:
            check_timeout(timeout)
        ahead, epoch = self._ahead, self._consumer.epoch
        while ahead:
            try:
                message = ahead.popleft()
            except IndexError:  # another thread took the last one
                break
            if message.epoch == epoch:
                return message
        first, *rest = self._bridge.run(self._consumer.receive_batch(self._read_ahead, timeout))
        self._ahead.extend(rest)
        return first

    def receive_batch(
        self, max_messages: int = 1_000, timeout: float | None = None
    ) -> list[Message]:
        """The messages that are ready: at least one, at most ``max_messages``. Raises
        ``ValueError`` when ``max_messages`` is below 1."""
        self._check_open()
        check_receive_batch(max_messages, timeout)
        ahead, epoch = self._ahead, self._consumer.epoch
        out: list[Message] = []
        while len(out) < max_messages:
            try:
                message = ahead.popleft()
            except IndexError:
                break
            if message.epoch == epoch:
                out.append(message)
        if out:
            return out
        return self._bridge.run(self._consumer.receive_batch(max_messages, timeout))

    def __iter__(self) -> Iterator[Message]:
        """Messages as they come; ends when the consumer is closed."""
        while True:
            try:
                yield self.receive()
            except ClientClosed:
                return

    def ack(self, message: Message) -> None:
        """Acknowledge one message (sent in a batch shortly).

        Raises:
            ClientClosed: the consumer is closing or closed: the broker sends it again.
        """
        self._check_open()
        self._acks.append(message)
        if not self._acks_woken:
            self._wake_for_acks()

    def ack_many(self, messages: Iterable[Message]) -> None:
        """Acknowledge messages, e.g. a whole ``receive_batch`` (sent in a batch shortly).

        Raises:
            ClientClosed: as :meth:`ack`.
        """
        self._check_open()
        self._acks.extend(messages)  # the caller's iterable, iterated on the caller's thread
        if not self._acks_woken:
            self._wake_for_acks()

    def ack_cumulative(self, message: Message) -> None:
        """Acknowledge ``message`` and every earlier message of its partition."""
        self._bridge.call(self._after_acks, self._consumer.ack_cumulative, message)

    def nack(
        self,
        message: Message,
        *,
        delay: float | None = None,
        reason: str = "",
        dead_letter: bool = False,
    ) -> None:
        """Report that ``message`` failed; it comes again after ``delay`` seconds (``None``:
        the subscription's backoff), or with ``dead_letter`` goes to the poison policy
        now. See :meth:`AsyncConsumer.nack`."""
        self._bridge.call(
            self._after_acks,
            lambda m: self._consumer.nack(m, delay=delay, reason=reason, dead_letter=dead_letter),
            message,
        )

    def close(self) -> None:
        """Send pending acks, release what was read ahead and not handed out, end the
        session, stop the loop thread. Idempotent."""
        self._bridge.check_caller()  # from a loop thread: RuntimeError, nothing closed
        self._closing = True
        self._bridge.close(self._aclose())

    async def _aclose(self) -> None:
        self._hand_over_acks()
        ahead = self._ahead
        unreceived = [ahead.popleft() for _ in range(len(ahead))]
        await self._consumer.aclose(unreceived)

    def _check_open(self) -> None:
        """Raise as every call does: from a thread that runs an event loop (even when the
        answer is at hand: code must not work only while a read-ahead lasts), or once
        closing began."""
        if sys.get_asyncgen_hooks().firstiter is not None:  # see check_caller
            self._bridge.check_caller()  # raises: this thread runs an event loop
        if self._closing:
            raise ClientClosed("the consumer is closed")

    def _wake_for_acks(self) -> None:
        """Have the loop take the queued acks (once for every ack queued until it runs)."""
        self._acks_woken = True
        try:
            self._loop.call_soon_threadsafe(self._hand_over_acks)
        except RuntimeError:  # the loop stopped: close() ran meanwhile
            raise ClientClosed("the consumer is closed") from None

    def _hand_over_acks(self) -> None:
        """On the loop: give the queued acks to the async consumer, in the order queued."""
        self._acks_woken = False  # first: an ack queued from now on wakes the loop again
        acks = self._acks
        if acks:
            # After the last acks went out (close won a race with ack), they are dropped:
            # the broker sends those messages again, as raising would have said.
            with contextlib.suppress(ClientClosed):
                self._consumer.ack_many([acks.popleft() for _ in range(len(acks))])

    def _after_acks(self, call: Callable[[Message], object], message: Message) -> None:
        """On the loop: the queued acks, then ``call(message)`` (keeps the caller's order)."""
        self._hand_over_acks()
        call(message)

    def __enter__(self) -> Self:
        self.start()
        return self
