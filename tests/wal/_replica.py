"""Helpers shared by the replicated-append tests: a leader's batches and a log's bytes.

A leader is any log written by ordinary appends; its follower is fed the leader's raw
bytes. What the tests compare is the segment files: ``log_files`` (name -> bytes of every
``.log``) and ``log_bytes`` (all of them end to end, oldest first).
"""

from __future__ import annotations

import random
from pathlib import Path

from proto.batch import encode_records, iter_batches
from proto.record import Record


def random_batch(rng: random.Random, first_id: int) -> tuple[bytes, int]:
    """A producer's batch of 1-5 records (values 0-300 bytes, some keys and headers, rising
    timestamps), and its record count; record ids start at ``first_id``."""
    count = rng.randint(1, 5)
    records = [
        Record(
            b"%d:" % (first_id + i) + rng.randbytes(rng.randint(0, 300)),
            key=rng.randbytes(rng.randint(0, 8)) if rng.random() < 0.5 else None,
            headers={"trace": rng.randbytes(4)} if rng.random() < 0.3 else {},
            timestamp_ms=1_700_000_000_000 + first_id + i,
        )
        for i in range(count)
    ]
    return encode_records(records), count


def random_batches(rng: random.Random, n: int) -> list[bytes]:
    """``n`` producer batches, record ids dense from 0."""
    out, next_id = [], 0
    for _ in range(n):
        data, count = random_batch(rng, next_id)
        out.append(data)
        next_id += count
    return out


def log_files(path: str | Path) -> dict[str, bytes]:
    """Every ``.log`` file of the partition directory ``path``: name -> bytes."""
    root = Path(path)
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.suffix == ".log"}


def log_bytes(path: str | Path) -> bytes:
    """Every ``.log`` file of ``path`` end to end, oldest segment first."""
    return b"".join(log_files(path).values())


def boundaries(data: bytes) -> list[int]:
    """Byte positions in ``data`` (batches end to end) where a batch ends, 0 included."""
    ends = [0]
    for batch in iter_batches(data):
        ends.append(ends[-1] + batch.size)
    return ends
