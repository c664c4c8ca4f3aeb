"""The ``dispatch`` bench scenario, run small: it measures what it says, and judges goals."""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from bench import _dispatch_workloads, dispatch
from bench._dispatch_procs import GRACE_S
from bench._fanout_child import LineProcess
from bench._output import Goal, Params, Result, render_human
from bench._runner import SCENARIOS
from bench._samples import SampleLog, nearest_rank
from bench._scenario import RunOptions
from bench._server_process import ServerFailedError

#: Small sizes for every part: 2 rounds of lost notifications, 50 idle subscriptions, an
#: e2e run of 4 subscriptions at 200 msg/s for 1 s, the same at 100 msg/s side by side with
#: the bare gRPC fan-out, and 2,000 shared records.
SMALL = dispatch.Sizes(
    losses=40,
    per_round=20,
    idle_subscriptions=50,
    cpu_seconds=0.2,
    e2e_subscriptions=4,
    e2e_rate=200.0,
    e2e_seconds=1.0,
    e2e_processes=2,
    floor_rate=100.0,
    shared_records=2_000,
    shared_consumers=3,
)
PARAMS: Params = {"heartbeat_ms": 500.0, "loop": "test"}
#: The Redis Streams peer runs beside Headrace when its server and client are here (the
#: ``bench`` extra and Debian's redis-server; CI installs neither).
REDIS_SERVER = shutil.which("redis-server")
REDIS_PEERS = (
    {"redis-streams": REDIS_SERVER}
    if REDIS_SERVER is not None and importlib.util.find_spec("redis") is not None
    else {}
)
needs_redis = pytest.mark.skipif(
    not REDIS_PEERS, reason="needs redis-server and redis-py (pip install -e '.[bench]')"
)


def by_metric(results: list[Result]) -> tuple[dict[str, Result], dict[str, Result]]:
    """(measured, judged) results by metric name: Headrace's, at the e2e rate (the runs at
    the floor's rate and the bare fan-out's are left out; see :func:`side_by_side`)."""
    mine = [
        r
        for r in results
        if r.system == "headrace" and r.params.get("rate_msg_s") in (None, SMALL.e2e_rate)
    ]
    measured = {r.metric: r for r in mine if not r.is_goal}
    goals = {r.metric: r for r in mine if r.is_goal}
    return measured, goals


def side_by_side(results: list[Result], rate: float) -> dict[tuple[str, str], Result]:
    """The e2e results at ``rate``, by (system, metric)."""
    return {
        (r.system, r.metric): r
        for r in results
        if not r.is_goal and r.params.get("rate_msg_s") == rate
    }


def test_a_small_run_measures_every_metric_and_judges_its_goals(tmp_path: Path) -> None:
    """Scenario: the whole scenario, small: 40 records in 2 rounds with every notification
    dropped, 50 idle subscriptions for 0.2 s, then a real broker with 4 e2e subscriptions
    at 200 msg/s for 1 s and 2,000 records through 3 shared consumers. Expected: every
    metric with a goal is measured and judged, plus the e2e p50; all 40 lost records are
    delivered (by the heartbeat alone: nothing else can wake the dispatcher), none stuck,
    every delay positive, a CPU share in [0, 100], and the human report names them all."""
    samples = SampleLog()
    options = RunOptions(quick=True, data_dir=tmp_path, samples=samples)
    results = list(dispatch.run(options, sizes=SMALL, peers={}))
    measured, goals = by_metric(results)
    assert set(goals) == set(dispatch.GOALS)
    assert set(measured) == {*dispatch.GOALS, "e2e_latency_p50_ms"}
    missed = measured["missed_notification_delivery_ms"]
    assert missed.params["delivered"] == 40
    assert missed.value > 0
    assert measured["stuck_records"].value == 0
    assert goals["stuck_records"].params["met"] is True
    assert 0 <= measured["heartbeat_cpu_pct"].value <= 100
    assert goals["e2e_latency_p99_ms"].params["goal"] == "<= 5"
    assert goals["shared_msgs_s"].params["goal"] == ">= 500000"
    assert all(r.bench == "dispatch" for r in results)
    assert {r.system for r in results} == {"headrace", "grpc-aio-floor"}
    assert all(r.system == "headrace" for r in results if r.is_goal)  # peers are not judged
    assert len([r for r in results if r.is_goal]) == len(dispatch.GOALS)
    assert all(r.params["heartbeat_ms"] == 500.0 for r in results)
    report = render_human("dispatch", results)
    assert "e2e_latency_p99_ms" in report
    assert "shared_msgs_s" in report
    assert "dispatch" in SCENARIOS
    kept = {(d.system, d.metric, d.params.get("rate_msg_s")): d for d in samples}
    assert len(kept[("headrace", dispatch.MISSED_SERIES, None)].samples) == 40
    e2e = kept[("headrace", dispatch.E2E_SERIES, SMALL.e2e_rate)]
    assert nearest_rank(e2e.samples, 0.5) == measured["e2e_latency_p50_ms"].value
    assert ("grpc-aio-floor", dispatch.E2E_SERIES, SMALL.floor_rate) in kept


@pytest.fixture(scope="module")
def broker_run(tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """The broker phases at :data:`SMALL` sizes, run once for the tests that read them."""
    root = tmp_path_factory.mktemp("broker")
    return list(dispatch.broker_phases(root, SMALL, PARAMS, REDIS_PEERS))


@pytest.fixture(scope="module")
def broker_results(broker_run: list[Result]) -> dict[str, Result]:
    return by_metric(broker_run)[0]


def test_headrace_and_the_bare_grpc_fan_out_run_side_by_side(broker_run: list[Result]) -> None:
    """Scenario: the e2e phase again at the floor's rate (100 msg/s), then the bare gRPC
    fan-out (its own server and consumer processes) with the same subscriptions, rate and
    length. Expected: both measured every (record, subscription) pair, 400 each, with
    matching params but for the fsync, and positive, ordered percentiles."""
    got = side_by_side(broker_run, SMALL.floor_rate)
    got = {key: r for key, r in got.items() if key[0] != "redis-streams"}
    assert set(got) == {
        (system, f"e2e_latency_p{q}_ms")
        for system in ("headrace", "grpc-aio-floor")
        for q in (50, 99)
    }
    for system in ("headrace", "grpc-aio-floor"):
        p50, p99 = got[(system, "e2e_latency_p50_ms")], got[(system, "e2e_latency_p99_ms")]
        assert 0 < p50.value <= p99.value < GRACE_S * 1000
        assert p99.params["samples"] == 400
        assert p99.params["subscriptions"] == 4
    mine, floor = (
        got[("headrace", "e2e_latency_p99_ms")],
        got[("grpc-aio-floor", "e2e_latency_p99_ms")],
    )
    assert (mine.params["fsync"], floor.params["fsync"]) == ("always", "none")
    same = {"subscriptions", "rate_msg_s", "seconds", "payload_bytes", "samples"}
    assert {k: mine.params[k] for k in same} == {k: floor.params[k] for k in same}


@needs_redis
@pytest.mark.parametrize("rate", [SMALL.floor_rate, SMALL.e2e_rate])
def test_redis_streams_fans_out_beside_headrace_at_both_rates(
    broker_run: list[Result], rate: float
) -> None:
    """Scenario: a real redis-server (AOF, appendfsync always) with 4 consumer groups on
    one stream, their consumers in one process, fed at the floor's rate and at the e2e
    rate for 1 s. Expected: every (record, group) pair measured (100 or 200 records, 4
    groups), positive ordered percentiles, and the same params as Headrace's run at that
    rate but for the consumer processes."""
    got = side_by_side(broker_run, rate)
    p50, p99 = (
        got[("redis-streams", "e2e_latency_p50_ms")],
        got[("redis-streams", "e2e_latency_p99_ms")],
    )
    assert 0 < p50.value <= p99.value < GRACE_S * 1000
    assert p99.params["samples"] == round(rate * SMALL.e2e_seconds) * 4
    mine = got[("headrace", "e2e_latency_p99_ms")]
    same = {"fsync", "subscriptions", "rate_msg_s", "seconds", "payload_bytes", "samples"}
    assert {k: p99.params[k] for k in same} == {k: mine.params[k] for k in same}
    assert p99.params["consumer_processes"] == 1


def test_e2e_samples_every_record_and_subscription_pair(
    broker_results: dict[str, Result],
) -> None:
    """Scenario: a real broker (fsync always), 4 exclusive subscriptions split over 2
    consumer processes, 200 stamped records a second for 1 s. Expected: one latency
    sample per (record, subscription) pair, 800 in all; p50 and p99 positive, p50 <= p99,
    both under the 10 s grace; params say how they were measured."""
    p50, p99 = broker_results["e2e_latency_p50_ms"], broker_results["e2e_latency_p99_ms"]
    assert 0 < p50.value <= p99.value < GRACE_S * 1000
    assert p50.params == p99.params
    assert p99.params["samples"] == 800
    assert p99.params["subscriptions"] == 4
    assert p99.params["consumer_processes"] == 2
    assert p99.params["rate_msg_s"] == 200.0
    assert p99.params["fsync"] == "always"
    assert p99.unit == "ms"


def test_shared_throughput_counts_every_record_acked_one_by_one(
    broker_results: dict[str, Result],
) -> None:
    """Scenario: 2,000 records preloaded on 4 partitions, then 3 consumers on one shared
    subscription, each acking every record on its own. Expected: a positive msgs/s rate
    whose params name the records, consumers, partitions and per-record acks (the phase
    checks that every record arrived and the subscription's lag went to 0)."""
    shared = broker_results["shared_msgs_s"]
    assert shared.value > 0
    assert shared.unit == "msgs/s"
    assert shared.params["records"] == 2_000
    assert shared.params["consumers"] == 3
    assert shared.params["partitions"] == _dispatch_workloads.SHARED_PARTITIONS
    assert shared.params["acks"] == "per_record"


def test_a_broker_that_refuses_the_subscription_skips_the_shared_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scenario: the broker refuses the shared subscription with INVALID_ARGUMENT, as a
    broker without the ``shared`` type does (here the name is the reason, so that the
    refusal does not depend on which types the broker offers). Expected: no shared_msgs_s
    result, one line on stderr naming the metric and the broker's reason, and the e2e
    results of the same run are still there."""
    monkeypatch.setattr(_dispatch_workloads, "SHARED_SUBSCRIPTION", "-not-a-valid-name")
    sizes = dataclasses.replace(SMALL, e2e_subscriptions=1, e2e_processes=1, e2e_seconds=0.2)
    results = list(dispatch.broker_phases(tmp_path, sizes, PARAMS))
    measured, _ = by_metric(results)
    assert "shared_msgs_s" not in measured
    assert "e2e_latency_p99_ms" in measured
    err = capsys.readouterr().err
    assert (
        "bench: dispatch: skipping shared_msgs_s: the broker refused a shared subscription" in err
    )
    assert "INVALID_ARGUMENT" in err


def test_sizes_refuse_more_consumer_processes_than_subscriptions() -> None:
    """Scenario: Sizes with 3 e2e processes for 2 subscriptions, or no shared consumer.
    Expected: ValueError, before anything starts."""
    with pytest.raises(ValueError, match="e2e_processes"):
        dataclasses.replace(SMALL, e2e_subscriptions=2, e2e_processes=3)
    with pytest.raises(ValueError, match="shared_consumers"):
        dataclasses.replace(SMALL, shared_consumers=0)


@pytest.mark.parametrize(
    ("op", "value", "met"),
    [("<=", 5.0, True), ("<=", 5.01, False), ("<", 5.0, False), (">=", 5.0, True)],
)
def test_goal_operators(op: str, value: float, met: bool) -> None:
    """Scenario: each goal operator against 5. Expected: met exactly as the operator says."""
    assert Goal(op, 5.0).met(value) is met


def test_an_unknown_goal_operator_is_refused() -> None:
    """Scenario: a goal with operator ``~``. Expected: ValueError naming it."""
    with pytest.raises(ValueError, match="unknown goal operator"):
        Goal("~", 1.0).met(1.0)


@pytest.mark.asyncio(loop_scope="function")
async def test_a_line_wait_that_times_out_loses_no_line(tmp_path: Path) -> None:
    """Scenario: a child prints one line after 0.5 s and exits; the driver first waits
    0.05 s for it (the summary wait that times out), then again.
    Expected: the first wait raises TimeoutError, the second gets the line; after that the
    closed stdout is reported with the exit status."""
    code = "import time; time.sleep(0.5); print('late', flush=True)"
    child = await LineProcess.spawn(
        [sys.executable, "-c", code], log=tmp_path / "child.log", who="the child"
    )
    try:
        with pytest.raises(TimeoutError):
            await child.line(0.05)
        assert await child.line(10) == "late"
        with pytest.raises(ServerFailedError, match="the child exited with status 0"):
            await child.line(10)
    finally:
        await child.reap()
