"""Scenario ``wal``: the write-ahead log measured against the disk it writes to, in one run.

Owns the grid of append measurements, the physical baselines, the reopen measurement and
the goals derived from them. In order:

1. ``disk`` (plain ``os`` calls, the physical limits): ``disk_seq_write_mb_s`` (1 MiB
   writes, ``fdatasync`` after each) and ``disk_fdatasync_s`` (4 KiB appends, one
   ``fdatasync`` each).
2. ``encode_records_s``: ``wal.encode_columns`` of 1000 records of 100 B. Encoding is the
   producer's job, so the append grid below appends batches encoded beforehand.
3. The append grid, one fresh log per cell: ``append_records_s``, ``append_mb_s``,
   ``append_latency_p50_ms`` and ``append_latency_p99_ms`` for every ``record_bytes`` x
   ``batch`` x ``fsync`` x ``appenders``. Each appender awaits ``LogWriter.append`` in a
   loop; latency is one append's await time. A cell runs until its time or byte budget is
   spent. ``append_mb_s`` counts log bytes (encoded batches as written), MiB = 2**20.
   With ``--plot`` every cell's append latencies go to the run's sample log
   (``append_latency_quantile_ms``), and so do the first fdatasync baseline's call times
   (``fdatasync_latency_quantile_ms``, system ``disk``), the floor of a synced append.
4. ``reopen_1gib_s``: ``Log.open`` + ``close`` of a ~1 GiB log (128 MiB with ``--quick``;
   ``params["log_bytes"]`` says which), median of 3, page cache warm.
4b. A catch-up read of a 256 MiB log (32 MiB with ``--quick``) from a cold and a warm page
   cache, on the event loop against off it (:mod:`bench._cold`): ``catch_up_mb_s``,
   ``catch_up_loop_stall_max_ms``, ``catch_up_loop_stall_p99_ms``.
5. Goals derived from the above (``params`` carry ``goal`` and ``met``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._cold import measure_cold_catch_up
from bench._measure import median, new_runner, per_second, percentile
from bench._output import Goal, Params, ParamValue, Result
from bench._samples import SampleLog
from bench._scenario import RunOptions
from bench._scratch import cell_dir
from wal import FsyncPolicy, Log, LogConfig, LogWriter, encode_columns

BENCH = "wal"
KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

SEQ_BANDWIDTH_GOAL = Goal(">=", 0.8)
RECORDS_S_GOAL = Goal(">=", 2_000_000)
GROUP_COMMIT_GOAL = Goal(">=", 10)
REOPEN_GOAL = Goal("<", 0.5)

MAX_GROUP_BYTES = LogConfig().max_group_bytes
_POOL = 4  # distinct pre-encoded batches per cell, shared round-robin by the appenders
_BUILD_CHUNK = 32  # batches per append_many while building the reopen log


@dataclass(frozen=True, slots=True)
class Cell:
    """One point of the append grid."""

    record_bytes: int
    batch: int
    fsync: FsyncPolicy
    appenders: int
    group_commit: bool = True

    @property
    def name(self) -> str:
        """A directory name for the cell's log."""
        group = "" if self.group_commit else "-nogroup"
        return f"r{self.record_bytes}-b{self.batch}-{self.fsync.value}-a{self.appenders}{group}"

    def config(self) -> LogConfig:
        """The log's config; without group commit every fdatasync covers one batch."""
        return LogConfig(
            fsync=self.fsync, max_group_bytes=MAX_GROUP_BYTES if self.group_commit else 1
        )

    def params(self, loop: str) -> dict[str, ParamValue]:
        """The cell's result params."""
        return {
            "record_bytes": self.record_bytes,
            "batch": self.batch,
            "fsync": self.fsync.value,
            "appenders": self.appenders,
            "group_commit": self.group_commit,
            "loop": loop,
        }


@dataclass(frozen=True, slots=True)
class Grid:
    """The append grid; tests pass a smaller one."""

    record_bytes: tuple[int, ...] = (100, 1024)
    batch: tuple[int, ...] = (1, 100, 1000)
    fsync: tuple[FsyncPolicy, ...] = (FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL)
    appenders: tuple[int, ...] = (1, 16)

    def cells(self) -> Iterator[Cell]:
        """Every combination, record size outermost; after each record size's single-record
        cells, the baseline for group commit: the most appenders, one fdatasync per batch."""
        for rb, b, f, a in itertools.product(
            self.record_bytes, self.batch, self.fsync, self.appenders
        ):
            yield Cell(rb, b, f, a)
            if b == 1 and f is FsyncPolicy.ALWAYS and a == max(self.appenders) and a > 1:
                yield Cell(rb, b, f, a, group_commit=False)


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each measurement does.

    Attributes:
        cell_seconds: Time budget of one grid cell.
        cell_bytes: Log-byte budget of one grid cell (whichever budget runs out first).
        disk_seq_bytes: Bytes written by the sequential-write baseline.
        fdatasync_seconds: Duration of the fdatasync-rate baseline.
        encode_seconds: Duration of the encode measurement.
        reopen_log_bytes: Size of the log built for the reopen measurement.
        reopen_runs: Reopens timed (the median is reported).
        pair_rounds: Rounds of the paired disk/WAL bandwidth comparison.
        pair_bytes: Bytes each side writes in one round.
        catch_up_bytes: Size of the log the catch-up reads go through (:mod:`bench._cold`).
        catch_up_rounds: Rounds of each catch-up mode and cache state.
    """

    cell_seconds: float
    cell_bytes: int
    disk_seq_bytes: int
    fdatasync_seconds: float
    encode_seconds: float
    reopen_log_bytes: int
    reopen_runs: int = 3
    pair_rounds: int = 7
    pair_bytes: int = 128 * MIB
    catch_up_bytes: int = 256 * MIB
    catch_up_rounds: int = 3


FULL = Sizes(1.5, 1 * GIB, 256 * MIB, 1.5, 0.5, 1 * GIB)
QUICK = Sizes(
    0.12,
    32 * MIB,
    32 * MIB,
    0.2,
    0.05,
    128 * MIB,
    pair_rounds=3,
    pair_bytes=16 * MIB,
    catch_up_bytes=32 * MIB,
    catch_up_rounds=1,
)


def run(
    options: RunOptions, *, grid: Grid | None = None, sizes: Sizes | None = None
) -> Iterator[Result]:
    """Measure everything, yielding each result as soon as it is known, then the goals."""
    sizes = sizes or (QUICK if options.quick else FULL)
    measured: list[Result] = []
    for result in _measure_all(options.data_dir, grid or Grid(), sizes, options.samples):
        measured.append(result)
        yield result
    yield from derive_goals(measured)


def _measure_all(
    root: Path, grid: Grid, sizes: Sizes, samples: SampleLog | None
) -> Iterator[Result]:
    # The disk baselines run first and last: this disk's speed drifts, and the ratios use
    # the better of the two, so drift can only make Headrace look worse.
    yield from _disk_baselines(root, sizes, "start", samples)
    yield measure_encode(sizes.encode_seconds)
    yield from measure_grid(root, grid, sizes, samples)
    yield measure_reopen(root, sizes.reopen_log_bytes, sizes.reopen_runs)
    yield from measure_cold_catch_up(root, sizes.catch_up_bytes, sizes.catch_up_rounds)
    yield from measure_seq_pairs(root, sizes)
    yield from _disk_baselines(root, sizes, "end")


def measure_seq_pairs(root: Path, sizes: Sizes) -> Iterator[Result]:
    """The bandwidth goal, measured in pairs: this disk's sequential speed swings several-fold
    within a minute, so each round writes ``pair_bytes`` of 1 MiB blocks with fdatasync,
    then appends the same bytes as 1 KiB x 1000 batches (one appender, fsync always: also
    one ~1 MiB write and one fdatasync each), back to back. The goal is the median of the
    rounds' ratios; both medians are reported beside it."""
    cell = Cell(1024, 1000, FsyncPolicy.ALWAYS, 1)
    budget = Sizes(60.0, sizes.pair_bytes, 0, 0, 0, 0)
    disk_rates: list[float] = []
    wal_rates: list[float] = []
    loop, runner = new_runner()
    with runner:
        for i in range(sizes.pair_rounds):
            disk_rates.append(measure_disk_seq_write(root, sizes.pair_bytes).value)
            with cell_dir(root, f"pair-{i}") as path:
                stats = runner.run(run_cell(path, cell, budget))
            appended = len(stats.latencies) * stats.batch_bytes
            wal_rates.append(per_second(appended, stats.seconds) / MIB)
    params: Params = {
        **cell.params(loop),
        "rounds": sizes.pair_rounds,
        "pair_bytes": sizes.pair_bytes,
        "stat": "median",
    }
    yield _result("disk", "paired_disk_seq_write_mb_s", median(disk_rates), "MiB/s", params)
    yield _result("headrace", "paired_append_mb_s", median(wal_rates), "MiB/s", params)
    ratios = [w / d for w, d in zip(wal_rates, disk_rates, strict=True)]
    yield _goal("seq_bandwidth_ratio", median(ratios), "x", SEQ_BANDWIDTH_GOAL, params)


def _disk_baselines(
    root: Path, sizes: Sizes, when: str, samples: SampleLog | None = None
) -> Iterator[Result]:
    for result in (
        measure_disk_seq_write(root, sizes.disk_seq_bytes),
        measure_disk_fdatasync(root, sizes.fdatasync_seconds, samples),
    ):
        yield Result(
            result.bench,
            result.system,
            result.metric,
            result.value,
            result.unit,
            {**result.params, "when": when},
        )


def _result(system: str, metric: str, value: float, unit: str, params: Params) -> Result:
    return Result(BENCH, system, metric, value, unit, dict(params))


def _values(record_bytes: int, count: int) -> list[bytes]:
    """``count`` random values (incompressible, so no layer below can cheat)."""
    blob = os.urandom(record_bytes * count)
    return [blob[i : i + record_bytes] for i in range(0, len(blob), record_bytes)]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------------------
# The disk's physical limits


def _open_new(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def measure_disk_seq_write(root: Path, total_bytes: int) -> Result:
    """Sequential 1 MiB appends with ``fdatasync`` after each: the disk's bandwidth."""
    block = os.urandom(MIB)
    count = max(1, total_bytes // MIB)
    with cell_dir(root, "disk-seq") as path:
        fd = _open_new(path / "seq.dat")
        try:
            start = time.perf_counter()
            for _ in range(count):
                _write_all(fd, block)
                os.fdatasync(fd)
            elapsed = time.perf_counter() - start
        finally:
            os.close(fd)
    params = {"block_bytes": MIB, "total_bytes": count * MIB}
    return _result("disk", "disk_seq_write_mb_s", per_second(count, elapsed), "MiB/s", params)


def measure_disk_fdatasync(root: Path, seconds: float, samples: SampleLog | None = None) -> Result:
    """4 KiB appends with ``fdatasync`` after each, for ``seconds``: the disk's flush rate.
    Each write + fdatasync's time goes to ``samples`` when given."""
    times = time_fdatasyncs(root, seconds, 4 * KIB)
    params = {"block_bytes": 4 * KIB}
    if samples is not None:
        samples.add(BENCH, "disk", "fdatasync_latency_quantile_ms", params, _ms(times))
    rate = per_second(len(times), sum(times))
    return _result("disk", "disk_fdatasync_s", rate, "calls/s", params)


def time_fdatasyncs(root: Path, seconds: float, block_bytes: int) -> list[float]:
    """Append ``block_bytes`` and ``fdatasync``, again and again for ``seconds`` (at least
    once), in a fresh file under ``root``; each append + sync's seconds, in order."""
    block = os.urandom(block_bytes)
    times: list[float] = []
    with cell_dir(root, "disk-fdatasync") as path:
        fd = _open_new(path / "sync.dat")
        try:
            now = time.perf_counter()
            deadline = now + seconds
            while not times or now < deadline:
                _write_all(fd, block)
                os.fdatasync(fd)
                times.append(time.perf_counter() - now)
                now += times[-1]
        finally:
            os.close(fd)
    return times


def _ms(seconds: Iterable[float]) -> Iterator[float]:
    return (s * 1000 for s in seconds)


# ---------------------------------------------------------------------------------------
# Encoding


def measure_encode(seconds: float, record_bytes: int = 100, batch: int = 1000) -> Result:
    """Records per second through ``encode_columns``, one batch of ``batch`` at a time."""
    values = _values(record_bytes, batch)
    ts = _now_ms()
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while count == 0 or time.perf_counter() < deadline:
        encode_columns(values, timestamps_ms=ts)
        count += 1
    rate = per_second(count * batch, time.perf_counter() - start)
    params = {"record_bytes": record_bytes, "batch": batch}
    return _result("headrace", "encode_records_s", rate, "records/s", params)


# ---------------------------------------------------------------------------------------
# The append grid


class _Quota:
    """The budget of one cell, shared by its appenders: appends left and a deadline."""

    def __init__(self, appends: int, seconds: float) -> None:
        self._left = appends
        self._deadline = time.perf_counter() + seconds

    def take(self) -> bool:
        """Claim one append; ``False`` once the budget is spent."""
        if self._left <= 0 or time.perf_counter() >= self._deadline:
            return False
        self._left -= 1
        return True


@dataclass(frozen=True, slots=True)
class CellStats:
    """What one cell measured: one latency per append of a batch, over ``seconds``."""

    batch_records: int
    batch_bytes: int
    seconds: float
    latencies: list[float]  # seconds, ascending

    def results(self, params: Params) -> list[Result]:
        """The cell's four headrace results."""
        appends = len(self.latencies)
        p50, p99 = (percentile(self.latencies, q) * 1000 for q in (50, 99))
        records_s = per_second(appends * self.batch_records, self.seconds)
        mib_s = per_second(appends * self.batch_bytes, self.seconds) / MIB
        return [
            _result("headrace", "append_records_s", records_s, "records/s", params),
            _result("headrace", "append_mb_s", mib_s, "MiB/s", params),
            _result("headrace", "append_latency_p50_ms", p50, "ms", params),
            _result("headrace", "append_latency_p99_ms", p99, "ms", params),
        ]


def measure_grid(
    root: Path, grid: Grid, sizes: Sizes, samples: SampleLog | None = None
) -> Iterator[Result]:
    """Every cell of ``grid``, each on a fresh log, all on one event loop; each cell's
    latencies go to ``samples`` when given."""
    loop, runner = new_runner()
    with runner:
        for cell in grid.cells():
            with cell_dir(root, cell.name) as path:
                stats = runner.run(run_cell(path, cell, sizes))
            params = cell.params(loop)
            if samples is not None:
                latencies = _ms(stats.latencies)
                samples.add(BENCH, "headrace", "append_latency_quantile_ms", params, latencies)
            yield from stats.results(params)


def _batch_pool(cell: Cell) -> list[bytes]:
    ts = _now_ms()
    return [
        encode_columns(_values(cell.record_bytes, cell.batch), timestamps_ms=ts)
        for _ in range(min(cell.appenders, _POOL))
    ]


async def run_cell(path: Path, cell: Cell, sizes: Sizes) -> CellStats:
    """Open a fresh log at ``path`` and append to it until the cell's budget is spent."""
    pool = _batch_pool(cell)
    async with await LogWriter.open(str(path), cell.config()) as writer:
        await writer.append(pool[0])  # warm-up: creates the segment, starts the worker thread
        quota = _Quota(max(cell.appenders, sizes.cell_bytes // len(pool[0])), sizes.cell_seconds)
        seconds, latencies = await _drive(writer, pool, cell.appenders, quota)
    return CellStats(cell.batch, len(pool[0]), seconds, latencies)


async def _drive(
    writer: LogWriter, pool: Sequence[bytes], appenders: int, quota: _Quota
) -> tuple[float, list[float]]:
    """Run the appenders concurrently; return the wall time and every append's latency."""
    per_task: list[list[float]] = [[] for _ in range(appenders)]
    start = time.perf_counter()
    await asyncio.gather(
        *(_append_loop(writer, pool[i % len(pool)], quota, per_task[i]) for i in range(appenders))
    )
    seconds = time.perf_counter() - start
    return seconds, sorted(itertools.chain.from_iterable(per_task))


async def _append_loop(
    writer: LogWriter, batch: bytes, quota: _Quota, latencies: list[float]
) -> None:
    while quota.take():
        start = time.perf_counter()
        await writer.append(batch)
        latencies.append(time.perf_counter() - start)


# ---------------------------------------------------------------------------------------
# Reopen


def _build_log(path: Path, target_bytes: int) -> tuple[int, int]:
    """Write a log of about ``target_bytes`` in ~1 MiB batches, unsynced until one final
    flush. Returns (log bytes, segments)."""
    log = Log.open(str(path), LogConfig(fsync=FsyncPolicy.NEVER))
    try:
        batch = log.validate(encode_columns(_values(KIB, KIB), timestamps_ms=_now_ms()))
        count = max(1, -(-target_bytes // batch.size))
        for done in range(0, count, _BUILD_CHUNK):
            log.append_many([batch] * min(_BUILD_CHUNK, count - done))
        log.flush()
        return log.size_bytes, len(log.segment_infos())
    finally:
        log.close()


def _time_reopen(path: Path) -> float:
    start = time.perf_counter()
    Log.open(str(path)).close()
    return time.perf_counter() - start


def measure_reopen(root: Path, target_bytes: int, runs: int) -> Result:
    """Median time of ``Log.open`` + ``close`` of a log of about ``target_bytes``."""
    with cell_dir(root, "reopen") as path:
        log_bytes, segments = _build_log(path, target_bytes)
        seconds = median([_time_reopen(path) for _ in range(runs)])
    params: dict[str, ParamValue] = {
        "log_bytes": log_bytes,
        "segments": segments,
        "runs": runs,
        "stat": "median",
        "page_cache": "warm",
    }
    params.update(REOPEN_GOAL.params(seconds))
    return _result("headrace", "reopen_1gib_s", seconds, "s", params)


# ---------------------------------------------------------------------------------------
# Goals


def _matching(results: Sequence[Result], metric: str, **params: ParamValue) -> list[Result]:
    return [
        r
        for r in results
        if r.metric == metric and all(r.params.get(k) == v for k, v in params.items())
    ]


def _best(results: Sequence[Result], metric: str, **params: ParamValue) -> Result | None:
    return max(_matching(results, metric, **params), key=lambda r: r.value, default=None)


def _goal(metric: str, value: float, unit: str, goal: Goal, inputs: Params) -> Result:
    return _result("headrace", metric, value, unit, {**inputs, **goal.params(value)})


def derive_goals(results: Sequence[Result]) -> Iterator[Result]:
    """The goal metrics computable from ``results`` (a smaller grid yields fewer)."""
    yield from _records_s_goal(results)
    sizes = {r.params["record_bytes"] for r in _matching(results, "append_records_s", batch=1)}
    for record_bytes in sorted(s for s in sizes if isinstance(s, int)):
        yield from _group_commit(results, record_bytes)


def _records_s_goal(results: Sequence[Result]) -> Iterator[Result]:
    best = _best(results, "append_records_s", record_bytes=100, batch=1000, fsync="always")
    if best is not None:
        yield _goal(
            "records_s_100b_batch1000_always", best.value, "records/s", RECORDS_S_GOAL, best.params
        )


def _group_commit(results: Sequence[Result], record_bytes: int) -> Iterator[Result]:
    """Group commit against one fdatasync per record, both judged against the same goal
    (issue 17: at least 10x): at the same concurrency with grouping off, and against one
    appender (one fdatasync per record, the latency-bound rate); plus a context ratio
    against the disk's raw flush rate."""
    cell: dict[str, ParamValue] = {"record_bytes": record_bytes, "batch": 1, "fsync": "always"}
    grouped = _best(results, "append_records_s", group_commit=True, **cell)
    if grouped is None or grouped.params["appenders"] == 1:
        return
    n = grouped.params["appenders"]
    alone = _best(results, "append_records_s", group_commit=False, appenders=n, **cell)
    if alone is not None:
        inputs = {**grouped.params, "vs": f"{n} appenders, one fdatasync per record"}
        yield _goal(
            "group_commit_speedup", grouped.value / alone.value, "x", GROUP_COMMIT_GOAL, inputs
        )
    one = _best(results, "append_records_s", group_commit=True, appenders=1, **cell)
    if one is not None:
        inputs = {**grouped.params, "vs": "1 appender, one fdatasync per record"}
        yield _goal(
            "group_commit_vs_one_appender",
            grouped.value / one.value,
            "x",
            GROUP_COMMIT_GOAL,
            inputs,
        )
    disk = _best(results, "disk_fdatasync_s")
    if disk is not None:
        inputs = {**grouped.params, "vs": "disk_fdatasync_s"}
        yield _result(
            "headrace", "group_commit_vs_fdatasync", grouped.value / disk.value, "x", inputs
        )
