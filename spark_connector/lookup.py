"""How Spark finds ``format("headrace")``: :func:`register` and :func:`diagnose`.

Spark knows a Python data source in two ways. At its first use of one, the JVM runs a
Python process once that imports every installed ``pyspark_*`` module defining
``DefaultSource`` (ours is :mod:`pyspark_headrace`): a *static* registration, shared by
the JVM's sessions. ``spark.dataSource.register(cls)`` adds one to a session at run time.
Registering a name that is already static makes Spark log ``WARN DataSourceManager: The
data source headrace replaced a statically registered data source.``, so :func:`register`
registers only when the session does not already resolve ``headrace`` to our class.

Two interpreters matter, both read from the environment the Spark JVM was started with:

- the lookup runs ``PYSPARK_DRIVER_PYTHON``, else ``PYSPARK_PYTHON``, else ``python3``
  (Spark's ``PythonUtils``); if it cannot import ``pyspark_headrace``, ``load()`` fails
  with ``[DATA_SOURCE_NOT_FOUND]`` and a long Java trace that names neither;
- Python workers (every read and write) run ``PYSPARK_PYTHON``, else ``python3``; if it
  cannot import ``spark_connector``, tasks fail with ``No module named ...``.

:func:`diagnose` runs each interpreter as Spark would (Spark's ``PYTHONPATH`` first) and
says, in sentences, what is wrong and what to do.

Reads Spark's registry through its JVM objects (``DataSourceManager``, pyspark 4.3): if
those change, :func:`register` falls back to registering, as before.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from typing import Any

from spark_connector.source import HeadraceDataSource

logger = logging.getLogger(__name__)

#: The data source name Spark knows us by.
NAME = "headrace"
#: The hook module Spark's lookup imports.
HOOK = "pyspark_headrace"
#: How long an interpreter may take to import the connector, seconds (pyarrow and
#: pyspark load in 1-2 s on a laptop; a cold disk can be slower).
PROBE_TIMEOUT_S = 60.0
#: What to set, in the words every message ends with.
_FIX = (
    "Install headrace into that interpreter, or set PYSPARK_PYTHON to one that has it "
    "(this driver's is {driver}) before the SparkSession starts; `import spark_connector` "
    "before building the session does that when PYSPARK_PYTHON is unset"
)


def register(spark: Any) -> None:
    """Make ``format("headrace")`` available in ``spark`` (a SparkSession).

    Does nothing when the session already resolves ``headrace`` to
    :class:`HeadraceDataSource` (found by Spark's lookup, or registered before), so Spark
    logs no "replaced a statically registered data source" warning. Logs a warning when
    Spark's Python workers cannot import the connector (see :func:`diagnose`).
    """
    if registered(spark) is HeadraceDataSource:
        logger.debug("Spark already knows format(%r) as HeadraceDataSource", NAME)
        return
    spark.dataSource.register(HeadraceDataSource)
    problem = _worker_problem(spark)
    if problem is not None:
        logger.warning("%s", problem)


def registered(spark: Any) -> object | None:
    """The class ``format("headrace")`` resolves to in ``spark``, or None when Spark knows
    no such source (or its registry cannot be read)."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        if not manager.dataSourceExists(NAME):
            return None
        command = manager.lookupDataSource(NAME).dataSourceCls().command()
        # cloudpickle's output, made by this session's own Python or Spark's lookup
        # process; a class importable here comes back as the class object itself.
        source: object = pickle.loads(bytes(command.unsafeArray()))
    except Exception:  # any failure of these private APIs (or of the unpickling) is "unknown"
        logger.debug("cannot read Spark's registry of data sources", exc_info=True)
        return None
    return source[0] if isinstance(source, tuple) else source  # register() pickles a pair


def diagnose(spark: Any) -> list[str]:
    """Why ``format("headrace")`` fails in ``spark``, where this module can tell.

    Returns:
        One sentence per problem found, each naming the cause and the fix; empty when
        the session resolves ``headrace`` to the connector and its Python workers can
        import it.
    """
    worker = spark.sparkContext.pythonExec
    worker_error = _import_error(spark, worker, "spark_connector")
    source = registered(spark)
    problems: list[str] = []
    if source is None:
        lookup, origin = _lookup_python(spark)
        if worker_error is not None and lookup == worker:  # one sentence for both roles
            return [_not_found_by_workers(lookup, origin, worker_error)]
        problems.append(_not_found(spark, lookup, origin))
    elif source is not HeadraceDataSource:
        problems.append(
            f"format({NAME!r}) in this session is {_qualname(source)}, not "
            "spark_connector's HeadraceDataSource; spark_connector.register(spark) replaces it"
        )
    if worker_error is not None:
        problems.append(_workers_fail(spark, worker, worker_error))
    return problems


def _not_found(spark: Any, python: str, origin: str) -> str:
    """Why a session has no ``headrace`` source: the lookup interpreter, or a late install."""
    error = _import_error(spark, python, HOOK)
    if error is not None:
        fix = _FIX.format(driver=sys.executable)
        return (
            f"Spark did not find format({NAME!r}): it looks Python data sources up with "
            f"{python} ({origin}), which cannot import {HOOK}: {error}. {fix}; or call "
            "spark_connector.register(spark)"
        )
    return (
        f"Spark did not find format({NAME!r}), though {python} ({origin}) imports {HOOK}: "
        "Spark looks Python data sources up once per JVM, at their first use, and headrace "
        "was not importable then (installed later?) or the lookup failed (the JVM log says "
        "'Skipping the lookup of Python Data Sources'). Call spark_connector.register(spark)"
    )


def _not_found_by_workers(python: str, origin: str, error: str) -> str:
    fix = _FIX.format(driver=sys.executable)
    return (
        f"Spark did not find format({NAME!r}): its lookup of Python data sources and its "
        f"Python workers run {python} ({origin}), which cannot import spark_connector: "
        f"{error}; reads and writes would fail in the workers too. {fix}"
    )


def _worker_problem(spark: Any) -> str | None:
    """A sentence when Spark's Python workers cannot import the connector, else None."""
    python = spark.sparkContext.pythonExec
    error = _import_error(spark, python, "spark_connector")
    return None if error is None else _workers_fail(spark, python, error)


def _workers_fail(spark: Any, python: str, error: str) -> str:
    origin = (
        "PYSPARK_PYTHON when the SparkSession started"
        if _jvm_env(spark, "PYSPARK_PYTHON")
        else "the first python3 on PATH, as PYSPARK_PYTHON was unset when the session started"
    )
    fix = _FIX.format(driver=sys.executable)
    return (
        f"Spark's Python workers run {python} ({origin}), which cannot import "
        f"spark_connector: {error}; every read and write of format({NAME!r}) fails in a "
        f"worker. {fix}"
    )


def _lookup_python(spark: Any) -> tuple[str, str]:
    """The interpreter Spark's lookup runs, and where that name came from."""
    for variable in ("PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON"):
        value = _jvm_env(spark, variable)
        if value:
            return value, f"{variable} when the SparkSession started"
    unset = "PYSPARK_DRIVER_PYTHON and PYSPARK_PYTHON were unset"
    return "python3", f"the first python3 on PATH, as {unset} when the SparkSession started"


def _import_error(spark: Any, python: str, module: str) -> str | None:
    """The last line of what ``python -c 'import module'`` says, run with Spark's own
    ``PYTHONPATH`` as Spark runs it; None when the import works."""
    spark_path = spark.sparkContext._jvm.org.apache.spark.api.python.PythonUtils.sparkPythonPath()
    user_path = _jvm_env(spark, "PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (spark_path, user_path) if p))
    try:
        done = subprocess.run(
            [python, "-c", f"import {module}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except OSError as exc:
        return f"it cannot be run ({exc.strerror or exc})"
    except subprocess.TimeoutExpired:
        return f"importing it took more than {PROBE_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"it exited {done.returncode}"


def _jvm_env(spark: Any, variable: str) -> str | None:
    value = spark.sparkContext._jvm.java.lang.System.getenv(variable)
    return str(value) if value else None


def _qualname(source: object) -> str:
    return f"{getattr(source, '__module__', '?')}.{getattr(source, '__qualname__', source)}"
