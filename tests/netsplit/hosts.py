"""A Headrace cluster whose members are separate hosts: etcd members and brokers, each in
its own network namespace of a :class:`~tests.netsplit.netns.Lab`, so a test can split the
network between any two of them.

Role: :class:`NetEtcd` runs a three-member etcd, one member per namespace (``e1``..``e3``),
each listening on its namespace's address (client port 2379, peer port 2380; every member
has a host of its own, so the ports never collide). :class:`NetBroker` runs one real
``headrace serve`` in cluster mode inside a namespace (``b1``...), listening on and
advertising ``<its address>:50051``, with ``--cluster-etcd`` every member's address and
``--insecure`` (plain TCP off loopback, refused without it). The test and its clients run
in the root namespace and reach every host through the lab's bridge.

Nothing here talks to etcd through Headrace's etcd client: ``/health`` and ``etcdctl``
from the root namespace, so a check does not share the bugs of the code under test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.broker_processes import CONFIG, ROOT, wait_serving
from tests.cluster.etcd_harness import HEALTHY_WITHIN_S, etcd_binary
from tests.netsplit.netns import Lab

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
BROKER_PORT = 50051
ETCD_NODES = ["e1", "e2", "e3"]
"""The etcd members' nodes in the ``net`` fixture's lab."""
BROKER_NODES = ["b1", "b2"]
"""The brokers' nodes in the ``net`` fixture's lab."""


@dataclass
class NetEtcd:
    """An etcd cluster with one member per namespace. Start with :meth:`start`; the lab's
    :meth:`~tests.netsplit.netns.Lab.close` kills it (or call :meth:`stop`).

    Not task-safe: one test (or one module fixture) drives it.

    Args:
        lab: the lab holding the member namespaces.
        names: the members' node names in the lab.
        root: where their data directories and logs go.
    """

    lab: Lab
    names: list[str]
    root: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def address(self, name: str) -> str:
        return self.lab.node(name).address

    @property
    def endpoints(self) -> list[str]:
        """Every member's client ``host:port``, in member order."""
        return [f"{self.address(n)}:{ETCD_CLIENT_PORT}" for n in self.names]

    def start(self) -> None:
        """Start every member and wait until each answers ``/health``."""
        self.root.mkdir(parents=True, exist_ok=True)
        cluster = ",".join(f"{n}=http://{self.address(n)}:{ETCD_PEER_PORT}" for n in self.names)
        for name in self.names:
            client = f"http://{self.address(name)}:{ETCD_CLIENT_PORT}"
            peer = f"http://{self.address(name)}:{ETCD_PEER_PORT}"
            argv = [
                etcd_binary(),
                f"--name={name}",
                f"--data-dir={self.root / name}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={cluster}",
                "--initial-cluster-state=new",
                "--initial-cluster-token=headrace-netsplit",
                "--heartbeat-interval=100",
                "--election-timeout=1000",
            ]
            log_to = self.root / f"{name}.log"
            self.processes[name] = self.lab.popen(name, argv, log_to=log_to)
        self.wait_healthy()

    def is_healthy(self, name: str) -> bool:
        """``GET /health`` (from the root namespace) answers ``{"health":"true"}``."""
        url = f"http://{self.address(name)}:{ETCD_CLIENT_PORT}/health"
        try:
            with urllib.request.urlopen(url, timeout=0.5) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + HEALTHY_WITHIN_S
        while not all(self.is_healthy(n) for n in self.names):
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"etcd {name} exited: see {self.root / name}.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy after {HEALTHY_WITHIN_S} s ({self.root})")
            time.sleep(0.05)

    def etcdctl(self, *args: str) -> str:
        """Run ``etcdctl`` (API v3) from the root namespace against every member."""
        done = subprocess.run(
            ["etcdctl", f"--endpoints={','.join(self.endpoints)}", "--command-timeout=3s", *args],
            capture_output=True,
            check=True,
            env={**os.environ, "ETCDCTL_API": "3"},
            timeout=10,
        )
        return done.stdout.decode()

    def get_json(self, key: str) -> dict[str, object] | None:
        """The JSON value at ``key`` (``None`` when absent)."""
        lines = self.etcdctl("get", key, "--print-value-only").splitlines()
        if not lines:
            return None
        value = json.loads(lines[0])
        assert isinstance(value, dict), value
        return value

    def stop(self) -> None:
        """SIGKILL every member and reap it."""
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
        self.processes.clear()


@dataclass
class Net:
    """A lab and the etcd running in it (the ``net`` fixture)."""

    lab: Lab
    etcd: NetEtcd


class NetBroker:
    """One ``headrace serve`` in cluster mode inside namespace ``name`` of the lab.

    Args:
        lab: the lab; ``name`` must be one of its nodes.
        name: the node, also the broker's node id.
        etcd: the cluster's etcd.
        root: where its data directory, config and log go.
        prefix: the cluster's etcd key prefix.
        ttl_s: its session TTL, whole seconds.
    """

    def __init__(
        self, lab: Lab, name: str, etcd: NetEtcd, root: Path, *, prefix: str, ttl_s: int
    ) -> None:
        self.lab = lab
        self.node_id = name
        self.address = f"{lab.node(name).address}:{BROKER_PORT}"
        self.data_dir = root / name / "data"
        self.log = root / name / "serve.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        config = root / name / "headrace.toml"
        config.write_text(CONFIG + f'session_ttl_s = {ttl_s}\nprefix = "{prefix}"\n')
        self.argv = [
            sys.executable, "-c", "from broker.cli import main; main()", "serve",
            "--config", str(config), "--data-dir", str(self.data_dir),
            "--listen", self.address, "--metrics-listen", "",
            "--cluster-etcd", ",".join(etcd.endpoints), "--node-id", name,
            "--advertise", self.address, "--insecure",
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        """Start the process inside its namespace (do not wait)."""
        assert self.process is None
        self.process = self.lab.popen(self.node_id, self.argv, cwd=ROOT, log_to=self.log)

    async def wait_serving(self, within_s: float = 30.0) -> None:
        """Wait until its health service (asked from the root namespace) says SERVING."""
        assert self.process is not None
        await wait_serving(self.process, self.address, self.node_id, self.log, within_s)

    def stop(self) -> None:
        """SIGTERM (a clean shutdown, SIGKILL after 30 s) and reap it."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
