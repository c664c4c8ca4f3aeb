"""A Spark batch read through a broker that serves TLS only, with the ``tlsCa`` option:
the driver's admin client and the executors' fetchers all connect over TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import AdminClient, Producer
from tests._certs import Pki
from tests.broker.test_cli_security import _tls_serve

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def tls_address(tmp_path: Path, pki: Pki) -> Iterator[str]:
    """`headrace serve` with the test CA's server certificate (TLS only)."""
    yield from _tls_serve(tmp_path, pki)


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
