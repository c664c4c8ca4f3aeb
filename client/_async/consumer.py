"""AsyncConsumer: a subscription's messages, with credits, batched acks and reconnects.

Role: one Subscribe stream at a time (a "session"). The consumer opens the subscription,
grants the broker ``receive_queue`` records of credit, and cuts each delivered batch into
:class:`~client._message.Message` views that decode only what is read. As the application
takes messages, credit is given back in chunks of half the queue, so the broker never sends
more than the queue holds.

Acks are batched behind the scenes: acked offsets are coalesced into ranges per partition
(in-order acks make one range per batch) and sent when a quarter of the broker's unacked
cap is pending (``shared`` and ``key_shared``: or half the receive queue, as consumers
share the cap), or ``ack_interval_ms`` after the first pending ack, or on close. An ack
after the close sent the last acks raises ``ClientClosed`` (it could never count).

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

Reconnects: when the stream breaks after it was open (the broker restarted, the network
dropped), the consumer opens a new session with backoff and full jitter, and the broker
resumes at the subscription's saved cursor. Messages buffered from the old session are
dropped, and acks of messages from it are ignored: the broker redelivers them (at least
once). Errors on the first open (no such topic, bad name, an exclusive subscription held by
another consumer) are raised to the caller.

The first open waits for the broker as a reconnect does: while the broker is unreachable
(UNAVAILABLE, DEADLINE_EXCEEDED) ``start`` retries with the same backoff for up to
``connect_timeout`` seconds, then raises ``Unavailable`` naming the address and the wait.
Example: the broker restarts and is back 3 s later; a consumer started meanwhile opens its
subscription then, instead of failing at once. A connection that dies under the first
Subscribe (CANCELLED, UNKNOWN, INTERNAL from gRPC itself) is retried the same way, and so
is an exclusive subscription refused as held after that: the holder may be the session
that died, which the broker lets go once it notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from types import TracebackType
from typing import Self

import grpc

from client._channel import DEFAULT_RECONNECT_BACKOFF_MAX_S, check_security
from client._message import DeliveredBatch, Message, MessageBuffer
from client._retry import backoff_s
from client._shared import ChannelKey, ChannelLease, refused_for_streams
from client._signal import Signal
from client._types import DEFAULT_BROKER, QUEUED, Queued
from client.errors import (
    ClientClosed,
    ClientError,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc
from proto.names import CONSUMER_NAME_RULE, is_valid_consumer_name
from proto.shown import shown

logger = logging.getLogger(__name__)

_TYPES = {
    "exclusive": _pb.EXCLUSIVE,
    "failover": _pb.FAILOVER,
    "shared": _pb.SHARED,
    "key_shared": _pb.KEY_SHARED,
}
_POSITIONS = {"earliest": _pb.EARLIEST, "latest": _pb.LATEST}
_MODES = {"at_least_once": _pb.AT_LEAST_ONCE, "at_most_once": _pb.AT_MOST_ONCE}
_MAX_NACK_DELAY_S = 86_400.0
#: The largest ``receive_queue`` (the protocol's credit is a 32-bit count).
MAX_RECEIVE_QUEUE = 2**31 - 1

#: While credit or acks wait for the stream's writer, the application yields to the loop
#: once per this many receives (a yield costs about as much as a few receives).
_NUDGE_EVERY = 16
#: Moves to another shared connection after stream-limit refusals, in a row, before such
#: a refusal is handled as any other error (reported, or retried with backoff).
_MAX_MOVES = 4

_PERMANENT = (InvalidArgument, NotFound, PermissionDenied, Unauthenticated, DataLoss)


class AsyncConsumer:
    """Receives a subscription's messages; ``async for message in consumer``.

    Task-safe on one event loop; an async context manager (closing sends pending acks).

    Args:
        topic: The topic to read.
        subscription: The subscription's name; created on first use.
        broker: ``host:port`` of the broker.
        type: ``exclusive`` (one consumer at a time), ``failover``, ``shared`` or
            ``key_shared``.
        initial_position: Where a new subscription starts: ``earliest`` or ``latest``.
        mode: ``at_least_once`` (a message counts once acked; unacked ones come again) or
            ``at_most_once`` (it counts once sent: never redelivered, acks not needed).
        consumer_name: How this consumer shows in ``headrace lag``.
        receive_queue: Records the broker may send ahead of the application. Default 1,000.
        ack_interval_ms: The longest an ack waits to be sent. Default 20 ms.
        channel: An existing channel to use (not closed by the consumer). Without one,
            the consumers of one event loop with the same ``broker``,
            ``reconnect_backoff_max_s`` and security share a connection
            (:mod:`client._shared`).
        connect_timeout: How long the first open waits for an unreachable broker,
            seconds, before ``start`` raises ``Unavailable``. Default 30.
        reconnect_backoff_max_s: Longest pause between the channel's reconnect attempts
            while the broker is unreachable, seconds (see :mod:`client._channel`).
            Default 1.
        token: The bearer token sent on every call. This and the three TLS arguments
            below are unused with ``channel`` (that channel's own security applies); a
            bad one raises ``ValueError`` here (:mod:`client._channel`).
        tls_ca: A PEM CA bundle file; giving it turns TLS on.
        tls_cert: A PEM client certificate file for mutual TLS (with ``tls_key``).
        tls_key: The PEM key file of ``tls_cert``.
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
        broker: str = DEFAULT_BROKER,
        type: str = "exclusive",  # the name DESIGN gives it
        initial_position: str = "earliest",
        mode: str = "at_least_once",
        consumer_name: str = "",
        receive_queue: int = 1_000,
        ack_interval_ms: float = 20.0,
        channel: grpc.aio.Channel | None = None,
        connect_timeout: float = 30.0,
        reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        force: bool = False,
    ) -> None:
        _check_settings(type, initial_position, mode, receive_queue, ack_interval_ms)
        if not is_valid_consumer_name(consumer_name):  # the broker refuses it on open
            raise ValueError(f"consumer_name {shown(consumer_name)}: {CONSUMER_NAME_RULE}")
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, not {connect_timeout!r}")
        self._connect_timeout = connect_timeout
        self.topic = topic
        self.subscription = subscription
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
        self._ack_interval_s = ack_interval_ms / 1000
        self._target = broker
        self._key = ChannelKey(broker, reconnect_backoff_max_s, token, tls_ca, tls_cert, tls_key)
        if channel is None:
            check_security(token, tls_ca, tls_cert, tls_key)  # bad ones raise here, not later
        #: The shared channel held while running, when no ``channel`` was given.
        self._lease: ChannelLease | None = None
        self._stub = None if channel is None else broker_pb2_grpc.BrokerStub(channel)
        self._rng = random.Random()
        self._buffer = MessageBuffer(self._credit_chunk)
        #: Whether ``__anext__`` must take its slow path: closed, or the writer has
        #: requests waiting (``_nudge``).
        self._hold = False
        self._ready = Signal()  # once per delivery: no loop lookup per wait
        self._subscribed = asyncio.Event()
        #: Whether a first Subscribe broke in transit (see :meth:`_final_error`).
        self._ghost = False
        self._error: ClientError | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # Session state: replaced on every reconnect.
        self._epoch = 0
        self._opened = 0  # sessions the broker confirmed (SUBSCRIBED)
        self._out = _Outbox()
        self._nudge = False  # the outbox has requests its writer has not taken yet
        self._nudge_in = 0  # receives until the next yield to that writer
        self._taken = 0
        self._ranges: dict[int, list[list[int]]] = {}
        self._up_to: dict[int, int] = {}
        self._nacks: list[_pb.Nack] = []
        self._pending = 0
        self._ack_threshold = 1
        self._ack_timer: asyncio.TimerHandle | None = None
        self._ack_partition = -1  # the run the last ack extended: [begin, end) of a partition
        self._ack_run = [-1, -1]
        self._acks_final = False  # the last acks went out: later acks raise ClientClosed
        self._ack_epoch = 0  # the session whose messages acks count for (-1 once final)
        self._releases: list[_pb.OffsetRange] = []
        self._live = False  # a session is open (SUBSCRIBED seen, stream not ended)
        self._drained = asyncio.Event()

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

    # -- acknowledging ----------------------------------------------------------------

    def ack(self, message: Message) -> Queued:
        """Acknowledge one message (sent in a batch shortly). Returns at once; the result
        may be awaited (see :class:`~client.Queued`), so ``await consumer.ack(m)`` works too.

        Raises:
            ClientClosed: the consumer is closed and sent its last acks: this one would
                never reach the broker (which sends the message again).
        """
        _, _, partition, offset, _, epoch = message
        run = self._ack_run
        if run[1] == offset and partition == self._ack_partition and epoch == self._ack_epoch:
            # The common case: the next offset of the last run. (The first ack after the
            # writer took the acks starts a run, below, so the timer is armed there.)
            run[1] = offset + 1
            self._pending += 1
            if self._pending >= self._ack_threshold:
                self._flush_acks()
            return QUEUED
        if epoch != self._ack_epoch:
            self._check_acks_open()
            return QUEUED  # from a broken session: the broker will deliver it again
        self._ack_run = self._add_run(partition, offset)
        self._ack_partition = partition
        self._acked(1)
        return QUEUED

    def ack_many(self, messages: Iterable[Message]) -> Queued:
        """Acknowledge messages, e.g. a whole :meth:`receive_batch` (sent in a batch
        shortly). One call is much cheaper than one :meth:`ack` per message. May be
        awaited, as :meth:`ack`.

        Raises:
            ClientClosed: as :meth:`ack`.
        """
        epoch = self._ack_epoch
        last_partition, last = self._ack_partition, self._ack_run
        count = 0
        for message in messages:
            _, _, partition, offset, _, message_epoch = message
            if message_epoch != epoch:
                self._check_acks_open()
                continue  # from a broken session: the broker will deliver it again
            count += 1
            if partition == last_partition and last[1] == offset:
                last[1] = offset + 1
                continue
            last = self._add_run(partition, offset)
            last_partition = partition
        self._ack_partition, self._ack_run = last_partition, last
        if count:
            self._acked(count)
        return QUEUED

    def _add_run(self, partition: int, offset: int) -> list[int]:
        """Record the ack of ``offset``: extend the partition's last run or start one."""
        ranges = self._ranges.setdefault(partition, [])
        if ranges and ranges[-1][1] == offset:
            run = ranges[-1]
            run[1] = offset + 1
        else:
            run = [offset, offset + 1]
            ranges.append(run)
        return run

    def _check_acks_open(self) -> None:
        if self._acks_final:
            raise ClientClosed(
                "the consumer is closed and sent its last acks; ack before leaving "
                "`async with` (the broker sends unacked messages again)"
            )

    def ack_cumulative(self, message: Message) -> Queued:
        """Acknowledge ``message`` and every earlier message of its partition. May be
        awaited, as :meth:`ack`.

        Raises:
            ClientClosed: as :meth:`ack`.
        """
        if message.epoch != self._ack_epoch:
            self._check_acks_open()
            return QUEUED
        p = message.partition
        self._up_to[p] = max(self._up_to.get(p, 0), message.offset + 1)
        self._acked(1)
        return QUEUED

    def nack(
        self,
        message: Message,
        *,
        delay: float | None = None,
        reason: str = "",
        dead_letter: bool = False,
    ) -> Queued:
        """Report that ``message`` failed: the broker sends it again after ``delay``
        seconds (``None``: the subscription's backoff, which grows with each failure).
        ``reason`` is kept with the record (its first 1,024 characters) and shows in the
        dead-letter queue if it ends there (after the subscription's max deliveries).
        With ``dead_letter`` it is not sent again: the subscription's poison policy
        applies to it at once (by default, into its dead-letter queue with ``reason``),
        as AMQP's reject with requeue=false; ``delay`` must then be ``None``.
        May be awaited, as :meth:`ack`.

        Raises:
            ValueError: ``delay`` is negative or longer than a day, or given with
                ``dead_letter``.
            ClientClosed: as :meth:`ack`.
        """
        if delay is not None and not 0 <= delay <= _MAX_NACK_DELAY_S:
            raise ValueError(f"delay must be from 0 to {_MAX_NACK_DELAY_S:g} seconds, not {delay}")
        if delay is not None and dead_letter:
            raise ValueError("a nack with dead_letter is not sent again: give it no delay")
        if message.epoch != self._ack_epoch:
            self._check_acks_open()
            return QUEUED  # from a broken session: the broker will deliver it again anyway
        nack = _pb.Nack(
            partition=message.partition,
            begin=message.offset,
            end=message.offset + 1,
            reason=reason,
            dead_letter=dead_letter,
        )
        if delay is not None:
            nack.delay_ms = round(delay * 1000)
        self._nacks.append(nack)
        self._acked(1)
        return QUEUED

    def _acked(self, count: int) -> None:
        self._pending += count
        if self._pending >= self._ack_threshold:
            self._flush_acks()
        elif self._ack_timer is None:
            self._arm_ack_timer()

    def _arm_ack_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._ack_timer = loop.call_later(self._ack_interval_s, self._flush_acks)

    def _flush_acks(self) -> None:
        """Have the writer send the pending acks (with whatever is acked until it runs)."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if (self._pending or self._releases) and not self._out.acks_due:
            # Once due, the writer takes every ack made until it runs: acks past the
            # threshold before then need no second wake-up each.
            self._out.acks_due = True
            self._kick()

    def _take_acks(self) -> _pb.SubscribeRequest:
        """The pending acks, nacks and releases as one request; they are no longer
        pending. Called by the writer when the stream is ready for them."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        acks = _pb.Acks(
            ranges=[
                _pb.OffsetRange(partition=p, begin=b, end=e)
                for p, ranges in self._ranges.items()
                for b, e in ranges
            ],
            up_to=[_pb.PartitionOffset(partition=p, offset=o) for p, o in self._up_to.items()],
            nacks=self._nacks,
            releases=self._releases,
        )
        self._reset_acks()
        return _pb.SubscribeRequest(ack=acks)

    def _reset_acks(self) -> None:
        self._ranges, self._up_to, self._nacks, self._pending = {}, {}, [], 0
        self._ack_partition, self._ack_run = -1, [-1, -1]
        self._releases = []

    # -- sessions ---------------------------------------------------------------------

    async def _run(self) -> None:
        if self._stub is None:
            self._lease = ChannelLease(self._key)
            self._stub = broker_pb2_grpc.BrokerStub(self._lease.channel)
        attempt = moves = 0
        started = time.monotonic()
        while not self._closed:
            opened = self._opened
            try:
                await self._session()
                return  # the stream ended because we half-closed it
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc)
            except ClientError as exc:
                error = exc
            if self._opened > opened:
                moves = 0
            if self._lease is not None and refused_for_streams(error) and moves < _MAX_MOVES:
                # The shared connection is at the broker's stream limit: another one, at
                # once (a new connection has room; MAX_MOVES bounds a race for it).
                moves += 1
                self._stub = broker_pb2_grpc.BrokerStub(await self._lease.move())
                continue
            final = self._final_error(error, started)
            if final is not None:
                self._error = final
                self._ready.set()
                return
            if self._opened > opened:
                attempt = 0  # that session was open: start the backoff over
            pause = backoff_s(attempt, self._rng)
            if not self._subscribed.is_set():  # never sleep past connect_timeout
                pause = min(pause, max(0.0, started + self._connect_timeout - time.monotonic()))
            # The first try of a first open that breaks is retried at once, quietly: a
            # call the broker refuses before reading it can surface as INTERNAL ("Internal
            # error from Core") and then, on the retry, as the refusal itself; a warning
            # for it would add a second line to that refusal. Later breaks are warned of.
            first_try = attempt == 0 and not self._subscribed.is_set()
            logger.log(
                logging.INFO if first_try else logging.WARNING,
                "subscription %s of %s: stream broke (%s); reconnecting in %.2f s",
                self.subscription,
                self.topic,
                error,
                pause,
            )
            await asyncio.sleep(pause)
            attempt = min(attempt + 1, 10)

    def _final_error(self, error: ClientError, started: float) -> ClientError | None:
        """The error that ends the consumer, or ``None`` to open a new session.

        Before the first session opened, only an unreachable broker, or a connection
        that died under the Subscribe (and then an exclusive subscription held by the
        session that died with it), is waited for, and only for ``connect_timeout``
        seconds from ``started``; after it, every error is worth a reconnect but a
        permanent one (:func:`_reconnectable`).
        """
        if self._closed:
            return error
        if self._subscribed.is_set():
            return None if _reconnectable(error) else error
        if _broke(error):
            # The connection died under the first Subscribe: not the broker's answer. The
            # broker may have attached us before it died, and then holds an exclusive
            # subscription for that ghost until it notices the stream is gone.
            self._ghost = True
        held_by_ghost = self._ghost and isinstance(error, FailedPrecondition)
        if not (error.retryable or _broke(error) or held_by_ghost):
            return error
        if time.monotonic() - started < self._connect_timeout:
            return None
        if not error.retryable:  # still broken, or still held: that, as it is
            return error
        return Unavailable(
            f"the broker at {self._target} could not be reached for "
            f"{self._connect_timeout:g} s ({error}); check that it runs there, or raise "
            "connect_timeout"
        )

    def _new_session(self) -> _Outbox:
        self._epoch += 1
        self._ack_epoch = self._epoch
        self._buffer.clear()
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        self._reset_acks()
        self._taken = 0
        self._drained = asyncio.Event()
        self._out.ended = True  # the last session's writer, if still there, stops
        self._out.wake.set()
        self._out = _Outbox(self._open.initial_credit)
        return self._out

    async def _session(self) -> None:
        out = self._new_session()
        epoch = self._epoch
        assert self._stub is not None  # set by _run
        call = self._stub.Subscribe(self._write(out))
        try:
            async for response in call:
                if response.HasField("delivery"):
                    d = response.delivery
                    out.balance -= d.to_offset - d.from_offset
                    batch = DeliveredBatch(d.topic, d.batch)
                    self._buffer.add(
                        batch,
                        d.partition,
                        d.from_offset,
                        d.to_offset,
                        redeliveries=dict(d.redeliveries),
                        epoch=epoch,
                    )
                    self._ready.set()
                elif response.HasField("subscribed"):
                    self._ack_threshold = self._ack_threshold_for(
                        response.subscribed.max_unacked or 1_000
                    )
                    self._subscribed.set()
                    self._opened += 1
                    self._live = True
                elif response.HasField("drained"):
                    self._drained.set()
        finally:
            self._live = False
            out.ended = True  # ends the request iterator of this stream
            out.wake.set()
            call.cancel()

    def _ack_threshold_for(self, cap: int) -> int:
        """Pending acks that are sent without waiting for ``ack_interval_ms``: a quarter
        of the broker's cap on unacked records. Consumers of a ``shared`` or
        ``key_shared`` subscription share that cap, so each also sends them once half its
        queue is pending (four of them holding a quarter each would stop the broker until
        their timers fired). An exclusive or failover consumer has the cap to itself: its
        acks go out in fewer, larger requests (a stream write costs the loop about as
        much as 100 records)."""
        if self._open.type in (_pb.SHARED, _pb.KEY_SHARED):
            return max(1, min(cap // 4, self._credit_chunk))
        return max(1, cap // 4)

    async def _write(self, out: _Outbox) -> AsyncIterator[_pb.SubscribeRequest]:
        """A session's requests: the open, then what the outbox holds each time gRPC is
        ready for the next request. Requests are built here, not when queued: credit
        granted and acks made while the last request was on its way go out as one."""
        yield _pb.SubscribeRequest(open=self._open)
        while not out.ended:
            self._writer_ran()
            if out.credit and out.balance + out.credit > 0:
                credit, out.credit = out.credit, 0
                out.balance += credit
                yield _pb.SubscribeRequest(credit=credit)
            elif out.acks_due:
                out.acks_due = False
                if self._pending or self._releases:
                    yield self._take_acks()
            elif out.drain:
                out.drain = False
                yield _pb.SubscribeRequest(drain=_pb.Drain())
            elif out.half_close:
                return  # the broker ends the stream after applying what came before
            else:
                out.idle = True
                out.wake.clear()
                await out.wake.wait()
                out.idle = False


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


class _Outbox:
    """What one session's request writer has to send; the consumer fills it, the writer
    (:meth:`AsyncConsumer._write`) empties it. Nothing here is a queue of requests: a
    second grant adds to the first, and acks stay in the consumer's ranges until sent."""

    __slots__ = ("acks_due", "balance", "credit", "drain", "ended", "half_close", "idle", "wake")

    def __init__(self, initial_credit: int = 0) -> None:
        #: The broker's credit for the session as far as the consumer knows: the initial
        #: credit, plus grants sent, less records delivered. The broker's own can only be
        #: lower (deliveries on their way), so a grant that leaves this at 0 or below
        #: would not let the broker send anything either.
        self.balance = initial_credit
        self.credit = 0  # records of credit to grant
        self.acks_due = False  # send the pending acks
        self.drain = False  # send a drain
        self.half_close = False  # end the requests once the rest is sent
        self.ended = False  # the stream is over: send nothing more
        self.idle = False  # the writer waits for ``wake``
        self.wake = Signal()


#: Statuses a call gets when its connection dies under it (grpc's own, not the broker's
#: answers): a reset stream surfaces as CANCELLED, UNKNOWN or INTERNAL ("Internal error
#: from Core", "Stream removed").
_BROKEN_CODES = frozenset(
    {grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
)


def _broke(error: ClientError) -> bool:
    """Whether ``error`` says the connection died, rather than the broker refusing."""
    return error.code in _BROKEN_CODES


def _reconnectable(error: ClientError) -> bool:
    """Whether a broken session (one that was open) is worth reopening.

    Everything is, except what a new session would meet again: a bad request, a deleted
    topic, missing rights, damaged data. A connection that dies mid-stream surfaces as
    UNAVAILABLE, CANCELLED, UNKNOWN or even INTERNAL ("Internal error from Core"); an
    exclusive subscription still held by our previous session is FAILED_PRECONDITION
    until the broker notices that session is gone.
    """
    return not isinstance(error, _PERMANENT)
