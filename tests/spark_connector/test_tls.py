"""Spark against a broker that serves TLS only, with the ``tlsCa`` option: the driver's
admin client and the executors' fetchers all connect over TLS. And against a broker with
auth on (TLS + tokens): a stream read and a sink write with ``token``, and a stream whose
token lacks ``consume``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from client import AdminClient, Producer
from tests._certs import Pki
from tests.broker.test_cli_security import Secured, _tls_serve, secured_serve

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def tls_address(tmp_path: Path, pki: Pki) -> Iterator[str]:
    """`headrace serve` with the test CA's server certificate (TLS only)."""
    yield from _tls_serve(tmp_path, pki)


@pytest.fixture
def secured(tmp_path: Path, pki: Pki) -> Iterator[Secured]:
    """`headrace serve` with TLS and a tokens file; topic 'orders' (2 partitions) exists;
    tokens admin (admin:*), producer (produce:orders), consumer (consume:orders:billing)."""
    with secured_serve(tmp_path, pki) as broker:
        yield broker


def test_batch_read_over_tls(spark: Any, tls_address: str, pki: Pki) -> None:
    """Scenario: 50 records in 2 partitions of a TLS broker; spark.read with tlsCa and a
    token option (sent, not checked here). Expected: exactly the 50 values, each once."""
    with AdminClient(tls_address, tls_ca=pki.ca) as admin:
        admin.create_topic("tls-read", 2)
    with Producer(tls_address, tls_ca=pki.ca) as producer:
        producer.send_many("tls-read", [b"%d" % n for n in range(50)]).result()
    rows = (
        spark.read.format("headrace")
        .option("broker", tls_address)
        .option("topic", "tls-read")
        .option("tlsCa", pki.ca)
        .option("token", "hr_spark_token")
        .load()
        .select("value")
        .collect()
    )
    assert sorted(int(r.value) for r in rows) == list(range(50))


def _stream(spark: Any, secured: Secured, token: str, name: str, checkpoint: Path) -> Any:
    """An availableNow stream of orders through subscription billing into memory table
    ``name``, with the named token and the test CA; started."""
    return (
        spark.readStream.format("headrace")
        .option("broker", secured.address)
        .option("tlsCa", secured.ca)
        .option("token", secured.tokens[token])
        .option("topic", "orders")
        .option("subscription", "billing")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_sink_and_stream_with_tokens_over_tls(spark: Any, secured: Secured, tmp_path: Path) -> None:
    """Scenario: against a TLS + tokens broker, df.write of 40 rows to orders with the
    producer token and tlsCa; then an availableNow stream of orders through subscription
    billing with the consumer token into a memory sink. Expected: the stream gets the 40
    values, each once; the acks reached the broker (billing's cursor is at the head of
    every partition, 40 in all, as the admin token sees it)."""
    values = [f"v{i}" for i in range(40)]
    (
        spark.createDataFrame([(v,) for v in values], "value string")
        .write.format("headrace")
        .option("broker", secured.address)
        .option("tlsCa", secured.ca)
        .option("token", secured.tokens["producer"])
        .option("topic", "orders")
        .mode("append")
        .save()
    )
    query = _stream(spark, secured, "consumer", "secured_out", tmp_path / "ck")
    assert query.awaitTermination(120)
    assert query.exception() is None
    rows = spark.sql("select value from secured_out").collect()
    assert sorted(r.value.decode() for r in rows) == sorted(values)
    admin = AdminClient(secured.address, token=secured.tokens["admin"], tls_ca=secured.ca)
    with admin:
        cursors = admin.describe_subscription("orders", "billing").partitions
    assert [p.cursor for p in cursors] == [p.head for p in cursors]
    assert sum(p.cursor for p in cursors) == 40


def test_a_stream_whose_token_lacks_consume_fails_naming_the_role(
    spark: Any, secured: Secured, tmp_path: Path
) -> None:
    """Scenario: the same stream with the producer token (produce:orders only).
    Expected: the query fails; the error Spark surfaces names the token, the role consume
    and the subscription orders/billing; no cursor was made or moved."""
    query = _stream(spark, secured, "producer", "denied_out", tmp_path / "ck")
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(120)
    message = str(caught.value)
    assert "reading subscription 'billing': the broker refused the credentials: token" in message
    assert "For Spark, the token is the option 'token'" in message
    denied = "token 'producer' (" + secured.tokens["producer"][:15]
    assert f"{denied}_…) lacks role consume on subscription 'orders/billing'" in message
    admin = AdminClient(secured.address, token=secured.tokens["admin"], tls_ca=secured.ca)
    with admin:
        assert admin.list_subscriptions("orders") == []


def test_a_sink_whose_token_lacks_produce_fails_naming_the_role(
    spark: Any, secured: Secured
) -> None:
    """Scenario: df.write of 5 rows to orders with the consumer token (consume only).
    Expected: the write fails; the error Spark surfaces is the connector's access error
    (not a complaint about the rows) naming the token, the role produce and the topic
    orders; nothing was written (orders' heads are 0)."""
    df = spark.createDataFrame([(f"v{i}",) for i in range(5)], "value string")
    writer = (
        df.write.format("headrace")
        .option("broker", secured.address)
        .option("tlsCa", secured.ca)
        .option("token", secured.tokens["consumer"])
        .option("topic", "orders")
        .mode("append")
    )
    with pytest.raises(Exception) as caught:  # noqa: PT011 - Spark's own exception type
        writer.save()
    message = str(caught.value)
    assert "AccessDeniedError: the headrace sink may not write to topic 'orders'" in message
    assert "RowError" not in message
    denied = "token 'consumer' (" + secured.tokens["consumer"][:15]
    assert f"{denied}_…) lacks role produce on topic 'orders'" in message
    admin = AdminClient(secured.address, token=secured.tokens["admin"], tls_ca=secured.ca)
    with admin:
        assert [p.head for p in admin.describe_topic("orders").partitions] == [0, 0]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"token": "admin"}, "if the broker serves TLS, set the option 'tlsCa'"),
        ({"tlsCa": "ca"}, "For Spark, the token is the option 'token'"),
    ],
    ids=["no-tlsCa", "no-token"],
)
def test_missing_security_options_fail_load_naming_the_spark_option(
    spark: Any, secured: Secured, options: dict[str, str], words: str
) -> None:
    """Scenario: load() against the TLS + tokens broker without tlsCa (a plaintext client
    on a TLS port sees "Socket closed"), then without a token. Expected: the error names
    the Spark option to set, not only the broker's words (which name the command line's
    --token and HEADRACE_TOKEN)."""
    reader = spark.read.format("headrace").option("broker", secured.address)
    reader = reader.option("topic", "orders")
    for name, which in options.items():
        reader = reader.option(name, secured.ca if which == "ca" else secured.tokens[which])
    with pytest.raises(Exception, match=re.escape(words)):
        reader.load()
