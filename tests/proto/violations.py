"""Batches that break one rule of the format each, shared by the codec's and the broker's
tests: every one has a valid CRC (re-sealed after the edit), so the rule itself must
catch it, and each names the field the error must name."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from proto.batch import CRC_START, Layout, crc32c, decode_batch, encode_columns

TS = 1_700_000_000_000


def reseal(data: bytearray) -> bytes:
    """``data`` with its CRC recomputed, so only the edit is wrong."""
    struct.pack_into("<I", data, 12, crc32c(memoryview(data)[CRC_START:]))
    return bytes(data)


def one() -> bytes:
    """One record, key absent, value ``b"hi"``: every section has padding but the offsets."""
    return encode_columns([b"hi"], timestamps_ms=TS)


def many() -> bytes:
    """Two records with keys, headers and falling timestamps (first is not the minimum);
    the offset arrays (3 x i32) and header names (6 bytes) end in padding."""
    return encode_columns(
        [b"a", b"bb"],
        keys=[b"k", None],
        timestamps_ms=[TS + 5, TS],
        headers=[{"h": b"1"}, {"trace": b"xyz"}],
    )


def _at(make: Callable[[], bytes], where: Callable[[Layout], int], value: int) -> bytes:
    """``make()`` with the byte at ``where(layout)`` set to ``value``."""
    data = bytearray(make())
    batch = decode_batch(bytes(data))
    assert batch is not None
    data[where(batch.layout)] = value
    return reseal(data)


def _pack(make: Callable[[], bytes], fmt: str, at: int, value: int) -> bytes:
    data = bytearray(make())
    struct.pack_into(fmt, data, at, value)
    return reseal(data)


@dataclass(frozen=True)
class Violation:
    """One broken rule: its test id, the batch, the field named, a message fragment."""

    id: str
    make: Callable[[], bytes]
    field: str
    words: str


VIOLATIONS: list[Violation] = [
    Violation(
        "client-base-offset", lambda: _pack(one, "<Q", 0, 7), "base_offset", "base_offset must be 0"
    ),
    Violation(
        "producer-id-below-minus-one",
        lambda: _pack(one, "<q", 40, -7),
        "producer_id",
        "use -1 for a producer that is not idempotent",
    ),
    Violation(
        "base-sequence-without-producer",
        lambda: _pack(one, "<i", 48, 7),
        "base_sequence",
        "it must be -1 when producer_id is -1",
    ),
    Violation(
        "idempotent-base-sequence-negative",
        lambda: encode_columns([b"hi"], timestamps_ms=TS, producer_id=5, base_sequence=-3),
        "base_sequence",
        "an idempotent producer's (id 5) must be >= 0",
    ),
    Violation(
        "idempotent-sequence-past-i32",
        lambda: encode_columns(
            [b"a", b"b"], timestamps_ms=TS, producer_id=5, base_sequence=2**31 - 1
        ),
        "base_sequence",
        "last record's sequence (2147483648) at most 2147483647",
    ),
    Violation("reserved", lambda: _pack(one, "<I", 52, 1), "reserved", "reserved must be 0"),
    Violation(
        "flags-reserved-bit", lambda: _pack(one, "<H", 18, 0x8), "flags", "flags has reserved bits"
    ),
    Violation(
        "padding-after-key-validity",
        lambda: _at(one, lambda lay: lay.key_validity + 1, 1),
        "padding",
        "padding after key_validity",
    ),
    Violation(
        "padding-after-key-offsets",
        lambda: _at(many, lambda lay: lay.key_offsets + 12, 1),
        "padding",
        "padding after key_offsets",
    ),
    Violation(
        "padding-after-value-data",
        lambda: _at(one, lambda lay: lay.value_data + 2, 0xFF),
        "padding",
        "padding after value_data",
    ),
    Violation(
        "padding-after-header-names",
        lambda: _at(many, lambda lay: lay.header_key_data + 6, 1),
        "padding",
        "padding after header_key_data",
    ),
    Violation(
        "key-validity-tail",
        lambda: _at(one, lambda lay: lay.key_validity, 0b10),
        "key_validity",
        "bits set past the last record",
    ),
    Violation(
        "first-timestamp-is-the-minimum",
        lambda: _pack(many, "<q", 24, TS),
        "first_timestamp_ms",
        "first record's timestamp",
    ),
    Violation(
        "max-timestamp-not-exact",
        lambda: _pack(many, "<q", 32, TS + 10),
        "max_timestamp_ms",
        "exactly the largest",
    ),
    Violation(
        "value-offsets-not-from-zero",
        lambda: _at(one, lambda lay: lay.value_offsets, 1),
        "value_offsets",
        "value_offsets must start at 0",
    ),
]
