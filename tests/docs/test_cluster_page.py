"""docs/operations/cluster.md runs as printed: `cluster local` on loopback, the page's
session through the seed list, and a broker started from the page's `[cluster]` settings.

Substitutions (the only changes made to the page's commands): the data directory and
`--base-port` of `cluster local` (a temporary directory and a free port range, so tests
can run side by side); the seed ports in `export HEADRACE_BROKER=...` (those of that base
port). In the TOML example, the etcd endpoints, the TLS files and the addresses become
this test's loopback etcd and ports (the TLS keys are left out: loopback needs none).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from tests.broker.test_cli_client import CLI
from tests.broker.test_cli_cluster import free_base_port, headrace, local_cluster
from tests.cluster.etcd_harness import etcd_binary
from tests.docs._shell import ROOT, block_after, commands, environment, session, substitute

PAGE = ROOT / "docs" / "operations" / "cluster.md"
#: The base port the page's commands assume (`cluster local`'s default).
PAGE_BASE = 52379


def test_the_local_cluster_session_runs_as_printed(tmp_path: Path) -> None:
    """Scenario: the page's `cluster local --brokers 3` (data directory and base port
    substituted), then its second block in one shell, seeds substituted.
    Expected: `cluster local` is the page's command but for the substitutions; every
    command of the session exits 0; the two topics are created; the five records come
    back; `cluster status` names 3 of 3 brokers alive, a controller, etcd healthy and no
    offline topic, as the page's sample does; orders and payments are owned by two
    different brokers (fewest partitions first). The client guide's cluster listing
    example (docs/examples/cluster_listing.py, seeds from HEADRACE_BROKER) then lists
    both topics online with their owners, and billing's lag 0 on b1."""
    etcd_binary()
    (start,) = commands(block_after(PAGE, "## Try it on one machine"))
    assert start == ".venv/bin/headrace cluster local --brokers 3 --data-dir /tmp/headrace-cluster"
    base = free_base_port(3)
    data = tmp_path / "cluster"
    steps = commands(block_after(PAGE, "In another terminal"))
    seeds_on_page = ",".join(f"127.0.0.1:{PAGE_BASE + i}" for i in (1, 2, 3))
    assert steps[0] == f"export HEADRACE_BROKER={seeds_on_page}"
    with local_cluster(data, 3, base) as (seeds, _process):
        assert seeds == ",".join(f"127.0.0.1:{base + i}" for i in (1, 2, 3))
        ran = session(
            [substitute(s, {seeds_on_page: seeds}) for s in steps], tmp_path, {}, timeout=180
        )
        for step in ran:
            assert step.returncode == 0, (step.command, step.stdout, step.stderr)
        assert "created topic orders with 3 partitions" in ran[1].stdout
        assert "created topic payments with 2 partitions" in ran[2].stdout
        assert sorted(ran[4].stdout.split()) == ["1", "2", "3", "4", "5"]
        status = ran[5].stdout
        assert re.search(r"3 of 3 brokers alive, controller b[123]", status), status
        assert "etcd: 1 of 1 endpoint healthy" in status
        assert "offline topics: none" in status
        listed = subprocess.run(
            [sys.executable, str(ROOT / "docs" / "examples" / "cluster_listing.py")],
            env=environment({"HEADRACE_BROKER": seeds}),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert [line.split()[:3] for line in lines if line.startswith(("orders ", "payments "))][
            :2
        ] == [["orders", "b1", "online"], ["payments", "b2", "online"]], listed.stdout
        assert "orders billing b1 0" in lines, listed.stdout
        document = json.loads(headrace("cluster", "status", "--json", "--broker", seeds).stdout)
        owned = {b["node_id"]: (b["topics"], b["partitions"]) for b in document["brokers"]}
        assert sorted(owned.values()) == [(0, 0), (1, 2), (1, 3)], owned


def test_the_replicated_topic_example_runs_as_printed(tmp_path: Path) -> None:
    """Scenario: `cluster local --brokers 3`, then the page's replicated-topic block with
    HEADRACE_BROKER set to the seeds, then `topics describe orders` and `cluster status`.
    Expected: the create exits 0 naming three replicas; describe prints the page's four
    replication lines (leader with its epoch, the three brokers as replicas, the in-sync
    set, min_insync 2); status has the under-replicated section the page describes."""
    etcd_binary()
    (create,) = commands(block_after(PAGE, "## Replicated topics"))
    assert create == (
        ".venv/bin/headrace topics create orders --partitions 3 --replication-factor 3 "
        "--min-insync-replicas 2"
    )
    base = free_base_port(3)
    with local_cluster(tmp_path / "cluster", 3, base) as (seeds, _process):
        ran = session(
            [create, "headrace topics describe orders", "headrace cluster status"],
            tmp_path,
            {"HEADRACE_BROKER": seeds},
            timeout=120,
        )
    for step in ran:
        assert step.returncode == 0, (step.command, step.stdout, step.stderr)
    assert "created topic orders with 3 partitions, replicas b" in ran[0].stdout
    lines = ran[1].stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("leader "))
    assert re.fullmatch(r"leader     b[123] \(epoch \d+\)", lines[at]), lines
    assert sorted(lines[at + 1].removeprefix("replicas   ").split(", ")) == ["b1", "b2", "b3"]
    assert lines[at + 2].startswith("isr        b")
    assert lines[at + 3] == "min_insync 2"
    rest = lines[at + 4 :]  # answered by the leader: each follower per partition, then
    split = next(i for i, line in enumerate(rest) if line.startswith("log "))  # other logs
    follower_table, log_table = rest[:split], rest[split:]
    assert follower_table[0].split() == [
        "partition",
        "follower",
        "fetch_offset",
        "lag_records",
        "lag_s",
        "in_sync",
    ]
    assert len(follower_table) == 1 + 3 * 2, lines  # 3 partitions x 2 followers
    assert log_table[0].split() == ["log", "follower", "lag_records", "lag_s", "in_sync"]
    assert sorted(line.split()[0] for line in log_table[1:]) == ["state", "state"], lines
    assert "under-replicated topics: " in ran[2].stdout


def test_the_toml_example_joins_a_cluster(tmp_path: Path) -> None:
    """Scenario: the page's broker.toml with its etcd endpoints and addresses pointed at
    this test's `cluster local` etcd on loopback and free ports (TLS keys left out), then
    `headrace serve --config broker.toml` as the page says.
    Expected: the TOML parses with the keys the page explains; the broker joins as b1's
    neighbour under the page's node id (renamed b9: b1 is taken by the local cluster's
    first broker) and `cluster status` shows it alive; SIGTERM stops it with exit 0."""
    etcd_binary()
    text = block_after_toml(PAGE)
    config = tomllib.loads(text)
    assert set(config["cluster"]) == {
        "etcd", "node_id", "advertise", "etcd_ca", "etcd_cert", "etcd_key",
    }  # fmt: skip
    assert config["broker"]["listen"] == "0.0.0.0:50051"
    base = free_base_port(1)
    with local_cluster(tmp_path / "cluster", 1, base) as (seeds, _process):
        port = free_port()
        doc: dict[str, dict[str, object]] = {
            "broker": {"data_dir": str(tmp_path / "b9"), "listen": f"127.0.0.1:{port}"},
            "cluster": {
                "etcd": [f"127.0.0.1:{base}"],
                "node_id": "b9",
                "advertise": f"127.0.0.1:{port}",
            },
        }
        lines = [f'[{table}]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
                 for table, keys in doc.items()]  # fmt: skip
        (tmp_path / "broker.toml").write_text("\n".join(lines))
        with subprocess.Popen(
            [*CLI, "serve", "--config", "broker.toml"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as serve:
            try:
                found = wait_alive(seeds, "b9")
                assert found["address"] == f"127.0.0.1:{port}"
            finally:
                serve.send_signal(signal.SIGTERM)
                assert serve.wait(timeout=30) == 0, serve.stderr.read() if serve.stderr else ""


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def block_after_toml(page: Path) -> str:
    """The first ```toml block of ``page`` after its "Running it for real" heading."""
    text = page.read_text()
    start = text.index("## Running it for real")
    found = re.search(r"```toml\n(.*?)```", text[start:], re.DOTALL)
    assert found is not None
    return found[1]


def wait_alive(seeds: str, node_id: str, within_s: float = 30.0) -> dict[str, object]:
    """The ``cluster status --json`` entry of ``node_id`` once it is alive."""
    deadline = time.monotonic() + within_s
    last = ""
    while time.monotonic() < deadline:
        answer = headrace("cluster", "status", "--json", "--broker", seeds)
        last = answer.stdout + answer.stderr
        if answer.returncode == 0:
            for entry in json.loads(answer.stdout)["brokers"]:
                if entry["node_id"] == node_id and entry["alive"]:
                    return dict(entry)
        time.sleep(0.3)
    raise AssertionError(f"{node_id} never showed alive: {last}")
