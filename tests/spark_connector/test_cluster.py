"""The connector on a real multi-process Spark cluster, not only ``local[2]``.

``local-cluster[2,1,1024]`` starts a master and two executor JVMs from the pip package,
each with its own Python workers, so readers, partitions and writers really cross
process boundaries by pickling, as they do on a standalone or YARN cluster. The job runs
in its own process (see ``_cluster_job.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from client import AdminClient
from tests.spark_connector.conftest import ROOT, Broker, lag, produce

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_stream_and_sink_on_a_two_executor_cluster(broker: Broker, tmp_path: Path) -> None:
    """Scenario: 6,000 records on 3 partitions; a streaming query on local-cluster[2,1,1024]
    copies them through subscription "cluster" to topic "out" in micro-batches of 2,000
    split into 4 tasks each, then batch-reads "out", with no register() call (Spark finds
    the source through pyspark_headrace). Expected: every record exactly once in "out",
    tasks ran on more than one executor process, and the subscription's lag is 0.
    """
    produce(broker.address, "in", 6000)
    with AdminClient(broker.address) as admin:
        admin.create_topic("out", partitions=2)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.spark_connector._cluster_job",
            broker.address,
            str(tmp_path / "ck"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["values"] == list(range(6000))
    assert len(result["executors"]) == 2
    assert result["batches"] == 3
    assert all(cursor == head for cursor, head in lag(broker.address, "in", "cluster").values())
