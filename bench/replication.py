"""Scenario ``replication``: Headrace beside replicated peers, in one run (issue 37).

Owns which systems run (and finding their servers), the phases each goes through, the
results, the goals, the human table's footnotes, and the extension points that the
replication work fills (:func:`headrace_r3_entry`, :func:`failover_results`).

Systems, in this order, each on a fresh data directory and its own event loop (uvloop
when importable), on loopback, every write synced before it is acknowledged:

- ``headrace-r1``: one ``headrace serve`` (replication factor 1, fsync ``always``), through
  the public client (:class:`bench._headrace_pubsub.HeadraceSystem`, as ``bench pubsub``
  drives it).
- ``headrace-r3``: factor 3 with ``min_insync_replicas`` 2 over a real three-broker
  cluster and a three-member etcd, fsync ``always``, through the same client and phases
  as ``headrace-r1`` (:mod:`bench._replication_headrace`); skipped without ``etcd``.
- ``nats-jetstream-r3``: three nats-servers, ``sync_interval: always``, a three-replica
  file stream (:mod:`bench._replication_nats`).
- ``redis-wait1``: a Redis primary and one replica, ``appendfsync always`` on both, each
  ``XADD`` followed by ``WAIT 1`` (:mod:`bench._replication_redis`).

Every system runs :attr:`Sizes.rounds` times (three; once with ``--quick``), the systems
alternated within each round so that load from elsewhere on the machine falls on all of
them; each row carries its ``round``. Each run goes through, with 100 B payloads
(:class:`Sizes`: 100,000 messages and 10 s of e2e; 5,000 and 2 s with ``--quick``):

1. ``publish_msgs_s``: publish the messages with the most in flight its client and the
   acknowledgement rule allow (Headrace: one ``send_many``; JetStream: windows of 4,000
   ``publish_async``; Redis: 64 connections, each write its ``XADD`` + ``WAIT 1``), every
   one acknowledged.
   Beside it, for the Headrace systems (:class:`BrokerPids`), the CPU each broker process
   spent in that phase per record published (:func:`process_cpu_s`: every thread's time
   on a CPU, user and system, from ``/proc/<pid>/task/*/schedstat``, in ns):
   ``cpu_us_per_record_leader`` (the topic's leader; at factor 1 the one broker) and, at
   factor 3, ``cpu_us_per_record_followers`` (the mean of the two followers; ``each``
   gives both, ``processes`` how many). The client's own CPU is not in them.
2. ``e2e_latency_p50_ms``, ``e2e_latency_p99_ms``: an open-loop publisher at
   :data:`E2E_RATE` msg/s (the same for every system, below each one's publish rate here)
   and a concurrent consumer; latency from each message's scheduled send time to its
   receipt (:func:`bench._pubsub_system.measure_e2e`: no coordinated omission). With
   ``--plot`` every latency goes to the sample log (``e2e_latency_quantile_ms``).

Every row's params carry ``fsync``, ``replicas`` (copies of each write), ``acked`` (what
the acknowledgement waits for), ``version``, ``payload_bytes``, ``messages``,
``e2e_rate_msg_s``, ``e2e_seconds``, ``loop``, ``load_1m`` (the machine's load average
when the system's run began) and ``round``. Then :func:`failover_results` (leadership
transfer, leader SIGTERM and SIGKILL under a publisher, on a cluster of their own), then
the goals of issue 37 (:func:`derive_goals`, on each system's median round), judged only
when ``headrace-r3`` is measured. A peer that cannot run here is skipped with the reason on
stderr; a system that fails midway is reported on stderr, stopped, and the run goes on.

Environment:
    HEADRACE_BENCH_SYSTEMS: Comma-separated system names to run (default: all).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.metadata
import importlib.util
import os
import shutil
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from bench._headrace_pubsub import HeadraceSystem
from bench._measure import new_runner, per_second, percentile
from bench._output import Goal, Params, PeerGoal, Result
from bench._peers import Peer
from bench._pubsub_system import E2E_PAYLOAD_BYTES
from bench._samples import SampleLog
from bench._scenario import RunOptions
from bench._server_process import ServerFailedError

if TYPE_CHECKING:
    from bench._replication_headrace import Failover

BENCH = "replication"
R1, R3 = "headrace-r1", "headrace-r3"
NATS_R3, REDIS_WAIT1 = "nats-jetstream-r3", "redis-wait1"
SYSTEMS = (R1, R3, NATS_R3, REDIS_WAIT1)
SYSTEMS_ENV = "HEADRACE_BENCH_SYSTEMS"
#: The e2e phase's offered rate, msg/s, for every system: below half of the slowest
#: publish rate measured here (Redis with WAIT 1: 4,700-12,600 msg/s in full runs at load
#: averages of 2.8-7.7 on the 2 cores, and 2,161 at 9, where an offered 2,000 msg/s,
#: ``bench pubsub``'s rate, saturated it and its e2e p50 grew to seconds).
E2E_RATE = 1000.0
#: The metric of the e2e latency distributions in the sample log.
E2E_SERIES = "e2e_latency_quantile_ms"
#: The Redis peer as ``bench.pubsub.find_servers`` looks it up (Debian's redis-server).
REDIS_PEER = Peer(REDIS_WAIT1, "redis-server", "redis-server", "redis", "redis")

Warn = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each system does.

    Attributes:
        messages: Messages published in the throughput phase.
        rounds: Runs of every system, the systems alternated within each round.
        e2e_rate: Messages per second of the paced e2e publisher.
        e2e_seconds: How long it publishes.
        payload_bytes: Size of every payload.
        failover_attempts: Attempts of each failover kind (transfer, SIGTERM, SIGKILL).
        session_ttl_s: The failover cluster's session TTL (the broker's default: 10 s).
    """

    messages: int
    rounds: int = 3
    e2e_rate: float = E2E_RATE
    e2e_seconds: float = 10.0
    payload_bytes: int = E2E_PAYLOAD_BYTES
    failover_attempts: int = 5
    session_ttl_s: int = 10

    @property
    def e2e_messages(self) -> int:
        """Messages the e2e publisher sends."""
        return round(self.e2e_rate * self.e2e_seconds)


#: 100,000 messages: 2-7 s for JetStream R3 and 8-45 s for Redis with WAIT 1 here (by
#: load); a round of the three systems took about a minute, a full run 2.5-3 minutes.
FULL = Sizes(100_000)
#: A few seconds per system, one round: smoke runs and the tests.
QUICK = Sizes(5_000, rounds=1, e2e_seconds=2.0, failover_attempts=1, session_ttl_s=2)


class ReplicatedSystem(Protocol):
    """A system of this scenario: a server (or several) and its Python client.

    Built with a fresh data directory it owns; servers on free 127.0.0.1 ports. Driven
    by one task; not task-safe.
    """

    system: str
    fsync: str
    #: Copies of each acknowledged write, and what the acknowledgement waits for.
    replicas: int
    acked: str
    #: The server's version (known once started).
    version: str

    async def start(self) -> None:
        """Start the servers; return once a publish can be acknowledged as timed."""
        ...

    async def publish(self, count: int, payload: bytes) -> float:
        """Seconds to publish ``count`` messages, every one acknowledged."""
        ...

    async def e2e(self, rate: float, seconds: float) -> list[float]:
        """Latencies in ms: an open-loop paced publisher and a concurrent consumer."""
        ...

    async def stop(self) -> None:
        """Stop the clients and the servers; always safe to call."""
        ...


@runtime_checkable
class BrokerPids(Protocol):
    """A system whose broker processes' CPU the publish phase measures."""

    async def broker_pids(self) -> tuple[int, list[int]]:
        """The process ids of the publish topic's leader and of its followers."""
        ...


class HeadraceR1(HeadraceSystem):
    """Headrace at replication factor 1: one ``headrace serve``, fsync ``always``."""

    system = R1
    replicas = 1
    acked = "synced"

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.version = importlib.metadata.version("headrace")

    async def broker_pids(self) -> tuple[int, list[int]]:
        """The one broker leads; no followers."""
        return self._process.pid, []


def process_cpu_s(pid: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user and system) process ``pid``'s live threads have run: the sum of
    the first field of each ``task/<tid>/schedstat`` (ns on a CPU). Nanoseconds where
    ``/proc/<pid>/stat`` counts clock ticks (10 ms), so a quick run's few milliseconds are
    seen; a thread that exits between two readings takes its time with it (a broker's
    threads live as long as it does). A thread gone while being read counts 0."""
    total = 0
    for task in (proc / str(pid) / "task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text(encoding="ascii").split()[0])
    return total / 1e9


@dataclass(frozen=True, slots=True)
class Entry:
    """One system to measure: the name it is selected by, and how to build it in a
    directory."""

    name: str
    build: Callable[[Path], ReplicatedSystem]


# ---------------------------------------------------------------------------------------
# Extension points: what the replication work (issue 37) fills in


def headrace_r3_entry() -> Entry:
    """``headrace-r3``: Headrace at replication factor 3, ``min_insync_replicas`` 2, over a
    real three-broker cluster and a three-member etcd
    (:class:`bench._replication_headrace.HeadraceR3`), measured by the same phases as
    every system; its rows are judged by :func:`derive_goals`."""
    from bench._replication_headrace import HeadraceR3

    return Entry(R3, HeadraceR3)


def failover_results(
    options: RunOptions, sizes: Sizes, *, warn: Warn = _stderr
) -> Iterator[Result]:
    """The failover rows of issue 37, run after the systems on a fresh cluster of their
    own (:func:`bench._replication_headrace.measure_failover`, :attr:`Sizes.failover_attempts`
    attempts of each kind, the brokers' session TTL :attr:`Sizes.session_ttl_s`):

    - ``failover_sigkill_s``: the leader SIGKILLed under a publisher: the median of the
      attempts' time to the first acknowledged publish of a record sent at or after the
      kill, judged by :func:`failover_sigkill_goal`; ``failover_sigkill_max_s``, the
      slowest attempt, judged the same way;
    - ``failover_graceful_s`` and ``failover_graceful_max_s``: the leader SIGTERMed (its
      controlled shutdown hands the topic to an in-sync follower), judged by
      :data:`FAILOVER_GRACEFUL_GOAL`;
    - ``failover_transfer_s`` and ``failover_transfer_max_s``: a leadership transfer the
      bench writes to etcd as an operator tool would, judged the same way.

    Each row's params carry ``attempts``, ``session_ttl_s``, ``min_s``, ``elected_s`` (the
    median time until etcd's record named the new leader), ``pause_s`` and
    ``max_pause_s`` (the median and longest of the attempts' longest pause between two
    acknowledgements: what a writer saw stall), ``after_election_s`` and
    ``max_after_election_s`` (the median and longest of the attempts' time from that
    record to the first acknowledgement), ``failed`` (records the producer saw fail: 0
    expected) and ``version``. Nothing when ``headrace-r3`` is not
    selected (``HEADRACE_BENCH_SYSTEMS``) or etcd is missing (said on stderr); a failure
    is reported on stderr and yields nothing.
    """
    selected, _ = select_systems(os.environ.get(SYSTEMS_ENV))
    if R3 not in selected or sizes.failover_attempts < 1:
        return
    if shutil.which("etcd") is None:
        warn(
            f"bench: {BENCH}: skipping failover: etcd is not installed "
            "(apt-get install etcd-server)"
        )
        return
    from bench._replication_headrace import measure_failover

    directory = options.data_dir / "failover"
    directory.mkdir(parents=True)
    loop, runner = new_runner()
    try:
        with runner:
            gc.collect()
            got = runner.run(
                measure_failover(directory, sizes.session_ttl_s, sizes.failover_attempts)
            )
    except Exception as exc:  # report, as a failed system is
        warn(f"bench: {BENCH}: failover failed: {exc!r}")
        return
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if got.stopped:
        warn(f"bench: {BENCH}: failover stopped early: {got.stopped}")
    yield from failover_rows(got, loop)


def failover_rows(got: Failover, loop: str) -> Iterator[Result]:
    """The rows of :func:`failover_results` from the attempts measured (pure): per kind
    with at least one attempt, the median and the slowest, each judged by its goal."""
    from bench._replication_headrace import FAILOVER_RATE

    base: Params = {
        "session_ttl_s": got.ttl_s,
        "failed": len(got.failed),
        "rate_msg_s": FAILOVER_RATE,
        "loop": loop,
        "version": importlib.metadata.version("headrace"),
    }
    for kind, attempts, goal in (
        ("sigkill", got.sigkill, failover_sigkill_goal(got.ttl_s)),
        ("graceful", got.graceful, FAILOVER_GRACEFUL_GOAL),
        ("transfer", got.transfer, FAILOVER_GRACEFUL_GOAL),
    ):
        if not attempts:
            continue
        times = [a.acked_s for a in attempts]
        after = [a.acked_s - a.elected_s for a in attempts]
        params: Params = {
            **base,
            "attempts": len(attempts),
            "min_s": round(min(times), 4),
            "elected_s": round(statistics.median(a.elected_s for a in attempts), 4),
            "pause_s": round(statistics.median(a.pause_s for a in attempts), 4),
            "max_pause_s": round(max(a.pause_s for a in attempts), 4),
            # From the record naming the new leader to the first ack: the part after the
            # election (the new leader's start, the follower's switch, the client's pause).
            "after_election_s": round(statistics.median(after), 4),
            "max_after_election_s": round(max(after), 4),
        }
        for metric, value in (
            (f"failover_{kind}_s", statistics.median(times)),
            (f"failover_{kind}_max_s", max(times)),
        ):
            yield Result(BENCH, R3, metric, value, "s", {**params, **goal.params(value)})


#: A graceful leadership change (controlled shutdown, transfer): the first acknowledged
#: publish within 200 ms.
FAILOVER_GRACEFUL_GOAL = Goal("<=", 0.2)


def failover_sigkill_goal(session_ttl_s: float) -> Goal:
    """After a leader's SIGKILL: the first acknowledged publish within the session TTL
    plus one second."""
    return Goal("<=", session_ttl_s + 1.0)


def notes() -> list[str]:
    """The footnotes under the human tables: what the rows mean, and what is not there."""
    lines = [
        f"e2e: an open-loop publisher at {E2E_RATE:,.0f} msg/s for every system; latency from "
        "each message's scheduled send time to its receipt by a consumer.",
        "redis-wait1: WAIT 1 after every write (one write in flight per connection, 64 "
        "connections); WAIT counts a replica that applied the write, not one that fsynced "
        "it; a reader of the primary sees a write before its WAIT returns.",
        "nats-jetstream-r3: acknowledged once 2 of the 3 servers stored it (sync_interval: "
        "always); the clients connect to the stream leader's server.",
    ]
    lines += [
        "headrace-r3: three brokers and a three-member etcd on loopback, replication factor "
        "3, min_insync_replicas 2; acknowledged once every replica in the in-sync set (all "
        "three while they keep up, never fewer than 2) synced it.",
        "failover: a producer sends 1,000 msg/s to a topic of factor 3; the figure is the "
        "time from the event (the leader's SIGKILL; its SIGTERM, a controlled shutdown; a "
        "leadership transfer written to etcd by the bench, as an operator tool would) to "
        "the first acknowledged record sent at or after it; the goal after a SIGKILL is the "
        "session TTL + 1 s, 200 ms for the others.",
        "cpu_us_per_record_*: each broker process's CPU (every thread, user and system) "
        "during the publish phase, per record published: the topic's leader, and the mean "
        "of its followers; the client's and etcd's CPU are not in them.",
    ]
    return lines


# ---------------------------------------------------------------------------------------
# Which systems run


def select_systems(value: str | None) -> tuple[list[str], list[str]]:
    """Parse ``HEADRACE_BENCH_SYSTEMS``: (known names in run order, unknown names).
    Empty or unset selects every system."""
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    if not names:
        return list(SYSTEMS), []
    return [s for s in SYSTEMS if s in names], [n for n in names if n not in SYSTEMS]


def default_entries(
    selected: Sequence[str],
    *,
    has_module: Callable[[str], bool] | None = None,
    warn: Warn = _stderr,
) -> list[Entry]:
    """The entries of the ``selected`` systems that can run here, in run order; the others
    are skipped with the reason on stderr."""
    has_module = has_module or (lambda name: importlib.util.find_spec(name) is not None)
    entries: list[Entry] = []
    if R1 in selected:
        entries.append(Entry(R1, HeadraceR1))
    if R3 in selected:
        if shutil.which("etcd") is None:
            warn(
                f"bench: {BENCH}: skipping {R3}: etcd is not installed "
                "(apt-get install etcd-server)"
            )
        else:
            entries.append(headrace_r3_entry())
    if NATS_R3 in selected:
        entries += _nats_entry(has_module, warn)
    if REDIS_WAIT1 in selected:
        entries += _redis_entry(has_module, warn)
    return entries


def _nats_entry(has_module: Callable[[str], bool], warn: Warn) -> list[Entry]:
    if not has_module("nats"):
        warn(
            f"bench: {BENCH}: skipping {NATS_R3}: its Python client nats-py is not installed "
            "(pip install -e '.[bench]')"
        )
        return []
    from bench._replication_nats import NatsJetStreamR3, find_nats_server

    found = find_nats_server(warn=warn)
    if found is None:
        return []
    binary, version = found
    return [Entry(NATS_R3, lambda d: NatsJetStreamR3(d, binary=binary, version=version))]


def _redis_entry(has_module: Callable[[str], bool], warn: Warn) -> list[Entry]:
    from bench._replication_redis import RedisWait1
    from bench.pubsub import find_servers

    servers = find_servers([REDIS_PEER], has_module=has_module, warn=warn, scenario=BENCH)
    if (binary := servers.get(REDIS_WAIT1)) is None:
        return []
    return [Entry(REDIS_WAIT1, lambda d: RedisWait1(d, binary=binary))]


# ---------------------------------------------------------------------------------------
# Running


def run(
    options: RunOptions,
    *,
    entries: Sequence[Entry] | None = None,
    sizes: Sizes | None = None,
    warn: Warn = _stderr,
) -> Iterator[Result]:
    """Measure every system in turn, yielding results as they come; then the failover
    rows and the goals. ``entries`` default to the environment's choice."""
    sizes = sizes or (QUICK if options.quick else FULL)
    if entries is None:
        selected, unknown = select_systems(os.environ.get(SYSTEMS_ENV))
        for name in unknown:
            warn(f"bench: {BENCH}: unknown system {name!r} in {SYSTEMS_ENV} (known: {SYSTEMS})")
        entries = default_entries(selected, warn=warn)
    if not entries:
        warn(f"bench: {BENCH}: no system to measure")
    measured: list[Result] = []
    for round_ in range(1, sizes.rounds + 1):
        for index, entry in enumerate(entries):
            data_dir = options.data_dir / f"{round_}-{index}-{entry.name}"
            for result in measure_system(
                entry, data_dir, sizes, options.samples, round_=round_, warn=warn
            ):
                measured.append(result)
                yield result
    for result in failover_results(options, sizes):
        measured.append(result)
        yield result
    yield from derive_goals(measured)


def measure_system(
    entry: Entry,
    data_dir: Path,
    sizes: Sizes,
    samples: SampleLog | None = None,
    *,
    round_: int = 1,
    warn: Warn = _stderr,
) -> Iterator[Result]:
    """Build the system in ``data_dir``, start it, run its phases on a fresh event loop.
    A failure is reported with ``warn`` and ends this system's run, never the scenario's;
    the system is always stopped and ``data_dir`` removed."""
    data_dir.mkdir(parents=True)
    loop, runner = new_runner()
    load = os.getloadavg()[0]
    system: ReplicatedSystem | None = None
    try:
        with runner:
            try:
                system = entry.build(data_dir)
                runner.run(system.start())
                params = {**system_params(system, sizes, loop, load), "round": round_}
                yield from _phases(runner, system, sizes, params, samples=samples, warn=warn)
            except Exception as exc:  # one system's failure must not end the others' run
                warn(f"bench: {BENCH}: {entry.name} failed, skipping the rest of it: {exc!r}")
            finally:
                if system is not None:
                    _stop(runner, system, warn)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _phases(
    runner: asyncio.Runner,
    system: ReplicatedSystem,
    sizes: Sizes,
    params: Params,
    *,
    samples: SampleLog | None,
    warn: Warn,
) -> Iterator[Result]:
    """The publish phase, then the e2e phase, each after a full garbage collection (no
    phase pays for the garbage start-up or the phase before it left)."""
    name = system.system
    pids = runner.run(system.broker_pids()) if isinstance(system, BrokerPids) else None
    gc.collect()
    before = cpu_of(pids)
    seconds = runner.run(system.publish(sizes.messages, os.urandom(sizes.payload_bytes)))
    after = cpu_of(pids)
    rate = per_second(sizes.messages, seconds)
    yield Result(BENCH, name, "publish_msgs_s", rate, "msgs/s", params)
    if pids is not None:
        yield from cpu_rows(name, before, after, sizes.messages, params)
    gc.collect()
    latencies = runner.run(system.e2e(sizes.e2e_rate, sizes.e2e_seconds))
    ordered = _e2e_samples(latencies, sizes.e2e_messages, name, warn)
    if samples is not None:
        samples.add(BENCH, name, E2E_SERIES, params, ordered)
    for q in (50, 99):
        yield Result(BENCH, name, f"e2e_latency_p{q}_ms", percentile(ordered, q), "ms", params)


def cpu_of(pids: tuple[int, list[int]] | None) -> list[float]:
    """:func:`process_cpu_s` of the leader, then of each follower (``[]`` for none)."""
    if pids is None:
        return []
    leader, followers = pids
    return [process_cpu_s(pid) for pid in (leader, *followers)]


def cpu_rows(
    name: str,
    before: Sequence[float],
    after: Sequence[float],
    messages: int,
    params: Params,
) -> Iterator[Result]:
    """The publish phase's CPU rows (pure): microseconds of CPU per record published, of
    the leader and of the followers' mean (none without followers); ``processes`` and
    ``each`` (every follower's figure, 2 decimals) in the params."""
    per = [(b - a) / messages * 1e6 for a, b in zip(before, after, strict=True)]
    leader, followers = per[0], per[1:]
    yield Result(
        BENCH, name, "cpu_us_per_record_leader", leader, "us/record",
        {**params, "processes": 1, "each": f"{leader:.2f}"},
    )  # fmt: skip
    if followers:
        each = " ".join(f"{f:.2f}" for f in followers)
        mean = statistics.fmean(followers)
        yield Result(
            BENCH, name, "cpu_us_per_record_followers", mean, "us/record",
            {**params, "processes": len(followers), "each": each},
        )  # fmt: skip


def system_params(system: ReplicatedSystem, sizes: Sizes, loop: str, load: float) -> Params:
    """The params of every row of ``system`` (see the module docstring)."""
    return {
        "fsync": system.fsync,
        "replicas": system.replicas,
        "acked": system.acked,
        "version": system.version,
        "payload_bytes": sizes.payload_bytes,
        "messages": sizes.messages,
        "e2e_rate_msg_s": sizes.e2e_rate,
        "e2e_seconds": sizes.e2e_seconds,
        "loop": loop,
        "load_1m": round(load, 2),
    }


def _stop(runner: asyncio.Runner, system: ReplicatedSystem, warn: Warn) -> None:
    try:
        runner.run(system.stop())
    except Exception as exc:  # report, and go on with the next system
        warn(f"bench: {BENCH}: stopping {system.system} failed: {exc!r}")


def _e2e_samples(samples: Sequence[float], sent: int, label: str, warn: Warn) -> list[float]:
    """The e2e latencies in ascending order; says on stderr when some never arrived.

    Raises:
        ServerFailedError: No message arrived at all.
    """
    if not samples:
        raise ServerFailedError(f"none of the {sent} e2e messages arrived")
    if len(samples) < sent:
        warn(
            f"bench: {BENCH}: {label}: {sent - len(samples)} of {sent} e2e messages did not "
            "arrive in time; its percentiles cover the others only"
        )
    return sorted(samples)


# ---------------------------------------------------------------------------------------
# Goals (issue 37), judged once headrace-r3 is measured

#: Factor 3 publishes at least half of factor 1's rate, in the same run.
R3_OVER_R1_GOAL = Goal(">=", 0.5)
#: ... and more than JetStream's three-replica stream.
R3_OVER_NATS_GOAL = Goal(">", 1.0)
#: e2e p50 at factor 3 no worse than JetStream R3's, in the same run.
R3_P50_GOAL = PeerGoal(NATS_R3)


def medians(results: Sequence[Result]) -> list[Result]:
    """One row per (system, metric) of the measured rows: the round with the median value
    (the lower middle one of an even count), its params without ``round`` and
    ``load_1m`` and with ``rounds``, in first-seen order."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        if not r.is_goal:
            groups.setdefault((r.system, r.metric), []).append(r)
    picked = []
    for rows in groups.values():
        mid = sorted(rows, key=lambda r: r.value)[(len(rows) - 1) // 2]
        params = {k: v for k, v in mid.params.items() if k not in ("round", "load_1m")}
        params["rounds"] = len(rows)
        picked.append(Result(mid.bench, mid.system, mid.metric, mid.value, mid.unit, params))
    return picked


def derive_goals(results: Sequence[Result]) -> Iterator[Result]:
    """The goals of issue 37 on ``headrace-r3``'s rows, each system's median round
    (:func:`medians`) against the others': ``publish_r3_over_r1_x`` (``>= 0.5``),
    ``publish_r3_over_nats_r3_x`` (``> 1``) and its e2e p50 held against JetStream R3's.
    Nothing for a figure whose other side was not measured (nothing at all without
    ``headrace-r3``)."""
    middle = medians(results)
    publish = {r.system: r for r in middle if r.metric == "publish_msgs_s"}
    r3 = publish.get(R3)
    if r3 is not None:
        for other, metric, goal in (
            (R1, "publish_r3_over_r1_x", R3_OVER_R1_GOAL),
            (NATS_R3, "publish_r3_over_nats_r3_x", R3_OVER_NATS_GOAL),
        ):
            if (base := publish.get(other)) is not None:
                ratio = per_second(r3.value, base.value)
                params = {**r3.params, "vs": other, **goal.params(ratio)}
                yield Result(BENCH, R3, metric, ratio, "x", params)
    for r in (r for r in middle if r.system == R3 and r.metric == "e2e_latency_p50_ms"):
        if (judged := R3_P50_GOAL.judge(r, middle)) is not None:
            yield judged
