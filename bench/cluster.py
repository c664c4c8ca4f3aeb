"""Scenario ``cluster``: aggregate throughput of 1, 2, ... brokers in cluster mode, in one run.

Owns the cells of the run, starting and stopping each cell's system, the placement check,
the client processes' go signal and CPU accounting, the first-request latencies, and the
derived rows and goal (issue 36, "Benchmark").

Cells, in this order, each on a fresh data directory:

1. ``headrace`` (``mode=single``): one ``headrace serve`` with no cluster settings (no
   etcd): the peer that shows what cluster mode itself costs.
2. ``headrace-cluster`` with ``brokers=N`` for each N of ``--brokers`` (default
   ``1..min(cores, 4)``): a real etcd (one member: a bench needs no quorum, and a client
   write path never touches etcd) and N real ``headrace serve --cluster-etcd`` processes,
   started with :mod:`broker.cli_cluster`'s own plan (the argv ``headrace cluster local``
   runs), each with ``max_unacked`` 20,000 as in ``bench pubsub``.

In every cell the same :data:`TOPICS` topics of :data:`PARTITIONS` partitions, one copy
each (``replication_factor`` 1, not the cluster's default 3), are created through the seed
list; in a cluster the run checks that placement gave every broker at
least one (it stops otherwise) and reports ``topics_owned`` per node id. Then, with 100 B
payloads:

- ``publish_records_s``: one producer process per topic (:mod:`bench._cluster_client`:
  ``bench pubsub``'s headline publish shape, an idempotent ``AsyncProducer`` and
  ``send_many``), each routed by the client library from the whole seed list; all start
  together on one go signal; the figure is every acknowledged record over the time from
  the first start to the last end.
- ``consume_records_s``: then one consumer process per topic, from ``earliest``, the same
  way.
- Per phase, the CPU each side used over that window (each broker thread's
  ``schedstat``, each client's own process time, ``/proc/stat`` for the whole machine):
  ``broker_cpu_us_per_record``, ``client_cpu_us_per_record``, and ``broker_cores_used``,
  ``client_cores_used`` and ``machine_cores_busy`` (CPU seconds over the window: how
  much of the machine each side had, and how much was busy in all, others' load
  included).
- ``first_request_latency_p50_ms`` / ``_p99_ms`` in the first round's cell of the
  smallest broker count of 2 or more: a fresh producer per sample, timed from its
  construction to the acknowledgement of its first ``publish``; ``seed=owner`` with the
  topic's owner as its only seed, ``seed=non-owner`` with another broker (refused with
  the owner's address, resent there), alternated, :data:`LATENCY_CLIENTS` of each.

Every cell runs :attr:`Sizes.rounds` times, the cells alternated within each round, so
that load from elsewhere on the machine falls on all of them; each row carries its
``round``. The derived rows use, per cell, the round with the median publish rate.

Derived rows (system ``headrace-cluster``): ``publish_scaling_x`` and
``consume_scaling_x`` (N brokers over 1, same run), judged for N = 2 against the goal
(``>= 1.5``); ``publish_ceiling_x``: the most N brokers could gain here if CPU were the
only limit, from the 1-broker cell's per-record CPU costs: with ``b`` broker and ``c``
client CPU seconds per record and ``k`` cores, one broker peaks at ``min(1/b, k/(b+c))``
records/s and N at ``min(N/b, k/(b+c))``; when the clients cost as much as the broker
(``c >= b``) on 2 cores, one broker is not the bottleneck and the ceiling is 1.0; and
``cluster_mode_cost_x`` (single-broker mode over the 1-broker cluster).

Depends on the client library, :mod:`broker.cli_cluster` (the local cluster's plan, etcd
health, broker health and stop order) and ``etcd`` on the PATH.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench._cluster_client import Spec
from bench._headrace_pubsub import MAX_UNACKED, probe_admin, serve_process
from bench._machine import usable_cores
from bench._measure import new_runner, per_second, percentile
from bench._output import Goal, Params, Result
from bench._scenario import RunOptions
from bench._server_process import ServerFailedError, ServerProcess, wait_until_serving
from broker.cli_cluster import INSTALL_ETCD, _Child, _etcd_healthy, _plan, _serving, _stop_all
from client import AsyncAdminClient, AsyncProducer

BENCH = "cluster"
SINGLE = "headrace"
CLUSTER = "headrace-cluster"
#: Topics in every cell (at least one per broker: the most brokers a default run uses).
TOPICS = 4
PARTITIONS = 2
PAYLOAD_BYTES = 100
#: Fresh clients per seed kind in the first-request latency.
LATENCY_CLIENTS = 50
#: The scaling goal of issue 36: 2 brokers over 1, publish, same run (physical limit 2x).
SCALING_GOAL = Goal(">=", 1.5)
#: How long a cell may take to start (etcd, every broker serving), seconds.
START_WITHIN_S = 60.0
#: How long a client phase may take, seconds.
PHASE_WITHIN_S = 600.0


@dataclass(frozen=True, slots=True)
class Sizes:
    """Records each producer sends, how many fresh clients the latency takes per kind, and
    how many rounds of every cell run (alternated, so load from elsewhere falls on each)."""

    records_per_topic: int
    latency_clients: int
    rounds: int


#: 8 M records a phase: 5-9 s here (0.85-1.7 M records/s as the load varied), three rounds.
FULL = Sizes(records_per_topic=2_000_000, latency_clients=LATENCY_CLIENTS, rounds=3)
#: About 0.3 s per phase, one round: a smoke run of the whole path.
QUICK = Sizes(records_per_topic=100_000, latency_clients=10, rounds=1)


def default_brokers(cores: int | None = None) -> tuple[int, ...]:
    """``1..min(cores, 4)``: on this 2-core machine ``(1, 2)``; at least ``(1, 2)``."""
    top = max(2, min(cores if cores is not None else usable_cores(), 4))
    return tuple(range(1, top + 1))


def parse_brokers(text: str) -> tuple[int, ...]:
    """``"1,2"`` -> ``(1, 2)``: distinct counts from 1 to :data:`TOPICS`, ascending.

    Raises:
        ValueError: a count is not an integer in range.
    """
    counts = sorted({int(part) for part in text.split(",") if part.strip()})
    if not counts or counts[0] < 1 or counts[-1] > TOPICS:
        raise ValueError(f"broker counts must be within 1..{TOPICS}, got {text!r}")
    return tuple(counts)


# ---------------------------------------------------------------------------------------
# Systems: one broker without etcd, or etcd plus N brokers


@dataclass(slots=True)
class _System:
    """A running cell: its seed list, broker addresses by node id and broker pids."""

    seeds: str
    nodes: dict[str, str]
    pids: list[int]
    children: list[_Child] = field(default_factory=list)
    single: ServerProcess | None = None

    def stop(self) -> None:
        if self.single is not None:
            self.single.stop()
        if self.children:
            _stop_all(self.children)


def _config(directory: Path) -> Path:
    path = directory / "headrace.toml"
    path.write_text(f"[broker]\nmax_unacked = {MAX_UNACKED}\n")
    return path


async def _start_single(directory: Path) -> _System:
    process, address = serve_process(directory, f"[broker]\nmax_unacked = {MAX_UNACKED}\n")
    process.start()
    system = _System(address, {"local": address}, [], single=process)
    try:
        await wait_until_serving(
            lambda: probe_admin(address), timeout_s=START_WITHIN_S, process=process
        )
    except BaseException:
        system.stop()
        raise
    system.pids.append(process.pid)
    return system


def _ports_free(ports: Sequence[int]) -> bool:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _free_base(brokers: int) -> int:
    """A base port for :func:`broker.cli_cluster._plan` whose every port is free now."""
    for _ in range(200):
        base = random.randrange(20_000, 40_000)
        wanted = [base, base + 100, *(base + i for i in range(1, brokers + 1))]
        if _ports_free(wanted):
            return base
    raise ServerFailedError("no free loopback ports for etcd and the brokers")


def _start_cluster(directory: Path, brokers: int) -> _System:
    """etcd, then ``brokers`` brokers in cluster mode; returns once each one serves."""
    etcd = shutil.which("etcd")
    if etcd is None:
        raise ServerFailedError(INSTALL_ETCD)
    base = _free_base(brokers)
    config = _config(directory)
    children = _plan(etcd, directory, brokers, base)
    for child in children[1:]:  # quiet, no metrics listener, the bench's broker settings
        child.argv += ["--config", str(config), "--metrics-listen", "", "--log-level", "WARNING"]
    system = _System(
        ",".join(c.ready for c in children[1:]),
        {c.name: c.ready for c in children[1:]},
        [],
        children=children,
    )
    try:
        children[0].start()
        _wait(children[0], lambda: _etcd_healthy(f"127.0.0.1:{base}"))
        for child in children[1:]:
            child.start()
        for child in children[1:]:
            _wait(child, functools.partial(_serving, child.ready))
    except BaseException:
        system.stop()
        raise
    system.pids += [c.process.pid for c in children[1:] if c.process is not None]
    return system


def _wait(child: _Child, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + START_WITHIN_S
    while not ready():
        if child.exited() is not None or time.monotonic() > deadline:
            raise ServerFailedError(f"{child.name} did not serve: {child.last_lines()}")
        time.sleep(0.05)


async def _create_topics(system: _System, clustered: bool) -> dict[str, str]:
    """Create :data:`TOPICS` topics through the seeds; return topic -> owner node id.

    One copy each (``replication_factor`` 1, which a single broker takes too): the
    scenario measures how publish load spreads over N owners (issue 36); the cluster's
    default factor 3 would make every broker hold and fetch every topic. Replication's
    cost is the ``replication`` scenario's.

    Raises:
        ServerFailedError: in a cluster, a broker was given no topic.
    """
    names = [f"bench-cluster-{i}" for i in range(TOPICS)]
    async with AsyncAdminClient(system.seeds) as admin:
        for name in names:
            await admin.create_topic(name, PARTITIONS, replication_factor=1)
        owners = {t.name: t.owner or "local" for t in await admin.list_topics() if t.name in names}
    if clustered and set(owners.values()) != set(system.nodes):
        raise ServerFailedError(f"placement left a broker without a topic: {owners}")
    return owners


# ---------------------------------------------------------------------------------------
# Client phases


def _cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has run so far, summed over its live threads.

    From each thread's ``schedstat`` (nanoseconds) rather than ``stat`` (clock ticks of
    10 ms: a quick run's whole broker CPU is a few ticks). A thread that ended during the
    window takes its time with it; the broker's threads (gRPC's, the loop's executor)
    live as long as it does.
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def _machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent not idle so far (``/proc/stat``:
    all but idle and iowait), whoever spent them."""
    with open("/proc/stat", encoding="ascii") as stat:
        ticks = [int(n) for n in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Phase:
    """One client phase's outcome: records, wall window, and CPU by side (``machine_cpu_s``:
    every process's, the bench's and anything else running on the machine)."""

    records: int
    seconds: float
    broker_cpu_s: float
    client_cpu_s: float
    machine_cpu_s: float = 0.0

    @property
    def records_s(self) -> float:
        return per_second(self.records, self.seconds)


def run_phase(specs: Sequence[Spec], broker_pids: Sequence[int]) -> Phase:
    """Start one client process per spec, wait for each ``ready``, send ``go`` to all,
    and gather their results; the brokers' CPU is read around the whole window.

    Raises:
        ServerFailedError: a client failed or sent no result.
    """
    argv = [sys.executable, "-m", "bench._cluster_client"]
    procs = [
        subprocess.Popen(
            [*argv, spec.to_json()], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for spec in specs
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise ServerFailedError(f"a {specs[0].role} client did not get ready")
        before = sum(_cpu_s(pid) for pid in broker_pids)
        busy = _machine_busy_s()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outs = [_result(proc) for proc in procs]
        after = sum(_cpu_s(pid) for pid in broker_pids)
        busy = _machine_busy_s() - busy
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    start = min(o["start"] for o in outs)
    end = max(o["end"] for o in outs)
    return Phase(
        records=int(sum(o["records"] for o in outs)),
        seconds=end - start,
        broker_cpu_s=after - before,
        client_cpu_s=sum(o["cpu_s"] for o in outs),
        machine_cpu_s=busy,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=PHASE_WITHIN_S)
    if proc.returncode != 0 or not out.strip():
        raise ServerFailedError(f"a client exited with code {proc.returncode}")
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


async def first_request_ms(seed: str, topic: str) -> float:
    """Milliseconds from a fresh producer's construction (seed list ``seed``) to the
    acknowledgement of its first publish to ``topic``."""
    started = time.perf_counter()
    async with AsyncProducer(seed, linger_ms=0) as producer:
        await producer.publish(topic, b"x" * PAYLOAD_BYTES)
        elapsed = time.perf_counter() - started
    return elapsed * 1e3


async def first_requests(
    system: _System, owners: dict[str, str], clients: int
) -> dict[str, list[float]]:
    """``clients`` first-request latencies through the owner and through a non-owner,
    alternated, over the topics in turn."""
    samples: dict[str, list[float]] = {"owner": [], "non-owner": []}
    topics = sorted(owners)
    for i in range(clients):
        topic = topics[i % len(topics)]
        owner = owners[topic]
        other = next(node for node in sorted(system.nodes) if node != owner)
        samples["owner"].append(await first_request_ms(system.nodes[owner], topic))
        samples["non-owner"].append(await first_request_ms(system.nodes[other], topic))
    return samples


# ---------------------------------------------------------------------------------------
# The run


@dataclass(frozen=True, slots=True)
class Cell:
    """What one cell measured."""

    system: str
    brokers: int
    publish: Phase
    consume: Phase
    latency: dict[str, list[float]]
    #: Topics each broker (node id) owned: ``{"local": TOPICS}`` for the single broker.
    owned: dict[str, int]


def measure_cell(
    directory: Path, brokers: int, clustered: bool, sizes: Sizes, *, latency: bool
) -> Cell:
    """Start the cell's system, create and place the topics, run both phases (and the
    first-request latencies when asked), stop it."""
    _, runner = new_runner()
    with runner:
        if clustered:
            system = _start_cluster(directory, brokers)
        else:
            system = runner.run(_start_single(directory))
        try:
            owners = runner.run(_create_topics(system, clustered))
            specs = [
                Spec("produce", system.seeds, topic, sizes.records_per_topic, PAYLOAD_BYTES)
                for topic in sorted(owners)
            ]
            publish = run_phase(specs, system.pids)
            taken = sizes.records_per_topic + 1  # the warm-up record
            consume = run_phase(
                [Spec("consume", s.seeds, s.topic, taken) for s in specs], system.pids
            )
            samples: dict[str, list[float]] = {}
            if latency:
                samples = runner.run(first_requests(system, owners, sizes.latency_clients))
        finally:
            system.stop()
    owned = {node: sum(1 for o in owners.values() if o == node) for node in system.nodes}
    return Cell(CLUSTER if clustered else SINGLE, brokers, publish, consume, samples, owned)


def run(options: RunOptions, brokers: Sequence[int] | None = None) -> Iterator[Result]:
    """Every round runs every cell in order (the single-broker peer, then each broker
    count); then the derived rows (over each cell's median round) and the goal."""
    if shutil.which("etcd") is None:  # before any cell: not after a minute of the others
        raise ServerFailedError(INSTALL_ETCD)
    sizes = QUICK if options.quick else FULL
    counts = tuple(sorted({1, *brokers})) if brokers else default_brokers()  # 1: the base
    cores = usable_cores()
    base: Params = {
        "topics": TOPICS,
        "partitions": PARTITIONS,
        "producers": TOPICS,
        "records": TOPICS * sizes.records_per_topic,
        "payload_bytes": PAYLOAD_BYTES,
        "fsync": "always",
        "cores": cores,
    }
    cells: list[Cell] = []
    plan = [(1, False), *((n, True) for n in counts)]
    for round_ in range(1, sizes.rounds + 1):
        for n, clustered in plan:
            name = f"{'cluster' if clustered else 'single'}-{n}-{round_}"
            directory = options.data_dir / name
            directory.mkdir()
            latency = round_ == 1 and clustered and n == next((c for c in counts if c >= 2), 0)
            cell = measure_cell(directory, n, clustered, sizes, latency=latency)
            cells.append(cell)
            yield from cell_results(cell, {**base, "round": round_})
    yield from derived(median_cells(cells), {**base, "rounds": sizes.rounds}, cores)


def median_cells(cells: Sequence[Cell]) -> list[Cell]:
    """One cell per (system, brokers): the round with the median publish rate (the lower
    middle one of an even count), in first-seen order."""
    groups: dict[tuple[str, int], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.system, cell.brokers), []).append(cell)
    return [
        sorted(group, key=lambda c: c.publish.records_s)[(len(group) - 1) // 2]
        for group in groups.values()
    ]


def cell_results(cell: Cell, base: Params) -> Iterator[Result]:
    """The measured rows of one cell."""
    params: Params = {
        "mode": "cluster" if cell.system == CLUSTER else "single",
        "brokers": cell.brokers,
        **base,
    }
    for node, topics in sorted(cell.owned.items()):
        p: Params = {"brokers": cell.brokers, "node": node, "round": base["round"]}
        yield Result(BENCH, cell.system, "topics_owned", topics, "topics", p)
    for phase_name, phase in (("publish", cell.publish), ("consume", cell.consume)):
        p = {**params, "phase": phase_name}
        yield Result(BENCH, cell.system, f"{phase_name}_records_s", phase.records_s, "records/s", p)
        per_record = 1e6 / max(phase.records, 1)
        yield Result(
            BENCH, cell.system, "broker_cpu_us_per_record", phase.broker_cpu_s * per_record, "us", p
        )
        yield Result(
            BENCH, cell.system, "client_cpu_us_per_record", phase.client_cpu_s * per_record, "us", p
        )
        window = max(phase.seconds, 1e-9)
        for metric, cpu_s in (
            ("broker_cores_used", phase.broker_cpu_s),
            ("client_cores_used", phase.client_cpu_s),
            ("machine_cores_busy", phase.machine_cpu_s),
        ):
            yield Result(BENCH, cell.system, metric, cpu_s / window, "cores", p)
    for seed, samples in cell.latency.items():
        ordered = sorted(samples)
        p = {"brokers": cell.brokers, "seed": seed, "clients": len(ordered)}
        for q in (50, 99):
            value = percentile(ordered, q)
            yield Result(BENCH, cell.system, f"first_request_latency_p{q}_ms", value, "ms", p)


def ceiling_x(broker_cpu: float, client_cpu: float, cores: int, brokers: int) -> float:
    """The CPU-only ceiling of ``brokers`` brokers' publish rate over one broker's, given
    per-record CPU seconds of the brokers and the clients and the machine's ``cores``
    (pure: see the module docstring)."""
    shared = cores / (broker_cpu + client_cpu)
    return min(brokers / broker_cpu, shared) / min(1 / broker_cpu, shared)


def derived(cells: Sequence[Cell], base: Params, cores: int) -> Iterator[Result]:
    """Scaling over the 1-broker cluster cell, its CPU ceiling, and cluster mode's cost."""
    by_count = {c.brokers: c for c in cells if c.system == CLUSTER}
    single = next((c for c in cells if c.system == SINGLE), None)
    one = by_count.get(1)
    if one is None:
        return
    if single is not None:
        cost = per_second(single.publish.records_s, one.publish.records_s)
        yield Result(BENCH, CLUSTER, "cluster_mode_cost_x", cost, "x", {**base, "vs": "single"})
    b = one.publish.broker_cpu_s / max(one.publish.records, 1)
    c = one.publish.client_cpu_s / max(one.publish.records, 1)
    for n, cell in sorted(by_count.items()):
        if n == 1:
            continue
        params: Params = {**base, "brokers": n, "vs_brokers": 1}
        ceiling = ceiling_x(b, c, cores, n) if b > 0 and c > 0 else float(n)
        yield Result(BENCH, CLUSTER, "publish_ceiling_x", ceiling, "x", params)
        consume = per_second(cell.consume.records_s, one.consume.records_s)
        yield Result(BENCH, CLUSTER, "consume_scaling_x", consume, "x", params)
        publish = per_second(cell.publish.records_s, one.publish.records_s)
        if n == 2:
            params = {**params, **SCALING_GOAL.params(publish)}
        yield Result(BENCH, CLUSTER, "publish_scaling_x", publish, "x", params)
