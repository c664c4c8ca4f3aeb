"""The sink: ``df.write`` and ``df.writeStream`` with ``format("headrace")``.

Role: publish rows to a topic, exactly once per row even when Spark replays a micro-batch
or retries a task.

Rows. ``value`` (binary or string) is required and never null; ``key`` (binary or string),
``headers`` (``map<string, binary or string>``), ``partition`` (an integer) and
``timestamp`` (the record's time; default: when it is published) are optional. ``topic``
and ``offset`` are ignored, as Spark's Kafka sink ignores them, so a read's rows can be
written back unchanged. Other columns are an error, so a misspelt column is not silently
dropped.

Exactly once. Each task publishes under an idempotent producer id derived from an identity
that is the same every time Spark runs the same work, and the same rows go to the same
partitions in the same batches every time (no timing, no randomness), so a re-run sends
batches with the same producer id and sequence numbers, which the broker answers as
duplicates instead of appending them again:

- a streaming write: the query id, the micro-batch id and the task's partition id. Spark
  keeps the query id across restarts from a checkpoint and replays a failed micro-batch
  under the same batch id (SPARK_NOTES);
- a batch write: an id drawn once on the driver for the whole ``save()``, and the task's
  partition id, so a retried task matches its failed attempt.

Partitions: a row's ``partition`` column when set, else the hash of its key (as every
Headrace producer places keys), else unkeyed rows go to partitions in turn, one Arrow
batch at a time, starting from the task's partition id.

The guarantee holds when a replay produces the same rows in the same order, which Spark
gives for deterministic queries over replayable sources (Headrace's own source, files).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from client import (
    ClientError,
    NotFound,
    PermissionDenied,
    Producer,
    Unauthenticated,
    Unavailable,
    partition_for,
)
from spark_connector.errors import (
    AccessDeniedError,
    ConnectorError,
    RowError,
    unreachable,
)
from spark_connector.options import SinkOptions

logger = logging.getLogger(__name__)

_BYTES = (BinaryType, StringType)
#: Columns a row may carry that the sink ignores, as Spark's Kafka sink does: a read's
#: own ``topic`` and ``offset`` (the ``topic`` option names the target; the broker assigns
#: offsets), so a source's rows can be written back as they are.
IGNORED_COLUMNS = frozenset({"topic", "offset"})
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)


@dataclass(frozen=True)
class Published(WriterCommitMessage):
    """What one task published: ``records`` rows, ``duplicates`` of them already there
    (a replay or retry), under ``producer_id``."""

    partition_id: int
    producer_id: int
    records: int
    duplicates: int


def check_schema(schema: StructType) -> None:
    """Check the columns a sink receives, before any task runs.

    Raises:
        RowError: ``value`` is missing, a column has the wrong type, or a column is not
            one of value, key, headers, partition.
    """
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise RowError(
            f"the headrace sink needs a 'value' column (binary or string); got columns "
            f"{sorted(fields)}. Select or alias one, e.g. to_json(struct(*)) AS value"
        )
    for name, kind in fields.items():
        if name in ("value", "key"):
            ok = isinstance(kind, _BYTES)
            want = "binary or string"
        elif name == "headers":
            ok = (
                isinstance(kind, MapType)
                and isinstance(kind.keyType, StringType)
                and isinstance(kind.valueType, _BYTES)
            )
            want = "map<string, binary> or map<string, string>"
        elif name == "partition":
            ok = isinstance(kind, _INTEGERS)
            want = "an integer"
        elif name == "timestamp":
            ok = isinstance(kind, TimestampType | TimestampNTZType)
            want = "a timestamp"
        elif name in IGNORED_COLUMNS:
            continue
        else:
            raise RowError(
                f"the headrace sink does not know column {name!r}: it takes value, key, "
                "headers, partition and timestamp (and ignores topic and offset). Drop or "
                "rename the column"
            )
        if not ok:
            raise RowError(f"column {name!r} must be {want}, not {kind.simpleString()}")


def producer_id_for(identity: str) -> int:
    """A producer id (0 to 2**62 - 1) from a stable identity string."""
    digest = hashlib.blake2b(identity.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


@contextlib.contextmanager
def _client_errors(options: SinkOptions) -> Iterator[None]:
    """The client's errors inside as the connector's, each saying which option to check."""
    try:
        yield
    except NotFound as exc:
        raise ConnectorError(f"the headrace sink: {exc}") from exc
    except (Unauthenticated, PermissionDenied) as exc:  # the token, not the rows
        raise AccessDeniedError(
            f"the headrace sink may not write to topic {options.topic!r} with its 'token' "
            f"option: {exc}"
        ) from exc
    except Unavailable as exc:
        raise unreachable(options.broker, "", exc, tls=options.tls_ca is not None) from exc
    except ClientError as exc:
        raise RowError(f"the broker refused rows for topic {options.topic!r}: {exc}") from exc


def publish(options: SinkOptions, batches: Iterator[pa.RecordBatch], identity: str) -> Published:
    """Publish every row of ``batches`` under the producer id of ``identity``; returns once
    all are durable.

    Raises:
        RowError: A row cannot be published (null value, record over the size limit).
        AccessDeniedError: The ``token`` option may not produce to the topic.
        BrokerUnreachableError: The broker did not answer within the delivery timeout.
    """
    context = TaskContext.get()
    task = context.partitionId() if context is not None else 0
    pid = producer_id_for(f"{identity}:{task}")
    records = duplicates = 0
    with _client_errors(options):
        with Producer(
            options.broker, producer_id=pid, delivery_timeout_s=60.0, **options.security()
        ) as producer:
            count = producer.partition_count(options.topic)
            futures = []
            for i, batch in enumerate(batches):
                for target, columns in _split(batch, count, (task + i) % count):
                    futures.append(producer.send_many(options.topic, partition=target, **columns))
                    records += len(columns["values"])
            for future in futures:
                sent = future.result()
                duplicates += sum(r.count for r in sent.ranges if r.duplicate)
        fault_point(context, "sink.after_publish")
    return Published(task, pid, records, duplicates)


#: The task-local property that names a fault point to trip (tests set it with
#: ``SparkContext.setLocalProperty``); unset in production, where these checks cost one
#: property lookup per task.
FAULT_PROPERTY = "headrace.fault"


def fault_point(context: TaskContext | None, name: str) -> None:
    """Raise at the named point on a task's first attempt, when the task's local property
    :data:`FAULT_PROPERTY` names it: a deterministic crash for exactly-once tests (the work
    before the point is done, Spark then runs the task again)."""
    if context is None or context.attemptNumber() > 0:
        return
    if context.getLocalProperty(FAULT_PROPERTY) == name:
        raise ConnectorError(f"injected fault at {name} (local property {FAULT_PROPERTY})")


def _split(
    batch: pa.RecordBatch, partitions: int, unkeyed_target: int
) -> list[tuple[int, dict[str, Any]]]:
    """The rows of one Arrow batch as ``send_many`` arguments, grouped by partition in a
    fixed order."""
    names = batch.schema.names
    values = _bytes_column(batch, "value")
    if values.null_count:
        first = values.is_null().to_pylist().index(True)
        raise RowError(f"row {first} of a batch has a null 'value': every record needs one")
    vals: list[bytes] = values.to_pylist()
    keys: list[bytes | None] | None = (
        _bytes_column(batch, "key").to_pylist() if "key" in names else None
    )
    headers = _headers(batch) if "headers" in names else None
    times = _timestamps(batch) if "timestamp" in names else None
    explicit = batch.column("partition").to_pylist() if "partition" in names else None
    if explicit is None and (keys is None or not any(k is not None for k in keys)):
        columns = {"values": vals, "keys": keys, "headers": headers, "timestamps_ms": times}
        return [(unkeyed_target, columns)]
    groups: dict[int, list[int]] = {}
    for i in range(len(vals)):
        target = _target(i, explicit, keys, partitions, unkeyed_target)
        groups.setdefault(target, []).append(i)
    out = []
    for target in sorted(groups):
        rows = groups[target]
        out.append(
            (
                target,
                {
                    "values": [vals[i] for i in rows],
                    "keys": None if keys is None else [keys[i] for i in rows],
                    "headers": None if headers is None else [headers[i] for i in rows],
                    "timestamps_ms": None if times is None else [times[i] for i in rows],
                },
            )
        )
    return out


def _target(
    i: int,
    explicit: list[int | None] | None,
    keys: list[bytes | None] | None,
    partitions: int,
    unkeyed_target: int,
) -> int:
    if explicit is not None and explicit[i] is not None:
        p = explicit[i]
        assert p is not None
        if not 0 <= p < partitions:
            raise RowError(
                f"row {i} of a batch asks for partition {p}; the topic has partitions "
                f"0-{partitions - 1}"
            )
        return p
    key = keys[i] if keys is not None else None
    return partition_for(key, partitions) if key is not None else unkeyed_target


def _bytes_column(batch: pa.RecordBatch, name: str) -> pa.Array:
    column = batch.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.binary())
    return column


def _timestamps(batch: pa.RecordBatch) -> list[int] | None:
    """The ``timestamp`` column as ms since the epoch, nulls stamped with the time now;
    None when every row's is null (the producer stamps them)."""
    column = batch.column("timestamp")
    if column.null_count == len(column):
        return None
    millis = pc.cast(pc.cast(column, pa.timestamp("ms", tz="UTC")), pa.int64())
    if column.null_count:
        millis = pc.fill_null(millis, time.time_ns() // 1_000_000)
    out: list[int] = millis.to_pylist()
    return out


def _headers(batch: pa.RecordBatch) -> list[Mapping[str, bytes]]:
    out: list[Mapping[str, bytes]] = []
    for row in batch.column("headers").to_pylist():
        if not row:
            out.append({})
            continue
        out.append({k: v.encode() if isinstance(v, str) else (v or b"") for k, v in row})
    return out


class HeadraceBatchWriter(DataSourceArrowWriter):
    """``df.write.format("headrace")``: appends; a task Spark retries within the same
    ``save()`` is deduplicated, but a ``save()`` run again publishes everything again (it
    draws a new id: it cannot tell a rerun from a new write of the same rows)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_schema(schema)
        self.options = options
        self.write_id = secrets.token_hex(16)  # drawn once, on the driver, per save()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish(self.options, iterator, f"write:{self.write_id}")

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit(self.options, "write", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        logger.warning(
            "write to %s failed; records its tasks published before the failure stay in the "
            "topic (a batch write is not atomic). Running the save() again publishes every "
            "row again: only Spark's own retries of a task within one save() are "
            "deduplicated. To retry without duplicates, write only the rows that are "
            "missing, or write through a stream (writeStream), whose replays are deduplicated",
            self.options.topic,
        )


class HeadraceStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("headrace")``: a replayed micro-batch is deduplicated."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_schema(schema)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        context = TaskContext.get()
        if context is None:
            raise ConnectorError("the headrace sink's write() runs only inside a Spark task")
        query = context.getLocalProperty("sql.streaming.queryId")
        batch = context.getLocalProperty("streaming.sql.batchId")
        if not query or batch is None:
            raise ConnectorError(
                "the headrace stream sink found no query id or batch id in the task context"
            )
        return publish(self.options, iterator, f"stream:{query}:{batch}")

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _log_commit(self.options, f"micro-batch {batchId}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        logger.warning(
            "micro-batch %d to %s aborted; its replay is deduplicated", batchId, self.options.topic
        )


def _log_commit(
    options: SinkOptions, what: str, messages: list[WriterCommitMessage | None]
) -> None:
    done = [m for m in messages if isinstance(m, Published)]
    logger.info(
        "%s to %s: %d records published, %d of them already there (replay or retry)",
        what,
        options.topic,
        sum(m.records for m in done),
        sum(m.duplicates for m in done),
    )
