"""The Spark guide's script, docs/examples/spark_order_counts.py, runs as printed.

It is run as a user runs it (``python spark_order_counts.py`` in a directory of their
own, against a ``headrace serve`` process, with its own SparkSession), with one change:
the broker address of ``make run`` is replaced by the test broker's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from client import AdminClient
from tests.spark_connector.conftest import ROOT, Broker, lag

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

EXAMPLE = ROOT / "docs" / "examples" / "spark_order_counts.py"
MAKE_RUN_BROKER = '"127.0.0.1:50051"'


def _run(script: Path, cwd: Path) -> str:
    """Run ``script`` as a user would: no PYSPARK_* set, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env={**env, "SPARK_LOCAL_IP": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_the_order_counts_script_counts_each_run_once(broker: Broker, tmp_path: Path) -> None:
    """Scenario: on an empty broker, the script runs twice in the same directory (its
    checkpoint is ./order-counts-checkpoint). Expected: it creates "orders" (3
    partitions) and "order-counts"; the first run prints 100 orders for each customer,
    the second 200 (each run publishes 100 more each, and the checkpoint keeps the
    counts: nothing counted twice or lost); the subscription's cursor is at the head."""
    text = EXAMPLE.read_text()
    assert text.count(MAKE_RUN_BROKER) == 1, "the script names the broker once"
    script = tmp_path / EXAMPLE.name
    script.write_text(text.replace(MAKE_RUN_BROKER, f'"{broker.address}"'))
    work = tmp_path / "work"
    work.mkdir()

    assert _run(script, work) == "alice 100\nbob 100\ncarol 100\n"
    with AdminClient(broker.address) as admin:
        assert {t.name: len(t.partitions) for t in admin.list_topics()} == {
            "orders": 3,
            "order-counts": 1,
        }
    assert _run(script, work) == "alice 200\nbob 200\ncarol 200\n"
    assert (work / "order-counts-checkpoint").is_dir()
    positions = lag(broker.address, "orders", "spark-order-counts")
    assert sum(head for _, head in positions.values()) == 600
    assert all(cursor == head for cursor, head in positions.values())
