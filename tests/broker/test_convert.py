"""broker.convert's Subscribe delivery: what goes on the wire for a dispatcher Delivery."""

from __future__ import annotations

import pytest

from broker.convert import delivery, fetch_response_bytes
from dispatcher.protocol import Delivery
from proto import broker_pb2 as _pb


def _wire(topic: str, d: Delivery) -> _pb.SubscribeResponse:
    return _pb.SubscribeResponse.FromString(delivery(topic, d).SerializeToString())


def test_a_first_delivery_carries_its_batch_and_range_and_no_redeliveries() -> None:
    """Scenario: a first delivery of offsets [100, 122) of partition 3. Expected: after a
    trip through the wire format, the response is a delivery with the topic, partition,
    batch bytes and range, and an empty redelivery map."""
    got = _wire("orders", Delivery(3, b"batch-bytes", 100, 122, {}))
    assert got.WhichOneof("kind") == "delivery"
    d = got.delivery
    assert (d.topic, d.partition, d.batch, d.from_offset, d.to_offset) == (
        "orders",
        3,
        b"batch-bytes",
        100,
        122,
    )
    assert dict(d.redeliveries) == {}


def test_a_redelivery_carries_each_offsets_count() -> None:
    """Scenario: offsets 100 and 101 were delivered 2 and 3 times before. Expected: the
    map says so, and nothing else changes."""
    got = _wire("orders", Delivery(0, b"b", 100, 102, {100: 2, 101: 3}))
    assert dict(got.delivery.redeliveries) == {100: 2, 101: 3}
    assert (got.delivery.from_offset, got.delivery.to_offset) == (100, 102)


def test_a_delivery_of_default_values_is_still_a_delivery() -> None:
    """Scenario: every field at its protobuf default (partition 0, empty topic and batch,
    offsets 0). Expected: the response's ``kind`` is still ``delivery``; a client that
    switches on it must not see an empty response."""
    got = _wire("", Delivery(0, b"", 0, 0, {}))
    assert got.WhichOneof("kind") == "delivery"


@pytest.mark.parametrize(
    ("batches", "high_water_mark", "first_offset"),
    [
        ([], 0, 0),
        ([b"ab"], 5, 0),
        ([b"x" * 127, b"y" * 128, b""], 300, 7),
        ([b"z" * 20_000], 2**40 + 3, 2**33),
        ([memoryview(b"..batch..")[2:7]], 1, 1),
    ],
)
def test_fetch_response_bytes_equal_protobufs_own(
    batches: list[bytes | memoryview], high_water_mark: int, first_offset: int
) -> None:
    """Scenario: the hand-written FetchResponse encoding for a table of batches (empty,
    one-byte and two-byte length varints, memoryview slices) and offsets (zero, large).
    Expected: byte for byte what protobuf serializes, and it parses back to the same."""
    got = fetch_response_bytes(batches, high_water_mark, first_offset)
    want = _pb.FetchResponse(
        batches=[bytes(b) for b in batches],
        high_water_mark=high_water_mark,
        first_offset=first_offset,
    )
    assert got == want.SerializeToString()
    assert _pb.FetchResponse.FromString(got) == want
