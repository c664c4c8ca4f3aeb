"""The stream reader's driver-side methods called directly, as Spark's source runner
calls them, against a real broker: acks that fail while the broker is down, and pickling.
No SparkSession: these are the reader's own rules."""

from __future__ import annotations

import pickle

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from spark_connector.offsets import from_spark, topic_id_of
from spark_connector.options import parse_source
from spark_connector.reader import HeadracePartition, HeadraceStreamReader
from tests.spark_connector.conftest import Broker, lag, produce


def _reader(broker: Broker, **options: str) -> HeadraceStreamReader:
    base = {"broker": broker.address, "topic": "t", "subscription": "spark"}
    return HeadraceStreamReader(parse_source({**base, **options}, streaming=True))


def test_a_failed_ack_is_counted_and_retried_not_raised(broker: Broker) -> None:
    """Scenario: a reader plans a batch; the broker is stopped before Spark commits it,
    then started again. Expected: commit() returns without raising and counts one failed
    ack; the next latestOffset() acks the same position, and the cursor reaches it."""
    produce(broker.address, "t", 90, partitions=3)
    reader = _reader(broker)
    start = reader.initialOffset()
    assert from_spark(start) == {0: 0, 1: 0, 2: 0}
    assert len(topic_id_of(start)) == 16
    end = reader.latestOffset(start, ReadAllAvailable())
    assert sum(from_spark(end).values()) == 90
    broker.stop()
    reader.commit(end)
    assert reader.ack_failures >= 1
    broker.start()
    again = reader.latestOffset(end, ReadAllAvailable())
    assert again == end
    assert {
        p: cursor for p, (cursor, _) in lag(broker.address, "t", "spark").items()
    } == from_spark(end)
    reader.stop()


def test_readers_and_partitions_pickle_without_their_channels(broker: Broker) -> None:
    """Scenario: a reader that has opened its driver-side clients is pickled, as Spark
    sends it to workers; so is a partition. Expected: both round-trip; the copy has no
    clients (it makes its own) and keeps its options and acked positions; latestOffset on
    the copy works and honours a row limit."""
    produce(broker.address, "t", 30, partitions=3)
    reader = _reader(broker)
    start = reader.initialOffset()
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == reader.options
    assert copy._driver is None
    end = copy.latestOffset(start, ReadMaxRows(12))
    assert sum(from_spark(end).values()) == 12
    part = HeadracePartition(1, 5, 9)
    assert pickle.loads(pickle.dumps(part)) == part
    reader.stop()
    copy.stop()
