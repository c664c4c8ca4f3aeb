"""Which interpreter Spark's Python workers run: importing ``spark_connector`` makes it
the driver's own when ``PYSPARK_PYTHON`` is unset (a driver run as ``.venv/bin/python
job.py`` would otherwise get whatever ``python3`` is first on ``PATH``), and leaves a value
the user set alone. The job runs in its own process: ``PYSPARK_PYTHON`` is read when a
SparkContext starts, and the test session already has one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark_connector.conftest import ROOT, Broker, produce

pytestmark = pytest.mark.timeout(300)

JOB = """
import sys
import spark_connector  # before the session: sets PYSPARK_PYTHON when it is unset
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .getOrCreate()
)
rows = spark.read.format("headrace").option("broker", sys.argv[1]).option("topic", "t").load()
print("rows", rows.count())
spark.stop()
"""


def _wrong_python(directory: Path) -> Path:
    """A directory whose ``python3`` and ``python`` are not an interpreter: a worker
    started from ``PATH`` fails, naming itself."""
    directory.mkdir()
    for name in ("python3", "python"):
        script = directory / name
        script.write_text("#!/bin/sh\necho 'the python3 on PATH ran' >&2\nexit 3\n")
        script.chmod(0o755)
    return directory


@pytest.mark.slow
def test_workers_run_the_drivers_interpreter_when_pyspark_python_is_unset(
    broker: Broker, tmp_path: Path
) -> None:
    """Scenario: 30 records in topic "t"; a driver process (this interpreter) imports
    spark_connector, starts a local SparkSession and batch-reads the topic, with
    PYSPARK_PYTHON unset and a PATH whose first ``python3`` is not an interpreter.
    Expected: the read counts 30 rows (Spark's workers ran this interpreter, not the
    ``python3`` on PATH)."""
    produce(broker.address, "t", 30)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PATH"] = f"{_wrong_python(tmp_path / 'bin')}{os.pathsep}{env.get('PATH', '')}"
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run(
        [sys.executable, "-c", JOB, broker.address],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows 30" in done.stdout.splitlines()


def test_a_pyspark_python_the_user_set_is_left_alone() -> None:
    """Scenario: spark_connector is imported in a process whose PYSPARK_PYTHON is set,
    and in one where it is not. Expected: the set value is unchanged; the unset one
    becomes this interpreter."""
    probe = "import os, spark_connector; print(os.environ['PYSPARK_PYTHON'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    for preset, expected in (
        ("/opt/python/bin/python3", "/opt/python/bin/python3"),
        (None, sys.executable),
    ):
        run_env = dict(env, PYSPARK_PYTHON=preset) if preset else env
        out = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=ROOT,
            env=run_env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == expected
