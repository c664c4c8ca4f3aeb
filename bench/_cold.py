"""The ``wal`` scenario's catch-up read from a cold page cache: on the loop, or off it.

Owns :func:`measure_cold_catch_up`. One log of ``log_bytes`` (1 KiB x 1000 batches, fsync
``always``) is read from its first offset to its head, 1 MiB a read, the way a consumer
catching up on old data reads it, in two modes side by side, alternated for ``rounds``:

- ``loop``: ``LogWriter.read`` on the event loop, as every read ran before cold reads went
  to a thread (``wal.fs.nonblocking_reads``);
- ``thread``: ``LogWriter.read_nowait``, and ``read_cold`` on a worker thread when the page
  cache misses (what the dispatcher and Fetch do).

Each mode runs with the log's pages dropped from the page cache first
(``POSIX_FADV_DONTNEED`` on every segment file: ``cache=cold``), then again with them
cached (``cache=warm``, what the non-blocking attempt costs when it hits). Beside the
reader a task sleeps 1 ms at a time; the gaps between its wake-ups show how long the loop
was held: the longest (``catch_up_loop_stall_max_ms``) and the 99th percentile
(``catch_up_loop_stall_p99_ms``), with the reader's rate (``catch_up_mb_s``). The figures
are medians over the rounds.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

from bench._measure import median, new_runner, per_second, percentile
from bench._output import Params, Result
from bench._scratch import cell_dir
from wal import FsyncPolicy, LogConfig, LogWriter, encode_columns

BENCH = "wal"
MIB = 1 << 20
MODES = ("loop", "thread")
CACHES = ("cold", "warm")


def measure_cold_catch_up(root: Path, log_bytes: int, rounds: int) -> Iterator[Result]:
    """The catch-up results of both modes and both cache states (see the module)."""
    loop, runner = new_runner()
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with runner, cell_dir(root, "cold-catch-up") as path:
        runner.run(_build(path, log_bytes))
        for i in range(rounds):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:  # neither always goes first
                for cache in CACHES:
                    if cache == "cold":
                        _drop_page_cache(path)
                    runs.setdefault((mode, cache), []).append(runner.run(_catch_up(path, mode)))
    for (mode, cache), got in sorted(runs.items()):
        params: Params = {
            "mode": mode,
            "cache": cache,
            "log_bytes": log_bytes,
            "read_bytes": MIB,
            "rounds": rounds,
            "stat": "median",
            "loop": loop,
        }
        rate, stall_max, stall_p99 = (median([g[i] for g in got]) for i in range(3))
        yield Result(BENCH, "headrace", "catch_up_mb_s", rate, "MiB/s", params)
        yield Result(BENCH, "headrace", "catch_up_loop_stall_max_ms", stall_max, "ms", params)
        yield Result(BENCH, "headrace", "catch_up_loop_stall_p99_ms", stall_p99, "ms", params)


async def _build(path: Path, log_bytes: int) -> None:
    batch = encode_columns([b"x" * 1024] * 1000)
    config = LogConfig(fsync=FsyncPolicy.ALWAYS)
    async with await LogWriter.open(str(path), config) as writer:
        for _ in range(max(1, log_bytes // len(batch))):
            await writer.append(batch)


def _drop_page_cache(path: Path) -> None:
    """Ask the kernel to drop the cached pages of every file of the log (clean: the log
    was synced), as if it had been read long ago."""
    for name in os.listdir(path):
        fd = os.open(path / name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


async def _catch_up(path: Path, mode: str) -> tuple[float, float, float]:
    """Read the whole log in ``mode``; (MiB/s, longest loop stall ms, p99 stall ms)."""
    config = LogConfig(fsync=FsyncPolicy.ALWAYS, tail_cache_bytes=0)
    async with await LogWriter.open(str(path), config) as writer:
        gaps: list[float] = []
        reading = True

        async def ticker() -> None:
            last = time.perf_counter()
            while reading:
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append((now - last) * 1000)
                last = now

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)  # the ticker runs before the first read
        offset, total = writer.first_offset, 0
        started = time.perf_counter()
        while offset < writer.high_water_mark:
            if mode == "loop":
                batches = writer.read(offset, MIB)
            else:
                batches = writer.read_nowait(offset, MIB) or await writer.read_cold(offset, MIB)
            total += sum(b.size for b in batches)
            offset = batches[-1].next_offset
            await asyncio.sleep(0)  # as a dispatcher yields between passes
        seconds = time.perf_counter() - started
        reading = False
        await ticking
    return per_second(total, seconds) / MIB, max(gaps), percentile(sorted(gaps), 99)
