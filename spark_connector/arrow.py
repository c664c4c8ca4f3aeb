"""Record batches to Arrow: the rows a read yields, with no Python work per record.

Role: wrap the columns of a :class:`client.RecordBatch` (offset arrays plus data buffers,
already Arrow's binary layout) as ``pyarrow`` arrays over the same bytes, and build the
``pyarrow.RecordBatch`` that Spark's Arrow path takes as is. Per batch, the work is a
fixed number of array constructions, whatever the record count.

Spark checks the schema exactly (SPARK_NOTES): ``binary`` not ``large_binary``, ``int32``
partitions, ``int64`` offsets, ``timestamp[us, tz=UTC]``, and ``map<string, binary>``
headers; :func:`arrow_schema` is the one definition of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from proto.batch import RecordBatch

#: Spark's DDL form of the schema, for ``DataSource.schema()``.
SCHEMA_DDL = (
    "topic string, partition int, offset long, key binary, value binary, "
    "timestamp timestamp, headers map<string,binary>"
)
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_HEADERS = pa.map_(pa.string(), pa.binary())


def schema_ddl(include_headers: bool) -> str:
    """The DDL schema of a read, with or without the ``headers`` column."""
    return SCHEMA_DDL if include_headers else SCHEMA_DDL.rsplit(", headers", 1)[0]


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema matching :func:`schema_ddl` exactly."""
    fields = [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", _TIMESTAMP),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADERS))
    return pa.schema(fields)


def to_arrow(
    topic: str, partition: int, batch: RecordBatch, *, include_headers: bool
) -> pa.RecordBatch:
    """One record batch as an Arrow record batch, sharing its bytes.

    Slice the result (``.slice``, zero-copy) to drop records outside a read's range.
    """
    n = batch.record_count
    lay = batch.layout
    buf = batch.buffer

    def section(start: int, size: int) -> pa.Buffer:
        return pa.py_buffer(buf[start : start + size])

    key_offsets = section(lay.key_offsets, 4 * (n + 1))
    value_offsets = section(lay.value_offsets, 4 * (n + 1))
    keys = pa.Array.from_buffers(
        pa.binary(),
        n,
        [
            section(lay.key_validity, (n + 7) // 8),
            key_offsets,
            section(lay.key_data, batch.key_offsets()[-1]),
        ],
    )
    values = pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, value_offsets, section(lay.value_data, batch.value_offsets()[-1])],
    )
    millis = pa.Array.from_buffers(pa.int64(), n, [None, section(lay.timestamps, 8 * n)])
    columns: list[Any] = [
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(np.arange(batch.base_offset, batch.base_offset + n, dtype=np.int64)),
        keys,
        values,
        pc.multiply(millis, 1000).view(_TIMESTAMP),
    ]
    if include_headers:
        columns.append(_headers(batch, section))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


def _headers(batch: RecordBatch, section: Any) -> pa.Array:
    """The ``map<string, binary>`` column: empty maps when the batch has no headers."""
    n = batch.record_count
    if not batch.has_headers:
        offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
        return pa.MapArray.from_arrays(
            offsets, pa.array([], pa.string()), pa.array([], pa.binary())
        )
    lay = batch.layout
    m = lay.header_count
    key_offsets = batch.int32s(lay.header_key_offsets, m + 1)
    value_offsets = batch.int32s(lay.header_value_offsets, m + 1)
    names = pa.Array.from_buffers(
        pa.string(),
        m,
        [
            None,
            section(lay.header_key_offsets, 4 * (m + 1)),
            section(lay.header_key_data, key_offsets[-1]),
        ],
    )
    items = pa.Array.from_buffers(
        pa.binary(),
        m,
        [
            None,
            section(lay.header_value_offsets, 4 * (m + 1)),
            section(lay.header_value_data, value_offsets[-1]),
        ],
    )
    per_record = pa.Array.from_buffers(
        pa.int32(), n + 1, [None, section(lay.header_offsets, 4 * (n + 1))]
    )
    if _repeats_a_name(per_record, names):
        return _last_of_each_name(batch)
    return pa.MapArray.from_arrays(per_record, names, items)


def _repeats_a_name(per_record: pa.Array, names: pa.Array) -> bool:
    """Whether some record has two headers of one name. In C, O(entries): nothing when no
    record has two headers; else each entry's (record, name code) key, sorted (nearly
    sorted already: a record's entries are contiguous), has a neighbour equal to it."""
    counts = np.diff(per_record.to_numpy(zero_copy_only=False))
    if len(names) < 2 or counts.max() < 2:
        return False
    encoded = pc.dictionary_encode(names)
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    keys = owner * len(encoded.dictionary) + encoded.indices.to_numpy(zero_copy_only=False)
    keys.sort()
    return bool((keys[1:] == keys[:-1]).any())


def _last_of_each_name(batch: RecordBatch) -> pa.Array:
    """The headers column when a record repeats a name: a Spark map may not hold a key
    twice (SQL would see the first value, ``collect()`` the last, and Parquet would store
    an invalid map), so each name keeps its last value, as ``Message.headers`` does
    (docs/protocol.md 2.3). Python work per record: only batches that repeat a name."""
    rows = [list(dict(pairs).items()) for pairs in batch.header_lists()]
    return pa.array(rows, type=_HEADERS)


def concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """Many small Arrow batches as one (Spark pays per batch it receives)."""
    if len(batches) == 1:
        return batches[0]
    return pa.concat_batches(batches)
