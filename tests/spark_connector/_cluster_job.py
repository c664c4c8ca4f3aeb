"""A Spark job on a real multi-process cluster (``local-cluster[2,1,1024]``: a master and
two executor JVMs, each with its own Python workers), run as its own process by
``test_cluster.py``: one SparkContext per JVM, and the test session already has one.

Usage: ``python -m tests.spark_connector._cluster_job BROKER CHECKPOINT_DIR``. It streams
topic ``in`` through subscription ``cluster`` into topic ``out`` (availableNow, 4 tasks
per batch), then batch-reads ``out``, and prints one JSON line: the rows it read, the
distinct executor ids that ran tasks, and how many micro-batches ran. It never calls
``spark_connector.register``: Spark finds ``format("headrace")`` by itself through the
installed ``pyspark_headrace`` module.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _executor_pid(_: int) -> int:
    """The pid of the executor JVM running this task: the parent of the Python worker
    daemon that forked this worker."""
    time.sleep(0.2)  # long enough that both executors get tasks
    with open(f"/proc/{os.getppid()}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def main() -> None:
    broker, checkpoint = sys.argv[1], sys.argv[2]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("headrace-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", os.getcwd())
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    source = (
        spark.readStream.format("headrace")
        .option("broker", broker)
        .option("topic", "in")
        .option("subscription", "cluster")
        .option("minPartitions", "4")
        .option("maxRecordsPerTrigger", "2000")
        .load()
    )
    query = (
        source.select(F.col("value"), F.col("key"))
        .writeStream.format("headrace")
        .option("broker", broker)
        .option("topic", "out")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    batches = len([p for p in query.recentProgress if p["numInputRows"]])
    out = spark.read.format("headrace").option("broker", broker).option("topic", "out")
    rows = out.option("minPartitions", "4").load()
    values = sorted(int(r["value"]) for r in rows.select("value").collect())
    executors = sorted(
        set(spark.sparkContext.parallelize(range(16), 16).map(_executor_pid).collect())
    )
    print(json.dumps({"values": values, "executors": executors, "batches": batches}))
    spark.stop()


if __name__ == "__main__":
    main()
