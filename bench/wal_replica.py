"""Scenario ``wal_replica``: the WAL's side of replication, a leader's raw read and a
follower's byte-for-byte append, measured on one disk in one process.

Owns the measurement of :meth:`wal.LogWriter.read_raw` and
:meth:`wal.LogWriter.append_replicated` for 100 B records. A leader log of ``log_bytes`` is
built first (batches of ``batch`` records, page cache warm), then:

1. ``read_raw_mb_s`` / ``read_raw_records_s``: the leader's whole log read in
   ``chunk_bytes`` raw reads from offset 0, each from where the last ended.
2. ``append_replicated_mb_s`` / ``append_replicated_records_s``: a fresh follower appends
   those chunks (read beforehand) one call after another, under ``fsync`` (each call
   synced under ``always``: one fdatasync per chunk).
3. ``replicate_mb_s`` / ``replicate_records_s``: both in turn, as a follower's fetch loop
   does with the leader in the same process (read a chunk, append it, read the next).

MiB = 2**20 log bytes (batches as stored). Each figure is the median of ``rounds`` runs. A
network hop, and the leader and follower being two processes on two machines, are not in
these figures: this is the ceiling the WAL puts on a follower.

Imports ``wal`` and ``bench``'s own helpers, nothing that runs a broker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench._measure import median, new_runner, per_second
from bench._output import Params, Result
from bench._scenario import RunOptions
from bench._scratch import cell_dir
from wal import FsyncPolicy, Log, LogConfig, LogWriter, encode_columns

BENCH = "wal_replica"
MIB = 1 << 20
RECORD_BYTES = 100
CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work the scenario does.

    Attributes:
        log_bytes: Size of each leader log, bytes.
        rounds: Runs of each measurement (the median is reported).
        batches: Records per leader batch, one leader log each.
        fsync: The follower's fsync policies.
    """

    log_bytes: int
    rounds: int
    batches: tuple[int, ...] = (1, 100)
    fsync: tuple[FsyncPolicy, ...] = (FsyncPolicy.ALWAYS, FsyncPolicy.NEVER)


FULL = Sizes(64 * MIB, 3)
QUICK = Sizes(8 * MIB, 1)


def run(options: RunOptions, *, sizes: Sizes | None = None) -> Iterator[Result]:
    """Measure every batch size and policy, yielding each result as it is known."""
    sizes = sizes or (QUICK if options.quick else FULL)
    loop, runner = new_runner()
    with runner:
        for batch in sizes.batches:
            with cell_dir(options.data_dir, f"leader-b{batch}") as leader_dir:
                records = _build_leader(leader_dir, batch, sizes.log_bytes)
                leader = runner.run(LogWriter.open(str(leader_dir)))
                try:
                    for fsync in sizes.fsync:
                        params: Params = {
                            "record_bytes": RECORD_BYTES,
                            "batch": batch,
                            "chunk_bytes": CHUNK_BYTES,
                            "fsync": fsync.value,
                            "log_bytes": leader.log.size_bytes,
                            "rounds": sizes.rounds,
                            "stat": "median",
                            "loop": loop,
                        }
                        rates = [
                            runner.run(_round(leader, options.data_dir, fsync, i))
                            for i in range(sizes.rounds)
                        ]
                        yield from _results(rates, leader.log.size_bytes, records, params)
                finally:
                    runner.run(leader.aclose())


@dataclass(frozen=True, slots=True)
class Seconds:
    """One round's times: the raw read alone, the append alone, both in turn."""

    read: float
    append: float
    replicate: float


def _results(
    rates: list[Seconds], log_bytes: int, records: int, params: Params
) -> Iterator[Result]:
    for name, seconds in (
        ("read_raw", [r.read for r in rates]),
        ("append_replicated", [r.append for r in rates]),
        ("replicate", [r.replicate for r in rates]),
    ):
        s = median(seconds)
        yield Result(
            BENCH, "headrace", f"{name}_mb_s", per_second(log_bytes, s) / MIB, "MiB/s", params
        )
        yield Result(
            BENCH, "headrace", f"{name}_records_s", per_second(records, s), "records/s", params
        )


def _build_leader(path: Path, batch: int, target_bytes: int) -> int:
    """A leader log of about ``target_bytes`` of ``batch``-record batches of 100 B random
    values, synced once at the end; returns its record count."""
    log = Log.open(str(path), LogConfig(fsync=FsyncPolicy.NEVER))
    try:
        pool = [
            log.validate(
                encode_columns(
                    [os.urandom(RECORD_BYTES) for _ in range(batch)],
                    timestamps_ms=time.time_ns() // 1_000_000,
                )
            )
            for _ in range(8)
        ]
        count = max(1, -(-target_bytes // pool[0].size))
        for start in range(0, count, 256):
            n = min(256, count - start)
            log.append_many([pool[(start + i) % len(pool)] for i in range(n)])
        log.flush()
        return log.head
    finally:
        log.close()


async def _read_all(leader: LogWriter) -> tuple[list[bytes], float]:
    """The leader's log in raw chunks, and the seconds the reads took."""
    chunks: list[bytes] = []
    offset = 0
    start = time.perf_counter()
    while offset < leader.high_water_mark:
        chunk = await leader.read_raw(offset, CHUNK_BYTES)
        chunks.append(chunk)
        offset = _next_offset(chunk)
    return chunks, time.perf_counter() - start


def _next_offset(chunk: bytes) -> int:
    """The offset just past the last batch of ``chunk``, from its header (base offset at
    byte 0, record count at byte 20 of each batch)."""
    pos, last = 0, 0
    while pos < len(chunk):
        length = int.from_bytes(chunk[pos + 8 : pos + 12], "little")
        last = pos
        pos += length
    base = int.from_bytes(chunk[last : last + 8], "little")
    return base + int.from_bytes(chunk[last + 20 : last + 24], "little")


async def _round(leader: LogWriter, root: Path, fsync: FsyncPolicy, i: int) -> Seconds:
    """One round: read the leader alone, append alone, then both in turn, each follower
    fresh."""
    chunks, read_s = await _read_all(leader)
    config = LogConfig(fsync=fsync)
    with cell_dir(root, f"append-{fsync.value}-{i}") as path:
        follower = await LogWriter.open(str(path), config)
        start = time.perf_counter()
        for chunk in chunks:
            await follower.append_replicated(chunk)
        append_s = time.perf_counter() - start
        await follower.aclose()
    chunks.clear()
    with cell_dir(root, f"replicate-{fsync.value}-{i}") as path:
        follower = await LogWriter.open(str(path), config)
        start = time.perf_counter()
        while follower.head < leader.high_water_mark:
            await follower.append_replicated(await leader.read_raw(follower.head, CHUNK_BYTES))
        replicate_s = time.perf_counter() - start
        await follower.aclose()
    return Seconds(read_s, append_s, replicate_s)
