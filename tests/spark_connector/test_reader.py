"""The source against a real broker and a real local SparkSession: streams, batch reads,
acks, restarts, data loss and bad options.

Every stream reads the records written by ``produce`` (value ``b"<n>"``) and checks the
exact set of (partition, offset) it saw: no gap and no duplicate.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from client import AdminClient, Fetcher, Producer
from tests.broker.test_serve_process import free_port
from tests.spark_connector.conftest import Broker, lag, produce, wait_for

pytestmark = pytest.mark.timeout(240)


def _stream(spark: Any, broker: Broker, topic: str, sub: str, **options: str) -> Any:
    reader = (
        spark.readStream.format("headrace")
        .option("broker", broker.address)
        .option("topic", topic)
        .option("subscription", sub)
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def _batch(spark: Any, broker: Broker, topic: str, **options: str) -> Any:
    reader = spark.read.format("headrace").option("broker", broker.address).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def _caught_up(address: str, topic: str, sub: str) -> bool:
    return all(cursor == head for cursor, head in lag(address, topic, sub).values())


def _lag_json(address: str, topic: str) -> list[dict[str, Any]]:
    """What ``headrace lag --json --topic`` prints, parsed: the user's view of lag."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from broker.cli import main; main()",
            "lag",
            "--json",
            "--topic",
            topic,
        ],
        env={**os.environ, "HEADRACE_BROKER": address},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _positions(rows: list[Any]) -> list[tuple[int, int]]:
    return sorted((r["partition"], r["offset"]) for r in rows)


def _all_positions(address: str, topic: str) -> list[tuple[int, int]]:
    with AdminClient(address) as admin:
        info = admin.describe_topic(topic)
    return [(p.partition, o) for p in info.partitions for o in range(p.first_offset, p.head)]


def test_processing_time_stream_reads_everything_once_within_the_limit_and_acks(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """Scenario: 900 records, a stream with maxRecordsPerTrigger=200 and a 100 ms trigger
    into a memory sink; 600 more arrive while it runs. Expected: every record exactly once
    with its key, value and header; no micro-batch over 200 records; and the subscription's
    cursor reaches the head (lag 0), the last batch included, while the query runs."""
    produce(broker.address, "s1", 900)
    df = _stream(spark, broker, "s1", "spark", maxRecordsPerTrigger="200")
    query = (
        df.writeStream.format("memory")
        .queryName("s1_out")
        .trigger(processingTime="100 milliseconds")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        produce(broker.address, "s1", 600, first=900)
        wait_for(lambda: spark.sql("select count(*) from s1_out").first()[0] >= 1500, 60, "1500")
        wait_for(lambda: _caught_up(broker.address, "s1", "spark"), 10, "lag 0")
        rows = spark.sql("select * from s1_out").collect()
        sizes = [p["numInputRows"] for p in query.recentProgress]
    finally:
        query.stop()
    assert _positions(rows) == _all_positions(broker.address, "s1")
    assert sorted(int(r["value"]) for r in rows) == list(range(1500))
    assert all(r["key"] == b"k%d" % (int(r["value"]) % 7) for r in rows)
    assert all(r["headers"] == {"n": r["value"]} for r in rows)
    assert max(sizes) <= 200
    assert sum(sizes) == 1500


def test_available_now_honours_the_limit_acks_the_last_batch_and_restarts_cleanly(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """Scenario: 1000 records; an availableNow run with maxRecordsPerTrigger=300 into
    Parquet; then 250 more and a second run on the same checkpoint. Expected: batches of
    300, 300, 300, 100; lag 0 as soon as each run ends, in `headrace lag --json` too
    (Spark never commits the last batch, so the connector acks it); the second run reads
    only the new records; the Parquet output holds every record once."""
    produce(broker.address, "s2", 1000)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    def run() -> list[int]:
        query = (
            _stream(spark, broker, "s2", "spark", maxRecordsPerTrigger="300")
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    assert run() == [300, 300, 300, 100]
    assert _caught_up(broker.address, "s2", "spark")
    shown = _lag_json(broker.address, "s2")
    assert [(row["subscription"], row["lag"], row["state"]) for row in shown] == [
        ("spark", 0, "CAUGHT_UP")
    ] * 3
    produce(broker.address, "s2", 250, first=1000)
    assert sum(run()) == 250
    assert _caught_up(broker.address, "s2", "spark")
    rows = spark.read.parquet(out).collect()
    assert _positions(rows) == _all_positions(broker.address, "s2")
    assert len(rows) == 1250


def test_a_broker_killed_mid_query_loses_nothing(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """Scenario: a running stream; the broker is SIGKILLed after the first records arrive,
    started again, and 500 more are produced. Expected: the query keeps running and ends up
    with every record exactly once; lag reaches 0."""
    produce(broker.address, "s3", 500)
    query = (
        _stream(spark, broker, "s3", "spark", maxRecordsPerTrigger="100")
        .writeStream.format("memory")
        .queryName("s3_out")
        .trigger(processingTime="100 milliseconds")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        wait_for(lambda: spark.sql("select count(*) from s3_out").first()[0] >= 100, 60, "rows")
        broker.kill()
        broker.start()
        produce(broker.address, "s3", 500, first=500)
        wait_for(lambda: spark.sql("select count(*) from s3_out").first()[0] >= 1000, 90, "1000")
        wait_for(lambda: _caught_up(broker.address, "s3", "spark"), 10, "lag 0")
        assert query.isActive
        rows = spark.sql("select * from s3_out").collect()
    finally:
        query.stop()
    assert _positions(rows) == _all_positions(broker.address, "s3")


def test_batch_read_of_an_explicit_range_in_many_tasks(spark: Any, broker: Broker) -> None:
    """Scenario: 300 records on 3 partitions; a batch read from {0: 2, 1: earliest} to
    {0: 5, 1: 3} (partition 2 unnamed: earliest to the head), then one with minPartitions=6,
    then one from a time. Expected: exactly those offsets; 6 or more tasks covering every
    record once; then topic b2 with 300 records stamped 1,000,000 + n ms: a read from time
    1,000,150 returns exactly records 150-299, on every partition."""
    produce(broker.address, "b1", 300)
    ranged = _batch(
        spark,
        broker,
        "b1",
        startingOffsets=json.dumps({"0": 2, "1": -2}),
        endingOffsets=json.dumps({"0": 5, "1": 3}),
    ).collect()
    part2 = [pos for pos in _all_positions(broker.address, "b1") if pos[0] == 2]
    assert _positions(ranged) == [(0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2), *part2]
    split = _batch(spark, broker, "b1", minPartitions="6")
    assert split.rdd.getNumPartitions() >= 6
    assert _positions(split.collect()) == _all_positions(broker.address, "b1")
    produce(broker.address, "b2", 0)
    with Producer(broker.address) as producer:  # record n at time 1,000,000 + n ms
        producer.send_many(
            "b2",
            [b"t%d" % n for n in range(300)],
            keys=[b"k%d" % (n % 7) for n in range(300)],
            timestamps_ms=[1_000_000 + n for n in range(300)],
        ).result()
    timed = _batch(spark, broker, "b2", startingTimestamp="1000150").collect()
    assert sorted(r["value"] for r in timed) == sorted(b"t%d" % n for n in range(150, 300))


def test_a_batch_read_refuses_ends_past_the_head_or_before_the_start(
    spark: Any, broker: Broker
) -> None:
    """Scenario: 30 records on 3 partitions (10 each); batch reads with endingOffsets past
    a head, endingOffsets before startingOffsets, and startingOffsets past a head.
    Expected: each fails at planning, naming the option, the partition and the head or
    start. Before, the first two read silently (to the head; from 0 to the end) and the
    last blamed a deleted topic."""
    produce(broker.address, "be", 30)
    cases = [
        ({"endingOffsets": '{"0": 999999}'}, "'endingOffsets': partition 0 is at 999999, past"),
        (
            {"startingOffsets": '{"0": 8}', "endingOffsets": '{"0": 3}'},
            "'endingOffsets': partition 0 ends at 3, before the read's start there (8)",
        ),
        ({"startingOffsets": '{"1": 11}'}, "'startingOffsets': partition 1 is at 11, past its"),
    ]
    for options, words in cases:
        with pytest.raises(Exception, match=re.escape(words)):
            _batch(spark, broker, "be", **options).collect()
    exact = _batch(spark, broker, "be", startingOffsets='{"0": 8}', endingOffsets='{"0": 10}')
    assert [pos for pos in _positions(exact.collect()) if pos[0] == 0] == [(0, 8), (0, 9)]


def test_topic_recreated_fails_the_query_or_is_skipped(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """Scenario: a stream reads 300 records (100 a partition); the topic is deleted and
    created again with 450 new ones (150 a partition: every new head is past the query's
    position, so only the topic's id can tell); the query restarts from its checkpoint.
    Expected: with failOnDataLoss=true (the default) it fails naming the cause and both
    ids; with false it reads all 450 new records (none skipped: before, it read from offset
    100 on and lost 300 silently) and the subscription catches up."""
    produce(broker.address, "d1", 300)
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")

    def run(**options: str) -> Any:
        query = (
            _stream(spark, broker, "d1", "spark", **options)
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(StreamingQueryException):  # checked through exception()
            query.awaitTermination(120)
        return query

    assert run().exception() is None
    with AdminClient(broker.address) as admin:
        old_id = admin.describe_topic("d1").topic_id
        admin.delete_topic("d1")
    produce(broker.address, "d1", 450, first=1000)
    with AdminClient(broker.address) as admin:
        new_id = admin.describe_topic("d1").topic_id
    assert len(old_id) == len(new_id) == 16
    assert old_id != new_id
    failed = run()
    assert failed.exception() is not None
    message = str(failed.exception())
    assert "records the query has not read are gone" in message
    assert f"the topic was deleted and created again (its id was {old_id}, now {new_id})" in (
        message
    )
    assert "failOnDataLoss=false" in message
    skipped = run(failOnDataLoss="false")
    assert skipped.exception() is None
    values = sorted(int(r["value"]) for r in spark.read.parquet(out).collect())
    assert values == [*range(300), *range(1000, 1450)]
    assert _caught_up(broker.address, "d1", "spark")


def test_records_deleted_by_retention_fail_a_batch_read_or_are_skipped(
    spark: Any, tmp_path: Path
) -> None:
    """Scenario: a broker with small segments and retention_bytes, no subscription; 3,000
    records, then retention deletes the oldest segments. Expected: a batch read from offset
    0 fails naming the deleted range; with failOnDataLoss=false it reads from the first
    retained offset to the head."""
    config = (
        "[broker]\nretention_check_interval_ms = 50\n"
        '[wal]\nfsync = "always"\nsegment_bytes = 4096\nretention_bytes = 8192\n'
    )
    broker = Broker(tmp_path, free_port(), config)
    broker.start()
    try:
        produce(broker.address, "r1", 3000, partitions=1, batch_max_bytes=1024)
        wait_for(lambda: _all_positions(broker.address, "r1")[0][1] > 0, 30, "retention")
        with pytest.raises(Exception, match="deleted by retention") as info:
            _batch(spark, broker, "r1", startingOffsets='{"0": 0}').collect()
        assert "failOnDataLoss=false" in str(info.value)
        rows = _batch(
            spark, broker, "r1", startingOffsets='{"0": 0}', failOnDataLoss="false"
        ).collect()
        assert _positions(rows) == _all_positions(broker.address, "r1")
    finally:
        broker.stop()


def test_retention_keeps_what_the_query_has_not_committed(spark: Any, tmp_path: Path) -> None:
    """Scenario: a broker whose retention would keep only ~8 KiB per partition, checked
    every 50 ms; a subscription made before 3,000 records arrive in small batches; a
    stream through it reads them 300 per trigger, with failOnDataLoss=true. Expected: the
    query reads every record (retention never deletes at or above the subscription's
    cursor, which follows only Spark's commits), and once it has caught up retention
    deletes the old segments."""
    config = (
        "[broker]\nretention_check_interval_ms = 50\ncursor_flush_interval_ms = 50\n"
        '[wal]\nfsync = "always"\nsegment_bytes = 4096\nretention_bytes = 8192\n'
    )
    broker = Broker(tmp_path, free_port(), config)
    broker.start()
    try:
        produce(broker.address, "floor", 0, partitions=1)
        with Fetcher(broker.address) as fetcher:  # the subscription, before any record
            fetcher.ack_up_to("floor", "spark", 0, 0)
        produce(broker.address, "floor", 3000, partitions=1, batch_max_bytes=1024)
        expected = _all_positions(broker.address, "floor")
        assert expected[0] == (0, 0)
        query = (
            _stream(spark, broker, "floor", "spark", maxRecordsPerTrigger="300")
            .writeStream.format("memory")
            .queryName("floor_out")
            .trigger(processingTime="100 milliseconds")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        try:
            wait_for(
                lambda: (
                    query.exception() is not None
                    or spark.sql("select count(*) from floor_out").first()[0] >= 3000
                ),
                90,
                "3000 rows",
            )
            assert query.exception() is None, str(query.exception())[:2000]
            wait_for(lambda: _caught_up(broker.address, "floor", "spark"), 10, "lag 0")
            assert query.exception() is None
            rows = spark.sql("select * from floor_out").collect()
        finally:
            query.stop()
        assert _positions(rows) == expected
        wait_for(lambda: _all_positions(broker.address, "floor")[0][1] > 0, 30, "retention")
    finally:
        broker.stop()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"topic": "t", "maxRecordsPerTriger": "5"}, "is not a headrace option"),
        ({"topic": "t", "broker": "nowhere"}, "expected HOST:PORT"),
        ({"topic": "missing"}, "does not exist"),
        ({"topic": "t", "startingOffsets": "{bad"}, "startingOffsets"),
        ({"topic": "t", "failOnDataLoss": "maybe"}, "true or false"),
    ],
)
def test_bad_options_fail_load_with_our_message(
    spark: Any, broker: Broker, options: dict[str, str], words: str
) -> None:
    """Scenario: load() with one bad option. Expected: it fails at load(), and the error
    Spark raises carries the connector's message (not a bare Py4JJavaError)."""
    produce(broker.address, "t", 1, partitions=1)
    reader = spark.read.format("headrace").option("broker", broker.address)
    for name, value in options.items():
        reader = reader.option(name, value)
    with pytest.raises(Exception, match=words) as info:
        reader.load()
    assert "Py4JJavaError" not in type(info.value).__name__


def test_an_unreachable_broker_fails_load_within_seconds(spark: Any) -> None:
    """Scenario: load() against a port where nothing listens. Expected: "cannot reach the
    headrace broker" naming the address and the option."""
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match="cannot reach the headrace broker at " + dead):
        spark.read.format("headrace").option("broker", dead).option("topic", "t").load()


@pytest.mark.parametrize("trigger", [{"availableNow": True}, {"processingTime": "1 second"}])
def test_a_stream_given_ending_offsets_fails_with_our_message_alone(
    spark: Any, broker: Broker, tmp_path: Path, trigger: dict[str, Any]
) -> None:
    """Scenario: a stream with the batch-only option endingOffsets, started with each kind
    of trigger (load() cannot refuse it: Spark calls it before it says the read is a
    stream). Expected: the query fails with the connector's message, and the error text
    has no PySpark UnboundLocalError after it (issue 34)."""
    produce(broker.address, "t", 1, partitions=1)
    query = (
        _stream(spark, broker, "t", "s", endingOffsets="latest")
        .writeStream.format("memory")
        .queryName("ending")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(**trigger)
        .start()
    )
    try:
        with pytest.raises(StreamingQueryException) as info:
            query.awaitTermination(120)
    finally:
        query.stop()
    text = str(info.value)
    assert "headrace option 'endingOffsets': applies to batch reads (spark.read) only" in text
    assert "UnboundLocalError" not in text
    assert "During handling of the above exception" not in text


def test_a_stream_without_subscription_reads_but_acks_nothing(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """Scenario: an availableNow stream with no subscription option. Expected: it reads
    every record from the earliest offset, and no subscription appears on the broker."""
    produce(broker.address, "t2", 40)
    query = (
        spark.readStream.format("headrace")
        .option("broker", broker.address)
        .option("topic", "t2")
        .load()
        .writeStream.format("memory")
        .queryName("nosub")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert _positions(spark.sql("select * from nosub").collect()) == _all_positions(
        broker.address, "t2"
    )
    with AdminClient(broker.address) as admin:
        assert admin.list_subscriptions("t2") == []
