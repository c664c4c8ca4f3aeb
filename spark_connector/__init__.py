"""The Spark connector: PySpark's Python Data Source API over Headrace topics.

``spark.readStream.format("headrace")`` reads a topic through a subscription and acks
Spark's commits back to it; ``spark.read.format("headrace")`` reads a fixed range;
``df.write`` / ``df.writeStream`` with ``format("headrace")`` publish rows, exactly once.
Call :func:`register` once per SparkSession first.

Modules:
    source    HeadraceDataSource: format("headrace"); checks options, hands out readers/writers
    options   P  .option() strings -> frozen SourceOptions / SinkOptions; unknown = error
    offsets   P  Spark JSON offsets, admission control, data-loss rules, task planning
    arrow        record batches -> pyarrow.RecordBatch over the same bytes; the schema
    reader       HeadraceBatchReader, HeadraceStreamReader: Fetch per task, AckUpTo on commit
    writer       HeadraceBatchWriter, HeadraceStreamWriter: idempotent, replay-safe publishing
    errors    P  ConnectorError -> OptionError, BrokerUnreachableError, DataLossError, RowError,
                 AccessDeniedError
    demo         `make demo`: a broker, an order stream, an aggregating query, a broker kill

Imports ``client`` only (DESIGN section 1). Needs the ``spark`` extra (pyspark, pyarrow).
"""

from __future__ import annotations

from typing import Any

from spark_connector.errors import (
    AccessDeniedError,
    BrokerUnreachableError,
    ConnectorError,
    DataLossError,
    OptionError,
    RowError,
)
from spark_connector.source import HeadraceDataSource

__all__ = [
    "AccessDeniedError",
    "BrokerUnreachableError",
    "ConnectorError",
    "DataLossError",
    "HeadraceDataSource",
    "OptionError",
    "RowError",
    "register",
]


def register(spark: Any) -> None:
    """Make ``format("headrace")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(HeadraceDataSource)
