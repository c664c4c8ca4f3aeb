"""``make demo``: one end-to-end pipeline on a laptop, with no external services.

1. A broker starts (``headrace serve``) in a temporary data directory.
2. A structured streaming query reads topic ``orders`` through subscription
   ``order-totals``, aggregates orders and revenue per region, and publishes the totals to
   topic ``region-totals`` through the sink after every micro-batch (complete output
   mode: a reader keeps the latest total per region).
3. A producer thread publishes a stream of sample orders to topic ``orders``.
4. The lag table is printed while the query runs, until the lag is zero.
5. Midway the broker is SIGKILLed and started again; the producer, the query and the sink
   ride over it. At the end the totals are checked against what was produced: nothing
   lost, nothing counted twice.

Run it with ``make demo`` or ``python -m spark_connector.demo [--orders N]``. It exits 0
when the check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

import spark_connector
from client import AdminClient, ClientError, Producer

REGIONS = ("north", "south", "east", "west")
SUBSCRIPTION = "order-totals"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DemoBroker:
    """``headrace serve`` in a child process, on a temporary data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.address = f"127.0.0.1:{_free_port()}"
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        serve = Path(sys.executable).with_name("headrace")
        command = [str(serve)] if serve.exists() else [shutil.which("headrace") or "headrace"]
        self.proc = subprocess.Popen(
            [
                *command,
                "serve",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                self.address,
                "--metrics-listen",
                "",
            ],
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with AdminClient(self.address, timeout_s=1) as admin:
                    admin.list_topics()
                return
            except ClientError:
                time.sleep(0.1)
        raise RuntimeError(f"the broker did not start on {self.address}")

    def kill(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None


class OrderStream(threading.Thread):
    """Publishes ``count`` orders at about ``rate`` per second; keeps the true totals."""

    def __init__(self, address: str, count: int, rate: int) -> None:
        super().__init__(name="orders", daemon=True)
        self.address, self.count, self.rate = address, count, rate
        self.orders: Counter[str] = Counter()
        self.cents: Counter[str] = Counter()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        try:
            with Producer(self.address, delivery_timeout_s=60) as producer:
                chunk = max(1, self.rate // 10)
                while self.sent < self.count:
                    n = min(chunk, self.count - self.sent)
                    values, keys = [], []
                    for i in range(self.sent, self.sent + n):
                        region = rng.choice(REGIONS)
                        cents = rng.randrange(100, 50_000)
                        self.orders[region] += 1
                        self.cents[region] += cents
                        order = {"id": i, "region": region, "cents": cents}
                        values.append(json.dumps(order).encode())
                        keys.append(region.encode())
                    producer.send_many("orders", values, keys=keys).result()
                    self.sent += n
                    time.sleep(0.1)
        except BaseException as exc:
            self.error = exc


def _spark() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("headrace-demo")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    return spark


def _start_query(spark: Any, address: str, checkpoint: Path) -> Any:
    orders = (
        spark.readStream.format("headrace")
        .option("broker", address)
        .option("topic", "orders")
        .option("subscription", SUBSCRIPTION)
        .option("maxRecordsPerTrigger", "5000")
        .load()
        .select(F.from_json(F.col("value").cast("string"), "region string, cents long").alias("o"))
        .groupBy("o.region")
        .agg(F.count("*").alias("orders"), F.sum("o.cents").alias("cents"))
    )
    totals = orders.select(
        F.col("region").alias("key"),
        F.to_json(F.struct("region", "orders", "cents")).alias("value"),
    )
    return (
        totals.writeStream.format("headrace")
        .outputMode("complete")
        .option("broker", address)
        .option("topic", "region-totals")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


def _lag_line(address: str) -> tuple[int, str]:
    with AdminClient(address, timeout_s=2) as admin:
        info = admin.describe_subscription("orders", SUBSCRIPTION)
    parts = "  ".join(f"p{p.partition}: {p.cursor}/{p.head} {p.state}" for p in info.partitions)
    return sum(p.lag for p in info.partitions), parts


def _final_totals(spark: Any, address: str) -> dict[str, dict[str, int]]:
    """The last published total of every region (offset order within its partition)."""
    rows = (
        spark.read.format("headrace")
        .option("broker", address)
        .option("topic", "region-totals")
        .load()
        .orderBy("partition", "offset")
        .collect()
    )
    latest: dict[str, dict[str, int]] = {}
    for row in rows:
        doc = json.loads(row["value"])
        latest[doc["region"]] = {"orders": doc["orders"], "cents": doc["cents"]}
    return latest


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m spark_connector.demo")
    parser.add_argument("--orders", type=int, default=20_000, help="orders to produce")
    parser.add_argument("--rate", type=int, default=1_000, help="orders per second")
    args = parser.parse_args(argv)
    # Spark's JVM first: it is started by a fork, and a fork is safest before this
    # process has any gRPC threads (see client/_grpc_env.py).
    spark = _spark()
    workdir = Path(tempfile.mkdtemp(prefix="headrace-demo-"))
    broker = DemoBroker(workdir / "data")
    print(f"1. starting a broker on {broker.address}, data in {workdir / 'data'}")
    try:
        broker.start()
        return _run(spark, broker, workdir, args.orders, args.rate)
    finally:
        try:
            spark.stop()
        finally:  # a Spark that fails to stop must not leave the broker running
            broker.stop()
            shutil.rmtree(workdir, ignore_errors=True)


def _run(spark: Any, broker: DemoBroker, workdir: Path, count: int, rate: int) -> int:
    with AdminClient(broker.address) as admin:
        admin.create_topic("orders", partitions=3)
        admin.create_topic("region-totals", partitions=2)
    print("2. streaming query: orders -> totals per region -> topic 'region-totals'")
    query = _start_query(spark, broker.address, workdir / "checkpoint")
    print(f"3. producing {count:,} orders at ~{rate:,}/s to topic 'orders'")
    stream = OrderStream(broker.address, count, rate)
    stream.start()
    killed = False
    try:
        while True:
            time.sleep(1)
            if query.exception() is not None:
                print(f"the query failed: {query.exception()}")
                return 1
            try:
                behind, parts = _lag_line(broker.address)
            except ClientError:
                continue
            print(f"4. lag {behind:>6,}  {parts}")
            if not killed and stream.sent >= count // 2 and stream.sent > behind:
                print("5. SIGKILL the broker mid-run, and start it again")
                broker.kill()
                time.sleep(1)
                broker.start()
                killed = True
                continue
            if stream.sent >= count and not stream.is_alive() and behind == 0:
                time.sleep(2)  # one more trigger publishes the last totals
                break
            if stream.error is not None:
                print(f"the producer failed: {stream.error}")
                return 1
    finally:
        query.stop()
    totals = _final_totals(spark, broker.address)
    return _report(stream, totals)


def _report(stream: OrderStream, totals: dict[str, dict[str, int]]) -> int:
    print(f"\n{'region':<8}{'orders':>8}  {'revenue':>14}  {'expected':>8}  {'revenue':>14}")
    ok = True
    for region in REGIONS:
        got = totals.get(region, {"orders": 0, "cents": 0})
        want = (stream.orders[region], stream.cents[region])
        ok = ok and (got["orders"], got["cents"]) == want
        print(
            f"{region:<8}{got['orders']:>8,}  {got['cents'] / 100:>14,.2f}"
            f"  {want[0]:>8,}  {want[1] / 100:>14,.2f}"
        )
    counted = sum(t["orders"] for t in totals.values())
    if ok:
        print(
            f"\nOK: {stream.sent:,} orders produced, {counted:,} counted, revenue exact: "
            "nothing lost, nothing counted twice, across a broker SIGKILL."
        )
        return 0
    print(f"\nMISMATCH: {stream.sent:,} orders produced, {counted:,} counted")
    return 1


if __name__ == "__main__":
    sys.exit(main())
