"""Hypothesis strategies for hostile requests: messages built from their descriptors, then
serialized, mutated, truncated, padded or replaced by random bytes.

A message strategy walks the request descriptor, so a field added to a ``.proto`` is fuzzed
at once. Names (topic, subscription...) mix a few that exist on the fuzzed broker, so calls
get past the lookup, with hostile ones: path traversal, absolute paths (into the test's own
tmp directory, where an escape would show), NUL bytes, separators, over-long names.
Names, header names and values and reasons include :data:`LOG_ATTACKS`: newlines with a
forged log record after them, CR, NUL and escape sequences (issue 38).
Integers lean to small values and the edges of their type. ``bytes`` fields named ``batch``
get record batches: valid, with a hostile header, corrupt, or with a forged CRC.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from proto.batch import CRC_START, crc32c
from wal import encode_columns

F = FieldDescriptor
_INT_RANGES = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}
#: Fields whose large values only cost time or disk, not coverage: kept small (plus the
#: out-of-range edges, which must be refused).
_SMALL_INTS = {
    "partitions": st.one_of(st.integers(-2, 4), st.sampled_from([10_001, 2**31 - 1, -(2**31)])),
    "max_wait_ms": st.one_of(st.integers(0, 20), st.sampled_from([30_001, 2**32 - 1])),
    "rate_per_s": st.one_of(st.integers(-1, 0), st.integers(1_000, 100_000)),
}
_NAME_FIELDS = {"topic", "name", "subscription", "consumer_name"}
#: What a forger of log lines and terminal output sends (issue 38): a newline then a line
#: with the broker's own timestamp, level and logger (dated 1999, so a test can tell one
#: that got through), CR, NUL, ANSI escape sequences. Used as names, header names and
#: values, and reasons.
FORGED_PREFIX = "1999-01-01 00:00:00,000 ERROR broker.auth:"
LOG_ATTACKS = (
    f"x\n{FORGED_PREFIX} token hr_admin granted admin (forged)",
    f"x\r\n{FORGED_PREFIX} forged after CRLF",
    f"\r{FORGED_PREFIX} forged over the line",
    "a\x00b\x00",
    "\x1b[2J\x1b[H\x1b[31mred",
    "\x1b]0;title\x07",
    "\u2028\u2029\x85",
    f"x\n{FORGED_PREFIX} " + "A" * 5000,
)


def hostile_names(existing: Sequence[str], escape_dir: str) -> st.SearchStrategy[str]:
    """Names that exist, names that are plausible, and names that try to leave the data
    directory (``escape_dir`` is an absolute directory an escape would write into)."""
    attacks = [
        "",
        ".",
        "..",
        "../x",
        "../../x",
        "a/../../x",
        "x/..",
        f"{escape_dir}/escaped",
        "/tmp/headrace-escaped",
        "a\x00b",
        "\x00",
        "a/b",
        "a\\b",
        "-rf",
        ".hidden",
        "x" * 201,
        "x" * 5000,
        "tópico",
        "a\nb",
        "CON",
        " ",
        *LOG_ATTACKS,
    ]
    return st.one_of(
        st.sampled_from(list(existing)),
        st.sampled_from(attacks),
        st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,12}", fullmatch=True),
        st.text(max_size=30),
    )


def batches(hostile_headers: bool = True) -> st.SearchStrategy[bytes]:
    """Record batch bytes: valid, valid with hostile headers, or damaged in every way
    (flipped bytes, forged CRC, truncated, padded, random)."""
    valid = st.builds(_batch, _records(hostile_headers), _producer())
    return st.one_of(
        valid,
        valid.flatmap(_damaged),
        st.binary(max_size=200),
    )


def _records(
    hostile_headers: bool,
) -> st.SearchStrategy[list[tuple[bytes | None, bytes, dict[str, bytes]]]]:
    header_names = st.one_of(
        st.sampled_from(["x-replay-count", "x-original-topic", "x-delivery-attempt", "trace"]),
        st.sampled_from(LOG_ATTACKS),
        st.text(max_size=10),
    )
    header_values = st.one_of(
        st.sampled_from([b"9" * 5000, b"4294967296", b"-1", b"\xff", b""]),
        st.sampled_from([a.encode() for a in LOG_ATTACKS]),
        st.binary(max_size=20),
    )
    headers = st.dictionaries(header_names, header_values, max_size=3 if hostile_headers else 0)
    record = st.tuples(st.none() | st.binary(max_size=16), st.binary(max_size=64), headers)
    return st.lists(record, min_size=1, max_size=4)


def _producer() -> st.SearchStrategy[tuple[int, int]]:
    return st.one_of(
        st.just((-1, -1)),
        st.tuples(st.integers(0, 2**63 - 1), st.integers(-1, 2**31 - 1)),
        st.tuples(st.integers(-(2**63), -2), st.integers(-(2**31), -2)),
    )


def _batch(
    records: list[tuple[bytes | None, bytes, dict[str, bytes]]], producer: tuple[int, int]
) -> bytes:
    keys = [k for k, _, _ in records]
    has_headers = any(h for _, _, h in records)
    return encode_columns(
        [v for _, v, _ in records],
        keys=keys,
        headers=[h for _, _, h in records] if has_headers else None,
        producer_id=producer[0],
        base_sequence=producer[1],
    )


def _damaged(batch: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(mutations(batch), mutations(batch).map(forge_crc))


def forge_crc(data: bytes) -> bytes:
    """``data`` with the CRC field recomputed: damage that the checksum cannot catch."""
    if len(data) < CRC_START:
        return data
    out = bytearray(data)
    struct.pack_into("<I", out, 12, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


def mutations(data: bytes) -> st.SearchStrategy[bytes]:
    """``data`` flipped, overwritten, truncated, cut in the middle, padded or doubled."""
    n = len(data)
    at = st.integers(0, max(n - 1, 0))
    return st.one_of(
        st.tuples(at, st.integers(1, 255)).map(lambda t: _xor(data, *t)),
        st.tuples(at, st.binary(min_size=1, max_size=8)).map(
            lambda t: data[: t[0]] + t[1] + data[t[0] + len(t[1]) :]
        ),
        at.map(lambda i: data[:i]),
        st.tuples(at, at).map(lambda t: data[: min(t)] + data[max(t) :]),
        st.binary(min_size=1, max_size=16).map(lambda tail: data + tail),
        st.just(data + data),
    )


def _xor(data: bytes, i: int, mask: int) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    out[i] ^= mask
    return bytes(out)


def requests(
    request: Descriptor,
    names: st.SearchStrategy[str],
    *,
    streaming: bool,
    oversized: int | None = None,
) -> st.SearchStrategy[list[bytes]]:
    """What a client sends on one call: one message (unary) or up to four (a stream), each
    valid, mutated, random, truncated to one byte, or (when given) ``oversized`` bytes long.
    """
    valid = messages(request, names).map(lambda m: m.SerializeToString())
    one = st.one_of(valid, valid.flatmap(mutations), st.binary(max_size=100), st.just(b"\x0a"))
    if oversized is not None:
        one |= st.just(oversized_message(oversized))
    return st.lists(one, min_size=0 if streaming else 1, max_size=4 if streaming else 1)


@functools.lru_cache(maxsize=2)
def oversized_message(size: int) -> bytes:
    """A message whose field 1 alone is ``size`` bytes long (one copy per size: a fuzz run
    that built one per RPC held 18 of them, 288 MiB at 16 MiB, in the test process)."""
    return b"\x0a" + _varint(size) + b"\x00" * size


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def messages(
    descriptor: Descriptor, names: st.SearchStrategy[str], depth: int = 0
) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor`` with every field optional and each oneof set to at most
    one member."""
    cls: type[Message] = GetMessageClass(descriptor)
    plain = {
        f.name: _field(f, names, depth)
        for f in descriptor.fields
        if f.containing_oneof is None or f.containing_oneof.name.startswith("_")
    }
    oneofs = [
        st.one_of(st.just({}), *(_named(f, names, depth) for f in o.fields))
        for o in descriptor.oneofs
        if not o.name.startswith("_")  # "_x": the synthetic oneof of a proto3 optional
    ]
    return st.tuples(st.fixed_dictionaries({}, optional=plain), *oneofs).map(
        lambda parts: _build(cls, parts)
    )


def _named(
    f: FieldDescriptor, names: st.SearchStrategy[str], depth: int
) -> st.SearchStrategy[dict[str, Any]]:
    """``{field name: value}``: one member of a oneof, set."""
    return _field(f, names, depth).map(lambda v: {f.name: v})


def _build(cls: Callable[..., Message], parts: tuple[dict[str, Any], ...]) -> Message:
    kwargs: dict[str, Any] = {}
    for part in parts:
        kwargs.update(part)
    return cls(**kwargs)


def _field(f: FieldDescriptor, names: st.SearchStrategy[str], depth: int) -> st.SearchStrategy[Any]:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key_f, value_f = (
            f.message_type.fields_by_name["key"],
            f.message_type.fields_by_name["value"],
        )
        return st.dictionaries(
            _scalar(key_f, names, depth), _scalar(value_f, names, depth), max_size=3
        )
    one = _scalar(f, names, depth)
    if f.is_repeated:
        return st.lists(one, max_size=4)
    return one


def _scalar(
    f: FieldDescriptor, names: st.SearchStrategy[str], depth: int
) -> st.SearchStrategy[Any]:
    if f.type == F.TYPE_MESSAGE:
        assert f.message_type is not None
        if depth >= 3:
            return st.just(GetMessageClass(f.message_type)())
        return messages(f.message_type, names, depth + 1)
    if f.name in _SMALL_INTS:
        lo, hi = _INT_RANGES[f.type]  # a name may be int32 in one message, uint32 in another
        return _SMALL_INTS[f.name].filter(lambda v: lo <= v <= hi)
    if f.type in _INT_RANGES:
        lo, hi = _INT_RANGES[f.type]
        edges = sorted({lo, hi, max(lo, -1), 0, min(hi, 2**31), min(hi, 2**32)})
        return st.one_of(st.integers(max(lo, -2), 16), st.sampled_from(edges), st.integers(lo, hi))
    if f.type == F.TYPE_ENUM:
        assert f.enum_type is not None
        return st.one_of(
            st.sampled_from([v.number for v in f.enum_type.values]), st.integers(-3, 9)
        )
    if f.type == F.TYPE_STRING:
        if f.name in _NAME_FIELDS:
            return names
        return st.one_of(st.text(max_size=40), st.sampled_from(LOG_ATTACKS))
    if f.type == F.TYPE_BYTES:
        return batches() if f.name == "batch" else st.binary(max_size=64)
    if f.type == F.TYPE_BOOL:
        return st.booleans()
    return st.floats(allow_nan=True, allow_infinity=True)  # double, float
