"""Option parsing: every option's good and bad values, with no Spark and no broker."""

from __future__ import annotations

import pytest

from spark_connector.errors import OptionError
from spark_connector.options import (
    EARLIEST,
    LATEST,
    SinkOptions,
    SourceOptions,
    parse_sink,
    parse_source,
)

BASE = {"topic": "orders", "subscription": "spark"}


def test_defaults_differ_between_streams_and_batch_reads() -> None:
    """Scenario: only topic and subscription. Expected: streams start at the acked
    cursor, batch reads at the earliest offset; both end at the head, with headers, failing
    on data loss, at the default broker."""
    stream = parse_source(BASE, streaming=True)
    assert stream == SourceOptions(topic="orders", subscription="spark", starting="acked")
    batch = parse_source({"topic": "orders"}, streaming=False)
    assert (batch.starting, batch.ending, batch.subscription) == ("earliest", "latest", None)
    assert (batch.broker, batch.fail_on_data_loss, batch.include_headers) == (
        "127.0.0.1:50051",
        True,
        True,
    )


def test_every_option_is_read_in_any_case() -> None:
    """Scenario: every option, names in odd case. Expected: each parsed to its type."""
    got = parse_source(
        {
            "TOPIC": "orders",
            "Subscription": "s",
            "broker": "broker.internal:7000",
            "token": "secret",
            "startingoffsets": '{"0": 5, "2": -2}',
            "maxRecordsPerTrigger": "1000",
            "MINPARTITIONS": "8",
            "failOnDataLoss": "FALSE",
            "includeHeaders": "false",
        },
        streaming=True,
    )
    assert got == SourceOptions(
        topic="orders",
        broker="broker.internal:7000",
        subscription="s",
        token="secret",
        starting={0: 5, 2: EARLIEST},
        max_records_per_trigger=1000,
        min_partitions=8,
        fail_on_data_loss=False,
        include_headers=False,
    )


def test_a_stream_without_subscription_starts_at_the_earliest_offset() -> None:
    """Scenario: a stream with no subscription. Expected: allowed (it acks nothing), and it
    starts at the earliest offset, since there is no cursor to start from."""
    got = parse_source({"topic": "t"}, streaming=True)
    assert (got.subscription, got.starting) == (None, "earliest")


def test_batch_ending_offsets_and_starting_timestamp() -> None:
    """Scenario: a batch read with JSON ending offsets, and one with a start time.
    Expected: -1 means the head; the time is kept in ms."""
    got = parse_source({"topic": "t", "endingOffsets": '{"0": 10, "1": -1}'}, streaming=False)
    assert got.ending == {0: 10, 1: LATEST}
    timed = parse_source({"topic": "t", "startingTimestamp": "1700000000000"}, streaming=False)
    assert timed.starting_timestamp_ms == 1_700_000_000_000


@pytest.mark.parametrize(
    ("options", "streaming", "option", "words"),
    [
        ({"topic": "t", "subscripton": "s"}, True, "subscripton", "the options are broker"),
        (
            {**BASE, "maxOffsetsPerTrigger": "5"},
            True,
            "maxOffsetsPerTrigger",
            "here it is maxRecordsPerTrigger",
        ),
        ({"subscribe": "t"}, True, "subscribe", "here it is topic"),
        ({"subscription": "s"}, True, "topic", "is required"),
        ({"topic": "  "}, False, "topic", "is required"),
        ({"topic": "t", "subscription": ""}, False, "subscription", "must not be empty"),
        ({"topic": "events,kin"}, False, "topic", "a query reads one topic"),
        ({"topic": "a/b"}, True, "topic", "'a/b' is not a valid topic name"),
        ({"topic": "t", "subscription": "a/b"}, True, "subscription", "not a valid subscription"),
        ({**BASE, "broker": "localhost"}, True, "broker", "expected HOST:PORT"),
        ({**BASE, "broker": "h:99999"}, True, "broker", "expected HOST:PORT"),
        ({**BASE, "broker": ":50051"}, True, "broker", "expected HOST:PORT"),
        ({**BASE, "startingOffsets": "oldest"}, True, "startingOffsets", "expected 'acked'"),
        ({**BASE, "startingOffsets": "[1]"}, True, "startingOffsets", "JSON such as"),
        ({**BASE, "startingOffsets": '{"x": 1}'}, True, "startingOffsets", "not a partition"),
        ({**BASE, "startingOffsets": '{"0": "1"}'}, True, "startingOffsets", "whole number"),
        ({**BASE, "startingOffsets": '{"0": true}'}, True, "startingOffsets", "whole number"),
        ({**BASE, "startingOffsets": '{"0": -3}'}, True, "startingOffsets", "use >= 0"),
        ({"topic": "t", "startingOffsets": "acked"}, False, "startingOffsets", "subscription"),
        ({"topic": "t", "startingOffsets": "latest"}, False, "startingOffsets", "read nothing"),
        ({**BASE, "endingOffsets": '{"0": 5}'}, True, "endingOffsets", "batch reads"),
        ({"topic": "t", "endingOffsets": '{"0": -2}'}, False, "endingOffsets", "use >= 0"),
        ({"topic": "t", "maxRecordsPerTrigger": "5"}, False, "maxRecordsPerTrigger", "streams"),
        ({**BASE, "maxRecordsPerTrigger": "0"}, True, "maxRecordsPerTrigger", "from 1 to"),
        ({**BASE, "maxRecordsPerTrigger": "1e6"}, True, "maxRecordsPerTrigger", "whole"),
        ({**BASE, "minPartitions": "-1"}, True, "minPartitions", "from 1 to 100000"),
        ({**BASE, "minPartitions": "100001"}, True, "minPartitions", "from 1 to 100000"),
        ({**BASE, "failOnDataLoss": "yes"}, True, "failOnDataLoss", "true or false"),
        ({**BASE, "includeHeaders": "1"}, True, "includeHeaders", "true or false"),
        ({**BASE, "startingTimestamp": "-5"}, True, "startingTimestamp", "from 0 to"),
        (
            {**BASE, "startingTimestamp": "5", "startingOffsets": "earliest"},
            True,
            "startingTimestamp",
            "not both",
        ),
    ],
)
def test_bad_options_name_the_option_and_the_fix(
    options: dict[str, str], streaming: bool, option: str, words: str
) -> None:
    """Scenario: one bad option at a time. Expected: OptionError naming that option, with
    words that say what is expected."""
    with pytest.raises(OptionError, match=words) as info:
        parse_source(options, streaming=streaming)
    assert info.value.option == option
    assert f"headrace option {option!r}" in str(info.value)


def test_schema_time_parse_checks_only_what_both_modes_share() -> None:
    """Scenario: DataSource.schema() parses before Spark says stream or batch. Expected:
    options valid in either mode pass; an unknown option still fails."""
    parse_source({"topic": "t", "maxRecordsPerTrigger": "5"}, streaming=None)
    parse_source({"topic": "t", "startingOffsets": "latest"}, streaming=None)
    with pytest.raises(OptionError, match="not a headrace option"):
        parse_source({"topic": "t", "pth": "/x"}, streaming=None)


def test_sink_options() -> None:
    """Scenario: sink options, and a source-only option given to the sink. Expected: topic
    and broker parsed; the source option is unknown to the sink."""
    assert parse_sink({"topic": "out", "broker": "h:1"}) == SinkOptions("out", "h:1")
    spark_own = {"topic": "out", "checkpointLocation": "/ck", "path": "/p"}
    assert parse_sink(spark_own) == SinkOptions("out")
    with pytest.raises(OptionError, match="the options are broker, topic, token"):
        parse_sink({"topic": "out", "subscription": "s"})


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({**BASE, "broker": "evil\n2026-12-06 ERROR forged:50051"}, "broker"),
        ({**BASE, "broker": "host\x1b[2J:50051"}, "broker"),
        ({**BASE, "topic": "t\r\x00" + "x" * 5000}, "topic"),
        ({**BASE, "maxRecordsPerTrigger": "\x1b[31m5"}, "maxRecordsPerTrigger"),
        ({**BASE, "startingOffsets": '{"0": "\\n\\u001b[2J"}'}, "startingOffsets"),
    ],
)
def test_an_option_with_control_characters_is_refused_and_shown_escaped(
    options: dict[str, str], option: str
) -> None:
    """Scenario: an option value holding a newline and a forged log line, an escape
    sequence, NUL or 5,000 characters (issue 38: a broker address reaches the driver's
    log). Expected: OptionError naming the option, its message one printable line of at
    most ~500 characters (the value escaped and cut by proto.shown)."""
    with pytest.raises(OptionError) as info:
        parse_source(options, streaming=True)
    assert info.value.option == option
    assert str(info.value).isprintable()
    assert len(str(info.value)) < 600
