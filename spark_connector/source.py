"""HeadraceDataSource: the ``format("headrace")`` entry point Spark instantiates.

Role: no logic of its own. It checks the options (so a bad one fails ``load()`` or
``start()``, not a task), checks that the broker answers and the topic exists, and hands
out the reader or writer for what Spark asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from spark_connector.arrow import schema_ddl
from spark_connector.errors import ConnectorError
from spark_connector.options import SinkOptions, parse_sink, parse_source
from spark_connector.reader import HeadraceBatchReader, HeadraceStreamReader, _Driver
from spark_connector.writer import HeadraceBatchWriter, HeadraceStreamWriter

#: How long ``load()`` waits for the broker before it says it cannot reach it, seconds.
LOAD_WAIT_S = 5.0


class HeadraceDataSource(DataSource):
    """Reads topics through a subscription, and publishes rows to a topic."""

    @classmethod
    def name(cls) -> str:
        return "headrace"

    def schema(self) -> str:
        """The row schema; checks the options and the topic first."""
        options = parse_source(self.options, streaming=None)
        driver = _Driver(options, wait_s=LOAD_WAIT_S)
        try:
            driver.topic()
        finally:
            driver.close()
        return schema_ddl(options.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return HeadraceBatchReader(parse_source(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        try:
            options = parse_source(self.options, streaming=True)
        except ConnectorError as exc:
            return _RefusedStreamReader(exc)
        return HeadraceStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return HeadraceBatchWriter(_sink_options(self.options, overwrite), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        # overwrite is Spark's "complete" output mode: each micro-batch's whole result table
        # is published (appended), and readers keep the latest record per key, as with
        # Kafka's sink. A topic is never truncated.
        return HeadraceStreamWriter(_sink_options(self.options), schema)


class _RefusedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream reader whose every call raises the error found in its options.

    Why not raise in ``streamReader()``: PySpark 4.3's stream runner calls it inside a
    ``try`` whose ``finally`` calls ``reader.stop()``, so an error raised there reaches the
    user followed by PySpark's own ``UnboundLocalError: cannot access local variable
    'reader'``. Raised from Spark's first call on the reader (the runner's loop), it is the
    one error the query fails with. Only options that a stream refuses and ``schema()``
    cannot check (Spark calls it before it says whether the read is a stream) get here.
    """

    def __init__(self, error: ConnectorError) -> None:
        self.error = error

    def _refuse(self, *args: Any) -> NoReturn:
        raise self.error

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark's method name
        self._refuse()

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:  # noqa: N802
        self._refuse(start, limit)

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 - Spark's method name
        self._refuse()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's method name
        self._refuse()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        self._refuse(start, end)

    def read(self, partition: InputPartition) -> Any:
        self._refuse(partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._refuse(end)

    def stop(self) -> None:
        """Nothing was opened."""


def _sink_options(options: Mapping[str, str], overwrite: bool = False) -> SinkOptions:
    """The sink's options, after checking that the broker answers and the topic exists."""
    if overwrite:
        raise ConnectorError(
            "the headrace sink only appends to a topic: use .mode('append'); streams may use "
            "outputMode append or complete"
        )
    sink = parse_sink(options)
    driver = _Driver(sink, wait_s=LOAD_WAIT_S)
    try:
        driver.topic()
    finally:
        driver.close()
    return sink
