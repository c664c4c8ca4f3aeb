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


ISSUE_36_VALUE = (
    b'{"name":"orders","id":"9f0c1d2e3a4b5c6d","partitions":3,"created_ms":1700000000000,'
    b'"owner":"b1","epoch":4,"state":"ready"}'
)
"""A topic value exactly as an issue-36 broker wrote it (no replication fields)."""


def test_an_issue_36_record_decodes_as_factor_one_and_encodes_back_byte_for_byte() -> None:
    """A stored issue-36 value decodes with the replication defaults (no replicas, no isr,
    min_insync 1): its effective replica and in-sync sets are (owner,). Encoded again it is
    the same bytes, so a factor-1 topic's value does not change under issue 37."""
    record = decode("/hr/topics/orders", ISSUE_36_VALUE, TopicRecord)
    assert (record.owner, record.epoch, record.state) == ("b1", 4, TopicState.READY)
    assert (record.replicas, record.isr, record.min_insync, record.reassign_to) == ((), (), 1, ())
    assert record.effective_replicas() == ("b1",)
    assert record.effective_isr() == ("b1",)
    assert encode(record) == ISSUE_36_VALUE


def test_a_placing_legacy_record_has_no_effective_replicas() -> None:
    """While no owner is chosen, a legacy record's effective sets are empty (not ("",))."""
    record = TopicRecord("t", "0" * 16, 1, 0, "", 0, TopicState.PLACING)
    assert record.effective_replicas() == ()
    assert record.effective_isr() == ()


def test_a_replicated_record_round_trips_with_its_sets() -> None:
    """Replicas, isr, min_insync and reassign_to are written when set and read back as
    tuples in order; the effective sets are then the stored ones."""
    record = TopicRecord("t", "0" * 16, 2, 0, "b2", 3, TopicState.READY).replace(
        replicas=("b2", "b1", "b3"), isr=("b2", "b3"), min_insync=2, reassign_to=("b2", "b4")
    )
    raw = encode(record)
    assert b'"replicas":["b2","b1","b3"]' in raw
    assert b'"isr":["b2","b3"]' in raw
    back = decode("/k", raw, TopicRecord)
    assert back == record
    assert back.effective_replicas() == ("b2", "b1", "b3")
    assert back.effective_isr() == ("b2", "b3")


def test_a_min_insync_below_one_is_a_bad_value() -> None:
    """min_insync 0 would let a publish be acknowledged by nobody: the value is refused,
    named by its key."""
    raw = ISSUE_36_VALUE[:-1] + b',"min_insync":0}'
    with pytest.raises(RecordError, match="/hr/topics/orders"):
        decode("/hr/topics/orders", raw, TopicRecord)
