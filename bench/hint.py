"""The ``hint`` scenario: what the broker's in-flight hint does to latency and CPU.

Owns :func:`run` and :func:`measure_cell`. For each cell of partitions and rate, a fresh
real ``headrace serve`` (fsync ``always``) takes an open-loop publisher at that rate, its
records spread over the partitions in turn, and one subscription consumed in the same
process, which acks every record (:func:`bench._pubsub_system.measure_e2e`: latency from
each record's scheduled send to its receipt). Two systems run each cell, alternated
round by round so that both meet the same machine:

- ``headrace``: the producer's default with ``linger_ms=0``, whose window follows each
  answer's ``in_flight_hint`` (``wal/commit_cost.py``, ``broker/busy.py``);
- ``headrace-window-1``: the same producer with ``max_in_flight=1``, which is how every
  linger-0 producer published before the hint.

Reported per system, cell and round: ``e2e_latency_p50_ms``, ``e2e_latency_p99_ms`` and
``broker_cpu_cores`` (the broker process's CPU seconds per second over the run, every
thread); per cell, the hint's median p50 and p99 over window 1's
(``e2e_p50_vs_window_1``, ``e2e_p99_vs_window_1``). The cells go from an idle broker,
where the hint pipelines, to a saturated one, where the busy rule keeps one batch in
flight once it has seen the load.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench._dispatch_procs import Broker
from bench._headrace_pubsub import e2e_consumer
from bench._measure import median, new_runner, percentile
from bench._output import Params, Result
from bench._pubsub_system import measure_e2e
from bench._scenario import RunOptions
from client import AsyncProducer

BENCH = "hint"
TOPIC = "hint"
SUBSCRIPTION = "hint-e2e"
#: The systems in the order each round runs them.
SYSTEMS = ("headrace", "headrace-window-1")


@dataclass(frozen=True, slots=True)
class Cell:
    """One load: ``rate`` records per second in all over ``partitions`` partitions."""

    partitions: int
    rate: float


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each run of the scenario measures."""

    cells: tuple[Cell, ...]
    seconds: float  # each run's sending time
    rounds: int  # runs of each system per cell, alternated


FULL = Sizes(
    cells=(Cell(1, 2_000), Cell(8, 1_000), Cell(8, 2_000), Cell(4, 8_000), Cell(8, 4_000)),
    seconds=4.0,
    rounds=2,
)
QUICK = Sizes(cells=(Cell(1, 2_000), Cell(8, 4_000)), seconds=1.5, rounds=1)


@dataclass(frozen=True, slots=True)
class Measurement:
    """One run: its latencies (ms, ascending), how many were sent, the broker's CPU."""

    latencies_ms: list[float]
    sent: int
    broker_cpu_cores: float


def run(options: RunOptions) -> Iterator[Result]:
    """Every cell, each system ``rounds`` times, alternated; then, per cell, the hint's
    median p50 and p99 over window 1's (``e2e_p50_vs_window_1``, ``e2e_p99_vs_window_1``:
    under 1 means the hint was quicker)."""
    sizes = QUICK if options.quick else FULL
    loop_name, runner = new_runner()
    with runner:
        for cell in sizes.cells:
            cell_params: Params = {
                "fsync": "always",
                "partitions": cell.partitions,
                "rate_msg_s": cell.rate,
                "seconds": sizes.seconds,
                "loop": loop_name,
            }
            seen: list[Result] = []
            for round_ in range(sizes.rounds):
                for system in SYSTEMS:
                    name = f"{system}-{cell.partitions}x{cell.rate:.0f}-{round_ + 1}"
                    directory = options.data_dir / name
                    directory.mkdir()
                    m = runner.run(measure_cell(directory, cell, system, sizes.seconds))
                    for r in _results(system, m, {**cell_params, "round": round_ + 1}):
                        seen.append(r)
                        yield r
            yield from _ratios(seen, {**cell_params, "rounds": sizes.rounds})


def _ratios(results: list[Result], params: Params) -> Iterator[Result]:
    """The hint's median over window 1's median, for p50 and p99, where both were seen."""
    for metric, ratio in (
        ("e2e_latency_p50_ms", "e2e_p50_vs_window_1"),
        ("e2e_latency_p99_ms", "e2e_p99_vs_window_1"),
    ):
        hinted = [r.value for r in results if r.system == SYSTEMS[0] and r.metric == metric]
        fixed = [r.value for r in results if r.system == SYSTEMS[1] and r.metric == metric]
        if hinted and fixed:
            yield Result(BENCH, SYSTEMS[0], ratio, median(hinted) / median(fixed), "x", params)


def _results(system: str, m: Measurement, params: Params) -> Iterator[Result]:
    if len(m.latencies_ms) < m.sent:
        params = {**params, "arrived": len(m.latencies_ms), "sent": m.sent}
    if m.latencies_ms:
        for q, metric in ((50, "e2e_latency_p50_ms"), (99, "e2e_latency_p99_ms")):
            yield Result(BENCH, system, metric, percentile(m.latencies_ms, q), "ms", params)
    yield Result(BENCH, system, "broker_cpu_cores", m.broker_cpu_cores, "cores", params)


async def measure_cell(directory: Path, cell: Cell, system: str, seconds: float) -> Measurement:
    """One run of ``system`` at ``cell`` on a broker started for it in ``directory``."""
    broker = Broker(directory)
    await broker.start()
    try:
        await broker.create_topic(TOPIC, cell.partitions)
        window = None if system == "headrace" else 1
        async with AsyncProducer(broker.address, linger_ms=0, max_in_flight=window) as producer:
            sent = 0

            async def send(payload: bytes) -> None:
                nonlocal sent
                sent += 1
                await producer.publish(TOPIC, payload, partition=sent % cell.partitions)

            consume = e2e_consumer(broker.address, TOPIC, SUBSCRIPTION)
            cpu_before, started = _cpu_s(broker.process.pid), time.monotonic()
            latencies = await measure_e2e(cell.rate, seconds, send, consume)
            cores = (_cpu_s(broker.process.pid) - cpu_before) / (time.monotonic() - started)
    finally:
        await asyncio.to_thread(broker.stop)
    latencies.sort()
    return Measurement(latencies, sent, cores)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system, every thread) the process ``pid`` used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
