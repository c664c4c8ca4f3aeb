"""Records and key layout, pure: round trips, the key names, and a bad value named by key."""

from __future__ import annotations

import pytest

from cluster.errors import RecordError
from cluster.records import Keys, TopicRecord, TopicState, decode, encode


def test_topic_record_round_trip_and_replace() -> None:
    """A topic record encodes to JSON with its state as the lowercase word and decodes
    back equal; replace changes only what it is given."""
    record = TopicRecord("orders", "9f0c1d2e3a4b5c6d", 3, 1, "", 0, TopicState.PLACING)
    raw = encode(record)
    assert b'"state":"placing"' in raw
    assert decode("/k", raw, TopicRecord) == record
    placed = record.replace(owner="b1", state=TopicState.CREATING)
    assert (placed.owner, placed.state, placed.id, placed.epoch) == (
        "b1",
        TopicState.CREATING,
        record.id,
        0,
    )
    assert not TopicState.PLACING.is_placed()
    assert TopicState.READY.is_placed()


def test_keys_under_the_prefix() -> None:
    """Every key lives under the prefix, in the documented layout."""
    keys = Keys("/hr/")
    assert (keys.cluster, keys.controller) == ("/hr/cluster", "/hr/controller")
    assert keys.broker("b1") == "/hr/brokers/b1"
    assert keys.topic("orders") == "/hr/topics/orders"
    assert keys.topic("x").startswith(keys.topics)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b'{"name":"t"}',
        b'{"name":"t","id":"x","partitions":1,'
        b'"created_ms":0,"owner":"","epoch":0,"state":"sleeping"}',
    ],
)
def test_a_bad_value_names_its_key(raw: bytes) -> None:
    """Garbage, a missing field or an unknown state: RecordError naming the key."""
    with pytest.raises(RecordError, match="/hr/topics/t"):
        decode("/hr/topics/t", raw, TopicRecord)
