"""A real etcd cluster on loopback for the cluster tests: N ``etcd`` processes, each with
its own data directory and free ports, that a test can kill, freeze, thaw and restart.

Role: start ``etcd`` (Debian's ``etcd-server`` 3.4; it must be on the PATH) with quick
elections (``--heartbeat-interval 100 --election-timeout 1000``), wait until every member
answers ``GET /health`` with ``{"health":"true"}``, and stop them all at the end. Nothing
here talks to etcd through Python's etcd client: the harness uses ``/health`` and
``etcdctl``, so it checks the code under test rather than sharing its bugs.

Missing ``etcd``: with ``CI`` set the tests FAIL (CI installs ``etcd-server``, see
``.ci/run``), as the Prometheus tests do; otherwise they skip.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HEALTHY_WITHIN_S = 15.0
"""How long a start waits for ``/health`` before it fails (a healthy start takes ~1 s)."""


def etcd_binary() -> str:
    """The path of ``etcd``. Missing: a failure when ``CI`` is set, a skip otherwise."""
    path = shutil.which("etcd")
    if path is None or shutil.which("etcdctl") is None:
        message = "etcd is not installed (apt-get install etcd-server etcd-client)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must install Debian's etcd-server (.ci/run)")
        pytest.skip(message)
    return path


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now (all bound at once, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(frozen=True)
class ServerTls:
    """Client-side TLS of the etcd members: their certificate and key, and the CA that
    signs the client certificates they require (``--client-cert-auth``)."""

    cert: str
    key: str
    ca: str
    client_cert: str
    client_key: str


@dataclass
class Member:
    """One etcd process: its name, ports, data directory and, while it runs, its process."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None
    frozen: bool = False
    tls: ServerTls | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<client port>``: what the code under test connects to."""
        return f"127.0.0.1:{self.client_port}"

    def is_healthy(self) -> bool:
        """``GET /health`` answers ``{"health":"true"}`` within half a second."""
        scheme, context = "http", None
        if self.tls is not None:
            scheme, context = "https", ssl.create_default_context(cafile=self.tls.ca)
            context.load_cert_chain(self.tls.client_cert, self.tls.client_key)
        url = f"{scheme}://{self.endpoint}/health"
        try:
            with urllib.request.urlopen(url, timeout=0.5, context=context) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False


@dataclass
class EtcdCluster:
    """N etcd members on loopback. Start with :meth:`start`, end with :meth:`stop`.

    Not task-safe: one test drives it. Signals go to one member's process by its pid.
    """

    root: Path
    size: int = 3
    tls: ServerTls | None = None
    members: list[Member] = field(default_factory=list)

    def __post_init__(self) -> None:
        ports = _free_ports(2 * self.size)
        for i in range(self.size):
            self.members.append(
                Member(f"e{i}", ports[2 * i], ports[2 * i + 1], self.root / f"e{i}", tls=self.tls)
            )

    @property
    def endpoints(self) -> list[str]:
        """Every member's client ``host:port``, in member order."""
        return [m.endpoint for m in self.members]

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)

    def _launch(self, member: Member) -> None:
        log = (self.root / f"{member.name}.log").open("ab")
        scheme = "https" if self.tls else "http"
        args = [
            etcd_binary(),
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={scheme}://127.0.0.1:{member.client_port}",
            f"--advertise-client-urls={scheme}://127.0.0.1:{member.client_port}",
            f"--listen-peer-urls=http://127.0.0.1:{member.peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{member.peer_port}",
            f"--initial-cluster={self._initial_cluster()}",
            "--initial-cluster-state=new",
            "--initial-cluster-token=headrace-test",
            "--heartbeat-interval=100",
            "--election-timeout=1000",
        ]
        if self.tls is not None:
            args += [
                f"--cert-file={self.tls.cert}",
                f"--key-file={self.tls.key}",
                f"--trusted-ca-file={self.tls.ca}",
                "--client-cert-auth",
            ]
        with log:
            member.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        member.frozen = False

    def start(self) -> None:
        """Start every member and wait until each answers ``/health``."""
        self.root.mkdir(parents=True, exist_ok=True)
        for member in self.members:
            self._launch(member)
        self.wait_healthy()

    def wait_healthy(self, members: list[Member] | None = None) -> None:
        """Wait until ``members`` (default: every running, unfrozen one) are healthy."""
        waiting = members or [m for m in self.members if m.process is not None and not m.frozen]
        deadline = time.monotonic() + HEALTHY_WITHIN_S
        while not all(m.is_healthy() for m in waiting):
            for m in waiting:
                if m.process is not None and m.process.poll() is not None:
                    raise RuntimeError(f"etcd {m.name} exited: see {self.root / m.name}.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy after {HEALTHY_WITHIN_S} s ({self.root})")
            time.sleep(0.05)

    def kill(self, member: Member) -> None:
        """SIGKILL ``member`` and reap it (its data directory stays, for :meth:`restart`)."""
        assert member.process is not None
        member.process.send_signal(signal.SIGKILL)
        member.process.wait()
        member.process = None
        member.frozen = False

    def freeze(self, member: Member) -> None:
        """SIGSTOP ``member``: it holds its sockets but answers nothing."""
        assert member.process is not None
        member.process.send_signal(signal.SIGSTOP)
        member.frozen = True

    def thaw(self, member: Member) -> None:
        """SIGCONT a member frozen by :meth:`freeze`."""
        assert member.process is not None
        member.process.send_signal(signal.SIGCONT)
        member.frozen = False

    def restart(self, member: Member) -> None:
        """Start a killed member again on its data directory and wait until it is healthy.
        It rejoins the cluster it was part of (its data directory records the membership)."""
        if member.process is not None:
            self.kill(member)
        self._launch(member)
        self.wait_healthy([member])

    def etcdctl(self, *args: str, member: Member | None = None) -> str:
        """Run ``etcdctl`` (API v3) against ``member`` (default: every running member)."""
        endpoints = [member.endpoint] if member else self._live_endpoints()
        done = subprocess.run(
            ["etcdctl", f"--endpoints={','.join(endpoints)}", "--command-timeout=3s", *args],
            capture_output=True,
            check=True,
            env={**os.environ, "ETCDCTL_API": "3"},
            timeout=10,
        )
        return done.stdout.decode()

    def _live_endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members if m.process is not None and not m.frozen]

    def leader(self) -> Member:
        """The member that is Raft leader now (``etcdctl endpoint status``)."""
        deadline = time.monotonic() + HEALTHY_WITHIN_S
        while True:
            try:
                statuses = json.loads(self.etcdctl("endpoint", "status", "-w", "json"))
            except subprocess.CalledProcessError:
                statuses = []
            for status in statuses:
                leader = status["Status"].get("leader", 0)  # absent (0) while electing
                if leader and leader == status["Status"]["header"]["member_id"]:
                    return next(m for m in self.members if m.endpoint == status["Endpoint"])
            if time.monotonic() > deadline:
                raise RuntimeError("no etcd leader")
            time.sleep(0.1)

    def compact(self) -> int:
        """Compact the history up to the current revision; returns that revision."""
        status = json.loads(self.etcdctl("endpoint", "status", "-w", "json"))
        revision = int(status[0]["Status"]["header"]["revision"])
        self.etcdctl("compact", str(revision))
        return revision

    def stop(self) -> None:
        """SIGKILL every member still running (thawing frozen ones first) and reap them."""
        for member in self.members:
            if member.process is None:
                continue
            if member.frozen:
                member.process.send_signal(signal.SIGCONT)
            member.process.kill()
            member.process.wait()
            member.process = None
