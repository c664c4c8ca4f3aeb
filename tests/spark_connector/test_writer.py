"""The sink against a real broker and a real local SparkSession: columns, partitions,
exactly once under a replayed micro-batch and a retried task, and bad rows."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

from client import AdminClient
from spark_connector.writer import FAULT_PROPERTY
from tests.spark_connector.conftest import Broker, produce

pytestmark = pytest.mark.timeout(240)


def _create(address: str, topic: str, partitions: int) -> None:
    with AdminClient(address) as admin:
        admin.create_topic(topic, partitions=partitions)


def _read(spark: Any, broker: Broker, topic: str) -> list[Any]:
    df = spark.read.format("headrace").option("broker", broker.address).option("topic", topic)
    rows: list[Any] = df.load().collect()
    return rows


def test_batch_write_publishes_every_column(spark: Any, broker: Broker) -> None:
    """Scenario: a DataFrame with string values, keys, string headers and an explicit
    partition on some rows, written with df.write. Expected: one record per row; the
    explicit partition where given, else the key's hash partition (as every Headrace
    producer places keys); values, keys and headers as bytes."""
    _create(broker.address, "w1", 3)
    rows = [(f"v{i}", f"k{i % 5}", {"h": str(i)}, 2 if i % 10 == 0 else None) for i in range(200)]
    df = spark.createDataFrame(
        rows, "value string, key string, headers map<string,string>, partition int"
    )
    df.write.format("headrace").option("broker", broker.address).option("topic", "w1").mode(
        "append"
    ).save()
    got = _read(spark, broker, "w1")
    assert sorted(r["value"] for r in got) == sorted(f"v{i}".encode() for i in range(200))
    by_value = {r["value"]: r for r in got}
    from client import partition_for

    for i in range(200):
        r = by_value[f"v{i}".encode()]
        assert r["key"] == f"k{i % 5}".encode()
        assert r["headers"] == {"h": str(i).encode()}
        want = 2 if i % 10 == 0 else partition_for(f"k{i % 5}".encode(), 3)
        assert r["partition"] == want


def test_rows_read_from_a_topic_are_written_back_unchanged(spark: Any, broker: Broker) -> None:
    """Scenario: a batch read of topic "src" (every source column: topic, partition,
    offset, key, value, timestamp, headers) written as it is to "copy", which has as many
    partitions. Expected: the sink ignores topic and offset, keeps each record's partition,
    key, value, headers and timestamp."""
    produce(broker.address, "src", 120)
    _create(broker.address, "copy", 3)
    source = _read(spark, broker, "src")
    df = spark.read.format("headrace").option("broker", broker.address).option("topic", "src")
    df.load().write.format("headrace").option("broker", broker.address).option(
        "topic", "copy"
    ).mode("append").save()

    def fields(rows: list[Any]) -> list[tuple[Any, ...]]:
        return sorted(
            (
                r["partition"],
                r["value"],
                r["key"],
                tuple(sorted(r["headers"].items())),
                r["timestamp"],
            )
            for r in rows
        )

    assert fields(_read(spark, broker, "copy")) == fields(source)


def _pipeline(spark: Any, broker: Broker, ck: str) -> Any:
    """headrace topic "in" -> upper-cased value -> headrace topic "out", availableNow."""
    source = (
        spark.readStream.format("headrace")
        .option("broker", broker.address)
        .option("topic", "in")
        .option("subscription", "copier")
        .option("maxRecordsPerTrigger", "500")
        .load()
    )
    out = source.select(F.upper(F.col("value").cast("string")).alias("value"), "key")
    query = (
        out.writeStream.format("headrace")
        .option("broker", broker.address)
        .option("topic", "out")
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    return query


def test_a_replayed_micro_batch_is_not_published_twice(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """Scenario: a stream copies 1,200 records from "in" to "out" in batches of 500. Then
    the last batch's entry in the checkpoint's commit log is deleted (a crash after the
    sink published and before Spark committed) and the query restarts, so Spark replays
    that micro-batch with the same batch id. Expected: "out" holds each record exactly
    once, before and after the replay."""
    produce(broker.address, "in", 1200)
    _create(broker.address, "out", 2)
    ck = str(tmp_path / "ck")
    first = _pipeline(spark, broker, ck)
    assert first.exception() is None
    assert len(_read(spark, broker, "out")) == 1200
    commits = sorted((tmp_path / "ck" / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(commits) == 3
    commits[-1].unlink()
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    replayed = _pipeline(spark, broker, ck)
    assert replayed.exception() is None
    assert [p["numInputRows"] for p in replayed.recentProgress if p["numInputRows"]] == [200]
    values = sorted(r["value"] for r in _read(spark, broker, "out"))
    assert values == sorted(b"%d" % n for n in range(1200))


def test_a_retried_task_is_not_published_twice(spark: Any, broker: Broker) -> None:
    """Scenario: a batch write of 6,000 rows in two tasks whose first attempts fail right
    after the sink published every row (the named fault point sink.after_publish), so
    Spark runs both again. Expected: the write succeeds and the topic holds each row
    exactly once: the second attempts' batches are answered as duplicates."""
    _create(broker.address, "w2", 2)
    df = spark.range(6000).repartition(2).select(F.col("id").cast("string").alias("value"))
    context = spark.sparkContext
    context.setLocalProperty(FAULT_PROPERTY, "sink.after_publish")
    try:
        df.write.format("headrace").option("broker", broker.address).option("topic", "w2").mode(
            "append"
        ).save()
    finally:
        context.setLocalProperty(FAULT_PROPERTY, None)
    values = sorted(int(r["value"]) for r in _read(spark, broker, "w2"))
    assert values == list(range(6000))


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        ("select 'x' as payload", "needs a 'value' column"),
        ("select 1 as value", "column 'value' must be binary or string"),
        ("select 'x' as value, 'y' as extra", "does not know column 'extra'"),
        ("select 'x' as value, 5 as timestamp", "column 'timestamp' must be a timestamp"),
        ("select 'x' as value, map('a', 1) as headers", "map<string, binary>"),
        ("select 'x' as value, 'p' as partition", "column 'partition' must be an integer"),
    ],
)
def test_bad_columns_fail_before_any_task(
    spark: Any, broker: Broker, frame: str, words: str
) -> None:
    """Scenario: a DataFrame the sink cannot publish. Expected: save() fails with the
    sink's message, and the topic stays empty."""
    with contextlib.suppress(Exception):
        _create(broker.address, "w3", 1)
    with pytest.raises(Exception, match=words):
        spark.sql(frame).write.format("headrace").option("broker", broker.address).option(
            "topic", "w3"
        ).mode("append").save()
    assert _read(spark, broker, "w3") == []


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        ("select cast(null as string) as value", "null 'value'"),
        ("select repeat('x', 2000000) as value", "refused rows"),
        ("select 'x' as value, 7 as partition", "asks for partition 7"),
    ],
)
def test_bad_rows_fail_the_write_with_a_clear_error(
    spark: Any, broker: Broker, frame: str, words: str
) -> None:
    """Scenario: a row that cannot be published (null value, a record over the broker's
    1 MiB limit, a partition the topic lacks). Expected: the write fails with a message
    that says which rule the row broke."""
    with contextlib.suppress(Exception):
        _create(broker.address, "w4", 1)
    with pytest.raises(Exception, match=words):
        spark.sql(frame).write.format("headrace").option("broker", broker.address).option(
            "topic", "w4"
        ).mode("append").save()


def test_overwrite_and_a_missing_topic_are_refused(spark: Any, broker: Broker) -> None:
    """Scenario: mode("overwrite"), then a topic that does not exist. Expected: "only
    appends", then "does not exist" with the command that creates it."""
    _create(broker.address, "w5", 1)
    df = spark.sql("select 'x' as value")
    writer = df.write.format("headrace").option("broker", broker.address)
    with pytest.raises(Exception, match="only appends"):
        writer.option("topic", "w5").mode("overwrite").save()
    with pytest.raises(Exception, match="headrace topics create nope"):
        writer.option("topic", "nope").mode("append").save()
