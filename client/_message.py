"""Received messages: lazy views over one delivered record batch.

Owns :class:`Message` and :class:`DeliveredBatch`. A delivery carries a whole encoded batch
and the offset range meant for this consumer. The batch is decoded once (its header and
column offsets); a message is an index into it, and its value, key, headers and time are cut
out of the batch only when read. So a consumer that reads only values touches nothing else.

Pure module: no I/O, no asyncio.
"""

from __future__ import annotations

from datetime import UTC, datetime

from client._wire.batch import RecordBatch, decode_batch
from client.errors import DataLoss


class DeliveredBatch:
    """One decoded batch, shared by the messages cut from it."""

    __slots__ = ("_headers", "_keys", "batch", "topic", "value_data", "value_offsets")

    def __init__(self, topic: str, data: bytes) -> None:
        decoded = decode_batch(data)
        if decoded is None or isinstance(decoded, Exception):
            raise DataLoss(f"the broker sent a damaged batch of topic {topic!r}: {decoded}")
        self.topic = topic
        self.batch: RecordBatch = decoded
        self.value_offsets: list[int] = decoded.value_offsets().tolist()
        self.value_data = decoded.value_data()
        self._keys: list[bytes | None] | None = None
        self._headers: list[dict[str, bytes]] | None = None

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

    def messages(
        self,
        partition: int,
        from_offset: int,
        to_offset: int,
        redeliveries: dict[int, int],
        epoch: int = 0,
    ) -> list[Message]:
        """The messages of offsets ``[from_offset, to_offset)``."""
        base = self.batch.base_offset
        if not base <= from_offset <= to_offset <= self.batch.next_offset:
            raise DataLoss(
                f"delivery [{from_offset}, {to_offset}) is outside its batch "
                f"[{base}, {self.batch.next_offset})"
            )
        if redeliveries:
            return [
                Message(
                    self, partition, o, o - base, redeliveries=redeliveries.get(o, 0), epoch=epoch
                )
                for o in range(from_offset, to_offset)
            ]
        return [
            Message(self, partition, o, o - base, epoch=epoch)
            for o in range(from_offset, to_offset)
        ]


class Message:
    """One received record.

    Attributes:
        partition: The partition it was read from.
        offset: Its offset in that partition.
        redelivery_count: How often it was delivered before (0 on first delivery).
    """

    __slots__ = ("_batch", "_i", "epoch", "offset", "partition", "redelivery_count")

    def __init__(
        self,
        batch: DeliveredBatch,
        partition: int,
        offset: int,
        i: int,
        *,
        redeliveries: int = 0,
        epoch: int = 0,
    ) -> None:
        self._batch = batch
        self._i = i
        self.partition = partition
        self.offset = offset
        self.redelivery_count = redeliveries
        #: The consumer session it arrived on; acks from older sessions are dropped.
        self.epoch = epoch

    @property
    def topic(self) -> str:
        """The topic it was read from."""
        return self._batch.topic

    @property
    def value(self) -> bytes:
        """The record's value."""
        offsets = self._batch.value_offsets
        return bytes(self._batch.value_data[offsets[self._i] : offsets[self._i + 1]])

    @property
    def key(self) -> bytes | None:
        """The record's key, or None."""
        return self._batch.key(self._i)

    @property
    def headers(self) -> dict[str, bytes]:
        """The record's headers (empty when it has none)."""
        return self._batch.headers(self._i)

    @property
    def timestamp_ms(self) -> int:
        """When it was published, in milliseconds since the epoch (0 if unknown)."""
        return int(self._batch.batch.timestamps()[self._i])

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
