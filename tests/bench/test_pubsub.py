"""Tests of the ``pubsub`` bench scenario that need no server: its pacing, its latency
bookkeeping, its results, goals and latency samples, which systems it picks and what it says when
a peer cannot be installed. Systems are :class:`FakeSystem`; no timing is judged beyond
"the pacer does not wait for slow sends".
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import itertools
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path

import pytest

from bench import _peers, _pubsub_system, _server_process, pubsub
from bench._output import Result
from bench._peers import NATS, REDIS, Peer
from bench._pubsub_system import (
    FakePerRecordSystem,
    FakeSystem,
    LatencyRecorder,
    PubSubSystem,
    measure_e2e,
    pace,
    paced_send_times,
    read_stamp,
    stamp_payload,
)
from bench._runner import SCENARIOS
from bench._samples import SampleLog, nearest_rank
from bench._scenario import RunOptions
from bench._server_process import (
    ServerFailedError,
    ServerProcess,
    parse_vmrss_mib,
    wait_until_serving,
)
from bench.pubsub import (
    GOALS,
    PEER_GOALS,
    Entry,
    Sizes,
    apt_install,
    default_installer,
    find_servers,
)

TINY = Sizes(messages=1000, e2e_rate=100.0, e2e_seconds=0.5)
METRICS = {
    "publish_msgs_s": "msgs/s",
    "consume_msgs_s": "msgs/s",
    "send_per_record_msgs_s": "msgs/s",
    "sync_send_per_record_msgs_s": "msgs/s",
    "consume_per_record_msgs_s": "msgs/s",
    "sync_consume_per_record_msgs_s": "msgs/s",
    "e2e_latency_p50_ms": "ms",
    "e2e_latency_p99_ms": "ms",
    "restart_to_serving_s": "s",
    "rss_mib": "MiB",
    "restart_after_kill_s": "s",
}


class Messages:
    """Collects what the code under test would print on stderr."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, message: str) -> None:
        self.lines.append(message)

    def mentioning(self, *words: str) -> list[str]:
        return [line for line in self.lines if all(w in line for w in words)]


# ---------------------------------------------------------------------------------------
# The pacer's schedule and the payload stamp


@pytest.mark.parametrize(
    ("rate", "seconds", "count", "last"),
    [
        (2000.0, 10.0, 20_000, 9.9995),
        (2000.0, 2.0, 4000, 1.9995),
        (3.0, 1.0, 3, 2 / 3),
        (1.0, 0.4, 0, None),
    ],
)
def test_schedule_is_evenly_spaced_from_zero(
    rate: float, seconds: float, count: int, last: float | None
) -> None:
    """round(rate * seconds) sends, the first at 0, one every 1/rate seconds."""
    times = paced_send_times(rate, seconds)
    assert len(times) == count
    if last is not None:
        assert times[0] == 0.0
        assert times[-1] == pytest.approx(last)
        gaps = {round(b - a, 12) for a, b in itertools.pairwise(times)}
        assert gaps <= {round(1 / rate, 12)}


@pytest.mark.parametrize(("rate", "seconds"), [(0.0, 1.0), (-5.0, 1.0), (10.0, -1.0)])
def test_schedule_rejects_impossible_paces(rate: float, seconds: float) -> None:
    """A rate that is not positive, or a negative duration, is an error, not an empty run."""
    with pytest.raises(ValueError, match="bad pace"):
        paced_send_times(rate, seconds)


def test_stamp_round_trips_and_fills_the_payload() -> None:
    """The stamp is read back exactly and the payload has the requested size."""
    payload = stamp_payload(123_456_789_012_345, 100)
    assert len(payload) == 100
    assert read_stamp(payload) == 123_456_789_012_345


def test_stamp_needs_room() -> None:
    """A payload too small for the 8-byte stamp is refused."""
    with pytest.raises(ValueError, match="cannot carry a stamp"):
        stamp_payload(1, 7)


def test_pace_sends_in_order_never_early() -> None:
    """Every send gets its scheduled time, in order, spaced 1/rate apart, and starts no
    earlier than that time."""
    calls: list[tuple[int, int]] = []

    async def send(due: int) -> None:
        calls.append((due, time.perf_counter_ns()))

    sent = asyncio.run(pace(500.0, 0.05, send))
    assert sent == 25 == len(calls)
    dues = [due for due, _ in calls]
    assert dues == sorted(dues)
    assert {b - a for a, b in itertools.pairwise(dues)} <= {2_000_000}
    assert all(started >= due for due, started in calls)


def test_pace_does_not_wait_for_slow_sends() -> None:
    """Open loop: sends that take 0.2 s each do not hold up the next ones, so 20 of them
    at 1000 msg/s finish in about 0.22 s, not 4 s."""

    async def slow_send(due: int) -> None:
        await asyncio.sleep(0.2)

    start = time.perf_counter()
    assert asyncio.run(pace(1000.0, 0.02, slow_send)) == 20
    assert time.perf_counter() - start < 1.5


def test_pace_reraises_a_failed_send() -> None:
    """A send that raises makes the whole pace raise that error, after the others ran."""
    sent: list[int] = []

    async def send(due: int) -> None:
        sent.append(due)
        if len(sent) == 3:
            raise ConnectionError("broker went away")

    with pytest.raises(ConnectionError, match="broker went away"):
        asyncio.run(pace(1000.0, 0.01, send))
    assert len(sent) == 10


def test_pace_freezes_what_the_process_holds_while_it_sends() -> None:
    """While the sends run, every object the process held before is frozen (no full
    collection walks it mid-run); garbage from before was collected first; afterwards
    nothing stays frozen, even when a send failed."""
    frozen: list[int] = []

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    Cycle()  # garbage in a cycle: only a collection frees it

    async def send(due: int) -> None:
        frozen.append(gc.get_freeze_count())
        assert not any(isinstance(o, Cycle) for o in gc.get_objects())

    async def failing(due: int) -> None:
        raise ConnectionError("gone")

    before = gc.get_freeze_count()
    assert asyncio.run(pace(1000.0, 0.005, send)) == 5
    assert min(frozen) > before
    assert gc.get_freeze_count() == before
    with pytest.raises(ConnectionError):
        asyncio.run(pace(1000.0, 0.002, failing))
    assert gc.get_freeze_count() == before


# ---------------------------------------------------------------------------------------
# Latency bookkeeping


def test_recorder_measures_from_the_stamp_and_finishes_at_expected() -> None:
    """Latency is the clock at receipt minus the stamp, in ms; the consumer is told to stop
    once every expected message arrived."""
    now = [5_000_000]

    async def scenario() -> LatencyRecorder:
        recorder = LatencyRecorder(2, clock_ns=lambda: now[0])
        recorder.record(stamp_payload(4_000_000, 100))
        assert recorder.running
        now[0] = 7_500_000
        recorder.record(stamp_payload(5_000_000, 100))
        return recorder

    recorder = asyncio.run(scenario())
    assert recorder.latencies_ms == [1.0, 2.5]
    assert not recorder.running


def test_recorder_stop_ends_the_consumer_loop() -> None:
    """stop() turns ``running`` false even when messages are missing."""

    async def scenario() -> bool:
        recorder = LatencyRecorder(10)
        recorder.stop()
        return recorder.running

    assert asyncio.run(scenario()) is False


Consume = Callable[[LatencyRecorder], Coroutine[object, object, None]]


async def _in_memory_e2e(
    consume_factory: Callable[[asyncio.Queue[bytes]], Consume], grace_s: float = 2.0
) -> list[float]:
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def send(payload: bytes) -> None:
        await queue.put(payload)

    consume = consume_factory(queue)
    return await measure_e2e(200.0, 0.05, send, consume, grace_s=grace_s)


def test_measure_e2e_gets_one_latency_per_message() -> None:
    """Through an in-memory queue every one of the 10 messages arrives, each with a small
    non-negative latency, and the consumer returns when told."""

    def factory(queue: asyncio.Queue[bytes]) -> Consume:
        async def consume(recorder: LatencyRecorder) -> None:
            recorder.set_ready()
            while recorder.running:
                try:
                    recorder.record(await asyncio.wait_for(queue.get(), 0.05))
                except TimeoutError:
                    continue

        return consume

    latencies = asyncio.run(_in_memory_e2e(factory))
    assert len(latencies) == 10
    assert all(0 <= ms < 1000 for ms in latencies)


def test_measure_e2e_cancels_a_consumer_that_ignores_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer that never looks at ``running`` is cancelled after the stop timeout, and
    what it recorded is still returned."""
    monkeypatch.setattr(_pubsub_system, "CONSUMER_STOP_S", 0.05)
    cancelled: list[bool] = []

    def factory(queue: asyncio.Queue[bytes]) -> Consume:
        async def consume(recorder: LatencyRecorder) -> None:
            recorder.set_ready()
            try:
                while True:
                    payload = await queue.get()
                    if len(recorder.latencies_ms) < 3:
                        recorder.record(payload)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        return consume

    latencies = asyncio.run(_in_memory_e2e(factory, grace_s=0.1))
    assert len(latencies) == 3
    assert cancelled == [True]


def test_measure_e2e_surfaces_a_consumer_error() -> None:
    """A consumer that crashes fails the measurement with its own error."""

    def factory(queue: asyncio.Queue[bytes]) -> Consume:
        async def consume(recorder: LatencyRecorder) -> None:
            raise ConnectionResetError("consumer lost its connection")

        return consume

    with pytest.raises(ConnectionResetError, match="lost its connection"):
        asyncio.run(_in_memory_e2e(factory))


def test_e2e_samples_says_when_messages_went_missing() -> None:
    """Fewer latencies than messages sent: sorted samples, and a line on stderr saying how
    many did not arrive."""
    said = Messages()
    ordered = pubsub.e2e_samples([3.0, 1.0, 2.0], 5, "peer (fsync=always)", said)
    assert ordered == [1.0, 2.0, 3.0]
    assert said.mentioning("peer (fsync=always)", "2 of 5")


def test_e2e_samples_fails_when_nothing_arrived() -> None:
    """No latency at all is a failure of the system, not a result."""
    with pytest.raises(ServerFailedError, match="none of the 4"):
        pubsub.e2e_samples([], 4, "peer", Messages())


# ---------------------------------------------------------------------------------------
# Server process helpers (with a stand-in process, not a broker)


def test_vmrss_is_read_in_mib() -> None:
    """VmRSS in kB from /proc/<pid>/status becomes MiB."""
    status = "Name:\tredis-server\nVmPeak:\t  99999 kB\nVmRSS:\t   15360 kB\nThreads:\t5\n"
    assert parse_vmrss_mib(status) == 15.0


def test_vmrss_missing_is_an_error() -> None:
    """A status without VmRSS (a zombie) is an error, not zero."""
    with pytest.raises(ValueError, match="no VmRSS"):
        parse_vmrss_mib("Name:\tx\nState:\tZ (zombie)\n")


def test_server_process_kill_and_stop(tmp_path: Path) -> None:
    """A started process has a pid and RSS; kill reaps it; stop after that is harmless."""
    process = ServerProcess([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "log")
    process.start()
    try:
        assert process.is_running
        assert _server_process.rss_mib(process.pid) > 0
    finally:
        process.kill()
    assert not process.is_running
    assert process.exit_code() == -9
    process.stop()
    with pytest.raises(ServerFailedError, match="not running"):
        _ = process.pid


def test_wait_until_serving_notices_the_server_died(tmp_path: Path) -> None:
    """If the process exits while we wait, the wait fails at once with its log's tail."""
    argv = [sys.executable, "-c", "print('bad config'); raise SystemExit(3)"]
    process = ServerProcess(argv, tmp_path / "log")
    process.start()

    async def never() -> None:
        raise ConnectionRefusedError

    start = time.perf_counter()
    with pytest.raises(ServerFailedError, match="bad config"):
        asyncio.run(wait_until_serving(never, timeout_s=30, process=process))
    assert time.perf_counter() - start < 10
    process.stop()


def test_wait_until_serving_times_out_with_the_last_error() -> None:
    """A probe that keeps failing ends in ServerFailedError naming its last error."""

    async def refused() -> None:
        raise ConnectionRefusedError("port 1")

    with pytest.raises(ServerFailedError, match="port 1"):
        asyncio.run(wait_until_serving(refused, timeout_s=0.05))


def test_wait_until_serving_returns_once_the_probe_succeeds() -> None:
    """The third attempt succeeds: the wait returns a non-negative duration."""
    attempts: list[int] = []

    async def probe() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionRefusedError

    assert asyncio.run(wait_until_serving(probe, timeout_s=5, interval_s=0.001)) >= 0
    assert len(attempts) == 3


# ---------------------------------------------------------------------------------------
# Which systems run


@pytest.mark.parametrize(
    ("value", "selected", "unknown"),
    [
        (None, ["headrace", "nats-jetstream", "redis-streams", "grpc-aio-floor"], []),
        ("", ["headrace", "nats-jetstream", "redis-streams", "grpc-aio-floor"], []),
        (" , ", ["headrace", "nats-jetstream", "redis-streams", "grpc-aio-floor"], []),
        ("grpc-aio-floor, headrace", ["headrace", "grpc-aio-floor"], []),
        ("nats-jetstream,redis-streams", ["nats-jetstream", "redis-streams"], []),
        (" redis-streams , headrace", ["headrace", "redis-streams"], []),
        ("redis,redis-streams", ["redis-streams"], ["redis"]),
    ],
)
def test_system_selection(value: str | None, selected: list[str], unknown: list[str]) -> None:
    """HEADRACE_BENCH_SYSTEMS picks systems by name, always in run order; unknown names
    are returned so they can be reported."""
    assert pubsub.select_systems(value) == (selected, unknown)


def test_the_floor_phase_measures_the_bare_transport_and_the_disk(tmp_path: Path) -> None:
    """Scenario: the floor phase at 200 msg/s for 0.5 s (real server and consumer
    processes over loopback gRPC, a real file synced). Expected: the floor's e2e p50 and
    p99 (p50 <= p99, both above 0), the disk's fdatasync p50, and the durable floor that
    is exactly their sum; every message arrived (nothing said); the data dir removed."""
    sizes = pubsub.Sizes(1_000, e2e_rate=200.0, e2e_seconds=0.5)
    said = Messages()
    results = {r.metric: r for r in pubsub.measure_floor(tmp_path / "floor", sizes, warn=said)}
    assert said.lines == []
    assert set(results) == {
        "e2e_latency_p50_ms",
        "e2e_latency_p99_ms",
        "fdatasync_p50_ms",
        "e2e_latency_p50_durable_floor_ms",
    }
    p50, p99 = results["e2e_latency_p50_ms"], results["e2e_latency_p99_ms"]
    sync, durable = results["fdatasync_p50_ms"], results["e2e_latency_p50_durable_floor_ms"]
    assert 0 < p50.value <= p99.value
    assert (p50.system, sync.system, durable.system) == ("grpc-aio-floor", "disk", "grpc-aio-floor")
    assert sync.value > 0
    assert durable.value == pytest.approx(p50.value + sync.value)
    assert (p50.params["fsync"], durable.params["fsync"]) == ("none", "always")
    assert not (tmp_path / "floor").exists()


def test_headrace_missing_is_skipped_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without bench._headrace_pubsub the headrace system is skipped, and stderr says so."""
    monkeypatch.setitem(sys.modules, "bench._headrace_pubsub", None)
    said = Messages()
    assert pubsub.default_entries(["headrace"], warn=said) == []
    assert said.mentioning("headrace system not available yet")


def test_pubsub_is_a_registered_scenario() -> None:
    """``python -m bench pubsub`` finds the scenario."""
    assert "pubsub" in SCENARIOS


# ---------------------------------------------------------------------------------------
# Finding and installing the peers' servers


def _which(paths: dict[str, str]) -> Callable[[str], str | None]:
    return paths.get


def _no_install(packages: Sequence[str]) -> bool:
    raise AssertionError(f"nothing should be installed, asked for {packages}")


def test_servers_on_path_are_used_without_installing() -> None:
    """Both servers are on PATH: both peers run, nothing is installed, nothing is said."""
    said = Messages()
    which = _which({"nats-server": "/usr/bin/nats-server", "redis-server": "/usr/bin/redis-server"})
    found = find_servers(
        [NATS, REDIS], which=which, installer=_no_install, has_module=lambda _: True, warn=said
    )
    assert found == {
        "nats-jetstream": "/usr/bin/nats-server",
        "redis-streams": "/usr/bin/redis-server",
    }
    assert said.lines == []


def test_missing_server_that_cannot_be_installed_is_skipped_with_the_reason() -> None:
    """Not root: the missing peer is skipped, and stderr says which, why, and the fix;
    the peer that is present still runs."""
    said = Messages()
    which = _which({"redis-server": "/usr/bin/redis-server"})
    found = find_servers(
        [NATS, REDIS],
        which=which,
        installer="not running as root",
        has_module=lambda _: True,
        warn=said,
    )
    assert found == {"redis-streams": "/usr/bin/redis-server"}
    [line] = said.lines
    assert "skipping nats-jetstream" in line
    assert "not running as root" in line
    assert "apt-get install -y nats-server" in line


def test_messages_name_the_scenario_that_looks_for_the_peer() -> None:
    """``bench dispatch`` looks for redis-server too: its messages say ``dispatch``, both
    when the client is missing and when the server is."""
    said = Messages()
    found = find_servers(
        [NATS, REDIS],
        which=_which({}),
        installer="not running as root",
        has_module=lambda name: name == "redis",
        warn=said,
        scenario="dispatch",
    )
    assert found == {}
    assert len(said.lines) == 2
    assert all(line.startswith("bench: dispatch: skipping ") for line in said.lines)
    assert said.mentioning("nats-py is not installed")
    assert said.mentioning("apt-get install -y redis-server")


def test_missing_servers_are_installed_in_one_go() -> None:
    """Both missing and apt works: one install of both packages, announced on stderr, and
    both peers run afterwards."""
    installed: dict[str, str] = {}
    calls: list[list[str]] = []

    def install(packages: Sequence[str]) -> bool:
        calls.append(list(packages))
        installed.update({p: f"/usr/bin/{p}" for p in packages})
        return True

    said = Messages()
    found = find_servers(
        [NATS, REDIS],
        which=installed.get,
        installer=install,
        has_module=lambda _: True,
        warn=said,
    )
    assert calls == [["nats-server", "redis-server"]]
    assert set(found) == {"nats-jetstream", "redis-streams"}
    assert said.mentioning("installing nats-server redis-server")


def test_failed_install_skips_the_peer() -> None:
    """apt-get fails: the peer is skipped and stderr says the install failed."""
    said = Messages()
    found = find_servers(
        [REDIS], which=_which({}), installer=lambda _: False, has_module=lambda _: True, warn=said
    )
    assert found == {}
    assert said.mentioning("skipping redis-streams", "apt-get install failed")


def test_missing_python_client_skips_the_peer_before_installing() -> None:
    """Without nats-py the NATS peer is skipped with the pip hint, and its server is not
    even looked for."""
    said = Messages()
    found = find_servers(
        [NATS],
        which=_which({}),
        installer=_no_install,
        has_module=lambda name: name != "nats",
        warn=said,
    )
    assert found == {}
    assert said.mentioning("skipping nats-jetstream", "nats-py", ".[bench]")


@pytest.mark.parametrize(
    ("euid", "apt", "expected"),
    [
        (1000, "/usr/bin/apt-get", "not running as root"),
        (0, None, "apt-get is not available"),
        (0, "/usr/bin/apt-get", apt_install),
    ],
)
def test_default_installer(euid: int, apt: str | None, expected: object) -> None:
    """apt-get is used only as root and only where it exists; otherwise the reason."""
    which = _which({"apt-get": apt} if apt else {})
    assert default_installer(which, lambda: euid) == expected


def test_peers_name_their_debian_packages() -> None:
    """The peers install from Debian's nats-server and redis-server packages."""
    assert (NATS.binary, NATS.package) == ("nats-server", "nats-server")
    assert (REDIS.binary, REDIS.package) == ("redis-server", "redis-server")
    assert isinstance(_peers.PEERS[0], Peer)


def test_redis_rejects_unknown_fsync(tmp_path: Path) -> None:
    """Only appendfsync always and everysec are measured."""
    with pytest.raises(ValueError, match="appendfsync"):
        _peers.RedisStreams(tmp_path, "no")


# ---------------------------------------------------------------------------------------
# Results and goals


def _measured(system: str, values: dict[str, float]) -> list[Result]:
    params = TINY.params("always", "uvloop")
    return [Result("pubsub", system, m, v, METRICS[m], dict(params)) for m, v in values.items()]


def test_goals_judge_headrace_only() -> None:
    """Each of Headrace's eleven metrics gets a goal row saying whether it was met; peers'
    results get none."""
    values = {
        "publish_msgs_s": 2_000_000.0,
        "consume_msgs_s": 900_000.0,
        "send_per_record_msgs_s": 300_000.0,
        "sync_send_per_record_msgs_s": 11_000.0,
        "consume_per_record_msgs_s": 499_999.0,
        "sync_consume_per_record_msgs_s": 12_700.0,
        "e2e_latency_p50_ms": 0.4,
        "e2e_latency_p99_ms": 7.0,
        "restart_to_serving_s": 0.2,
        "rss_mib": 150.0,
        "restart_after_kill_s": 0.5,
    }
    results = _measured("headrace", values) + _measured("redis-streams", values)
    goals = {r.metric: r for r in pubsub.derive_goals(results)}
    assert set(goals) == {*GOALS, *PEER_GOALS}
    met = {metric: r.params["met"] for metric, r in goals.items()}
    assert met == {
        "publish_msgs_s": True,
        "consume_msgs_s": False,
        "send_per_record_msgs_s": True,
        "sync_send_per_record_msgs_s": False,
        "consume_per_record_msgs_s": False,
        "sync_consume_per_record_msgs_s": False,
        "e2e_latency_p50_ms": True,  # 0.4 ms: at most Redis's 0.4 and 1 ms
        "e2e_latency_p99_ms": True,  # 7 ms: at most Redis's 7 in the same run
        "restart_to_serving_s": True,
        "rss_mib": False,
        "restart_after_kill_s": False,
    }
    assert all(r.system == "headrace" and r.is_goal for r in goals.values())
    assert goals["publish_msgs_s"].params["goal"] == ">= 1000000"
    assert goals["sync_send_per_record_msgs_s"].params["goal"] == ">= 300000"
    assert goals["consume_per_record_msgs_s"].params["goal"] == ">= 500000"


def test_e2e_goals_are_held_against_redis_always_in_the_same_run() -> None:
    """Headrace's e2e p50 0.9 ms and p99 4 ms; Redis ``always`` 0.8 / 6 ms and Redis
    ``everysec`` 0.3 / 1 ms in the same run. Expected: p50 is held to min(1 ms, Redis
    always 0.8) and missed; p99 to Redis always's 6 ms and met; ``everysec`` plays no
    part; each row's ``vs`` names what it was held against."""
    headrace = _measured("headrace", {"e2e_latency_p50_ms": 0.9, "e2e_latency_p99_ms": 4.0})
    always = _measured("redis-streams", {"e2e_latency_p50_ms": 0.8, "e2e_latency_p99_ms": 6.0})
    everysec = [
        Result(r.bench, r.system, r.metric, r.value / 6, r.unit, {**r.params, "fsync": "everysec"})
        for r in always
    ]
    goals = {r.metric: r for r in pubsub.derive_goals([*headrace, *everysec, *always])}
    p50, p99 = goals["e2e_latency_p50_ms"], goals["e2e_latency_p99_ms"]
    assert (p50.params["goal"], p50.params["met"]) == ("<= 0.8", False)
    assert p50.params["vs"] == "redis-streams fsync=always 0.8 ms in this run, and 1.00 ms"
    assert (p99.params["goal"], p99.params["met"]) == ("<= 6", True)
    assert p99.params["vs"] == "redis-streams fsync=always 6.00 ms in this run"


def test_e2e_goals_without_redis_fall_back_to_absolute_targets() -> None:
    """Headrace alone: p50 0.9 ms and p99 6 ms. Expected: p50 is held to 1 ms (met) and
    p99 to 5 ms (missed), each row saying Redis was not measured."""
    headrace = _measured("headrace", {"e2e_latency_p50_ms": 0.9, "e2e_latency_p99_ms": 6.0})
    goals = {r.metric: r for r in pubsub.derive_goals(headrace)}
    p50, p99 = goals["e2e_latency_p50_ms"], goals["e2e_latency_p99_ms"]
    assert (p50.params["goal"], p50.params["met"]) == ("<= 1", True)
    assert (p99.params["goal"], p99.params["met"]) == ("<= 5", False)
    assert p50.params["vs"] == "redis-streams fsync=always not measured: 1.00 ms alone"


def test_no_goals_without_headrace() -> None:
    """Peers alone produce no goal rows."""
    results = _measured("nats-jetstream", {"publish_msgs_s": 5e6, "rss_mib": 1.0})
    assert list(pubsub.derive_goals(results)) == []


def _entry(
    system: str,
    fsync: str,
    built: list[FakeSystem],
    fail_in: str | None = None,
    *,
    per_record: bool = False,
) -> Entry:
    def build(data_dir: Path) -> FakeSystem:
        assert data_dir.is_dir()
        kind = FakePerRecordSystem if per_record else FakeSystem
        fake = kind(system, fsync, fail_in=fail_in)
        built.append(fake)
        return fake

    return Entry(system, build)


def test_run_reports_every_metric_of_every_system(tmp_path: Path) -> None:
    """Three fake systems: seven results each with the scenario's params (eleven for Headrace,
    whose per-record rows follow its consume row), in the order the systems ran, then
    Headrace's eleven goals; every line is valid bench JSON; the data dirs are gone
    afterwards."""
    built: list[FakeSystem] = []
    entries = [
        _entry("headrace", "always", built, per_record=True),
        _entry("nats-jetstream", "default", built),
        _entry("redis-streams", "everysec", built),
    ]
    said = Messages()
    samples = SampleLog()
    options = RunOptions(quick=True, data_dir=tmp_path, samples=samples)
    results = list(pubsub.run(options, entries=entries, sizes=TINY, warn=said))
    measured = [r for r in results if not r.is_goal]
    assert [r.system for r in measured[11::7]] == ["nats-jetstream", "redis-streams"]
    assert [r.metric for r in measured[:11]] == list(METRICS)
    assert [r.system for r in measured[:11]] == ["headrace"] * 11
    assert {r.metric for r in measured[11:]}.isdisjoint(pubsub.PER_RECORD_METRICS)
    for r in measured:
        assert r.unit == METRICS[r.metric]
        assert r.value > 0
        assert r.params["payload_bytes"] == 100
        assert r.params["messages"] == 1000
        json.loads(r.to_json())
    assert {r.params["fsync"] for r in measured} == {"always", "default", "everysec"}
    assert len([r for r in results if r.is_goal]) == len(GOALS) + len(PEER_GOALS)
    assert all(fake.calls[-1] == "stop" for fake in built)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []
    kept = list(samples)
    assert [d.system for d in kept] == ["headrace", "nats-jetstream", "redis-streams"]
    assert all(d.metric == "e2e_latency_quantile_ms" for d in kept)
    assert all(list(d.samples) == sorted(d.samples) and d.samples for d in kept)
    p50s = [r.value for r in measured if r.metric == "e2e_latency_p50_ms"]
    assert [nearest_rank(d.samples, 0.5) for d in kept] == p50s


def test_a_failing_system_is_reported_stopped_and_skipped(tmp_path: Path) -> None:
    """A system that fails in consume keeps its publish result, is stopped, is named on
    stderr with its error, and the next system still runs in full."""
    built: list[FakeSystem] = []
    entries = [
        _entry("nats-jetstream", "default", built, fail_in="consume"),
        _entry("redis-streams", "always", built),
    ]
    said = Messages()
    results = list(
        pubsub.run(
            RunOptions(quick=True, data_dir=tmp_path),
            entries=entries,
            sizes=TINY,
            warn=said,
        )
    )
    nats_metrics = [r.metric for r in results if r.system == "nats-jetstream"]
    assert nats_metrics == ["publish_msgs_s"]
    assert len([r for r in results if r.system == "redis-streams"]) == 7
    assert built[0].calls == ["start", "publish", "consume", "stop"]
    assert said.mentioning("nats-jetstream failed", "failed in consume")


def test_run_with_no_system_says_so(tmp_path: Path) -> None:
    """Nothing selected or installable: no results, and a line on stderr."""
    said = Messages()
    options = RunOptions(quick=True, data_dir=tmp_path)
    assert list(pubsub.run(options, entries=[], sizes=TINY, warn=said)) == []
    assert said.mentioning("no system to measure")


def test_apt_install_output_goes_to_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """apt-get's chatter must not reach stdout, where --json lines go; a failing update
    stops before the install."""
    calls: list[tuple[list[str], object]] = []

    def fake_run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        calls.append((argv, kwargs["stdout"]))
        return subprocess.CompletedProcess(argv, 100)

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert apt_install(["redis-server"]) is False
    assert calls == [(["apt-get", "update"], sys.stderr)]


class _CountingSystem(FakeSystem):
    """A FakeSystem that remembers what each publish sent and whether a restart followed."""

    def __init__(self) -> None:
        super().__init__("headrace", "always")
        self.published: list[tuple[int, int]] = []

    async def publish(self, count: int, payload: bytes) -> float:
        self.published.append((count, len(payload)))
        return await super().publish(count, payload)


def test_restart_after_kill_fills_the_log_then_kills(tmp_path: Path) -> None:
    """The last phase publishes ``restart_log_bytes`` in 64 KiB payloads, then SIGKILLs and
    restarts; its result says how much was written, beside the usual params, and Headrace's
    goal for it is < 0.5 s."""
    fake = _CountingSystem()
    sizes = Sizes(messages=1000, e2e_rate=100.0, e2e_seconds=0.5, restart_log_bytes=8 << 20)
    entry = Entry("headrace", lambda _d: fake)
    results = list(pubsub.measure_system(entry, tmp_path / "x", sizes, warn=Messages()))
    last = results[-1]
    assert last.metric == "restart_after_kill_s"
    assert (last.value, last.unit) == (0.25, "s")
    assert last.params["log_bytes"] == 8 << 20
    assert last.params["log_payload_bytes"] == 64 << 10
    assert last.params["fsync"] == "always"
    assert fake.published[-1] == (128, 64 << 10)
    assert fake.calls[-3:] == ["publish", "kill_and_restart", "stop"]
    assert GOALS["restart_after_kill_s"].params(0.4)["met"] is True


def _peer_runnable(binary: str, module: str) -> bool:
    return shutil.which(binary) is not None and importlib.util.find_spec(module) is not None


@pytest.mark.parametrize(
    ("build", "binary", "module"),
    [
        (_peers.NatsJetStream, "nats-server", "nats"),
        (lambda d: _peers.RedisStreams(d, "always"), "redis-server", "redis"),
    ],
    ids=["nats-jetstream", "redis-streams"],
)
def test_a_peer_publishes_again_after_kill_and_restart(
    build: Callable[[Path], PubSubSystem], binary: str, module: str, tmp_path: Path
) -> None:
    """Scenario: a real peer server publishes, is SIGKILLed and restarted, then publishes
    again, as the scenario's last phase does. Expected: both publishes are acknowledged (the
    client reconnected after the restart; it used to publish on a closed client). Needs
    the peer's server and Python client (the bench extra); skipped otherwise."""
    if not _peer_runnable(binary, module):
        pytest.skip(f"needs {binary} and the {module} client (pip install -e '.[bench]')")
    system = build(tmp_path)

    async def scenario() -> None:
        await system.start()
        try:
            assert await system.publish(50, b"x" * 100) > 0
            assert await system.kill_and_restart() > 0
            assert await system.publish(50, b"y" * 100) > 0
        finally:
            await system.stop()

    asyncio.run(scenario())
