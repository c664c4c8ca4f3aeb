"""MessageBuffer (pure, no broker): deliveries kept as lazy iterators and taken in
segments; what was taken is counted exactly (credit), and what is left is reported as
offset ranges (releases) without building its messages."""

from __future__ import annotations

import gc

import pytest

from client._message import DeliveredBatch, MessageBuffer
from client.errors import DataLoss
from proto.batch import RecordBatch, decode_batch, encode_columns


def _batch(n: int, base: int = 0) -> DeliveredBatch:
    """A delivered batch of ``n`` records ``v0``.. at offsets ``base``.. (the log stamps
    the base offset on append)."""
    encoded = decode_batch(encode_columns([f"v{i}".encode() for i in range(n)]))
    assert isinstance(encoded, RecordBatch)
    return DeliveredBatch("t", encoded.with_base_offset(base))


def test_messages_are_taken_in_order_across_deliveries_and_segments() -> None:
    buffer = MessageBuffer(step=3)
    buffer.add(_batch(5), 0, 0, 5, redeliveries={}, epoch=1)
    buffer.add(_batch(4, base=10), 1, 11, 14, redeliveries={12: 2}, epoch=1)
    assert len(buffer) == 8
    assert buffer
    got = [buffer.take() for _ in range(8)]
    assert [(m.partition, m.offset) for m in got] == [(0, i) for i in range(5)] + [
        (1, 11),
        (1, 12),
        (1, 13),
    ]
    assert [m.value for m in got[:2]] == [b"v0", b"v1"]
    assert [m.redelivery_count for m in got[5:]] == [0, 2, 0]
    assert not buffer
    assert len(buffer) == 0
    assert buffer.took() == 8


def test_segments_bound_the_inline_count_and_took_counts_exactly() -> None:
    buffer = MessageBuffer(step=4)
    buffer.add(_batch(10), 0, 0, 10, redeliveries={}, epoch=1)
    first = buffer.take()
    assert first.offset == 0
    assert buffer.left == 3  # a segment of 4 started
    for _ in range(3):  # the consumer's inline path
        buffer.left -= 1
        next(buffer.current)
    assert buffer.left == 0
    assert buffer.took() == 4
    assert buffer.took() == 0  # counted once
    assert [m.offset for m in buffer.take_many(5)] == [4, 5, 6, 7, 8]
    assert buffer.took() == 5
    assert buffer.take().offset == 9
    assert buffer.took() == 1


def test_ranges_report_what_is_left_without_building_messages() -> None:
    buffer = MessageBuffer(step=2)
    buffer.add(_batch(6), 0, 0, 6, redeliveries={}, epoch=1)
    buffer.add(_batch(3, base=20), 2, 20, 23, redeliveries={}, epoch=2)
    buffer.take_many(3)  # 0..2 taken, the segment [2, 4) is half used
    assert buffer.ranges() == [(1, 0, 3, 6), (2, 2, 20, 23)]
    buffer.take_many(3)
    assert buffer.ranges() == [(2, 2, 20, 23)]
    buffer.clear()
    assert buffer.ranges() == []
    assert not buffer
    assert buffer.took() == 0


def test_a_delivery_builds_no_message_until_one_is_taken() -> None:
    buffer = MessageBuffer(step=1_000)
    before = len(gc.get_objects())
    buffer.add(_batch(5_000), 0, 0, 5_000, redeliveries={}, epoch=1)
    assert len(gc.get_objects()) - before < 100  # not 5,000 tuples
    assert buffer.take().offset == 0


def test_a_range_outside_its_batch_is_data_loss() -> None:
    buffer = MessageBuffer()
    with pytest.raises(DataLoss, match="outside its batch"):
        buffer.add(_batch(3), 0, 1, 5, redeliveries={}, epoch=1)
    assert not buffer


def test_segments_end_where_the_count_taken_reaches_a_multiple_of_step() -> None:
    """Deliveries of 3 and 10 with a step of 4: the first segment of the second delivery
    is 1 long, so a grant every 4 messages is due at a segment's end (at 4, 8, 12)."""
    buffer = MessageBuffer(step=4)
    buffer.add(_batch(3), 0, 0, 3, redeliveries={}, epoch=1)
    buffer.add(_batch(10, base=3), 0, 3, 13, redeliveries={}, epoch=1)
    ends = []
    for taken in range(1, 14):
        buffer.take()
        if not buffer.left:
            ends.append((taken, buffer.took()))
    assert ends == [(3, 3), (4, 1), (8, 4), (12, 4), (13, 1)]
