"""The Spark connector: PySpark's Python Data Source API over Headrace topics.

``spark.readStream.format("headrace")`` reads a topic through a subscription and acks
Spark's commits back to it; ``spark.read.format("headrace")`` reads a fixed range;
``df.write`` / ``df.writeStream`` with ``format("headrace")`` publish rows, exactly once.
Spark finds the source by itself where ``headrace`` is installed (:mod:`pyspark_headrace`);
:func:`register` adds it to a session that did not, and :func:`diagnose` says why one did not.

Modules:
    source    HeadraceDataSource: format("headrace"); checks options, hands out readers/writers
    lookup       register(), diagnose(): how Spark finds format("headrace"), and why it did not
    options   P  .option() strings -> frozen SourceOptions / SinkOptions; unknown = error
    offsets   P  Spark JSON offsets, admission control, data-loss rules, task planning
    arrow        record batches -> pyarrow.RecordBatch over the same bytes; the schema
    reader       HeadraceBatchReader, HeadraceStreamReader: Fetch per task, AckUpTo on commit
    writer       HeadraceBatchWriter, HeadraceStreamWriter: idempotent, replay-safe publishing
    errors    P  ConnectorError -> OptionError, BrokerUnreachableError, DataLossError, RowError,
                 AccessDeniedError
    demo         `make demo`: a broker, an order stream, an aggregating query, a broker kill

Imports ``client`` only (DESIGN section 1). Needs the ``spark`` extra (pyspark, pyarrow).

Importing it sets ``PYSPARK_PYTHON`` to this interpreter when it is unset. PySpark starts
its Python workers (which run the source, and even Spark's lookup of ``format("headrace")``)
with ``PYSPARK_PYTHON``, else with whatever ``python3`` is first on ``PATH``: for a driver
run as ``.venv/bin/python job.py`` that is usually another interpreter, without this
package, and every read fails with ``No module named ...`` from a worker. A driver that
imports this module before it builds its SparkSession gets workers like itself; a value
set by the user (or by ``spark-submit`` from ``spark.pyspark.python``) is left alone.
"""

from __future__ import annotations

import os
import sys

from spark_connector.errors import (
    AccessDeniedError,
    BrokerUnreachableError,
    ConnectorError,
    DataLossError,
    OptionError,
    RowError,
)
from spark_connector.lookup import diagnose, register
from spark_connector.source import HeadraceDataSource

if sys.executable:  # empty when embedded without an interpreter path: leave Spark's default
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

__all__ = [
    "AccessDeniedError",
    "BrokerUnreachableError",
    "ConnectorError",
    "DataLossError",
    "HeadraceDataSource",
    "OptionError",
    "RowError",
    "diagnose",
    "register",
]
