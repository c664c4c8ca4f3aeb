"""A subscription a Spark query commits to refuses `headrace consume` unless --force.

Issue 34, finding 6: `consume` attached to the subscription of a running Spark query and
moved its cursor, with no warning. The Spark source now sends ``committer="spark"`` with
its AckUpTo commits; the broker saves it with the subscription, shows it in
``subscriptions describe``, and refuses a consumer that attaches without ``force``
(FAILED_PRECONDITION, naming the committer and the way out). A real SparkSession, a real
``headrace serve`` and the CLI as processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.spark_connector.conftest import Broker, lag, produce

CLI = [sys.executable, "-c", "from broker.cli import main; main()"]


def headrace(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args, "--broker", broker.address],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_consume_is_refused_on_a_spark_subscription_until_forced(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """Scenario: 60 records on 3 partitions; an availableNow Spark query reads them
    through subscription `orders-spark` and commits; the broker restarts; `headrace
    consume` attaches to it, then again with --force after 4 more records.
    Expected: `subscriptions describe` shows committer `spark` (as JSON and text), after
    the restart too (it is saved with the subscription); the plain consume exits 1 with
    one line naming the committer, --force and another subscription name, and the
    cursors do not move; with --force it prints the 4 new records and exits 0."""
    produce(broker.address, "orders", 60)
    query = (
        spark.readStream.format("headrace")
        .option("broker", broker.address)
        .option("topic", "orders")
        .option("subscription", "orders-spark")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    done = lag(broker.address, "orders", "orders-spark")
    assert all(c == h for c, h in done.values())
    assert sum(h for _c, h in done.values()) == 60

    broker.stop()
    broker.start()
    described = headrace(broker, "subscriptions", "describe", "orders", "orders-spark", "--json")
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout)["committer"] == "spark"
    text = headrace(broker, "subscriptions", "describe", "orders", "orders-spark").stdout
    assert "committer: spark (consumers attach only with --force)" in text.splitlines()

    refused = headrace(broker, "consume", "orders", "-s", "orders-spark", "--count", "1")
    assert refused.returncode == 1
    assert refused.stdout == ""
    [line] = refused.stderr.strip().splitlines()
    assert "is committed to by 'spark'" in line
    assert "use another subscription name, or attach anyway with --force" in line
    assert lag(broker.address, "orders", "orders-spark") == done

    produce(broker.address, "orders", 4, first=60)
    forced = headrace(
        broker, "consume", "orders", "-s", "orders-spark", "--count", "4", "--force",
        "--timeout", "20",
    )  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert sorted(forced.stdout.split()) == ["60", "61", "62", "63"]
