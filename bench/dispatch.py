"""Scenario ``dispatch``: the dispatcher's safety net in process, and fan-out through a broker.

Owns the measurements of the dispatcher (issue 4) and their goals:

1. ``missed_notification_delivery_ms`` (the maximum) and ``stuck_records``: one
   subscription whose notifications are all dropped (its listener is taken off the log, so
   only the heartbeat can find new records), a consumer with ample credit that never acks
   (so credit and acks cannot wake the dispatcher either), the default 500 ms heartbeat.
   Records are appended one per call, each a lost notification, at random moments, in
   rounds; a record's delay runs from its append returning (durable) to its delivery
   reaching the consumer's queue. A record not delivered within 5 intervals is stuck.
   Once set up, the objects built so far are frozen out of the cyclic GC, as ``headrace
   serve`` does (a full collection over them paused the loop 12 ms here).
   Goal: the maximum within the interval plus 10 ms, and 0 stuck across 10,000 losses.
2. ``heartbeat_cpu_pct``: the process's CPU time while 1,000 idle subscriptions are
   heartbeated at 500 ms, as a percentage of one core (it includes the event loop's and
   the cursor flusher's own idling, so it errs high). Goal: under 1%.
3. ``e2e_latency_p50_ms`` and ``e2e_latency_p99_ms``: a ``headrace serve`` process (fsync
   ``always``) with a one-partition topic and 100 ``exclusive`` subscriptions, one consumer
   each. An open-loop publisher (``AsyncProducer``, ``linger_ms`` 0) sends 100 B records at
   2,000 msg/s for 5 s (2 s with ``--quick``), each stamped with its *scheduled* send time
   (no coordinated omission, as in the ``pubsub`` scenario). Every (record, subscription)
   pair is one sample: from the scheduled send to the consumer's receipt. The consumers
   run in their own process (made with the client's defaults, so they share one
   connection: :mod:`client._shared`), so the publisher's pacing and the consumers'
   decoding do not share one event loop; the clock is ``CLOCK_MONOTONIC``
   (``time.monotonic_ns``), which every process on the host shares. They ack each batch
   with one ``ack_many``, sent every 100 ms, and freeze their setup out of the cyclic GC,
   to keep the measuring side light.
   Goal for p99: at most 5 ms (p50 has none).
   The same e2e run is repeated at ``floor_rate`` (200 msg/s), side by side with the
   bare gRPC fan-out of :mod:`bench._fanout_floor` (system ``grpc-aio-floor``: the same
   transport, records, subscriptions and consumer process, and no broker work at all).
   Then Redis Streams (:mod:`bench._fanout_redis`, system ``redis-streams``, AOF
   ``appendfsync always``, one consumer group per subscription, the consumers in one
   Python process) fans out the same records at both rates, when ``redis-server`` and
   redis-py are here (found or installed as ``bench pubsub`` does; skipped with the reason
   on stderr otherwise). Headrace at the full rate is judged against the p99 goal, and at
   ``floor_rate`` against Redis in the same run (issue 17's fan-out goal: p50 and p99 at
   most Redis's; not judged without Redis): the floor shows how much of the latency is
   the transport's, and Redis what a C broker with the same Python consumers reaches on
   the same machine. (At 1,000 msg/s and above the
   bare fan-out, which forwards every loop turn's publishes to every stream, does not keep
   up here.)
4. ``shared_msgs_s``: 1,000,000 records (100,000 with ``--quick``) preloaded on a
   4-partition topic, then 8 consumers on one ``shared`` subscription, in a consumer
   process, each acking every record on its own (``consumer.ack(message)``, not
   ``ack_many``). Messages per second from the first receipt to the last consumer closed
   (closing waits until the broker applied every ack). Goal: at least 500,000 msg/s. A
   broker that refuses the ``shared`` type is reported on stderr and the metric skipped.

With ``--plot`` the latencies of 1 (``missed_notification_delivery_quantile_ms``) and of
every fan-out run of 3 (``e2e_latency_quantile_ms``) go to the run's sample log, for the
CDF charts.

The broker phases (3 and 4) share one broker; a phase that fails is reported on stderr and
skipped, and the run goes on. The broker and the consumer processes are
:mod:`bench._dispatch_procs`; the e2e and shared workloads that drive them,
:mod:`bench._dispatch_workloads`.

Every result's params carry ``heartbeat_ms`` and ``loop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import random
import sys
import time
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench import _fanout_floor, _fanout_redis
from bench._dispatch_procs import GRACE_S, Broker
from bench._dispatch_workloads import SHARED_PARTITIONS, e2e, shared
from bench._measure import new_runner, percentile
from bench._output import Goal, Params, PeerGoal, Result
from bench._peers import REDIS
from bench._pubsub_system import E2E_PAYLOAD_BYTES
from bench._samples import SampleLog
from bench._scenario import RunOptions
from bench._scratch import cell_dir
from bench._server_process import ServerFailedError
from bench.pubsub import find_servers
from dispatcher import ConsumerSession, HeartbeatConfig, SubscriptionRegistry
from wal import LogWriter, encode_columns

BENCH = "dispatch"
INTERVAL_S = HeartbeatConfig().interval_s
STUCK_AFTER_INTERVALS = 5
GOALS: dict[str, Goal] = {
    "missed_notification_delivery_ms": Goal("<=", INTERVAL_S * 1000 + 10),
    "stuck_records": Goal("<=", 0),
    "heartbeat_cpu_pct": Goal("<", 1.0),
    "e2e_latency_p99_ms": Goal("<=", 5.0),
    "shared_msgs_s": Goal(">=", 500_000),
}
#: Issue 17's fan-out goals: at ``floor_rate`` (100 subscriptions at 200 msg/s), Headrace's
#: e2e p50 and p99 at most those of the Redis Streams fan-out at the same rate in the same
#: run. Not judged when Redis was not measured.
FAN_OUT_METRICS = ("e2e_latency_p50_ms", "e2e_latency_p99_ms")
#: Metrics of the latency distributions in the sample log (``--plot``).
MISSED_SERIES = "missed_notification_delivery_quantile_ms"
E2E_SERIES = "e2e_latency_quantile_ms"


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each measurement does."""

    losses: int  # lost notifications in all
    per_round: int  # records appended (each one lost) per round
    idle_subscriptions: int
    cpu_seconds: float
    e2e_subscriptions: int
    e2e_rate: float  # records per second the e2e publisher sends
    e2e_seconds: float
    e2e_processes: int  # consumer processes the e2e subscriptions are split over
    floor_rate: float  # records per second of the side-by-side run with the bare fan-out
    shared_records: int
    shared_consumers: int

    def __post_init__(self) -> None:
        if not 1 <= self.e2e_processes <= self.e2e_subscriptions:
            raise ValueError("e2e_processes must be from 1 to e2e_subscriptions")
        if self.shared_consumers < 1 or self.shared_records < 1:
            raise ValueError("shared_consumers and shared_records must be at least 1")


FULL = Sizes(
    losses=10_000,
    per_round=500,
    idle_subscriptions=1_000,
    cpu_seconds=10.0,
    e2e_subscriptions=100,
    e2e_rate=2_000.0,
    e2e_seconds=5.0,
    e2e_processes=1,
    floor_rate=200.0,
    shared_records=1_000_000,
    shared_consumers=8,
)
QUICK = Sizes(
    losses=200,
    per_round=100,
    idle_subscriptions=1_000,
    cpu_seconds=2.0,
    e2e_subscriptions=100,
    e2e_rate=2_000.0,
    e2e_seconds=2.0,
    e2e_processes=1,
    floor_rate=200.0,
    shared_records=100_000,
    shared_consumers=8,
)


def _warn(message: str) -> None:
    _warn_raw(f"bench: {BENCH}: {message}")


def _warn_raw(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(
    options: RunOptions, *, sizes: Sizes | None = None, peers: Mapping[str, str] | None = None
) -> Iterator[Result]:
    """Measure, yielding each result as it is known, then the goals.

    ``peers``: the peers' server paths by system name (default: found, or installed, as
    ``bench pubsub`` does; a peer that cannot run is skipped with the reason on stderr).
    """
    sizes = sizes or (QUICK if options.quick else FULL)
    if peers is None:
        peers = find_servers([REDIS], warn=_warn_raw, scenario=BENCH)
    loop_name, runner = new_runner()
    params: Params = {"heartbeat_ms": INTERVAL_S * 1000, "loop": loop_name}
    measured: list[Result] = []
    with runner, cell_dir(options.data_dir, "missed") as directory:
        delays, stuck = runner.run(_missed_notifications(directory, sizes))
        if options.samples is not None:
            missed: Params = {**params, "losses": sizes.losses}
            options.samples.add(BENCH, "headrace", MISSED_SERIES, missed, delays)
        measured += [
            Result(
                BENCH,
                "headrace",
                "missed_notification_delivery_ms",
                max(delays),
                "ms",
                {**params, "losses": sizes.losses, "delivered": len(delays)},
            ),
            Result(
                BENCH,
                "headrace",
                "stuck_records",
                stuck,
                "records",
                {**params, "losses": sizes.losses},
            ),
        ]
    yield from measured
    loop_name, runner = new_runner()
    with runner, cell_dir(options.data_dir, "idle") as directory:
        pct = runner.run(_heartbeat_cpu(directory, sizes))
    cpu = Result(
        BENCH,
        "headrace",
        "heartbeat_cpu_pct",
        pct,
        "%",
        {**params, "subscriptions": sizes.idle_subscriptions, "seconds": sizes.cpu_seconds},
    )
    measured.append(cpu)
    yield cpu
    for result in broker_phases(options.data_dir, sizes, params, peers, log=options.samples):
        measured.append(result)
        yield result
    for result in measured:
        goal = GOALS.get(result.metric)
        judged = result.system == "headrace" and result.params.get("rate_msg_s") in (
            None,
            sizes.e2e_rate,
        )
        if goal is not None and judged:
            yield Result(
                BENCH,
                result.system,
                result.metric,
                result.value,
                result.unit,
                {**result.params, **goal.params(result.value)},
            )
    versus_redis = PeerGoal(_fanout_redis.SYSTEM, (("rate_msg_s", sizes.floor_rate),))
    for result in measured:
        fan_out = result.system == "headrace" and result.metric in FAN_OUT_METRICS
        if fan_out and result.params.get("rate_msg_s") == sizes.floor_rate:
            judged_vs_redis = versus_redis.judge(result, measured)
            if judged_vs_redis is not None:
                yield judged_vs_redis


async def _missed_notifications(directory: Path, sizes: Sizes) -> tuple[list[float], int]:
    """Delays (ms) of records whose notifications were all lost, and how many got stuck."""
    writer = await LogWriter.open(str(directory / "log"))
    registry = SubscriptionRegistry(
        str(directory / "data"), max_unacked=10_000_000, heartbeat=HeartbeatConfig()
    )
    await registry.open({})
    try:
        sub = await registry.subscribe("t", "s", [writer])
        sub.drop_notifications()  # every notification from now on is lost
        session = sub.attach("bench", credit=10_000_000)
        arrived: dict[int, float] = {}
        news = asyncio.Event()
        reader = asyncio.create_task(_receive(session, arrived, news))
        appended: dict[int, float] = {}
        rng = random.Random(7)
        gc.freeze()  # as ``headrace serve`` does once open: no full GC walks the setup
        try:
            for _ in range(sizes.losses // sizes.per_round):
                await _round(writer, rng, sizes.per_round, appended)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STUCK_AFTER_INTERVALS * INTERVAL_S):
                        while len(arrived) < len(appended):
                            news.clear()
                            await news.wait()
        finally:
            reader.cancel()
            gc.unfreeze()
        delays = [(arrived[o] - t) * 1000 for o, t in appended.items() if o in arrived]
        return delays, len(appended) - len(delays)
    finally:
        await registry.aclose()
        await writer.aclose()


async def _round(writer: LogWriter, rng: random.Random, count: int, out: dict[int, float]) -> None:
    """Append ``count`` one-record batches at random moments over one interval."""
    moments = sorted(rng.uniform(0, INTERVAL_S) for _ in range(count))
    start = time.perf_counter()
    for moment in moments:
        pause = start + moment - time.perf_counter()
        if pause > 0:
            await asyncio.sleep(pause)
        result = await writer.append(encode_columns([b"x" * 100]))
        out[result.first_offset] = time.perf_counter()


async def _receive(
    session: ConsumerSession, arrived: dict[int, float], news: asyncio.Event
) -> None:
    while (delivery := await session.next()) is not None:
        now = time.perf_counter()
        for offset in range(delivery.from_offset, delivery.to_offset):
            arrived[offset] = now
        news.set()


async def _heartbeat_cpu(directory: Path, sizes: Sizes) -> float:
    """Percent of one core the process spends while idle subscriptions are heartbeated."""
    writer = await LogWriter.open(str(directory / "log"))  # empty: every subscription idle
    registry = SubscriptionRegistry(str(directory / "data"), heartbeat=HeartbeatConfig())
    await registry.open({})
    try:
        for i in range(sizes.idle_subscriptions):
            await registry.subscribe("t", f"s{i}", [writer])
        await asyncio.sleep(INTERVAL_S * 2)  # let creation settle; every sub has ticked
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.sleep(sizes.cpu_seconds)
        return 100 * (time.process_time() - cpu) / (time.perf_counter() - wall)
    finally:
        await registry.aclose()
        await writer.aclose()


# ---------------------------------------------------------------------------------------
# Through a real broker: e2e fan-out latency and shared throughput


def broker_phases(
    root: Path,
    sizes: Sizes,
    params: Params,
    peers: Mapping[str, str] | None = None,
    *,
    log: SampleLog | None = None,
) -> Iterator[Result]:
    """Start one broker, then yield the e2e latencies and the shared throughput, then the
    bare gRPC fan-out's latencies and those of the ``peers`` found (server path by system
    name; only ``redis-streams`` has a fan-out here); a phase that fails is reported on
    stderr and skipped. Every fan-out's latencies go to ``log`` when given."""
    _, runner = new_runner()
    with runner, cell_dir(root, "broker") as directory:
        broker = Broker(directory)
        try:
            runner.run(broker.start())
        except ServerFailedError as exc:
            _warn(f"no e2e latency and no shared throughput: the broker did not start: {exc}")
            return
        try:
            yield from _guarded("e2e latency", runner, _e2e_results(broker, sizes, params, log))
            at_floor_rate = dataclasses.replace(sizes, e2e_rate=sizes.floor_rate)
            yield from _guarded(
                "e2e latency at the floor's rate",
                runner,
                _e2e_results(broker, at_floor_rate, params, log),
            )
            yield from _guarded("shared_msgs_s", runner, _shared_results(broker, sizes, params))
        finally:
            broker.stop()
    _, runner = new_runner()
    with runner, cell_dir(root, "floor") as directory:
        yield from _guarded(
            "the bare gRPC fan-out", runner, _floor_results(directory, sizes, params, log)
        )
    redis = (peers or {}).get(_fanout_redis.SYSTEM)
    if redis is not None:
        for rate in (sizes.floor_rate, sizes.e2e_rate):
            _, runner = new_runner()
            with runner, cell_dir(root, f"redis-{rate:g}") as directory:
                yield from _guarded(
                    f"the Redis Streams fan-out at {rate:g} msg/s",
                    runner,
                    _redis_results(directory, redis, sizes, rate, params, log=log),
                )


async def _floor_results(
    directory: Path, sizes: Sizes, params: Params, log: SampleLog | None
) -> list[Result]:
    """The same fan-out as the e2e phase at ``floor_rate``, through bare gRPC."""
    samples, sent = await _fanout_floor.measure(
        directory,
        streams=sizes.e2e_subscriptions,
        rate=sizes.floor_rate,
        seconds=sizes.e2e_seconds,
        grace_s=GRACE_S,
    )
    fields = _e2e_params(params, sizes, sizes.floor_rate, "none", 1)
    return _latencies(_fanout_floor.SYSTEM, samples, sent, sizes, fields, log=log)


async def _redis_results(
    directory: Path,
    binary: str,
    sizes: Sizes,
    rate: float,
    params: Params,
    *,
    log: SampleLog | None,
) -> list[Result]:
    """The same fan-out as the e2e phase at ``rate``, through Redis Streams."""
    samples, sent = await _fanout_redis.measure(
        directory,
        binary=binary,
        groups=sizes.e2e_subscriptions,
        rate=rate,
        seconds=sizes.e2e_seconds,
        grace_s=GRACE_S,
    )
    fields = _e2e_params(params, sizes, rate, _fanout_redis.FSYNC, 1)
    return _latencies(_fanout_redis.SYSTEM, samples, sent, sizes, fields, log=log)


async def _e2e_results(
    broker: Broker, sizes: Sizes, params: Params, log: SampleLog | None
) -> list[Result]:
    samples, sent = await e2e(
        broker,
        subscriptions=sizes.e2e_subscriptions,
        processes=sizes.e2e_processes,
        rate=sizes.e2e_rate,
        seconds=sizes.e2e_seconds,
    )
    fields = _e2e_params(params, sizes, sizes.e2e_rate, "always", sizes.e2e_processes)
    return _latencies("headrace", samples, sent, sizes, fields, log=log)


def _e2e_params(params: Params, sizes: Sizes, rate: float, fsync: str, processes: int) -> Params:
    return {
        **params,
        "fsync": fsync,
        "subscriptions": sizes.e2e_subscriptions,
        "rate_msg_s": rate,
        "seconds": sizes.e2e_seconds,
        "payload_bytes": E2E_PAYLOAD_BYTES,
        "consumer_processes": processes,
    }


def _latencies(
    system: str,
    samples: list[float],
    sent: int,
    sizes: Sizes,
    fields: Params,
    *,
    log: SampleLog | None = None,
) -> list[Result]:
    """p50 and p99 of one fan-out run; says on stderr when pairs did not arrive; keeps the
    samples in ``log`` when given."""
    expected = sent * sizes.e2e_subscriptions
    if len(samples) < expected:
        _warn(
            f"{system}: {expected - len(samples)} of {expected} e2e (record, subscription) "
            "pairs did not arrive in time; the percentiles cover the others only"
        )
    if log is not None and samples:
        log.add(BENCH, system, E2E_SERIES, fields, samples)
    fields = {**fields, "samples": len(samples)}
    return [
        Result(BENCH, system, f"e2e_latency_p{q}_ms", percentile(samples, q), "ms", fields)
        for q in (50, 99)
    ]


async def _shared_results(broker: Broker, sizes: Sizes, params: Params) -> list[Result]:
    rate = await shared(
        broker, records=sizes.shared_records, consumers=sizes.shared_consumers, warn=_warn
    )
    if rate is None:
        return []
    fields: Params = {
        **params,
        "fsync": "always",
        "records": sizes.shared_records,
        "partitions": SHARED_PARTITIONS,
        "consumers": sizes.shared_consumers,
        "acks": "per_record",
    }
    return [Result(BENCH, "headrace", "shared_msgs_s", rate, "msgs/s", fields)]


def _guarded(
    what: str, runner: asyncio.Runner, phase: Coroutine[object, object, list[Result]]
) -> list[Result]:
    try:
        return runner.run(phase)
    except Exception as exc:  # one phase's failure must not end the run
        _warn(f"{what} not measured: {exc!r}")
        return []
