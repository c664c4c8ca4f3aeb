"""AsyncConsumer: a subscription's messages, with credits, batched acks and reconnects.

Role: one Subscribe stream at a time (a "session"). The consumer opens the subscription,
grants the broker ``receive_queue`` records of credit, and cuts each delivered batch into
:class:`~client._message.Message` views that decode only what is read. As the application
takes messages, credit is given back in chunks of half the queue, so the broker never sends
more than the queue holds.

Acks are batched: :mod:`client._async._consumer_acks` says when they are sent.

Nothing is queued per request: a session's writer (``_write``, the request iterator gRPC
pulls from) builds each credit or ack request from the consumer's state when the stream is
ready for the next one, so grants and acks made meanwhile go out as one. An application
that takes buffered messages never awaits anything that blocks, so while requests wait for
the writer, receiving yields to the loop once every few messages; else the credit of a
9,000-record delivery would reach the broker only once all of it was taken, and the broker
would idle until then. The per-record path takes a message from a segment of the
:class:`~client._message.MessageBuffer` without a call, and counts credit at the
segment's end.

A clean close gives back what was never handed out. ``aclose`` first asks the broker to
stop sending (``drain``) and waits for its answer (``drained``, after the last delivery it
will send), so no delivery can still be on the way. Then it releases every buffered
message the application never received (the prefetch, the rest of a partly read batch)
together with the pending acks, and half-closes. Released records are not delivery
attempts: the next consumer gets them at once with their old redelivery count. Messages
the application did receive and did not ack still count as a failed delivery, so a
record that makes the application raise inside ``async with`` reaches max-deliveries.

Reconnects, and the first open's wait for an unreachable broker, are the sessions' job:
:mod:`client._async._consumer_session`.

The class is three modules by job, joined as mixins so that the per-record paths (take a
message, ack it) read one object's fields with no call between: this one (lifecycle,
receiving and credit), :class:`~client._async._consumer_acks.AckBatcher` (acks) and
:class:`~client._async._consumer_session.Sessions` (streams and reconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Self, Unpack

import grpc

from client._async._consumer_acks import AckBatcher
from client._async._consumer_session import Sessions
from client._connection import ConnectionOptions, ConnectionSettings
from client._message import Message, MessageBuffer
from client._signal import Signal
from client._types import DEFAULT_BROKER
from client.errors import (
    ClientClosed,
    ClientError,
)
from proto import broker_pb2 as _pb
from proto.names import CONSUMER_NAME_RULE, is_valid_consumer_name
from proto.shown import shown

_TYPES = {
    "exclusive": _pb.EXCLUSIVE,
    "failover": _pb.FAILOVER,
    "shared": _pb.SHARED,
    "key_shared": _pb.KEY_SHARED,
}
_POSITIONS = {"earliest": _pb.EARLIEST, "latest": _pb.LATEST}
_MODES = {"at_least_once": _pb.AT_LEAST_ONCE, "at_most_once": _pb.AT_MOST_ONCE}
#: The largest ``receive_queue`` (the protocol's credit is a 32-bit count).
MAX_RECEIVE_QUEUE = 2**31 - 1

#: While credit or acks wait for the stream's writer, the application yields to the loop
#: once per this many receives (a yield costs about as much as a few receives).
_NUDGE_EVERY = 16


class AsyncConsumer(AckBatcher, Sessions):
    """Receives a subscription's messages; ``async for message in consumer``.

    Task-safe on one event loop; an async context manager (closing sends pending acks).

    Args:
        topic: The topic to read.
        subscription: The subscription's name; created on first use.
        broker: ``host:port`` of the broker, or seed brokers: ``"h1:p1,h2:p2"`` or a
            sequence of addresses. The subscription opens at the topic's owner: a broker
            that does not serve the topic refuses the open, and the consumer reopens
            where the refusal (or, after a backoff, a Lookup) says; a session whose
            stream breaks looks the topic up again before it reopens. Acks ride the
            stream, so they go to the owner.
        type: ``exclusive`` (one consumer at a time), ``failover``, ``shared`` or
            ``key_shared``.
        initial_position: Where a new subscription starts: ``earliest`` or ``latest``.
        mode: ``at_least_once`` (a message counts once acked; unacked ones come again) or
            ``at_most_once`` (it counts once sent: never redelivered, acks not needed).
        consumer_name: How this consumer shows in ``headrace lag``.
        receive_queue: Records the broker may send ahead of the application. Default 1,000.
        ack_interval_ms: The longest an ack waits to be sent. Default 20 ms.
        channel: An existing channel to use for the first seed (not closed by the
            consumer). Without one,
            the consumers of one event loop with the same ``broker``,
            ``reconnect_backoff_max_s`` and security share a connection
            (:mod:`client._shared`).
        connect_timeout: How long the first open waits for an unreachable broker,
            seconds, before ``start`` raises ``Unavailable``. Default 30.
        **connection: The connection keywords, the same for every client class
            (:class:`~client.ConnectionOptions`): ``reconnect_backoff_max_s``,
            ``token``, ``tls_ca``, ``tls_cert`` and ``tls_key``. Unused with ``channel``
            (that channel's own settings apply); a bad one raises ``ValueError`` here.
        force: Attach even when a reader that pulls by offset (a Spark query) commits
            to the subscription (its ``committer`` in ``subscriptions describe``). Without
            it the broker refuses with ``FailedPrecondition`` naming the committer: this
            consumer's acks would move the cursor the query commits. Default off.
    """

    def __init__(
        self,
        topic: str,
        subscription: str,
        *,
        broker: str | Sequence[str] = DEFAULT_BROKER,
        type: str = "exclusive",  # the name DESIGN gives it
        initial_position: str = "earliest",
        mode: str = "at_least_once",
        consumer_name: str = "",
        receive_queue: int = 1_000,
        ack_interval_ms: float = 20.0,
        channel: grpc.aio.Channel | None = None,
        connect_timeout: float = 30.0,
        force: bool = False,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        #: Where the broker is and how to reach it (unused with ``channel``); consumers
        #: whose settings are equal share a connection (:mod:`client._shared`).
        self.connection = ConnectionSettings.of("AsyncConsumer", broker, connection)
        _check_settings(type, initial_position, mode, receive_queue, ack_interval_ms)
        if not is_valid_consumer_name(consumer_name):  # the broker refuses it on open
            raise ValueError(f"consumer_name {shown(consumer_name)}: {CONSUMER_NAME_RULE}")
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, not {connect_timeout!r}")
        self.topic = topic
        self.subscription = subscription
        #: Records the broker may send ahead of the application.
        self.receive_queue = receive_queue
        self._open = _pb.OpenSubscription(
            topic=topic,
            subscription=subscription,
            type=_TYPES[type],
            initial_position=_POSITIONS[initial_position],
            mode=_MODES[mode],
            consumer_name=consumer_name,
            initial_credit=receive_queue,
            force=force,
        )
        self._credit_chunk = max(1, receive_queue // 2)
        if channel is None:
            self.connection.check()  # bad settings raise here, not in the session task
        self._buffer = MessageBuffer(self._credit_chunk)
        #: Whether ``__anext__`` must take its slow path: closed, or the writer has
        #: requests waiting (``_nudge``).
        self._hold = False
        self._ready = Signal()  # once per delivery: no loop lookup per wait
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._nudge = False  # the outbox has requests its writer has not taken yet
        self._nudge_in = 0  # receives until the next yield to that writer
        self._taken = 0
        self._init_acks(ack_interval_ms)
        self._init_sessions(channel, connect_timeout)

    @property
    def epoch(self) -> int:
        """The number of the current session; a reconnect starts the next. Acks of an
        older session's messages are dropped (the broker delivers them again), so the
        blocking twin never hands out what it read ahead in one."""
        return self._epoch

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Open the subscription (done by the first receive, too). Idempotent.

        Raises:
            ClientError: the broker refused it (no such topic, bad name, held by another
                consumer, ...).
        """
        if self._closed:
            raise ClientClosed("the consumer is closed")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"consumer {self.subscription}")
        subscribed = asyncio.ensure_future(self._subscribed.wait())
        try:
            await asyncio.wait([subscribed, self._task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            subscribed.cancel()
        if not self._subscribed.is_set():
            self._raise()

    async def close(self) -> None:
        """The same as :meth:`aclose`: the sync twin's name for it."""
        await self.aclose()

    async def aclose(self, unreceived: Sequence[Message] = ()) -> None:
        """Send pending acks, end the session, close the channel (if the consumer opened
        it). Idempotent.

        ``unreceived``: messages taken from this consumer that the application never got
        (the blocking twin's read-ahead, :class:`~client.Consumer`), oldest first. They
        are released to the broker with the buffered ones."""
        if self._closed:
            return
        self._closed = self._hold = True
        task, self._task = self._task, None
        if task is not None:
            await self._release_unreceived(task, unreceived)
            self._flush_acks()
        self._acks_final, self._ack_epoch = True, -1
        if task is not None:
            self._out.half_close = True  # after the last acks: the broker ends the stream
            self._kick()
            try:
                await asyncio.wait_for(asyncio.shield(task), 5)
            except (TimeoutError, ClientError):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ClientError):
                    await task
        self._ready.set()
        if self._lease is not None:
            await self._lease.release()
        await self.router.aclose()

    async def _release_unreceived(
        self, task: asyncio.Task[None], taken: Sequence[Message] = ()
    ) -> None:
        """Drain the open session, then queue releases of the buffered messages the
        application never received, ``taken`` ones first (sent with the last acks). If
        the session is not
        open or breaks meanwhile, nothing is released: the broker counts a broken
        stream's records as failed, and a new session knows nothing of the old one's."""
        if not self._live or task.done():
            return
        epoch, drained = self._epoch, self._drained
        self._out.drain = True
        self._kick()
        waiter = asyncio.ensure_future(drained.wait())
        try:
            await asyncio.wait([waiter, task], timeout=5, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not drained.is_set() or epoch != self._epoch or not self._live:
            return
        runs: dict[int, list[list[int]]] = {}
        unreceived = ((m.epoch, m.partition, m.offset, m.offset + 1) for m in taken)
        for message_epoch, partition, begin, end in itertools.chain(
            unreceived, self._buffer.ranges()
        ):
            if message_epoch != epoch:
                continue
            ranges = runs.setdefault(partition, [])
            if ranges and ranges[-1][1] == begin:
                ranges[-1][1] = end
            else:
                ranges.append([begin, end])
        self._buffer.clear()
        self._releases = [
            _pb.OffsetRange(partition=p, begin=b, end=e)
            for p, ranges in runs.items()
            for b, e in ranges
        ]

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- receiving --------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        buffer = self._buffer
        if buffer.left and not self._hold:  # the common case, inlined: no call per record
            buffer.left -= 1
            if buffer.left:
                return next(buffer.current)
            message = next(buffer.current)
            self._took(buffer.took())  # a segment's end: credit may be due
            return message
        try:
            return await self.receive()
        except ClientClosed:
            raise StopAsyncIteration from None

    async def _let_writer_run(self) -> None:
        """Yield to the loop, so the stream's writer sends the credit and acks queued
        meanwhile: an application that takes buffered messages never awaits anything that
        blocks, and its grants would otherwise wait until the buffer is empty, leaving the
        broker idle until then. Once per ``_NUDGE_EVERY`` receives while the writer has not
        taken them (it may be busy with the previous write)."""
        self._nudge_in = _NUDGE_EVERY
        await asyncio.sleep(0)

    async def receive(self, timeout: float | None = None) -> Message:  # noqa: ASYNC109
        """The next message, waiting up to ``timeout`` seconds (None: as long as it takes).

        ``timeout`` is a parameter (not only ``asyncio.timeout`` around the call) so that
        the blocking twin has the same signature.

        Raises:
            ValueError: ``timeout`` is negative or not a number.
            TimeoutError: no message arrived in time.
            ClientClosed: the consumer was closed (buffered messages are not handed out
                after ``aclose`` began: they are released to the broker).
            ClientError: the session failed for good (see the message).
        """
        if timeout is not None:
            check_timeout(timeout)
        if self._nudge:
            self._nudge_in -= 1
            if self._nudge_in <= 0:
                await self._let_writer_run()
        if self._closed:
            raise ClientClosed("the consumer is closed")
        buffer = self._buffer
        if not buffer:
            await self._wait_for_messages(timeout)
        message = buffer.take()
        if not buffer.left:  # a segment's end: credit may be due
            self._took(buffer.took())
        return message

    async def receive_batch(
        self,
        max_messages: int = 1_000,
        timeout: float | None = None,  # noqa: ASYNC109 - the sync twin's signature
    ) -> list[Message]:
        """The messages that are ready: at least one (waiting up to ``timeout`` seconds
        for it), at most ``max_messages``.

        Raises:
            ValueError: ``max_messages`` is below 1, or ``timeout`` as :meth:`receive`.
            TimeoutError, ClientClosed, ClientError: as :meth:`receive`.
        """
        check_receive_batch(max_messages, timeout)
        if self._nudge:
            self._nudge_in -= 1
            if self._nudge_in <= 0:
                await self._let_writer_run()
        if self._closed:
            raise ClientClosed("the consumer is closed")
        if not self._buffer:
            await self._wait_for_messages(timeout)
        out = self._buffer.take_many(max_messages)
        self._took(self._buffer.took())
        return out

    async def _wait_for_messages(self, timeout: float | None) -> None:  # noqa: ASYNC109
        if timeout is None:  # the common case, without a timeout's bookkeeping per batch
            await self._until_buffered()
            return
        async with asyncio.timeout(timeout):
            await self._until_buffered()

    async def _until_buffered(self) -> None:
        if self._task is None:
            await self.start()
        while not self._buffer:
            self._raise()
            self._ready.clear()
            await self._ready.wait()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ClientClosed("the consumer is closed")
        if self._task is not None and self._task.done() and not self._buffer:
            raise ClientClosed("the subscription stream ended")

    def _took(self, count: int) -> None:
        self._taken += count
        if self._taken >= self._credit_chunk:
            self._grant()

    def _grant(self) -> None:
        """Give the broker back the credit of the messages taken (sent by the writer,
        added to any grant it has not sent yet).

        A grant that would leave the broker's credit at 0 or below is held back and
        added to the next: the broker sends only while a consumer's credit is above 0,
        so it could not act on it. Example: with a queue of 1,000, a delivery of a
        9,000-record batch leaves the broker at -8,000; the grants of the first 8,000
        records taken go out as one, instead of 16 writes of 500 (a stream write costs
        the loop about as much as 100 records).
        """
        out = self._out
        out.credit += self._taken
        self._taken = 0
        if out.balance + out.credit > 0:
            self._kick()

    def _kick(self) -> None:
        """Tell the stream's writer that the outbox has something to send."""
        out = self._out
        if out.idle:
            out.wake.set()
        if not self._nudge:
            self._nudge, self._nudge_in, self._hold = True, 1, True

    def _writer_ran(self) -> None:
        self._nudge = False
        self._hold = self._closed


def check_timeout(timeout: float) -> None:
    """Raise ``ValueError`` unless ``timeout`` is a number of seconds >= 0. A NaN one
    would disorder the event loop's timers (its deadline compares with none)."""
    if not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, not {timeout!r}")


def check_receive_batch(max_messages: int, timeout: float | None) -> None:
    """Raise ``ValueError`` for a ``receive_batch`` that could not keep its promise."""
    if max_messages < 1:
        raise ValueError(f"max_messages must be at least 1, not {max_messages}")
    if timeout is not None:
        check_timeout(timeout)


def _check_settings(
    type_: str, initial_position: str, mode: str, receive_queue: int, ack_interval_ms: float
) -> None:
    """Raise ``ValueError`` naming the first of a consumer's settings that is wrong."""
    if type_ not in _TYPES:
        raise ValueError(f"type must be one of {', '.join(_TYPES)}, not {type_!r}")
    if initial_position not in _POSITIONS:
        raise ValueError(f"initial_position must be earliest or latest, not {initial_position!r}")
    if mode not in _MODES:
        raise ValueError(f"mode must be at_least_once or at_most_once, not {mode!r}")
    if not 1 <= receive_queue <= MAX_RECEIVE_QUEUE:
        raise ValueError(
            f"receive_queue must be from 1 to {MAX_RECEIVE_QUEUE:,} records, not {receive_queue!r}"
        )
    if not (math.isfinite(ack_interval_ms) and ack_interval_ms >= 0):
        raise ValueError(f"ack_interval_ms must be a number >= 0, not {ack_interval_ms!r}")
