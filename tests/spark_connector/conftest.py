"""Fixtures of the connector tests: one local SparkSession for the whole run, and a real
``headrace serve`` child process per test (restartable and killable on its port and data
directory).

The session runs ``local[2,2]`` (two cores, and a failed task is tried once more, as on a
cluster) with this interpreter for its Python workers (so they see the installed
``client`` and ``spark_connector``) and two shuffle partitions, so that a micro-batch
costs a fraction of a second.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.broker.test_serve_process import free_port

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
[broker]
grace_seconds = 1.0
cursor_flush_interval_ms = 50
[wal]
fsync = "always"
"""


class Broker:
    """``headrace serve`` as a child process: start, SIGKILL, SIGTERM, start again."""

    def __init__(self, tmp_path: Path, port: int, config_text: str = CONFIG) -> None:
        self.address = f"127.0.0.1:{port}"
        self.data_dir = tmp_path / "data"
        self.log = tmp_path / "serve.log"
        config = tmp_path / "headrace.toml"
        config.write_text(config_text)
        self._cmd = [
            sys.executable,
            "-c",
            "from broker.cli import main; main()",
            "serve",
            "--config",
            str(config),
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.address,
            "--metrics-listen",
            "",
        ]
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the broker and wait until its health service says SERVING."""
        assert self._proc is None
        with self.log.open("ab") as stderr:
            self._proc = subprocess.Popen(self._cmd, cwd=ROOT, stderr=stderr)
        deadline = time.monotonic() + 30
        request = health_pb2.HealthCheckRequest()
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            with grpc.insecure_channel(self.address) as channel:
                try:
                    got = health_pb2_grpc.HealthStub(channel).Check(request, timeout=0.5)
                except grpc.RpcError:
                    time.sleep(0.05)
                    continue
                if got.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        raise RuntimeError(f"broker did not start: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL the broker and reap it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        """SIGTERM the broker (a clean shutdown) and reap it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A running broker on a free port, with its own data directory."""
    b = Broker(tmp_path, free_port())
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for every connector test, with the source registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import spark_connector

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("headrace-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_connector.register(session)
    try:
        yield session
    finally:
        session.stop()


def produce(
    address: str,
    topic: str,
    count: int,
    *,
    first: int = 0,
    partitions: int = 3,
    batch_max_bytes: int = 1 << 20,
) -> None:
    """Create ``topic`` if needed and publish records ``first .. first + count - 1``: value
    ``b"<n>"``, key ``b"k<n % 7>"``, header ``n``."""
    from client import AdminClient, AlreadyExists, Producer

    with AdminClient(address) as admin, contextlib.suppress(AlreadyExists):
        admin.create_topic(topic, partitions=partitions)
    numbers = range(first, first + count)
    with Producer(address, batch_max_bytes=batch_max_bytes) as producer:
        producer.send_many(
            topic,
            [b"%d" % n for n in numbers],
            keys=[b"k%d" % (n % 7) for n in numbers],
            headers=[{"n": b"%d" % n} for n in numbers],
        ).result()


def lag(address: str, topic: str, subscription: str) -> dict[int, tuple[int, int]]:
    """Per partition, (cursor, head) of a subscription."""
    from client import AdminClient

    with AdminClient(address) as admin:
        info = admin.describe_subscription(topic, subscription)
    return {p.partition: (p.cursor, p.head) for p in info.partitions}


def wait_for(check: Any, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``check()`` until it is true, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
