"""Record batches to Arrow: every column equals what the per-record decoder says, and the
schema is exactly the one Spark checks. No Spark, no broker."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from proto.batch import decode_batch
from spark_connector.arrow import arrow_schema, concat, schema_ddl, to_arrow
from wal import encode_columns

UTC = dt.UTC


def _batch(base_offset: int, **columns: object) -> object:
    data = bytearray(encode_columns(**columns))  # type: ignore[arg-type]
    data[:8] = base_offset.to_bytes(8, "little")
    batch = decode_batch(bytes(data))
    assert batch is not None
    return batch


@pytest.mark.parametrize("with_headers", [True, False])
def test_columns_match_the_record_decoder(with_headers: bool) -> None:
    """Scenario: a batch at base offset 100 with a null key, an empty value, headers on
    one record. Expected: every column equals the decoded records, timestamps in UTC
    microseconds, and empty maps where a record has no headers."""
    headers = [{"a": b"1", "b": b""}, {}, {"c": b"\x00\xff"}] if with_headers else None
    batch = _batch(
        100,
        values=[b"one", b"", b"three"],
        keys=[b"k1", None, b""],
        timestamps_ms=[1_700_000_000_123, 5, 0],
        headers=headers,
    )
    got = to_arrow("orders", 2, batch, include_headers=True)  # type: ignore[arg-type]
    assert got.schema == arrow_schema(include_headers=True)
    rows = got.to_pylist()
    assert [r["offset"] for r in rows] == [100, 101, 102]
    assert {r["topic"] for r in rows} == {"orders"}
    assert {r["partition"] for r in rows} == {2}
    assert [r["key"] for r in rows] == [b"k1", None, b""]
    assert [r["value"] for r in rows] == [b"one", b"", b"three"]
    assert rows[0]["timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert rows[1]["timestamp"] == dt.datetime(1970, 1, 1, 0, 0, 0, 5000, tzinfo=UTC)
    want = headers or [{}, {}, {}]
    assert [dict(r["headers"]) for r in rows] == want


def test_without_headers_column_and_slicing() -> None:
    """Scenario: includeHeaders=false, then a slice of the middle and a concat of two
    batches. Expected: no headers column (DDL and Arrow agree); the slice keeps offsets
    101-102; concat gives one batch in order."""
    batch = _batch(100, values=[b"a", b"b", b"c", b"d"])
    got = to_arrow("t", 0, batch, include_headers=False)  # type: ignore[arg-type]
    assert got.schema.names == ["topic", "partition", "offset", "key", "value", "timestamp"]
    assert "headers" not in schema_ddl(include_headers=False)
    middle = got.slice(1, 2)
    assert middle.column("offset").to_pylist() == [101, 102]
    other = to_arrow("t", 0, _batch(104, values=[b"e"]), include_headers=False)  # type: ignore[arg-type]
    joined = concat([middle, other])
    assert isinstance(joined, pa.RecordBatch)
    assert joined.column("value").to_pylist() == [b"b", b"c", b"e"]


def test_schema_matches_sparks_ddl_field_by_field() -> None:
    """Scenario: the Arrow schema against the DDL string Spark gets. Expected: the same
    names in the same order, binary (not large_binary) and int32 partitions."""
    names = [part.split()[0] for part in schema_ddl(include_headers=True).split(", ")]
    schema = arrow_schema(include_headers=True)
    assert schema.names == names
    assert schema.field("value").type == pa.binary()
    assert schema.field("partition").type == pa.int32()
    assert schema.field("timestamp").type == pa.timestamp("us", tz="UTC")


def test_a_repeated_header_name_keeps_its_last_value_once() -> None:
    """Scenario: records whose headers repeat a name (t = 1 then 2, beside u; t twice with
    the same value), a record without headers, and one with t alone. Expected: each map
    holds every name once, with its last value (as Message.headers has it); a Spark map
    may not hold a key twice. A batch that repeats no name keeps the zero-copy column."""
    batch = _batch(
        0,
        values=[b"a", b"b", b"c", b"d"],
        headers=[
            [("t", b"1"), ("u", b"x"), ("t", b"2")],
            [("t", b"9"), ("t", b"9")],
            [],
            [("t", b"3")],
        ],
    )
    got = to_arrow("t", 0, batch, include_headers=True)  # type: ignore[arg-type]
    assert got.schema == arrow_schema(include_headers=True)
    assert got.column("headers").to_pylist() == [
        [("t", b"2"), ("u", b"x")],
        [("t", b"9")],
        [],
        [("t", b"3")],
    ]
    plain = _batch(0, values=[b"a", b"b"], headers=[[("t", b"1"), ("u", b"2")], [("t", b"1")]])
    column = to_arrow("t", 0, plain, include_headers=True).column("headers")  # type: ignore[arg-type]
    assert column.to_pylist() == [[("t", b"1"), ("u", b"2")], [("t", b"1")]]
