"""Sessions: a consumer's Subscribe streams, one at a time, reopened when they break.

Role: the connection half of :class:`~client._async.consumer.AsyncConsumer`. A session is
one Subscribe stream: :meth:`Sessions._session` reads its deliveries into the consumer's
buffer, and its writer (:meth:`Sessions._write`, the request iterator gRPC pulls from)
builds each credit or ack request from the consumer's state when the stream is ready for
the next one (:class:`Outbox`). :meth:`Sessions._run`, the consumer's task, opens
sessions until the consumer closes.

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

Why a mixin of ``AsyncConsumer``: a session fills the consumer's buffer and sends its
credit and acks, the per-record state of its other halves; a mixin reads them as fields,
with no call between. The fields set by :meth:`Sessions._init_sessions` are this class's
own; the others it reads are listed below them.

Not task-safe apart from the consumer: everything runs on the consumer's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from client._async._routing import Router
from client._connection import ConnectionSettings
from client._message import DeliveredBatch, MessageBuffer
from client._retry import route_backoff_s
from client._routes import Step
from client._shared import ChannelLease, refused_for_streams
from client._signal import Signal
from client.errors import (
    ClientError,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Refused,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc

logger = logging.getLogger(__name__)

#: Moves to another shared connection after stream-limit refusals, in a row, before such
#: a refusal is handled as any other error (reported, or retried with backoff).
_MAX_MOVES = 4
#: The longest a reconnect waits for a Lookup of its topic, seconds.
_LOOKUP_S = 5.0

_PERMANENT = (InvalidArgument, NotFound, PermissionDenied, Unauthenticated, DataLoss)


class Sessions:
    """The Subscribe streams of one consumer (a mixin of :class:`~client.AsyncConsumer`)."""

    _connect_timeout: float
    _lease: ChannelLease | None
    _stub: broker_pb2_grpc.BrokerStub | None
    router: Router
    _address: str
    _rng: random.Random
    _subscribed: asyncio.Event
    _ghost: bool
    _error: ClientError | None
    _epoch: int
    _opened: int
    _out: Outbox
    _live: bool
    _drained: asyncio.Event
    # The consumer's:
    connection: ConnectionSettings
    topic: str
    subscription: str
    _open: _pb.OpenSubscription
    _closed: bool
    _buffer: MessageBuffer
    _ready: Signal
    _credit_chunk: int
    _taken: int
    # The ack batcher's:
    _ack_epoch: int
    _ack_timer: asyncio.TimerHandle | None
    _ack_threshold: int
    _pending: int
    _releases: list[_pb.OffsetRange]

    if TYPE_CHECKING:

        def _writer_ran(self) -> None: ...
        def _reset_acks(self) -> None: ...
        def _take_acks(self) -> _pb.SubscribeRequest: ...

    def _init_sessions(self, channel: grpc.aio.Channel | None, connect_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        #: The shared channel held while running, when no ``channel`` was given.
        self._lease = None
        self._stub = None if channel is None else broker_pb2_grpc.BrokerStub(channel)
        #: The topic's route (the seeds, its owner once known) and the Lookups.
        self.router = Router(self.connection, channel)
        #: The broker the stub calls (``channel`` stands for the first seed).
        self._address = self.router.table.seeds[0] if channel is not None else ""
        self._rng = random.Random()
        self._subscribed = asyncio.Event()
        #: Whether a first Subscribe broke in transit (see :meth:`_final_error`).
        self._ghost = False
        self._error = None
        # Session state: replaced on every reconnect.
        self._epoch = 0
        self._opened = 0  # sessions the broker confirmed (SUBSCRIBED)
        self._out = Outbox()
        self._live = False  # a session is open (SUBSCRIBED seen, stream not ended)
        self._drained = asyncio.Event()

    async def _run(self) -> None:
        await self._retarget()
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
            step = self._follow(error)
            if step is Step.NOW and moves < _MAX_MOVES:
                moves += 1  # to the owner a refusal named, at once
                await self._retarget()
                continue
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
            # Before a Lookup at most 250 ms: after a leader's failover the wait is for
            # its election, not for the broker (as the router and the producer).
            pause = route_backoff_s(attempt, self._rng, lookup=step is Step.LOOKUP)
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
            if step is not Step.RAISE:
                if step is Step.LOOKUP:
                    await self.router.refresh([self.topic], time.monotonic() + _LOOKUP_S)
                await self._retarget()

    def _follow(self, error: ClientError) -> Step:
        """What the route says after ``error`` on the stream to :attr:`_address` (a
        refusal: the owner, or a Lookup; a break: a Lookup when the owner was cached)."""
        if not isinstance(error, Refused) and not (_broke(error) or error.retryable):
            return Step.RAISE
        return self.router.table.after(self.topic, self._address, error, retry=True)

    async def _retarget(self) -> None:
        """Hold a channel to the broker the topic is routed to now (shared with the
        consumers of this loop that connect there alike), if not held already."""
        address = self.router.table.address(self.topic)
        if self._stub is not None and address == self._address:
            return
        old, self._address = self._lease, address
        self._lease = ChannelLease(dataclasses.replace(self.connection, broker=address))
        self._stub = broker_pb2_grpc.BrokerStub(self._lease.channel)
        if old is not None:
            await old.release()

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
        if not error.retryable or isinstance(error, Refused):
            return error  # still broken, held, or not served (a cluster's refusal): as it is
        return Unavailable(
            f"the broker at {self.connection.broker} could not be reached for "
            f"{self._connect_timeout:g} s ({error}); check that it runs there, or raise "
            "connect_timeout"
        )

    def _new_session(self) -> Outbox:
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
        self._out = Outbox(self._open.initial_credit)
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

    async def _write(self, out: Outbox) -> AsyncIterator[_pb.SubscribeRequest]:
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


class Outbox:
    """What one session's request writer has to send; the consumer fills it, the writer
    (:meth:`Sessions._write`) empties it. Nothing here is a queue of requests: a
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
