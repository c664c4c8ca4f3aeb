"""Scenario ``pubsub``: Headrace beside NATS JetStream and Redis Streams, in one run.

Owns which systems run (and getting the peers' servers installed), the order they run
in, the phases each goes through, the results and the goals. Every
system (a :class:`~bench._pubsub_system.PubSubSystem`) gets a fresh data dir and its own
event loop (uvloop when importable) and runs on loopback with its Python client, in this
order: ``headrace``, ``nats-jetstream``, ``redis-streams``
with ``appendfsync always``, then with ``everysec``. Each goes through, with 100 B
payloads and 200,000 messages (20,000 and 2 s of e2e with ``--quick``):

1. ``publish_msgs_s``: publish the messages with the best batching or pipelining its
   client allows, every one acknowledged by the server.
2. ``consume_msgs_s``: consume and ack those messages.
2a. Headrace only, the per-record client paths users meet first (same count, own topic):
   ``send_per_record_msgs_s`` (``AsyncProducer.send`` per record, then ``flush``; every
   future checked), ``sync_send_per_record_msgs_s`` (blocking ``Producer.send`` in a plain loop,
   then ``flush``), ``consume_per_record_msgs_s`` (``async for`` and ``ack`` on each) and
   ``sync_consume_per_record_msgs_s`` (the blocking ``Consumer``: ``for`` and ``ack`` on
   each).
3. ``e2e_latency_p50_ms``, ``e2e_latency_p99_ms``: an open-loop publisher at 2,000 msg/s
   for 10 s and a concurrent consumer; latency from each message's scheduled send time
   to its receipt (no coordinated omission). The pacer's own overhead (a thread handing
   each send to the loop, sleeping with a 1 us timer slack) is in every system's numbers
   alike: about 0.1-0.2 ms here, 0.27-0.33 ms p50 to the send starting with Headrace's
   client loop busy beside it.
   With ``--plot`` every latency goes to the run's sample log
   (``e2e_latency_quantile_ms``), for the CDF chart. Goals (issue 17): p50 at most 1 ms
   and at most Redis Streams' (``appendfsync always``) in the same run; p99 at most
   Redis's; each goal row's ``vs`` says what it was held against.
4. ``rss_mib``: the server's RSS after those phases.
5. ``restart_to_serving_s``: SIGKILL the server, restart it, time from the spawn to the
   first successful client operation.
6. ``restart_after_kill_s``: publish 1 GiB more (64 MiB with ``--quick``) in 64 KiB
   payloads, every one acknowledged, then as 5. No clean shutdown happened since the
   server first started, so a restart that rescans what was written since then shows
   here; the result's params add ``log_bytes`` and ``log_payload_bytes``.

Before the systems, the floor under phase 3 (system ``grpc-aio-floor``,
:func:`measure_floor`), while the disk is idle: the same
paced publisher and one consumer over bare grpc.aio, with no log, fsync or acks; the
disk's median ``fdatasync`` of one payload (``fdatasync_p50_ms``, system ``disk``); and
their sum, ``e2e_latency_p50_durable_floor_ms``: about the least e2e p50 that a broker on
grpc.aio, which syncs before it delivers, can show on this machine (the relay, plus one
sync in series).

Every result's params carry ``fsync``, ``payload_bytes``, ``messages``, ``e2e_rate_msg_s``,
``e2e_seconds`` and ``loop``. Headrace's results are then judged against its goals. A peer
whose server is missing is installed with apt-get when the bench runs as root, else it is
skipped with the reason on stderr; a system that fails midway is reported on stderr,
stopped, and the run goes on with the next one.

Environment:
    HEADRACE_BENCH_SYSTEMS: Comma-separated system names to run, e.g.
        ``nats-jetstream,redis-streams`` (default: all three, and the floor;
        ``grpc-aio-floor`` selects the floor).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import _fanout_floor, _peers
from bench._measure import new_runner, per_second, percentile
from bench._output import Goal, Params, PeerGoal, Result
from bench._peers import Peer
from bench._pubsub_system import E2E_PAYLOAD_BYTES, PerRecordSystem, PubSubSystem
from bench._samples import SampleLog
from bench._scenario import RunOptions
from bench._server_process import ServerFailedError
from bench.wal import time_fdatasyncs

BENCH = "pubsub"
#: Not a broker: the e2e phase's publisher and consumer over bare grpc.aio (see
#: :func:`measure_floor`).
FLOOR = _fanout_floor.SYSTEM
SYSTEMS = ("headrace", "nats-jetstream", "redis-streams", FLOOR)
SYSTEMS_ENV = "HEADRACE_BENCH_SYSTEMS"
#: The metric of the e2e latency distributions in the sample log.
E2E_SERIES = "e2e_latency_quantile_ms"

#: The rows of the per-record client paths, measured for systems that have them
#: (:class:`~bench._pubsub_system.PerRecordSystem`: Headrace), in the order they run.
PER_RECORD_METRICS = (
    "send_per_record_msgs_s",
    "sync_send_per_record_msgs_s",
    "consume_per_record_msgs_s",
    "sync_consume_per_record_msgs_s",
)

#: Headrace's targets, as the issue states them.
GOALS: dict[str, Goal] = {
    "publish_msgs_s": Goal(">=", 1_000_000),
    "consume_msgs_s": Goal(">=", 1_000_000),
    "send_per_record_msgs_s": Goal(">=", 300_000),
    "sync_send_per_record_msgs_s": Goal(">=", 300_000),
    "consume_per_record_msgs_s": Goal(">=", 500_000),
    # Not the issue's: the blocking consumer held to what it asks of the blocking producer.
    "sync_consume_per_record_msgs_s": Goal(">=", 300_000),
    "restart_to_serving_s": Goal("<", 0.5),
    "restart_after_kill_s": Goal("<", 0.5),
    "rss_mib": Goal("<", 150),
}

#: Headrace's targets set by Redis Streams with ``appendfsync always`` in the same run
#: (issue 17): e2e p50 at most Redis's and at most 1 ms, e2e p99 at most Redis's. Without
#: Redis in the run, p50 is held to 1 ms and p99 to 5 ms (the earlier absolute goal).
PEER_GOALS: dict[str, PeerGoal] = {
    "e2e_latency_p50_ms": PeerGoal("redis-streams", (("fsync", "always"),), cap=1.0),
    "e2e_latency_p99_ms": PeerGoal("redis-streams", (("fsync", "always"),), fallback=5.0),
}

#: How long after the floor's last send its consumer may still take records.
FLOOR_GRACE_S = 2.0
#: Seconds of payload-sized appends, each followed by ``fdatasync``, that the durable
#: floor's sync time is the median of.
FDATASYNC_SECONDS = 1.0

Warn = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each system does.

    Attributes:
        messages: Messages published, then consumed.
        e2e_rate: Messages per second of the paced e2e publisher.
        e2e_seconds: How long it publishes.
        payload_bytes: Size of every payload.
        restart_log_bytes: Bytes published before ``restart_after_kill_s``.
    """

    messages: int
    e2e_rate: float = 2000.0
    e2e_seconds: float = 10.0
    payload_bytes: int = E2E_PAYLOAD_BYTES
    restart_log_bytes: int = 1 << 30

    @property
    def e2e_messages(self) -> int:
        """Messages the e2e publisher sends."""
        return round(self.e2e_rate * self.e2e_seconds)

    def params(self, fsync: str, loop: str) -> Params:
        """The params of every result of a system with this ``fsync`` on this ``loop``."""
        return {
            "fsync": fsync,
            "payload_bytes": self.payload_bytes,
            "messages": self.messages,
            "e2e_rate_msg_s": self.e2e_rate,
            "e2e_seconds": self.e2e_seconds,
            "loop": loop,
        }


FULL = Sizes(200_000)
QUICK = Sizes(20_000, e2e_seconds=2.0, restart_log_bytes=64 << 20)
#: Payload size of the ``restart_after_kill_s`` fill: big records, so 1 GiB goes fast.
LOG_PAYLOAD_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class Entry:
    """One system to measure: the name it is selected by, and how to build it in a dir."""

    name: str
    build: Callable[[Path], PubSubSystem]


# ---------------------------------------------------------------------------------------
# Which systems run


def select_systems(value: str | None) -> tuple[list[str], list[str]]:
    """Parse ``HEADRACE_BENCH_SYSTEMS``: (known names in run order, unknown names).

    Empty or unset selects every system.
    """
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    if not names:
        return list(SYSTEMS), []
    return [s for s in SYSTEMS if s in names], [n for n in names if n not in SYSTEMS]


Which = Callable[[str], str | None]
#: Installs Debian packages; returns whether it succeeded.
Installer = Callable[[Sequence[str]], bool]


def apt_install(packages: Sequence[str]) -> bool:
    """``apt-get update && apt-get install -y packages``, output on stderr (stdout may be
    JSON lines). Returns whether both succeeded."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", *packages]):
        if subprocess.run(argv, stdout=sys.stderr, env=env, check=False).returncode != 0:
            return False
    return True


def default_installer(
    which: Which = shutil.which, euid: Callable[[], int] = os.geteuid
) -> Installer | str:
    """:func:`apt_install` when this process may use it, else the reason it may not."""
    if euid() != 0:
        return "not running as root"
    if which("apt-get") is None:
        return "apt-get is not available"
    return apt_install


def find_servers(
    peers: Sequence[Peer],
    *,
    which: Which = shutil.which,
    installer: Installer | str | None = None,
    has_module: Callable[[str], bool] | None = None,
    warn: Warn = _stderr,
    scenario: str = BENCH,
) -> dict[str, str]:
    """The peers that can run here, by system name, with the path of their server.

    Installs missing servers with ``installer`` (default: :func:`default_installer`).
    For every peer that still cannot run it calls ``warn`` with the reason and the fix.

    Args:
        peers: The peers wanted.
        which: Finds an executable on ``PATH``.
        installer: Installs packages, or a string saying why nothing can be installed.
        has_module: Whether a Python module can be imported (default: importlib's finder).
        warn: Where the messages go (default: stderr).
        scenario: The scenario the messages name.
    """
    has_module = has_module or (lambda name: importlib.util.find_spec(name) is not None)
    runnable = []
    for peer in peers:
        if has_module(peer.client_module):
            runnable.append(peer)
        else:
            warn(
                f"bench: {scenario}: skipping {peer.system}: its Python client {peer.client_dist} "
                "is not installed (pip install -e '.[bench]')"
            )
    found = {p.system: path for p in runnable if (path := which(p.binary)) is not None}
    missing = [p for p in runnable if p.system not in found]
    if missing:
        installer = installer if installer is not None else default_installer(which)
        found.update(_install(missing, which, installer, warn, scenario))
    return found


def _install(
    missing: Sequence[Peer], which: Which, installer: Installer | str, warn: Warn, scenario: str
) -> dict[str, str]:
    """Install the servers of ``missing`` in one go; the ones now on PATH, by system."""
    packages = [p.package for p in missing]
    if isinstance(installer, str):
        reason = f"cannot install it here: {installer}"
    else:
        warn(f"bench: {scenario}: installing {' '.join(packages)} with apt-get")
        ok = installer(packages)
        reason = "apt-get install failed" if not ok else "it is still not on PATH after install"
    found: dict[str, str] = {}
    for peer in missing:
        path = which(peer.binary)
        if path is not None:
            found[peer.system] = path
        else:
            warn(
                f"bench: {scenario}: skipping {peer.system}: {peer.binary} is not installed and "
                f"{reason}; install it with: apt-get install -y {peer.package}"
            )
    return found


def default_entries(selected: Sequence[str], *, warn: Warn = _stderr) -> list[Entry]:
    """The entries of the ``selected`` systems that can run here; the others are skipped
    with the reason on stderr."""
    entries: list[Entry] = []
    if "headrace" in selected:
        try:
            from bench._headrace_pubsub import HeadraceSystem
        except ImportError as exc:
            warn(f"bench: pubsub: headrace system not available yet ({exc}); skipping it")
        else:
            entries.append(Entry("headrace", HeadraceSystem))
    peers = [p for p in _peers.PEERS if p.system in selected]
    servers = find_servers(peers, warn=warn) if peers else {}
    if nats := servers.get("nats-jetstream"):
        entries.append(Entry("nats-jetstream", lambda d: _peers.NatsJetStream(d, binary=nats)))
    if redis := servers.get("redis-streams"):
        for fsync in _peers.REDIS_FSYNC:
            entries.append(Entry("redis-streams", _redis_builder(redis, fsync)))
    return entries


def _redis_builder(binary: str, fsync: str) -> Callable[[Path], PubSubSystem]:
    return lambda data_dir: _peers.RedisStreams(data_dir, fsync, binary=binary)


def _entries_from_env(warn: Warn) -> tuple[list[Entry], bool]:
    """The entries the environment selects, and whether it selects the floor."""
    selected, unknown = select_systems(os.environ.get(SYSTEMS_ENV))
    for name in unknown:
        warn(f"bench: pubsub: unknown system {name!r} in {SYSTEMS_ENV} (known: {SYSTEMS})")
    return default_entries(selected, warn=warn), FLOOR in selected


# ---------------------------------------------------------------------------------------
# Running


def run(
    options: RunOptions,
    *,
    entries: Sequence[Entry] | None = None,
    sizes: Sizes | None = None,
    floor: bool | None = None,
    warn: Warn = _stderr,
) -> Iterator[Result]:
    """Measure the floor (:func:`measure_floor`), then every system in turn, yielding
    results as they come, then Headrace's goals. ``entries`` and ``floor`` default to
    the environment's choice (see the module docstring); given ``entries``, ``floor``
    defaults to no."""
    sizes = sizes or (QUICK if options.quick else FULL)
    if entries is None:
        entries, floor_selected = _entries_from_env(warn)
        floor = floor_selected if floor is None else floor
    if not entries and not floor:
        warn("bench: pubsub: no system to measure")
    measured: list[Result] = []
    if floor:  # first: the systems' restart phases leave gigabytes for the disk to write
        for result in measure_floor(options.data_dir / FLOOR, sizes, warn=warn):
            measured.append(result)
            yield result
    for index, entry in enumerate(entries):
        data_dir = options.data_dir / f"{index}-{entry.name}"
        for result in measure_system(entry, data_dir, sizes, options.samples, warn=warn):
            measured.append(result)
            yield result
    yield from derive_goals(measured)


def measure_floor(data_dir: Path, sizes: Sizes, *, warn: Warn = _stderr) -> Iterator[Result]:
    """The floor under the e2e phase, as system ``grpc-aio-floor``: the same paced
    publisher and one consumer, over bare grpc.aio (:mod:`bench._fanout_floor` with one
    stream: no log, no fsync, no acks). Then the median time of a payload-sized append
    and its ``fdatasync`` (system ``disk``), and the sum of the two medians
    (``e2e_latency_p50_durable_floor_ms``): about the least e2e p50 that a broker on
    grpc.aio, which syncs before it delivers, can show on this machine.

    A failure is reported with ``warn`` and ends this phase only; ``data_dir`` is removed.
    """
    data_dir.mkdir(parents=True)
    loop, runner = new_runner()
    try:
        with runner:
            latencies, sent = runner.run(
                _fanout_floor.measure(
                    data_dir,
                    streams=1,
                    rate=sizes.e2e_rate,
                    seconds=sizes.e2e_seconds,
                    grace_s=FLOOR_GRACE_S,
                )
            )
        ordered = e2e_samples(latencies, sent, FLOOR, warn)
        syncs = sorted(time_fdatasyncs(data_dir, FDATASYNC_SECONDS, sizes.payload_bytes))
    except Exception as exc:  # like a system's failure, it must not end the run
        warn(f"bench: pubsub: the {FLOOR} phase failed, skipping it: {exc!r}")
        return
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    params = sizes.params("none", loop)
    p50 = percentile(ordered, 50)
    sync_ms = percentile(syncs, 50) * 1000
    yield Result(BENCH, FLOOR, "e2e_latency_p50_ms", p50, "ms", params)
    yield Result(BENCH, FLOOR, "e2e_latency_p99_ms", percentile(ordered, 99), "ms", params)
    yield Result(
        BENCH, "disk", "fdatasync_p50_ms", sync_ms, "ms", {"block_bytes": sizes.payload_bytes}
    )
    durable = {**params, "fsync": "always", "sum_of": "e2e_latency_p50_ms + fdatasync_p50_ms"}
    yield Result(BENCH, FLOOR, "e2e_latency_p50_durable_floor_ms", p50 + sync_ms, "ms", durable)


def measure_system(
    entry: Entry,
    data_dir: Path,
    sizes: Sizes,
    samples: SampleLog | None = None,
    *,
    warn: Warn = _stderr,
) -> Iterator[Result]:
    """Build the system in ``data_dir`` and run its phases on a fresh event loop. A failure
    is reported with ``warn`` and ends this system's run, never the scenario's; the system
    is always stopped and ``data_dir`` removed. Its e2e latencies go into ``samples``
    when given."""
    data_dir.mkdir(parents=True)
    loop, runner = new_runner()
    system: PubSubSystem | None = None
    try:
        with runner:
            try:
                system = entry.build(data_dir)
                yield from _phases(runner, system, sizes, loop=loop, samples=samples, warn=warn)
            except Exception as exc:  # one system's failure must not end the others' run
                warn(f"bench: pubsub: {entry.name} failed, skipping the rest of it: {exc!r}")
            finally:
                if system is not None:
                    _stop(runner, system, warn)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _stop(runner: asyncio.Runner, system: PubSubSystem, warn: Warn) -> None:
    try:
        runner.run(system.stop())
    except Exception as exc:  # report, and go on with the next system
        warn(f"bench: pubsub: stopping {system.system} failed: {exc!r}")


def _phases(
    runner: asyncio.Runner,
    system: PubSubSystem,
    sizes: Sizes,
    *,
    loop: str,
    samples: SampleLog | None,
    warn: Warn,
) -> Iterator[Result]:
    """The phases of one system, in order (see the module docstring)."""
    params = sizes.params(system.fsync, loop)
    count = sizes.messages

    def result(metric: str, value: float, unit: str) -> Result:
        return Result(BENCH, system.system, metric, value, unit, dict(params))

    payload = os.urandom(sizes.payload_bytes)
    runner.run(system.start())
    seconds = _timed(runner, system.publish(count, payload))
    yield result("publish_msgs_s", per_second(count, seconds), "msgs/s")
    seconds = _timed(runner, system.consume(count))
    yield result("consume_msgs_s", per_second(count, seconds), "msgs/s")
    if isinstance(system, PerRecordSystem):
        yield from _per_record(runner, system, count, payload, result)
    label = f"{system.system} (fsync={system.fsync})"
    e2e = runner.run(system.e2e(sizes.e2e_rate, sizes.e2e_seconds))
    ordered = e2e_samples(e2e, sizes.e2e_messages, label, warn)
    if samples is not None:
        samples.add(BENCH, system.system, E2E_SERIES, params, ordered)
    yield result("e2e_latency_p50_ms", percentile(ordered, 50), "ms")
    yield result("e2e_latency_p99_ms", percentile(ordered, 99), "ms")
    rss = system.rss_mib()  # before the restart: the RSS the load left behind
    yield result("restart_to_serving_s", runner.run(system.kill_and_restart()), "s")
    yield result("rss_mib", rss, "MiB")
    yield _restart_after_kill(runner, system, sizes, params)


def _timed(runner: asyncio.Runner, cell: Coroutine[object, object, float]) -> float:
    """Run one timed cell after a full garbage collection, so that no cell pays for the
    garbage the cells (and start-up) before it left: a collection moved into a ~25 ms cell
    once cost it 10 ms and more (issue 35)."""
    gc.collect()
    return runner.run(cell)


def _per_record(
    runner: asyncio.Runner,
    system: PerRecordSystem,
    count: int,
    payload: bytes,
    result: Callable[[str, float, str], Result],
) -> Iterator[Result]:
    """Phase 2a: the per-record client paths, one row each (:data:`PER_RECORD_METRICS`)."""
    phases: tuple[Callable[[], Coroutine[object, object, float]], ...] = (
        lambda: system.send_per_record(count, payload),
        lambda: system.sync_send_per_record(count, payload),
        lambda: system.consume_per_record(count),
        lambda: system.sync_consume_per_record(count),
    )
    for metric, phase in zip(PER_RECORD_METRICS, phases, strict=True):
        yield result(metric, per_second(count, _timed(runner, phase())), "msgs/s")


def _restart_after_kill(
    runner: asyncio.Runner, system: PubSubSystem, sizes: Sizes, params: Params
) -> Result:
    """Phase 6: fill the log with ``restart_log_bytes``, SIGKILL, time the restart."""
    payload = os.urandom(LOG_PAYLOAD_BYTES)
    count = max(1, sizes.restart_log_bytes // len(payload))
    runner.run(system.publish(count, payload))
    seconds = runner.run(system.kill_and_restart())
    log = {"log_bytes": count * len(payload), "log_payload_bytes": len(payload)}
    return Result(BENCH, system.system, "restart_after_kill_s", seconds, "s", {**params, **log})


def e2e_samples(samples: Sequence[float], sent: int, label: str, warn: Warn) -> list[float]:
    """The e2e latencies in ascending order; says on stderr when some messages never
    arrived (their latency is unknown, so the percentiles flatter the system).

    Raises:
        ServerFailedError: No message arrived at all.
    """
    if not samples:
        raise ServerFailedError(f"none of the {sent} e2e messages arrived")
    if len(samples) < sent:
        warn(
            f"bench: pubsub: {label}: {sent - len(samples)} of {sent} e2e messages did not "
            "arrive in time; its percentiles cover the others only"
        )
    return sorted(samples)


# ---------------------------------------------------------------------------------------
# Goals


def derive_goals(results: Sequence[Result]) -> Iterator[Result]:
    """Each of Headrace's measured results that has a goal, judged (params gain ``goal``
    and ``met``; the e2e rows, held against Redis in the same run, also ``vs``: see
    :data:`PEER_GOALS`). Nothing when Headrace was not measured."""
    for r in results:
        if r.system != "headrace" or r.is_goal:
            continue
        goal = GOALS.get(r.metric)
        if goal is not None:
            yield Result(
                r.bench, r.system, r.metric, r.value, r.unit, {**r.params, **goal.params(r.value)}
            )
        peer_goal = PEER_GOALS.get(r.metric)
        if peer_goal is not None and (judged := peer_goal.judge(r, results)) is not None:
            yield judged
