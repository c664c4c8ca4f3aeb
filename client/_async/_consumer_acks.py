"""AckBatcher: a consumer's acks, nacks and releases, coalesced and sent when due.

Role: the acknowledging half of :class:`~client._async.consumer.AsyncConsumer`. Acks are
batched behind the scenes: acked offsets are coalesced into ranges per partition
(in-order acks make one range per batch) and sent when a quarter of the broker's unacked
cap is pending (``shared`` and ``key_shared``: or half the receive queue, as consumers
share the cap), or ``ack_interval_ms`` after the first pending ack, or on close. An ack
after the close sent the last acks raises ``ClientClosed`` (it could never count).
Nothing is sent from here: :meth:`AckBatcher._flush_acks` marks the acks due in the
session's :class:`~client._async._consumer_session.Outbox`, and the session's writer
takes them (:meth:`AckBatcher._take_acks`) when the stream is ready.

Example: messages 0-99 of partition 2 acked in order, then 120: the writer sends one
request with the ranges [0, 100) and [120, 121) of partition 2.

Why a mixin of ``AsyncConsumer`` rather than an object it holds: ``ack`` is a per-record
path, and a call into a held object would add one call to every acknowledgement. The
fields below are this class's own (set by :meth:`AckBatcher._init_acks`); it reads the
consumer's ``_out`` and calls its ``_kick``.

Not task-safe apart from the consumer: everything runs on the consumer's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

from client._async._consumer_session import Outbox
from client._message import Message
from client._types import QUEUED, Queued
from client.errors import ClientClosed
from proto import broker_pb2 as _pb

_MAX_NACK_DELAY_S = 86_400.0


class AckBatcher:
    """The acks of one consumer (a mixin of :class:`~client.AsyncConsumer`)."""

    _ack_interval_s: float
    _ranges: dict[int, list[list[int]]]
    _up_to: dict[int, int]
    _nacks: list[_pb.Nack]
    _pending: int
    _ack_threshold: int
    _ack_timer: asyncio.TimerHandle | None
    _ack_partition: int
    _ack_run: list[int]
    _acks_final: bool
    _ack_epoch: int
    _releases: list[_pb.OffsetRange]
    # The consumer's:
    _out: Outbox

    if TYPE_CHECKING:

        def _kick(self) -> None: ...

    def _init_acks(self, ack_interval_ms: float) -> None:
        self._ack_interval_s = ack_interval_ms / 1000
        self._ranges = {}
        self._up_to = {}
        self._nacks = []
        self._pending = 0
        self._ack_threshold = 1
        self._ack_timer = None
        self._ack_partition = -1  # the run the last ack extended: [begin, end) of a partition
        self._ack_run = [-1, -1]
        self._acks_final = False  # the last acks went out: later acks raise ClientClosed
        self._ack_epoch = 0  # the session whose messages acks count for (-1 once final)
        self._releases = []

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
