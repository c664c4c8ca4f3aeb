"""`headrace cluster status|local`: a status from a single broker (node `local`), a whole
local cluster (real etcd, real broker processes) started, used through one seed, stopped
by SIGINT with nothing left running, and started again on the same directory."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from broker.app import Broker
from broker.cli_cluster import status_document, status_text
from proto import cluster_pb2
from tests.broker.conftest import broker_config
from tests.broker.test_cli_client import CLI
from tests.cluster.etcd_harness import etcd_binary


def headrace(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``headrace ARGS`` as a process."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, check=False, env=env
    )


def free_base_port(brokers: int) -> int:
    """A base port whose etcd, broker and metrics ports (``cluster local``'s layout) are
    all free now."""
    for _ in range(100):
        base = random.randrange(20_000, 30_000)
        wanted = [base, base + 100] + [base + i for i in range(1, brokers + 1)]
        wanted += [base + 100 + i for i in range(1, brokers + 1)]
        sockets = [socket.socket() for _ in wanted]
        try:
            for sock, port in zip(sockets, wanted, strict=True):
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return base
    raise RuntimeError("no free port range")


def processes_naming(text: str) -> list[str]:
    """The command lines of running processes that mention ``text`` (zombies excluded)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdecimal():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(f"{pid}: {cmdline}")
    return found


@contextmanager
def local_cluster(
    data_dir: Path, brokers: int, base: int
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Run `headrace cluster local` until it prints its seed list; yield (seeds, process);
    SIGINT it on the way out (a test may have done so already)."""
    argv = [*CLI, "cluster", "local", "--brokers", str(brokers), "--data-dir", str(data_dir),
            "--base-port", str(base)]  # fmt: skip
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            seeds = process.stdout.readline().strip()  # printed once every broker serves
            if not seeds:
                process.wait(timeout=30)
                assert process.stderr is not None
                pytest.fail(f"cluster local did not start: {process.stderr.read()}")
            yield seeds, process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                process.wait(timeout=60)


def test_status_of_a_single_broker_is_node_local(tmp_path: Path) -> None:
    """Scenario: a broker with no cluster and one topic; `cluster status`, then `--json`.
    Expected: the table says a single broker (node local) with 1 topic of 3 partitions,
    alive; the JSON has one broker `local`, controller `local`, no etcd, nothing offline."""

    async def run() -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        async with Broker(broker_config(tmp_path / "data")) as broker:
            address = f"127.0.0.1:{broker.port}"
            made = await asyncio.to_thread(
                headrace, "topics", "create", "t", "--partitions", "3", "--broker", address
            )
            assert made.returncode == 0, made.stderr
            text = await asyncio.to_thread(headrace, "cluster", "status", "--broker", address)
            as_json = await asyncio.to_thread(
                headrace, "cluster", "status", "--json", "--broker", address
            )
            return text, as_json

    text, as_json = asyncio.run(run())
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("a single broker (node local), no cluster: 1 of 1 broker alive")
    row = next(line for line in text.stdout.splitlines() if line.startswith("local "))
    assert row.split()[2:5] == ["yes", "1", "3"]
    document = json.loads(as_json.stdout)
    assert [(b["node_id"], b["alive"], b["topics"]) for b in document["brokers"]] == [
        ("local", True, 1)
    ]
    assert document["controller"] == "local"
    assert document["etcd"] == []
    assert document["offline_topics"] == []


def test_status_of_no_broker_is_one_line() -> None:
    """Scenario: `cluster status` where nothing listens.
    Expected: exit code 1 and one line naming the address."""
    done = headrace("cluster", "status", "--broker", "127.0.0.1:1")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: cannot reach a broker at 127.0.0.1:1")
    assert len(done.stderr.strip().splitlines()) == 1


def test_local_without_etcd_says_how_to_install_it(tmp_path: Path) -> None:
    """Scenario: `cluster local` with a PATH that holds no etcd.
    Expected: exit code 1; the line names apt-get install etcd-server and brew install
    etcd; no data directory is made."""
    done = headrace(
        "cluster", "local", "--data-dir", str(tmp_path / "c"),
        env={**os.environ, "PATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 1
    assert "apt-get install etcd-server" in done.stderr
    assert "brew install etcd" in done.stderr
    assert not (tmp_path / "c").exists()


def test_local_names_a_broker_that_cannot_start_and_leaves_nothing(tmp_path: Path) -> None:
    """Scenario: etcd is installed; broker b2's port is taken by another socket.
    Expected: exit code 1, one error naming b2 and its log; etcd and b1 are stopped (no
    process of the data directory is left)."""
    etcd_binary()
    base = free_base_port(2)
    data = tmp_path / "cluster"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 2))
        taken.listen()
        done = subprocess.run(
            [*CLI, "cluster", "local", "--brokers", "2", "--data-dir", str(data),
             "--base-port", str(base)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"Error: b2 exited while starting (code 1); its log {data / 'b2.log'}" in done.stderr
    assert done.stdout == ""
    assert processes_naming(str(data)) == []


def test_local_cluster_serves_topics_through_one_seed_and_stops_on_sigint(
    tmp_path: Path,
) -> None:
    """Scenario: `cluster local --brokers 2` (real etcd, two real brokers); four topics
    created through one seed with the CLI, five records produced and consumed; `cluster
    status --json`; SIGINT; then started again on the same directory.
    Expected: status shows 2 brokers alive owning the 4 topics between them (each at
    least one), a controller, etcd healthy, nothing offline; SIGINT ends it with exit code
    0 within 30 s and no process of the directory left; the restart lists the 4 topics
    and the records are still there."""
    etcd_binary()
    base = free_base_port(2)
    data = tmp_path / "cluster"
    with local_cluster(data, 2, base) as (seeds, process):
        first = seeds.split(",")[0]
        assert seeds == f"127.0.0.1:{base + 1},127.0.0.1:{base + 2}"
        for name in ("t1", "t2", "t3", "t4"):
            made = headrace("topics", "create", name, "--partitions", "2", "--broker", first)
            assert made.returncode == 0, made.stderr
        sent = subprocess.run(
            [*CLI, "produce", "t3", "--broker", first], input="1\n2\n3\n4\n5\n",
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        status = headrace("cluster", "status", "--json", "--broker", first)
        assert status.returncode == 0, status.stderr
        document = json.loads(status.stdout)
        brokers = {b["node_id"]: b for b in document["brokers"]}
        assert sorted(brokers) == ["b1", "b2"]
        assert all(b["alive"] for b in brokers.values())
        assert sum(b["topics"] for b in brokers.values()) == 4
        assert min(b["topics"] for b in brokers.values()) >= 1
        assert document["controller"] in brokers
        assert [e["healthy"] for e in document["etcd"]] == [True]
        assert document["offline_topics"] == []

        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - started < 30
        assert process.stderr is not None
        assert "stopped: etcd and every broker have exited" in process.stderr.read()
    assert processes_naming(str(data)) == []

    with local_cluster(data, 2, base) as (seeds, _):
        listed = headrace("topics", "list", "--json", "--broker", seeds)
        assert listed.returncode == 0, listed.stderr
        assert sorted(t["name"] for t in json.loads(listed.stdout)) == ["t1", "t2", "t3", "t4"]
        got = headrace(
            "consume", "t3", "--subscription", "s", "--from", "earliest", "--count", "5",
            "--timeout", "20", "--broker", seeds,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        assert sorted(got.stdout.split()) == ["1", "2", "3", "4", "5"]
    assert processes_naming(str(data)) == []


def test_status_lists_under_replicated_topics_with_whether_publishes_go_on() -> None:
    """Scenario: a cluster's ClusterStatus answer with two under-replicated topics, one
    whose in-sync set is below its min_insync; then a single broker's answer. Expected:
    the JSON carries both with their sets; the text says "under-replicated topics: 2" and
    a row for each with its leader, epoch, replicas, isr, min_insync and below_min (YES for
    the one below min_insync); the single broker's text has no such line and its JSON an
    empty list."""
    under = [
        cluster_pb2.UnderReplicatedTopic(
            topic="orders", owner_node="b1", epoch=4, replicas=["b1", "b2", "b3"],
            isr=["b1"], min_insync=2, message="m1",
        ),
        cluster_pb2.UnderReplicatedTopic(
            topic="audit", owner_node="b2", epoch=1, replicas=["b2", "b3"], isr=["b2"],
            min_insync=1, message="m2",
        ),
    ]  # fmt: skip
    answer = cluster_pb2.ClusterStatusResponse(
        node_id="b1", cluster_id="c0ffee", controller="b1", under_replicated=under
    )
    document = status_document(answer)
    assert document["under_replicated"][0] == {
        "topic": "orders", "owner_node": "b1", "epoch": 4, "replicas": ["b1", "b2", "b3"],
        "isr": ["b1"], "min_insync": 2, "message": "m1",
    }  # fmt: skip
    lines = status_text(document).splitlines()
    at = lines.index("under-replicated topics: 2")
    assert lines[at + 1].split() == [
        "topic", "leader", "epoch", "replicas", "isr", "min_insync", "below_min"
    ]  # fmt: skip
    assert lines[at + 2].split() == ["orders", "b1", "4", "b1,b2,b3", "b1", "2", "YES"]
    assert lines[at + 3].split() == ["audit", "b2", "1", "b2,b3", "b2", "1", "no"]
    single = status_document(cluster_pb2.ClusterStatusResponse(node_id="local"))
    assert single["under_replicated"] == []
    assert "under-replicated" not in status_text(single)
