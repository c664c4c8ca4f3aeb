"""Received messages: lazy views over one delivered record batch.

Owns :class:`Message`, :class:`DeliveredBatch` and :class:`MessageBuffer`. A delivery
carries a whole encoded batch and the offset range meant for this consumer. The batch is
decoded once (its header and column offsets); a message is an index into it, and its value,
key, headers and time are cut out of the batch only when read. So a consumer that reads only
values touches nothing else.

The buffer of delivered messages holds each delivery as a lazy iterator, and a
:class:`Message` is built (in C) only when it is taken. So a delivery of 9,000 records does
not allocate 9,000 objects at once: an application that drops each message after use keeps
one alive at a time, and the garbage collector, which runs after every 700 live
allocations, stays idle (building them eagerly cost full collections of 8 ms).

Pure module: no I/O, no asyncio.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from functools import partial
from itertools import islice, repeat
from typing import cast

from client.errors import DataLoss
from proto.batch import RecordBatch, decode_batch


class DeliveredBatch:
    """One decoded batch, shared by the messages cut from it."""

    __slots__ = (
        "_header_lists",
        "_headers",
        "_keys",
        "batch",
        "data",
        "topic",
        "value_offsets",
        "value_start",
    )

    def __init__(self, topic: str, data: bytes) -> None:
        decoded = decode_batch(data)
        if decoded is None or isinstance(decoded, Exception):
            raise DataLoss(f"the broker sent a damaged batch of topic {topic!r}: {decoded}")
        self.topic = topic
        self.batch: RecordBatch = decoded
        self.data = data
        #: Where the value section starts in ``data``; value ``i`` is at
        #: ``[value_start + value_offsets[i], value_start + value_offsets[i + 1])``.
        self.value_start = decoded.layout.value_data
        self.value_offsets: list[int] = decoded.value_offsets().tolist()
        self._keys: list[bytes | None] | None = None
        self._headers: list[dict[str, bytes]] | None = None
        self._header_lists: list[list[tuple[str, bytes]]] | None = None

    def key(self, i: int) -> bytes | None:
        """The key of record ``i`` of the batch (decoded for all records on first use)."""
        if self._keys is None:
            self._keys = self.batch.keys()
        return self._keys[i]

    def headers(self, i: int) -> dict[str, bytes]:
        """The headers of record ``i`` of the batch."""
        if self._headers is None:
            self._headers = self.batch.headers()
        return self._headers[i]

    def header_list(self, i: int) -> list[tuple[str, bytes]]:
        """The headers of record ``i`` as ``(name, value)`` pairs, duplicates kept."""
        if self._header_lists is None:
            self._header_lists = self.batch.header_lists()
        return self._header_lists[i]

    def messages(
        self,
        partition: int,
        from_offset: int,
        to_offset: int,
        redeliveries: dict[int, int],
        epoch: int = 0,
    ) -> Iterator[Message]:
        """The messages of offsets ``[from_offset, to_offset)``, built lazily and in C, one
        per ``next``."""
        base = self.batch.base_offset
        if not base <= from_offset <= to_offset <= self.batch.next_offset:
            raise DataLoss(
                f"delivery [{from_offset}, {to_offset}) is outside its batch "
                f"[{base}, {self.batch.next_offset})"
            )
        offsets = range(from_offset, to_offset)
        counts: Iterable[int] = (
            map(redeliveries.get, offsets, repeat(0)) if redeliveries else repeat(0)
        )
        rows = zip(
            repeat(self),
            range(from_offset - base, to_offset - base),
            repeat(partition),
            offsets,
            counts,
            repeat(epoch),
        )
        return map(_new_message, rows)


class Message(tuple[DeliveredBatch, int, int, int, int, int]):
    """One received record.

    Immutable. It is a tuple underneath only so that a delivery's messages are built in C,
    without a Python call each; use the attributes, the tuple layout is private.
    """

    __slots__ = ()

    @property
    def partition(self) -> int:
        """The partition it was read from."""
        return self[2]

    @property
    def offset(self) -> int:
        """Its offset in that partition."""
        return self[3]

    @property
    def redelivery_count(self) -> int:
        """How often it was delivered before (0 on first delivery)."""
        return self[4]

    @property
    def epoch(self) -> int:
        """The consumer session it arrived on; acks from older sessions are dropped."""
        return self[5]

    @property
    def topic(self) -> str:
        """The topic it was read from."""
        return self[0].topic

    @property
    def value(self) -> bytes:
        """The record's value."""
        batch, i = self[0], self[1]
        offsets, start = batch.value_offsets, batch.value_start
        return batch.data[start + offsets[i] : start + offsets[i + 1]]

    @property
    def key(self) -> bytes | None:
        """The record's key, or None."""
        return self[0].key(self[1])

    @property
    def headers(self) -> dict[str, bytes]:
        """The record's headers (empty when it has none). A name sent more than once
        appears once here, with its last value; :attr:`header_list` keeps every entry."""
        return self[0].headers(self[1])

    @property
    def header_list(self) -> list[tuple[str, bytes]]:
        """The record's headers as ``(name, value)`` pairs in the order sent, duplicate
        names kept (empty when it has none)."""
        return self[0].header_list(self[1])

    @property
    def timestamp_ms(self) -> int:
        """When it was published, in milliseconds since the epoch (0 if unknown)."""
        return int(self[0].batch.timestamps()[self[1]])

    @property
    def publish_time(self) -> datetime:
        """When it was published, as an aware UTC datetime."""
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"key={self.key!r}, value={self.value[:32]!r}, "
            f"redelivery_count={self.redelivery_count})"
        )


#: ``tuple.__new__`` bound to Message: builds one from a row without running Python code.
_new_message = cast(
    "Callable[[tuple[DeliveredBatch, int, int, int, int, int]], Message]",
    partial(tuple.__new__, Message),
)


class MessageBuffer:
    """Delivered messages not yet handed to the application, oldest first.

    Each delivery is kept as its lazy iterator (:meth:`DeliveredBatch.messages`) with what
    it covers. The delivery being taken from is cut into segments: ``current`` yields
    them and ``left`` says how many the segment still holds, both public so that the
    consumer's per-record path takes one inline (``left -= 1; next(current)``) and does
    its bookkeeping (credit) only when ``left`` reaches 0, via :meth:`took`. A segment ends
    where a delivery ends or where the count of messages taken reaches a multiple of
    ``step``, so a consumer that grants credit every ``step`` messages finds each grant
    due exactly at a segment's end.
    """

    __slots__ = (
        "_phase",
        "_rest",
        "_runs",
        "_seg",
        "_taken",
        "_where",
        "current",
        "left",
        "step",
    )

    def __init__(self, step: int = 1) -> None:
        #: Per delivery not started: its messages, count, and (epoch, partition, end).
        self._runs: deque[tuple[Iterator[Message], int, tuple[int, int, int]]] = deque()
        self.current: Iterator[Message] = iter(())
        self.left = 0  # messages left in the current segment
        self.step = step  # the longest segment
        self._seg = 0  # the current segment's length, less what took() counted of it
        self._rest = 0  # messages of the current delivery after the segment
        self._taken = 0  # messages of finished segments not yet counted by took()
        self._phase = 0  # messages taken in all, modulo ``step`` (counted segments only)
        self._where = (0, 0, 0)  # (epoch, partition, end offset) of the current delivery

    def __bool__(self) -> bool:
        return bool(self.left or self._rest or self._runs)

    def __len__(self) -> int:
        return self.left + self._rest + sum(count for _, count, _ in self._runs)

    def add(
        self,
        batch: DeliveredBatch,
        partition: int,
        from_offset: int,
        to_offset: int,
        *,
        redeliveries: dict[int, int],
        epoch: int,
    ) -> None:
        """Append the messages of a delivery (see :meth:`DeliveredBatch.messages`).

        Raises:
            DataLoss: the range is outside the batch.
        """
        messages = batch.messages(partition, from_offset, to_offset, redeliveries, epoch)
        if to_offset > from_offset:
            self._runs.append((messages, to_offset - from_offset, (epoch, partition, to_offset)))

    def _advance(self) -> None:
        """Start the next segment (the current one is used up; the buffer is not empty)."""
        self._count()
        if not self._rest:
            self.current, self._rest, self._where = self._runs.popleft()
        n = min(self.step - self._phase, self._rest)
        self._rest -= n
        self.left = self._seg = n

    def _count(self) -> None:
        """Add what was taken of the current segment to the count."""
        done = self._seg - self.left
        self._taken += done
        self._phase = (self._phase + done) % self.step
        self._seg = self.left

    def take(self) -> Message:
        """The oldest message (the buffer must not be empty)."""
        if not self.left:
            self._advance()
        self.left -= 1
        return next(self.current)

    def take_many(self, limit: int) -> list[Message]:
        """Up to ``limit`` of the oldest messages."""
        out: list[Message] = []
        while limit > 0 and self:
            if not self.left:
                self._advance()
            n = min(limit, self.left)
            out.extend(islice(self.current, n))
            self.left -= n
            limit -= n
        return out

    def took(self) -> int:
        """How many messages were taken since the last call."""
        self._count()
        n, self._taken = self._taken, 0
        return n

    def ranges(self) -> list[tuple[int, int, int, int]]:
        """What the buffer holds as ``(epoch, partition, begin, end)`` offset ranges, in
        order, without building its messages."""
        out = []
        if self.left or self._rest:
            epoch, partition, end = self._where
            out.append((epoch, partition, end - self.left - self._rest, end))
        for _, count, (epoch, partition, end) in self._runs:
            out.append((epoch, partition, end - count, end))
        return out

    def clear(self) -> None:
        """Forget every buffered message (and what was taken)."""
        self._runs.clear()
        self.current = iter(())
        self.left = self._seg = self._rest = self._taken = self._phase = 0
