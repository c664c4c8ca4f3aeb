"""Conformance vectors of the record batch: the files in ``docs/protocol/vectors/``.

Role: owns the list of vectors and writes them. A valid vector is ``NAME.bin`` (one encoded
batch, exactly as a producer sends it: ``base_offset`` 0) and ``NAME.json`` (its header
fields and its records, decoded). An invalid vector is ``invalid/NAME.bin`` and
``invalid/NAME.json``: the status a broker answers ``Publish`` of it with, and a substring of
the message. A client in any language checks its codec against the same files
(``docs/protocol.md``, section "Conformance vectors"). The consumer name vectors
(``names/``) come from :mod:`proto.name_vectors` and the cluster routing vectors
(``cluster/``) from :mod:`proto.cluster_vectors`, written by :func:`write` too.

Usage: ``python -m proto.vectors`` (re)writes the vectors; ``python -m proto.vectors
--check`` writes them to a temporary directory and exits 1, naming the files, if anything
committed differs (tests/test_vectors.py runs the same check).

JSON of a valid vector::

    {"description": "...", "base_offset": 0, "producer_id": -1, "base_sequence": -1,
     "first_timestamp_ms": 5, "max_timestamp_ms": 5, "has_headers": false,
     "records": [{"offset": 0, "timestamp_ms": 5, "key": null | "<base64>",
                  "value": "<base64>", "headers": [["name", "<base64>"], ...]}]}

``offset`` is relative to the batch (``base_offset`` + index); ``headers`` keeps the
batch's order.

The codec is :mod:`proto.batch`, the one that ``wal``, ``client`` and ``spark_connector`` use.
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proto import cluster_vectors, name_vectors
from proto.batch import CRC_START, RecordBatch, crc32c, decode_batch, encode_columns

ROOT = Path(__file__).resolve().parents[1]
VECTORS_DIR = ROOT / "docs" / "protocol" / "vectors"
INVALID = "invalid"

#: Marks an invalid vector whose rule the broker enforces from issue 16 on.
ISSUE_16 = "issue-16"
#: Marks an invalid vector whose rule the broker enforces from issue 17 on.
ISSUE_17 = "issue-17"


@dataclass(frozen=True)
class Valid:
    """A batch every conforming encoder can produce and every decoder must read."""

    name: str
    description: str
    values: Sequence[bytes]
    keys: Sequence[bytes | None] | None = None
    timestamps_ms: Sequence[int] | int = 0
    headers: Sequence[Mapping[str, bytes]] | None = None
    producer_id: int = -1
    base_sequence: int = -1
    #: Rewrites the encoded bytes (CRC recomputed): for what the codec's API cannot say.
    post: Callable[[bytearray], bytes] | None = None

    def encode(self) -> bytes:
        """The batch bytes."""
        data = encode_columns(
            self.values,
            keys=self.keys,
            timestamps_ms=self.timestamps_ms,
            headers=self.headers,
            producer_id=self.producer_id,
            base_sequence=self.base_sequence,
        )
        return data if self.post is None else self.post(bytearray(data))


@dataclass(frozen=True)
class Invalid:
    """A batch a broker must refuse: ``mutate`` breaks one rule of a valid batch."""

    name: str
    description: str
    source: Valid
    mutate: Callable[[bytearray], bytes]
    status: str
    message_contains: str
    enforced_since: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The batch bytes."""
        return self.mutate(bytearray(self.source.encode()))


def _u8(at: int, value: int, *, recrc: bool = True) -> Callable[[bytearray], bytes]:
    return _pack("<B", at, value, recrc=recrc)


def _pack(fmt: str, at: int, value: int, *, recrc: bool = True) -> Callable[[bytearray], bytes]:
    """Overwrite the field at byte ``at``; recompute the CRC so only that rule breaks."""

    def mutate(buf: bytearray) -> bytes:
        struct.pack_into(fmt, buf, at, value)
        if recrc:
            _fix_crc(buf)
        return bytes(buf)

    return mutate


def _fix_crc(buf: bytearray) -> None:
    struct.pack_into("<I", buf, 12, crc32c(memoryview(buf)[CRC_START:]))


def _layout_of(valid: Valid) -> RecordBatch:
    batch = decode_batch(valid.encode())
    assert batch is not None
    return batch


def _at_section(
    valid: Valid, section: Callable[[RecordBatch], int], fmt: str, value: int, delta: int = 0
) -> Callable[[bytearray], bytes]:
    """Overwrite a field ``delta`` bytes into a section of ``valid``'s layout."""
    return _pack(fmt, section(_layout_of(valid)) + delta, value)


def _truncate(keep: int) -> Callable[[bytearray], bytes]:
    return lambda buf: bytes(buf[:keep])


def _flip_crc(buf: bytearray) -> bytes:
    buf[12] ^= 0xFF
    return bytes(buf)


def _name(i: int) -> bytes:
    return f"k{i % 7}".encode()


ONE = Valid("one_record", "One record: no key, value 'hi', timestamp 5.", [b"hi"], None, 5)
KEYS = Valid(
    "keys_absent_and_empty",
    "Three records: an absent key (null), an empty key (present, zero bytes), a key 'k'.",
    [b"a", b"b", b"c"],
    [None, b"", b"k"],
    [1000, 1001, 1002],
)
HEADERS = Valid(
    "headers",
    "Headers: two on the first record, none on the second, a unicode name and an empty "
    "value on the third.",
    [b"v0", b"v1", b"v2"],
    [b"order-1", None, b"order-3"],
    [1700000000000, 1700000000001, 1700000000002],
    [
        {"content-type": b"application/json", "trace": b"\x00\x01\x02"},
        {},
        {"caf\u00e9-\u00fc\u2713-\U0001f680": b""},
    ],
)
EMPTY_HEADERS = Valid(
    "headers_flag_without_headers",
    "The headers flag is set but no record has a header: header_offsets is [0, 0] and both "
    "header offset arrays are [0]. Decoders must accept it.",
    [b"x"],
    None,
    7,
    [{}],
)
_DUP = Valid(
    "headers_duplicate_names",
    "One record with two headers of the same name, 'dup' = '1' then 'dup' = '2': both are "
    "kept, in order (a reader that shows headers as a list shows both).",
    [b"v"],
    [b"k"],
    1,
    [{"dup": b"1", "dvp": b"2"}],
)


def _second_name_to_dup(buf: bytearray) -> bytes:
    """Rename the second header of :data:`_DUP` ('dvp', 3 bytes) to 'dup'."""
    batch = decode_batch(bytes(buf))
    assert batch is not None
    at = batch.layout.header_key_data + 3
    assert buf[at : at + 3] == b"dvp"
    buf[at : at + 3] = b"dup"
    _fix_crc(buf)
    return bytes(buf)


DUPLICATE_HEADERS = replace(_DUP, post=_second_name_to_dup)
EMPTY_VALUE = Valid(
    "empty_value",
    "One record whose value is empty and whose key is empty; value_data is zero bytes.",
    [b""],
    [b""],
    0,
)
TIMESTAMPS = Valid(
    "timestamps_first_is_not_min",
    "first_timestamp_ms is the FIRST record's timestamp (here 500), not the minimum (100); "
    "max_timestamp_ms is the exact maximum (900). Negative timestamps are legal.",
    [b"a", b"b", b"c", b"d"],
    None,
    [500, 100, 900, -3],
)
IDEMPOTENT = Valid(
    "idempotent_producer",
    "An idempotent producer's first batch: producer_id 4660 (>= 0), base_sequence 0, two "
    "records (sequences 0 and 1).",
    [b"p0", b"p1"],
    [b"key", b"key"],
    [10, 11],
    producer_id=0x1234,
    base_sequence=0,
)
MANY = Valid(
    "many_records",
    "300 records: keys absent on every fifth record, values of varying length (0 to 36 "
    "bytes), timestamps increasing by 1 from 1700000000000, a header on every tenth.",
    [(b"value-%d-" % i) * (i % 4) for i in range(300)],
    [None if i % 5 == 0 else _name(i) for i in range(300)],
    [1700000000000 + i for i in range(300)],
    [{"n": b"%d" % i} if i % 10 == 0 else {} for i in range(300)],
)
LARGE = Valid(
    "large_value_1mib",
    "One record with a value of exactly 1 MiB (1048576 bytes, byte i = i mod 251): the "
    "default max_record_bytes, so a broker with default limits accepts it.",
    [bytes(i % 251 for i in range(1 << 20))],
    None,
    42,
)

VALID: tuple[Valid, ...] = (
    ONE,
    KEYS,
    HEADERS,
    EMPTY_HEADERS,
    DUPLICATE_HEADERS,
    EMPTY_VALUE,
    TIMESTAMPS,
    IDEMPOTENT,
    MANY,
    LARGE,
)

_FLAGS = 18
_COUNT = 20
_FIRST_TS = 24
_MAX_TS = 32
_PRODUCER = 40
_SEQUENCE = 48
_RESERVED = 52
_ARG = "INVALID_ARGUMENT"

INVALID_VECTORS: tuple[Invalid, ...] = (
    Invalid(
        "bad_crc",
        "The CRC-32C field does not match bytes [16, end).",
        ONE,
        _flip_crc,
        _ARG,
        "checksum mismatch",
    ),
    Invalid(
        "truncated",
        "The last 8 bytes are missing: batch_length says 96, 88 arrive.",
        ONE,
        _truncate(88),
        _ARG,
        "send exactly one whole batch",
    ),
    Invalid(
        "shorter_than_prefix",
        "Only 10 bytes: not even the length field is whole.",
        ONE,
        _truncate(10),
        _ARG,
        "send exactly one whole batch",
    ),
    Invalid(
        "trailing_bytes",
        "A whole batch followed by 8 more bytes.",
        ONE,
        lambda buf: bytes(buf) + bytes(8),
        _ARG,
        "send exactly one whole batch",
    ),
    Invalid("bad_magic", "magic is 0x49 instead of 0x48.", ONE, _u8(16, 0x49), _ARG, "magic"),
    Invalid(
        "bad_version", "version is 2; only version 1 exists.", ONE, _u8(17, 2), _ARG, "version"
    ),
    Invalid(
        "length_not_multiple_of_8",
        "batch_length is 95 (not a multiple of 8).",
        ONE,
        _pack("<I", 8, 95, recrc=False),
        _ARG,
        "batch length",
    ),
    Invalid(
        "unknown_flag",
        "flags has bit 1 set; only bit 0 is defined.",
        ONE,
        _pack("<H", _FLAGS, 0x3),
        _ARG,
        "flags",
    ),
    Invalid(
        "zero_records",
        "record_count is 0.",
        ONE,
        _pack("<I", _COUNT, 0),
        _ARG,
        "record_count must be at least 1",
    ),
    Invalid(
        "first_timestamp_is_min",
        "first_timestamp_ms is the minimum (100), not the first record's timestamp (500).",
        TIMESTAMPS,
        _pack("<q", _FIRST_TS, 100),
        _ARG,
        "first_timestamp_ms must be the first record's timestamp",
    ),
    Invalid(
        "max_timestamp_not_exact",
        "max_timestamp_ms is 901; the records' maximum is 900.",
        TIMESTAMPS,
        _pack("<q", _MAX_TS, 901),
        _ARG,
        "max_timestamp_ms must be exactly the largest record timestamp",
    ),
    Invalid(
        "value_offsets_decrease",
        "value_offsets of 3 one-byte values are [0, 1, 0, 3]: they decrease.",
        KEYS,
        _at_section(KEYS, lambda b: b.layout.value_offsets, "<i", 0, 8),
        _ARG,
        "value_offsets must start at 0 and never decrease",
    ),
    Invalid(
        "key_offsets_start_above_zero",
        "key_offsets start at 1, not 0.",
        ONE,
        _at_section(ONE, lambda b: b.layout.key_offsets, "<i", 1),
        _ARG,
        "must start at 0",
    ),
    Invalid(
        "value_length_past_data",
        "The last value offset (the value data length) is 10, "
        "but value_data and its padding hold 8 bytes.",
        ONE,
        _at_section(ONE, lambda b: b.layout.value_offsets, "<i", 10, 4),
        _ARG,
        "batch_length is",
    ),
    Invalid(
        "bitmap_bits_past_last_record",
        "The key-validity bitmap of 1 record has bit 3 set (past the last record).",
        ONE,
        _at_section(ONE, lambda b: b.layout.key_validity, "<B", 0x08),
        _ARG,
        "bits set past the last record",
    ),
    Invalid(
        "header_name_not_utf8",
        "The first header name starts with the bytes ff fe (not UTF-8).",
        HEADERS,
        _at_section(HEADERS, lambda b: b.layout.header_key_data, "<H", 0xFEFF),
        _ARG,
        "UTF-8",
    ),
    Invalid(
        "nonzero_reserved",
        "The reserved u32 at byte 52 is 1.",
        ONE,
        _pack("<I", _RESERVED, 1),
        _ARG,
        "reserved",
        ISSUE_16,
    ),
    Invalid(
        "nonzero_padding",
        "A padding byte after value_data is 0x01.",
        ONE,
        _at_section(ONE, lambda b: b.layout.value_data, "<B", 1, 2),
        _ARG,
        "padding",
        ISSUE_16,
    ),
    Invalid(
        "client_base_offset",
        "base_offset is 5; a client must send 0 (the log assigns offsets).",
        ONE,
        _pack("<Q", 0, 5, recrc=False),
        _ARG,
        "base_offset",
        ISSUE_16,
    ),
    Invalid(
        "producer_id_negative",
        "producer_id is -7; only -1 or >= 0 are allowed.",
        ONE,
        _pack("<q", _PRODUCER, -7),
        _ARG,
        "producer_id",
        ISSUE_16,
    ),
    Invalid(
        "base_sequence_without_producer",
        "producer_id is -1 (not idempotent) but base_sequence is 7; it must be -1 too.",
        ONE,
        _pack("<i", _SEQUENCE, 7),
        _ARG,
        "it must be -1 when producer_id is -1",
        ISSUE_17,
    ),
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decoded_json(batch: RecordBatch) -> dict[str, object]:
    """The JSON document of a decoded batch (the format in the module docstring).

    Headers are every ``(name, value)`` pair in order, so repeated names each appear.
    """
    records = [
        {
            "offset": batch.base_offset + i,
            "timestamp_ms": ts,
            "key": None if key is None else _b64(key),
            "value": _b64(value),
            "headers": [[name, _b64(value)] for name, value in pairs],
        }
        for i, (ts, key, value, pairs) in enumerate(
            zip(
                batch.timestamps().tolist(),
                batch.keys(),
                batch.values(),
                batch.header_lists(),
                strict=True,
            )
        )
    ]
    return {
        "base_offset": batch.base_offset,
        "producer_id": batch.producer_id,
        "base_sequence": batch.base_sequence,
        "first_timestamp_ms": batch.first_timestamp_ms,
        "max_timestamp_ms": batch.max_timestamp_ms,
        "has_headers": batch.has_headers,
        "records": records,
    }


def encode_json(doc: Mapping[str, object]) -> bytes:
    """Encode the batch a valid vector's JSON describes (the inverse of :func:`decoded_json`).

    A record whose header names repeat is handed to the codec as ``(name, value)`` pairs,
    which keep the order and the repeats.
    """
    records = doc["records"]
    assert isinstance(records, list)
    headers: list[Any] = []
    for r in records:
        pairs = [(name, base64.b64decode(v)) for name, v in r["headers"]]
        unique = len({name for name, _ in pairs}) == len(pairs)
        headers.append(dict(pairs) if unique else pairs)
    producer_id = doc["producer_id"]
    base_sequence = doc["base_sequence"]
    assert isinstance(producer_id, int)
    assert isinstance(base_sequence, int)
    return encode_columns(
        [base64.b64decode(r["value"]) for r in records],
        keys=[None if r["key"] is None else base64.b64decode(r["key"]) for r in records],
        timestamps_ms=[r["timestamp_ms"] for r in records],
        headers=headers if doc["has_headers"] else None,
        producer_id=producer_id,
        base_sequence=base_sequence,
    )


def _dump(doc: Mapping[str, object]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def write(out: Path) -> list[Path]:
    """Write every vector under ``out``; return the files written."""
    (out / INVALID).mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for v in VALID:
        data = v.encode()
        batch = decode_batch(data)
        assert batch is not None
        assert batch.size == len(data)
        written += _write_pair(
            out / v.name, data, {"description": v.description, **decoded_json(batch)}
        )
    for bad in INVALID_VECTORS:
        doc: dict[str, object] = {
            "description": bad.description,
            "status": bad.status,
            "message_contains": bad.message_contains,
        }
        if bad.enforced_since is not None:
            doc["enforced_since"] = bad.enforced_since
        written += _write_pair(out / INVALID / bad.name, bad.encode(), doc)
    return written + name_vectors.write(out) + cluster_vectors.write(out)


def _write_pair(stem: Path, data: bytes, doc: Mapping[str, object]) -> list[Path]:
    bin_path, json_path = stem.with_suffix(".bin"), stem.with_suffix(".json")
    bin_path.write_bytes(data)
    json_path.write_text(_dump(doc), encoding="utf-8")
    return [bin_path, json_path]


def differences(committed: Path) -> list[str]:
    """Files under ``committed`` that differ from what the codec writes now, or are
    missing, or are extra; empty when they agree."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        write(fresh)
        want = {p.relative_to(fresh): p.read_bytes() for p in fresh.rglob("*") if p.is_file()}
    have = {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()}
    problems = [f"{name}: missing" for name in sorted(want.keys() - have)]
    problems += [f"{name}: not written by proto.vectors" for name in sorted(have - want.keys())]
    problems += [
        f"{name}: differs"
        for name in sorted(want.keys() & have)
        if (committed / name).read_bytes() != want[name]
    ]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Write the vectors, or with ``--check`` compare the committed ones; 0 when fine."""
    parser = argparse.ArgumentParser(prog="python -m proto.vectors", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed vectors differ")
    parser.add_argument("--out", type=Path, default=VECTORS_DIR, help="vectors directory")
    args = parser.parse_args(argv)
    if args.check:
        problems = differences(args.out)
        for problem in problems:
            print(f"{args.out}/{problem}; run `python -m proto.vectors`", file=sys.stderr)
        return 1 if problems else 0
    for path in write(args.out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
