"""How Spark finds ``format("headrace")``: ``register()`` leaves Spark's own registration
alone (no "replaced a statically registered data source" warning), and ``diagnose()``
names an interpreter that cannot import the connector.

The jobs that read the JVM's log or need their own ``PYSPARK_PYTHON`` run in their own
process (a SparkContext reads it when it starts, and the test session already has one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import DataSource

from spark_connector import diagnose, register
from spark_connector.lookup import registered
from spark_connector.source import HeadraceDataSource

pytestmark = pytest.mark.timeout(300)

SESSION = """
import sys
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("WARN")
def mark(what):
    print("MARK", what, file=sys.stderr, flush=True)
"""

REGISTER_TWICE = (
    SESSION
    + """
import spark_connector
from spark_connector.lookup import registered
from spark_connector.source import HeadraceDataSource

print("found by Spark", registered(spark) is HeadraceDataSource)
mark("register")
spark_connector.register(spark)
spark_connector.register(spark)
print("diagnose", spark_connector.diagnose(spark))
mark("plain")
spark.dataSource.register(HeadraceDataSource)  # what register() did before
mark("end")
spark.stop()
"""
)

NOT_FOUND = (
    SESSION
    + """
try:
    spark.read.format("headrace").option("topic", "t").load()
except Exception as exc:
    print("load failed", "DATA_SOURCE_NOT_FOUND" in str(exc))
import spark_connector  # after the session, as a job that forgot it would

for problem in spark_connector.diagnose(spark):
    print("problem", problem)
mark("register")
spark_connector.register(spark)
mark("end")
spark.stop()
"""
)
STATIC_WARNING = "replaced a statically registered data source"


def _job(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with this interpreter, no PYSPARK_* and no PYTHONPATH but ``env``."""
    base = {
        k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_") and k != "PYTHONPATH"
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**base, "SPARK_LOCAL_IP": "127.0.0.1", **env},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _between(text: str, start: str, end: str) -> str:
    return text[text.index(f"MARK {start}\n") : text.index(f"MARK {end}\n")]


@pytest.mark.slow
def test_register_logs_no_warning_when_spark_found_the_source(tmp_path: Path) -> None:
    """Scenario: a job with the JVM log at WARN; Spark finds headrace by itself (the
    installed pyspark_headrace hook); the job calls register() twice, then diagnose(),
    then Spark's own spark.dataSource.register() as register() did before.
    Expected: the registry held HeadraceDataSource before register(); register() logs no
    "replaced a statically registered data source"; diagnose() finds nothing; the plain
    registration does log that warning (so the log was read where it would appear)."""
    done = _job(REGISTER_TWICE, tmp_path, PYSPARK_PYTHON=sys.executable)
    assert "found by Spark True" in done.stdout.splitlines()
    assert "diagnose []" in done.stdout.splitlines()
    assert STATIC_WARNING not in _between(done.stderr, "register", "plain")
    assert STATIC_WARNING in _between(done.stderr, "plain", "end")


@pytest.fixture
def python_without_headrace(tmp_path: Path) -> str:
    """An interpreter that cannot import the connector: this one without its
    site-packages (``-S``), as a system ``python3`` without headrace would be."""
    script = tmp_path / "bin" / "python-without-headrace"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    script.chmod(0o755)
    return str(script)


@pytest.mark.slow
def test_diagnose_names_a_pyspark_python_without_headrace(
    tmp_path: Path, python_without_headrace: str
) -> None:
    """Scenario: PYSPARK_PYTHON is an interpreter without headrace; a job builds its
    session without importing spark_connector, and load() of format("headrace") fails;
    the job then calls diagnose() and register(). Expected: load() failed with
    DATA_SOURCE_NOT_FOUND; diagnose() gives one sentence naming that interpreter, its
    import error, and PYSPARK_PYTHON as the fix; register() logs a warning naming it."""
    done = _job(NOT_FOUND, tmp_path / "bin", PYSPARK_PYTHON=python_without_headrace)
    lines = done.stdout.splitlines()
    assert "load failed True" in lines
    problems = [line for line in lines if line.startswith("problem ")]
    assert len(problems) == 1, lines
    assert problems[0].startswith(
        "problem Spark did not find format('headrace'): its lookup of Python data sources "
        f"and its Python workers run {python_without_headrace} (PYSPARK_PYTHON when the "
        "SparkSession started), which cannot import spark_connector: ModuleNotFoundError: "
        "No module named 'spark_connector'"
    )
    assert (
        f"set PYSPARK_PYTHON to one that has it (this driver's is {sys.executable})"
        in (problems[0])
    )
    warned = _between(done.stderr, "register", "end")
    assert f"Spark's Python workers run {python_without_headrace}" in warned
    assert "cannot import spark_connector" in warned


class OtherSource(DataSource):
    """Another data source that calls itself "headrace"."""

    @classmethod
    def name(cls) -> str:
        return "headrace"


def test_a_different_headrace_class_is_named_and_replaced_by_register(spark: Any) -> None:
    """Scenario: the test session (where Spark found the source) registers another class
    as "headrace"; diagnose(), then register(). Expected: the registry first holds
    HeadraceDataSource and diagnose() finds nothing; after the other registration,
    diagnose() names that class; register() puts HeadraceDataSource back."""
    assert registered(spark) is HeadraceDataSource
    assert diagnose(spark) == []
    try:
        spark.dataSource.register(OtherSource)
        assert registered(spark) is OtherSource
        assert diagnose(spark) == [
            "format('headrace') in this session is "
            f"{__name__}.OtherSource, not spark_connector's HeadraceDataSource; "
            "spark_connector.register(spark) replaces it"
        ]
        register(spark)
        assert registered(spark) is HeadraceDataSource
    finally:
        spark.dataSource.register(HeadraceDataSource)
