"""One partition's accumulator: its records in batches, and the task that publishes them.

Role: :class:`Accumulator` is the per-partition half of
:class:`~client._async.producer.AsyncProducer`. It collects records (and whole batches,
:class:`Bulk` slices of ``send_many`` or batches the blocking producer collected) into
batches, stamps each with its producer id and sequence numbers, publishes it (one unary
Publish at a time, or a window of batches on one PublishStream), retries, and settles every
record's future. The rules it keeps (linger and window, pipelining, recovery after trouble,
how a failure moves the partition to a fresh producer id) are stated in the module
docstring of :mod:`client._async.producer`, where a user of the producer reads them.

Invariants:
- Sequences are stamped in send order and the broker answers a stream in order, so an
  answer belongs to the oldest batch written and not yet answered.
- A batch is settled (resolved or failed) exactly once, and then released from the
  producer's buffer budget (:meth:`Owner.released`).
- An unknown outcome never lends its sequences to a later batch (the partition moves to a
  fresh producer id, or under a fixed id every later batch fails).

Depends on :class:`Owner`, the few settings and calls it takes from its producer, not on
the producer's module, so the import runs one way: ``producer`` -> ``_accumulator``.

Why one piece at about 620 lines (past the ~600 guideline): the unary path, the
pipelined window and the recovery after trouble all read and settle the same window of
sent batches (:class:`_Sent`), and the three invariants above hold across all three; a
recovery module apart would have to reach into the window's deque and the sender's
state. The class is about 450 lines, the rest is :class:`Owner`, :class:`Bulk` and the
window's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from client._async._routing import Router
from client._batching import BufferBudget, PendingBatch, RecordFuture
from client._retry import route_backoff_s
from client._routes import MAX_REDIRECTS, Step
from client._types import PublishedRange, PublishOutcome
from client.errors import (
    ClientError,
    DeadlineExceeded,
    Refused,
    from_rpc_error,
    from_status,
    publish_failure,
    publish_outcome,
)
from proto import broker_pb2 as _pb
from proto.batch import Headers, encode_columns, restamp
from proto.refusal import from_redirect_fields
from proto.shown import shown_text

logger = logging.getLogger(__name__)

#: The largest window a broker's ``in_flight_hint`` can give a default producer.
MAX_ADAPTIVE_WINDOW = 4


class Owner(Protocol):
    """What an accumulator reads and calls on the producer that owns it
    (:class:`~client._async.producer.AsyncProducer`); see that class for each setting."""

    budget: BufferBudget
    batch_max_bytes: int
    linger_s: float
    delivery_timeout_s: float
    fixed_producer_id: int | None
    max_in_flight: int
    adaptive_window: bool
    streams: bool
    rng: random.Random
    router: Router

    def new_producer_id(self) -> int: ...

    def batch_sealed(self, topic: str, partition: int) -> None: ...

    def released(self, batch: PendingBatch | Bulk) -> None: ...

    async def publish_batch(
        self, topic: str, partition: int, data: bytes
    ) -> _pb.PublishResponse: ...

    def _open_publish_stream(
        self, topic: str
    ) -> tuple[str, grpc.aio.StreamStreamCall[_pb.PublishRequest, _pb.PublishResponse]]: ...


@dataclass(slots=True)
class Bulk:
    """A slice of one :meth:`AsyncProducer.send_many` call, published as one batch: the
    columns go to the encoder as they are, and one future stands for all of them."""

    values: Sequence[bytes]
    keys: Sequence[bytes | None] | None
    headers: Sequence[Headers] | None
    timestamps: Sequence[int] | int
    indices: Sequence[int]
    size: int
    future: asyncio.Future[PublishedRange]

    @property
    def count(self) -> int:
        return len(self.values)

    def encode(self, producer_id: int, base_sequence: int) -> bytes:
        return encode_columns(
            self.values,
            keys=self.keys,
            timestamps_ms=self.timestamps,
            headers=self.headers,
            producer_id=producer_id,
            base_sequence=base_sequence,
        )

    def resolve(self, topic: str, response: _pb.PublishResponse) -> None:
        if not self.future.done():
            self.future.set_result(
                PublishedRange(
                    response.partition,
                    response.base_offset,
                    self.count,
                    response.duplicate,
                    self.indices,
                )
            )

    def fail(self, exc: ClientError) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


#: A gRPC status by its number, for the ``error_code`` of a PublishStream answer.
_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


@dataclass(slots=True)
class _Sent:
    """A batch taken by a pipelining sender: its bytes as last stamped, and its attempts."""

    batch: PendingBatch | Bulk
    data: bytes
    count: int
    producer_id: int
    base_sequence: int
    deadline: float  # monotonic: give up re-sending after it (delivery_timeout_s)
    attempts: int = 0
    unknown: bool = False  # on a stream that broke before its answer


@dataclass(slots=True)
class _Trouble:
    """What went wrong on a partition's stream since the window last drained.

    ``first`` is the first error: the stream broke (``broken``), a retryable answer, or a
    final one (``final``: the batch ``failed`` was failed with it). ``written_after``: a
    batch behind it was acknowledged anyway (the broker admits an id's first batch at any
    sequence), so the id's sequences no longer follow ours.
    """

    first: ClientError
    broke: ClientError | None = None  # the stream broke (maybe after ``first``)
    final: bool = False
    failed: _Sent | None = None
    written_after: bool = False


class Accumulator:
    """Records bound for one partition, and the task that publishes them in batches.

    Not task-safe beyond its event loop: its producer calls it on the loop, and its own
    sender task (with the reader task of its stream, when pipelining) does the rest."""

    def __init__(self, producer: Owner, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._producer = producer
        self._budget = producer.budget
        self._batch_max_bytes = producer.batch_max_bytes
        self._loop = asyncio.get_running_loop()
        self.pending = PendingBatch(topic, self._loop)  # filling; the loop's only
        self._sealed: deque[PendingBatch | Bulk] = deque()  # full batches, oldest first
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._producer_id = producer.new_producer_id()
        self._sequence = 0
        self._failed: ClientError | None = None  # latched: fixed id, unknown outcome
        # Pipelining (max_in_flight > 1, or the linger-0 default): one PublishStream,
        # answered in order. Under a fixed id, one batch in flight (unary): a batch behind
        # a refused one could be written (the broker admits an id's first batch at any
        # sequence) where the fixed-id rule says every later batch fails, unsent.
        fixed = producer.fixed_producer_id is not None
        self._max_in_flight = 1 if fixed else producer.max_in_flight
        #: The window follows the broker's ``in_flight_hint`` (the linger-0 default).
        self._adaptive = producer.adaptive_window and not fixed
        self._stream: grpc.aio.StreamStreamCall[_pb.PublishRequest, _pb.PublishResponse] | None
        self._stream = None
        self._stream_address = ""  # the broker the stream is open to
        self._reader: asyncio.Task[None] | None = None
        self._outstanding: deque[_Sent] = deque()  # written on the stream, unanswered
        self._redo: list[_Sent] = []  # answered or cut after trouble, unsettled, in order
        self._held: list[_Sent] = []  # taken while in trouble, not written: after _redo
        self._resending = False
        self._trouble: _Trouble | None = None
        self._rounds = 0  # retry rounds since the last acknowledgement, for backoff
        self._request_id = 0
        self._watchdog: asyncio.TimerHandle | None = None  # the oldest batch's deadline
        self._expired = False  # the watchdog cancelled the stream
        self._room = asyncio.Event()
        self._room.set()
        run = self._run_pipelined if producer.streams and not fixed else self._run
        self._task = asyncio.create_task(run(), name=f"producer:{topic}/{partition}")

    def add(
        self,
        value: bytes,
        key: bytes | None,
        headers: Headers | None,
        timestamp_ms: int,
    ) -> RecordFuture:
        p = self.pending
        index = len(p.values)
        self._budget.loop_used += p.add(value, key, headers, timestamp_ms)
        if index == 0:  # the first record since the sender last found nothing to do
            self._idle.clear()
            self._arrived.set()
        if p.size >= self._batch_max_bytes:
            self._sealed.append(p)  # a batch never grows past batch_max_bytes (one record)
            self.pending = PendingBatch(self.topic, self._loop)
            self._full.set()
            # Unkeyed records move on now, not when the sender takes the batch: a loop
            # that never yields then fills every partition, and flush publishes them
            # side by side instead of one partition's batches one after another.
            self._producer.batch_sealed(self.topic, self.partition)
        return RecordFuture(p, index)

    def add_sealed(self, batch: PendingBatch | Bulk) -> None:
        """Queue a whole batch (a slice of a ``send_many`` call, or records the blocking
        producer collected) after the records added before it. Its bytes are counted in
        the buffers already."""
        if self.pending.values:
            self._sealed.append(self.pending)
            self.pending = PendingBatch(self.topic, self._loop)
            self._producer.batch_sealed(self.topic, self.partition)
        self._sealed.append(batch)
        self._idle.clear()
        self._arrived.set()
        self._full.set()

    async def flush(self) -> None:
        """Wait until every record added so far is acknowledged or failed."""
        self._full.set()
        await self._idle.wait()

    async def aclose(self) -> None:
        await self.flush()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        stream, reader = self._stream, self._reader
        self._stream = None
        if self._watchdog is not None:
            self._watchdog.cancel()
        if stream is not None and reader is not None:
            # Half-close after the flush: the broker answered everything, then ends with OK.
            try:
                with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                    await stream.done_writing()
                with contextlib.suppress(asyncio.CancelledError, grpc.RpcError, TimeoutError):
                    await asyncio.wait_for(reader, 5.0)  # cancelled after 5 s
            finally:
                stream.cancel()  # even if aclose itself is cancelled: no stream left open

    async def _run(self) -> None:
        while True:
            await self._arrived.wait()
            if not self._sealed and not self.pending.values:
                self._arrived.clear()
                self._full.clear()
                self._idle.set()
                continue
            # No linger: take the batch now. (``wait_for`` with a timeout of 0 still makes
            # a task and cancels it: two more loop turns for every batch.)
            if not self._sealed and not self._full.is_set() and self._producer.linger_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._producer.linger_s)
            batch: PendingBatch | Bulk
            if self._sealed:  # the sticky partition moved on when it was sealed
                batch = self._sealed.popleft()
            else:
                batch, self.pending = self.pending, PendingBatch(self.topic, self._loop)
                self._producer.batch_sealed(self.topic, self.partition)
            try:
                await self._publish(batch)
            finally:
                self._producer.released(batch)

    async def _publish(self, p: PendingBatch | Bulk) -> None:
        if self._failed is not None:
            p.fail(self._failed)
            return
        count = p.count  # before encode, which lets a PendingBatch's columns go
        try:
            data = p.encode(self._producer_id, self._sequence if self._producer_id >= 0 else -1)
        except Exception as exc:  # the wire codec's own errors: a field out of range
            message = f"cannot encode the batch: {exc} (not written; fix the record)"
            p.fail(ClientError(message, outcome=PublishOutcome.REFUSED))
            return
        try:
            response = await self._producer.publish_batch(self.topic, self.partition, data)
        except ClientError as exc:
            self._after_failure(exc)
            p.fail(exc)
            return
        self._sequence += count
        p.resolve(self.topic, response)

    # -- pipelining: up to max_in_flight batches on one PublishStream ----------------------

    async def _run_pipelined(self) -> None:
        while True:
            await self._arrived.wait()
            if self._trouble is not None:
                if self._outstanding:  # the reader settles the rest of the window first
                    self._room.clear()
                    await self._room.wait()
                    continue
                await self._recover()
                continue
            if not self._sealed and not self.pending.values:
                self._arrived.clear()
                self._full.clear()
                if not self._outstanding:
                    self._idle.set()
                continue
            if not self._sealed and not self._full.is_set() and self._producer.linger_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._producer.linger_s)
                if self._trouble is not None:
                    continue
            if len(self._outstanding) >= self._max_in_flight:
                self._room.clear()
                await self._room.wait()  # the reader sets it on each answer and on trouble
                continue
            batch: PendingBatch | Bulk
            if self._sealed:  # the sticky partition moved on when it was sealed
                batch = self._sealed.popleft()
            else:
                batch, self.pending = self.pending, PendingBatch(self.topic, self._loop)
                self._producer.batch_sealed(self.topic, self.partition)
            await self._send_new(batch)

    async def _send_new(self, p: PendingBatch | Bulk) -> None:
        """Stamp ``p`` with the next sequences and write it on the stream."""
        # Pipelining never runs under a fixed id (its window is 1), so nothing latches.
        assert self._failed is None
        count = p.count
        pid = self._producer_id
        seq = self._sequence if pid >= 0 else -1
        try:
            data = p.encode(pid, seq)
        except Exception as exc:  # the wire codec's own errors: a field out of range
            message = f"cannot encode the batch: {exc} (not written; fix the record)"
            self._settle(p, ClientError(message, outcome=PublishOutcome.REFUSED))
            return
        if pid >= 0:
            self._sequence += count
        deadline = time.monotonic() + self._producer.delivery_timeout_s
        await self._send(_Sent(p, data, count, pid, seq, deadline))

    async def _send(self, sent: _Sent) -> None:
        """Write ``sent`` on the stream (opening one if there is none), behind everything
        written before; after trouble it waits in :attr:`_held` instead, in order."""
        if self._trouble is None and self._stream is None:
            self._open_stream()
        stream = self._stream
        if self._trouble is not None or stream is None:
            self._held.append(sent)
            return
        sent.attempts += 1
        self._request_id += 1
        request = _pb.PublishRequest(
            topic=self.topic,
            partition=self.partition,
            batch=sent.data,
            request_id=self._request_id,
        )
        self._outstanding.append(sent)
        if self._watchdog is None:
            self._watchdog = self._loop.call_at(self._outstanding[0].deadline, self._expire)
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await stream.write(request)  # a broken stream: the reader sees it end

    def _expire(self) -> None:
        """The oldest unanswered batch may be past its delivery timeout: if so, cut the
        stream (its batches then fail with an unknown outcome), else wait for the next."""
        self._watchdog = None
        if not self._outstanding:
            return
        deadline = self._outstanding[0].deadline
        if time.monotonic() < deadline:
            self._watchdog = self._loop.call_at(deadline, self._expire)
        elif self._stream is not None:
            self._expired = True
            self._stream.cancel()

    def _open_stream(self) -> None:
        self._stream_address, stream = self._producer._open_publish_stream(self.topic)
        self._stream = stream
        self._reader = asyncio.create_task(
            self._read(stream), name=f"producer-answers:{self.topic}/{self.partition}"
        )

    async def _read(
        self, stream: grpc.aio.StreamStreamCall[_pb.PublishRequest, _pb.PublishResponse]
    ) -> None:
        """Take the stream's answers, in order, one per batch written."""
        error: ClientError | None = None
        try:
            while True:
                response = await stream.read()
                if response is grpc.aio.EOF:
                    break
                assert isinstance(response, _pb.PublishResponse)
                if not self._outstanding:
                    error = ClientError("the broker answered a publish never sent")
                    stream.cancel()
                    break
                self._answer(self._outstanding.popleft(), response)
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
        except asyncio.CancelledError:
            if not self._expired:
                raise
            self._expired = False
            error = DeadlineExceeded(
                "no answer within delivery_timeout_s", grpc.StatusCode.DEADLINE_EXCEEDED
            )
        finally:
            current = self._stream is stream
            if current:
                self._stream = None
        if not current:
            return  # closed by _recover (it had answered everything) or aclose
        if self._outstanding:  # unanswered: their outcome is unknown
            what = error or ClientError("the publish stream ended before every answer")
            for sent in self._outstanding:
                sent.unknown = True
            self._redo.extend(self._outstanding)
            self._outstanding.clear()
            if self._trouble is None:
                self._trouble = _Trouble(what, broke=what)
            else:
                self._trouble.broke = what
        if self._trouble is not None:
            self._arrived.set()
            self._room.set()

    def _answer(self, sent: _Sent, response: _pb.PublishResponse) -> None:
        trouble = self._trouble
        if not response.error_code:
            self._settle(sent.batch, response=response)
            if self._adaptive:
                self._max_in_flight = min(max(response.in_flight_hint, 1), MAX_ADAPTIVE_WINDOW)
            if trouble is None:
                self._rounds = 0
                self._room.set()
                busy = self._outstanding or self._sealed or self.pending.values
                if not busy and not self._resending:
                    self._idle.set()
            elif trouble.final:
                trouble.written_after = True
            if trouble is not None and not self._outstanding:
                self._arrived.set()  # the writer settles the trouble now
                self._room.set()
            return
        code = _STATUS_BY_NUMBER.get(response.error_code, grpc.StatusCode.UNKNOWN)
        exc = _answer_error(code, response)
        gap = code == grpc.StatusCode.FAILED_PRECONDITION
        if trouble is None:
            if exc.retryable:
                self._trouble = _Trouble(exc)
                self._redo.append(sent)
            else:
                failure = self._failure(exc, sent)
                self._trouble = _Trouble(failure, final=True, failed=sent)
                self._settle(sent.batch, failure)
        elif exc.retryable or gap:
            # Behind a failed batch: refused for the gap it left, or retryable. Sent again
            # once the window drained (under a new id if the failed one's sequences moved).
            self._redo.append(sent)
        else:
            failure = self._failure(exc, sent)
            if failure.outcome is not PublishOutcome.REFUSED:
                trouble.written_after = True  # it may be in the log: its sequences moved on
            self._settle(sent.batch, failure)
        if not self._outstanding:
            self._arrived.set()
            self._room.set()

    def _failure(self, exc: ClientError, sent: _Sent) -> ClientError:
        outcome = publish_outcome(exc, attempts=sent.attempts)
        return publish_failure(exc, outcome, f"{self.topic}/{self.partition}")

    async def _recover(self) -> None:
        """The window drained after trouble: settle or re-send what it left, in order.

        - The stream broke, or a batch got a retryable answer: after a backoff, every
          unsettled batch goes again with the same bytes (the broker answers those it
          appended as duplicates), until the oldest one's delivery timeout; then they all
          fail with an unknown outcome and the partition goes on as after any unknown
          outcome (a fresh id; under a fixed id, every later batch fails).
        - A batch failed for good: the partition goes on as :meth:`_after_failure` says,
          except that batches behind it that were refused for the gap it left go again
          under a fresh producer id from sequence 0, re-stamped (also when one behind it
          was written anyway: the old id's sequences no longer follow ours). (A fixed id
          never pipelines: its window is 1.) Should the stream
          also have broken meanwhile, whatever it left fails (unknown outcome for the
          batches it cut, refused for the others): re-stamped, a batch that may be in
          the log could be written twice.
        """
        trouble = self._trouble
        assert trouble is not None
        redo = self._redo + self._held
        self._trouble, self._redo, self._held = None, [], []
        where = f"{self.topic}/{self.partition}"
        if trouble.final:
            assert trouble.failed is not None
            if trouble.broke is not None:
                behind = ClientError(
                    f"publish to {where} not sent again: a batch before it failed "
                    f"({trouble.first}) and the stream broke",
                    outcome=PublishOutcome.REFUSED,
                )
                cut = publish_failure(trouble.broke, PublishOutcome.UNKNOWN, where)
                for sent in redo:
                    self._settle(sent.batch, cut if sent.unknown else behind)
                redo = []
            if redo or trouble.written_after or trouble.broke is not None:
                self._producer_id = self._producer.new_producer_id()
                self._sequence = 0
                logger.warning(
                    "%s; going on under producer id %d",
                    shown_text(str(trouble.first)),
                    self._producer_id,
                )
            else:
                self._sequence = trouble.failed.base_sequence  # if _after_failure frees them
                self._after_failure(trouble.first)
            for sent in redo:
                seq = self._sequence if self._producer_id >= 0 else -1
                if (self._producer_id, seq) != (sent.producer_id, sent.base_sequence):
                    sent.data = restamp(sent.data, self._producer_id, seq)
                    sent.producer_id, sent.base_sequence = self._producer_id, seq
                if self._producer_id >= 0:
                    self._sequence += sent.count
                sent.attempts = 0  # a new batch as far as the broker knows
            await self._resend(redo)
            return
        if not redo:
            return
        step = self._reroute(trouble)
        # To the owner a refusal named: at once, a few times in a row (two brokers whose
        # views disagree for a moment could send the batches back and forth).
        at_once = step is Step.NOW and self._rounds < MAX_REDIRECTS
        # A pause before a Lookup is capped as the router's (250 ms): after a leader's
        # failover the wait is for its election, and a 2 s pause after it was the
        # producer's (bench replication: up to 1.8 s between the election and the resend).
        lookup = step is Step.LOOKUP or step is Step.NOW
        pause = 0.0 if at_once else route_backoff_s(self._rounds, self._producer.rng, lookup=lookup)
        if time.monotonic() + pause >= redo[0].deadline:
            failure = publish_failure(trouble.first, PublishOutcome.UNKNOWN, where)
            for sent in redo:
                self._settle(sent.batch, failure)
            self._after_failure(failure)
            return
        logger.info(
            "publish to %s failed (%s); sending %d batches again in %.3f s",
            where,
            shown_text(str(trouble.first)),
            len(redo),
            pause,
        )
        self._rounds += 1
        await asyncio.sleep(pause)
        if step is Step.LOOKUP or (not at_once and step is Step.NOW):
            await self._producer.router.refresh([self.topic], redo[0].deadline)
        self._move_stream()
        await self._resend(redo)

    def _reroute(self, trouble: _Trouble) -> Step:
        """Tell the router what went wrong on the stream (a refusal: nothing was done;
        or the stream broke), so that the batches go again where the topic lives now."""
        error = trouble.first if isinstance(trouble.first, Refused) else trouble.broke
        if error is None or not self._stream_address:
            return Step.BACKOFF
        router = self._producer.router
        return router.table.after(self.topic, self._stream_address, error, retry=True)

    def _move_stream(self) -> None:
        """Close the stream when the topic's route now names another broker (every batch
        on it was answered: the window drained), so the next write opens one there."""
        stream = self._stream
        if stream is None:
            return
        if self._producer.router.table.address(self.topic) != self._stream_address:
            self._stream = None
            stream.cancel()

    async def _resend(self, redo: list[_Sent]) -> None:
        self._resending = True  # the window may empty before the last is written
        try:
            for sent in redo:
                await self._send(sent)
        finally:
            self._resending = False

    def _settle(
        self,
        p: PendingBatch | Bulk,
        error: ClientError | None = None,
        *,
        response: _pb.PublishResponse | None = None,
    ) -> None:
        if response is not None:
            p.resolve(self.topic, response)
        else:
            assert error is not None
            p.fail(error)
        self._producer.released(p)

    def _after_failure(self, exc: ClientError) -> None:
        """Decide how the partition goes on after a failed batch (see the module docstring)."""
        if self._producer.fixed_producer_id is not None:
            # Under an id that cannot change, any failure ends this partition's batches: an
            # unknown outcome (a timeout, but also UNKNOWN or INTERNAL) may have appended
            # the batch, and a later batch under its sequences would then be answered as
            # its duplicate. The caller re-sends everything under the same id instead.
            self._failed = exc
            return
        gap = exc.code == grpc.StatusCode.FAILED_PRECONDITION
        if exc.outcome is PublishOutcome.REFUSED and not gap:
            return  # refused before any append: its sequence numbers are free again
        # Unknown outcome (the batch may be in the log), or the broker's sequence state of
        # this id lost step with ours: continue under a new id, so the next batch can be
        # neither taken for this one's duplicate nor refused for a gap.
        old, self._producer_id = self._producer_id, self._producer.new_producer_id()
        self._sequence = 0
        logger.warning(
            "%s; continuing under producer id %d, not %d",
            shown_text(str(exc)),
            self._producer_id,
            old,
        )


def _answer_error(code: grpc.StatusCode, response: _pb.PublishResponse) -> ClientError:
    """The error of a PublishStream answer: :class:`Refused` when it carries a
    ``redirect`` (the broker does not serve the topic: nothing was written)."""
    if code == grpc.StatusCode.ABORTED and response.HasField("redirect"):
        r = response.redirect
        redirection = from_redirect_fields(
            {
                "reason": r.reason,
                "topic": r.topic,
                "owner_node": r.owner_node,
                "owner_address": r.owner_address,
                "owner_epoch": r.owner_epoch,
            }
        )
        if redirection is not None:
            return Refused(response.error_message or "refused", code, redirection=redirection)
    return from_status(code, response.error_message)
