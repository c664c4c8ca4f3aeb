"""``headrace cluster status|local|config``: look at a cluster, and run one on this machine.

Role (``config``, the cluster's defaults in etcd, is :mod:`broker.cli_cluster_config`;
``reassign`` and ``rebalance`` are :mod:`broker.cli_cluster_moves`):

- ``status`` asks any broker (the first of ``--broker``'s seeds that answers) for
  ``ClusterStatus`` and prints each broker (node id, address, alive, topics and partitions
  owned, session age), the controller, each etcd endpoint's health, every offline topic
  with its reason, every under-replicated topic (its in-sync set smaller than its
  replica set: leader, epoch, replicas, isr, min_insync, and whether the isr is below
  min_insync so that publishes are refused) and, if any, the answering broker's stray
  local topics (not served);
  ``--json`` prints the same as one JSON object. A single broker answers
  too: one broker, node ``local``, no etcd.
- ``local`` runs a whole cluster on loopback in the foreground: one ``etcd`` (from the
  PATH; when it is missing the error says how to install it) and ``--brokers N`` brokers
  (``headrace serve --cluster-etcd ...``, node ids ``b1``..``bN``), each with its own
  directory under ``--data-dir`` and its log beside it. It waits until every broker
  serves, prints the seed list and what to try, and on SIGINT or SIGTERM stops the brokers
  (SIGTERM, all at once, each draining as ``serve`` does: each sees the others stopping
  and hands them no topic, so the stop takes about a second and every topic stays led
  where it was for the next run), then etcd; a process that does not stop in
  :data:`STOP_WITHIN_S` is killed. Nothing is left running: the children also get SIGKILL
  if this process dies without a chance to stop them (Linux's parent-death signal).
  Started again on the same directory, it finds its topics and tokens where it left them.

Ports (``--base-port P``, default 52379): broker ``i`` (1..N) listens on ``P + i`` and
serves metrics on ``P + 100 + i``; etcd's client port is ``P``, its peer port ``P + 100``.

Exit codes: 0 success (``local``: stopped by a signal), 1 error (one line on stderr), 2
usage.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import click
import grpc
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub

from broker.cli_client import Target, broker_option, reachable_channel, run
from broker.cli_cluster_config import config
from broker.cli_cluster_moves import reassign, rebalance
from broker.cli_output import plural, table
from proto import cluster_pb2 as _cluster
from proto.cluster_pb2_grpc import ClusterStub

#: How long ``local`` waits for etcd and every broker to serve, seconds.
START_WITHIN_S = 60.0
#: How long each process may take to stop after SIGTERM before it is killed, seconds.
STOP_WITHIN_S = 15.0
#: ``--base-port``'s default: etcd's client port; brokers follow it.
DEFAULT_BASE_PORT = 52379

INSTALL_ETCD = (
    "etcd is not on the PATH: install it (Debian or Ubuntu: `sudo apt-get install "
    "etcd-server`; macOS: `brew install etcd`; or a release from "
    "https://github.com/etcd-io/etcd/releases), then run this again"
)


@click.group()
def cluster() -> None:
    """Look at a cluster (status), run one on this machine (local), set its defaults
    (config)."""


cluster.add_command(config)
cluster.add_command(reassign)
cluster.add_command(rebalance)


# --- status --------------------------------------------------------------------------------


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0.1, 600),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the answer.",
)
@broker_option
def status(as_json: bool, timeout_s: float, target: Target) -> None:
    """Brokers, controller, etcd endpoints' health, offline and under-replicated topics,
    from any broker."""

    async def ask() -> _cluster.ClusterStatusResponse:
        async with reachable_channel(target, min(timeout_s, 5.0)) as (channel, _):
            try:
                answer: _cluster.ClusterStatusResponse = await ClusterStub(channel).ClusterStatus(
                    _cluster.ClusterStatusRequest(), timeout=timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                raise click.ClickException(
                    f"{target.broker.split(',')[0]} did not answer ClusterStatus: "
                    f"{exc.code().name}: {exc.details()}"
                ) from exc
            return answer

    answer = run(ask, target)
    document = status_document(answer)
    if as_json:
        click.echo(json.dumps(document))
        return
    click.echo(status_text(document))


def status_document(answer: _cluster.ClusterStatusResponse) -> dict[str, Any]:
    """The ``--json`` form of a ClusterStatus answer (the wire's field names)."""
    return {
        "node_id": answer.node_id,
        "cluster_id": answer.cluster_id,
        "controller": answer.controller,
        "revision": answer.revision,
        "brokers": [
            {
                "node_id": b.node_id,
                "address": b.address,
                "alive": b.alive,
                "topics": b.topics,
                "partitions": b.partitions,
                "session_age_s": round(b.session_age_s, 1),
            }
            for b in answer.brokers
        ],
        "etcd": [
            {"endpoint": e.endpoint, "healthy": e.healthy, "error": e.error} for e in answer.etcd
        ],
        "offline_topics": [
            {
                "topic": t.topic,
                "owner_node": t.owner_node,
                "reason": t.reason,
                "message": t.message,
            }
            for t in answer.offline_topics
        ],
        "strays": [
            {
                "topic": s.topic,
                "local_id": s.local_id,
                "cluster_id": s.cluster_id,
                "owner_node": s.owner_node,
                "path": s.path,
                "message": s.message,
            }
            for s in answer.strays
        ],
        "under_replicated": [
            {
                "topic": u.topic,
                "owner_node": u.owner_node,
                "epoch": u.epoch,
                "replicas": list(u.replicas),
                "isr": list(u.isr),
                "min_insync": u.min_insync,
                "message": u.message,
            }
            for u in answer.under_replicated
        ],
    }


def status_text(document: dict[str, Any]) -> str:
    """The human form: a summary line, then the brokers, etcd, offline and (in a cluster)
    under-replicated topics tables."""
    brokers = document["brokers"]
    alive = sum(1 for b in brokers if b["alive"])
    if document["cluster_id"]:
        head = f"cluster {document['cluster_id']}, answered by {document['node_id']}"
    else:
        head = f"a single broker (node {document['node_id']}), no cluster"
    controller = document["controller"] or "NONE (no broker is controller: topics cannot be placed)"
    lines = [
        f"{head}: {alive} of {plural(len(brokers), 'broker')} alive, controller {controller}",
        "",
        table(
            [
                {
                    **b,
                    "alive": "yes" if b["alive"] else "NO",
                    "session_age_s": f"{b['session_age_s']:.1f}",
                }
                for b in brokers
            ],
            ("node_id", "address", "alive", "topics", "partitions", "session_age_s"),
        ),
    ]
    if document["etcd"]:
        healthy = sum(1 for e in document["etcd"] if e["healthy"])
        lines += [
            "",
            f"etcd: {healthy} of {plural(len(document['etcd']), 'endpoint')} healthy",
            table(
                [{**e, "healthy": "yes" if e["healthy"] else "NO"} for e in document["etcd"]],
                ("endpoint", "healthy", "error"),
            ),
        ]
    offline = document["offline_topics"]
    lines += ["", f"offline topics: {len(offline) or 'none'}"]
    if offline:
        lines.append(table(offline, ("topic", "owner_node", "reason", "message")))
    under = document["under_replicated"]
    if document["cluster_id"]:  # a single broker keeps one copy: never under-replicated
        lines += ["", f"under-replicated topics: {len(under) or 'none'}"]
    if under:
        rows = [
            {
                **u,
                "leader": u["owner_node"],
                "replicas": ",".join(u["replicas"]),
                "isr": ",".join(u["isr"]),
                "below_min": "YES" if len(u["isr"]) < u["min_insync"] else "no",
            }
            for u in under
        ]
        lines.append(
            table(rows, ("topic", "leader", "epoch", "replicas", "isr", "min_insync", "below_min"))
        )
    if document["strays"]:  # rare: said only when there are some
        lines += ["", f"stray local topics on {document['node_id']} (not served):"]
        lines.append(
            table(document["strays"], ("topic", "local_id", "cluster_id", "owner_node", "path"))
        )
    return "\n".join(lines)


# --- local ---------------------------------------------------------------------------------


@dataclass
class _Child:
    """One process of the local cluster: what it is, how it runs, where it logs."""

    name: str
    argv: list[str]
    log: Path
    ready: str  # host:port of its gRPC (brokers) or "" (etcd: checked by /health)
    process: subprocess.Popen[bytes] | None = None
    reported: bool = field(default=False)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us only; we stop them in order
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, before exec
            )

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def last_lines(self, count: int = 5) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-count:])


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when ``cluster local`` dies (Linux only), so a
    ``kill -9`` of the parent leaves nothing running."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _StopSignalError(Exception):
    """SIGINT or SIGTERM arrived: control flow of ``local`` (caught there), not an error
    any caller sees."""


@cluster.command("local")
@click.option(
    "--brokers", "count", type=click.IntRange(1, 16), default=3, show_default=True,
    help="How many brokers.",
)  # fmt: skip
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Where etcd's and each broker's data and logs go (kept: a restart finds them).",
)
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65535 - 200),
    default=DEFAULT_BASE_PORT,
    show_default=True,
    help="etcd's client port; broker i listens on it + i, its metrics on it + 100 + i.",
)
def local(count: int, data_dir: str, base_port: int) -> None:
    """Run etcd and N brokers on loopback in the foreground; Ctrl-C stops them all."""
    etcd = shutil.which("etcd")
    if etcd is None:
        raise click.ClickException(INSTALL_ETCD)
    root = Path(data_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"cannot make --data-dir {root}: {exc.strerror}") from exc
    children = _plan(etcd, root, count, base_port)
    endpoint = f"127.0.0.1:{base_port}"
    seeds = ",".join(c.ready for c in children[1:])
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise _StopSignalError(signal.Signals(signum).name)

    for signum in previous:
        signal.signal(signum, on_signal)
    code = 0
    try:
        _start(children, endpoint)
        _print_ready(children, endpoint, seeds, root)
        _watch(children)
    except _StopSignalError as stop:
        click.echo(f"\n{stop}: stopping the brokers, then etcd ...", err=True)
    except click.ClickException as exc:
        click.echo(f"Error: {exc.format_message()}", err=True)
        code = 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        with _ignoring_signals():
            _stop_all(children)
    if code:
        raise SystemExit(code)
    click.echo("stopped: etcd and every broker have exited", err=True)


def _plan(etcd: str, root: Path, count: int, base: int) -> list[_Child]:
    """etcd first, then the brokers b1..bN, each with its directory and log."""
    client, peer = f"127.0.0.1:{base}", f"http://127.0.0.1:{base + 100}"
    children = [
        _Child(
            "etcd",
            [
                etcd,
                "--name", "headrace-local",
                "--data-dir", str(root / "etcd"),
                "--listen-client-urls", f"http://{client}",
                "--advertise-client-urls", f"http://{client}",
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"headrace-local={peer}",
                "--heartbeat-interval", "100",
                "--election-timeout", "1000",
            ],
            root / "etcd.log",
            "",
        )
    ]  # fmt: skip
    for i in range(1, count + 1):
        node = f"b{i}"
        address = f"127.0.0.1:{base + i}"
        argv = [
            sys.executable, "-c", "from broker.cli import main; main()", "serve",
            "--data-dir", str(root / node),
            "--listen", address,
            "--metrics-listen", f"127.0.0.1:{base + 100 + i}",
            "--cluster-etcd", client,
            "--node-id", node,
        ]  # fmt: skip
        children.append(_Child(node, argv, root / f"{node}.log", address))
    return children


def _start(children: Sequence[_Child], endpoint: str) -> None:
    """Start etcd, wait for its health, then every broker, and wait until each serves.

    Raises:
        click.ClickException: a process exited, or did not serve in time (its log's last
            lines quoted).
    """
    etcd, brokers = children[0], children[1:]
    click.echo(f"starting etcd on {endpoint} (log {etcd.log}) ...", err=True)
    etcd.start()
    _wait(etcd, lambda: _etcd_healthy(endpoint))
    click.echo(f"starting {plural(len(brokers), 'broker')} ...", err=True)
    for broker in brokers:
        broker.start()
    for broker in brokers:
        _wait(broker, lambda b=broker: _serving(b.ready))


def _wait(child: _Child, ready: Any) -> None:
    deadline = time.monotonic() + START_WITHIN_S
    while not ready():
        code = child.exited()
        if code is not None:
            raise click.ClickException(
                f"{child.name} exited while starting (code {code}); its log {child.log} "
                f"ends: {child.last_lines()}"
            )
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"{child.name} did not serve within {START_WITHIN_S:g} s; its log {child.log} "
                f"ends: {child.last_lines()}"
            )
        time.sleep(0.1)


def _etcd_healthy(endpoint: str) -> bool:
    import urllib.request  # noqa: PLC0415 - only ``local`` needs it

    try:
        with urllib.request.urlopen(f"http://{endpoint}/health", timeout=0.5) as answer:
            return bool(json.loads(answer.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


def _serving(address: str) -> bool:
    """Whether the broker at ``address`` answers its gRPC health check with SERVING."""
    with grpc.insecure_channel(address) as channel:
        try:
            answer = HealthStub(channel).Check(HealthCheckRequest(), timeout=0.5)
        except grpc.RpcError:
            return False
    return bool(answer.status == HealthCheckResponse.SERVING)


def _print_ready(children: Sequence[_Child], endpoint: str, seeds: str, root: Path) -> None:
    headrace = "headrace"
    lines = [
        f"headrace: a local cluster of {plural(len(children) - 1, 'broker')} is serving; "
        f"etcd on {endpoint}; data and logs in {root}. Ctrl-C stops it all.",
        *(f"  {c.name}: {c.ready}  (log {c.log})" for c in children[1:]),
        "Seed brokers (any of them reaches every topic):",
        f"  export HEADRACE_BROKER={seeds}",
        "Try, in another terminal:",
        f"  {headrace} topics create orders --partitions 3 --broker {seeds}",
        f"  {headrace} topics create payments --partitions 2 --broker {seeds}",
        f"  seq 5 | {headrace} produce orders --broker {seeds}",
        f"  {headrace} consume orders --subscription billing --count 5 --timeout 5 "
        f"--broker {seeds}",
        f"  {headrace} cluster status --broker {seeds}",
    ]
    click.echo("\n".join(lines), err=True)
    click.echo(seeds)  # stdout: the seed list alone, for scripts
    sys.stdout.flush()


def _watch(children: Sequence[_Child]) -> None:
    """Wait for a signal; say once when a process exits on its own (a broker may be
    stopped by hand to see its topics go offline); return if etcd exits."""
    while True:
        for child in children:
            code = child.exited()
            if code is not None and not child.reported:
                child.reported = True
                click.echo(
                    f"{child.name} exited (code {code}); its log {child.log} ends: "
                    f"{child.last_lines(3)}",
                    err=True,
                )
                if child.name == "etcd":
                    raise click.ClickException("etcd exited: the cluster cannot go on")
        time.sleep(0.2)


@contextlib.contextmanager
def _ignoring_signals() -> Any:
    """While stopping: a second Ctrl-C does not interrupt the stop (it would leave
    children behind)."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop_all(children: Sequence[_Child]) -> None:
    """SIGTERM the brokers (all at once), wait; then etcd; SIGKILL what does not stop."""
    _stop([c for c in children if c.name != "etcd"])
    _stop([c for c in children if c.name == "etcd"])


def _stop(children: Sequence[_Child]) -> None:
    running = [c for c in children if c.process is not None and c.process.poll() is None]
    for child in running:
        assert child.process is not None
        with contextlib.suppress(ProcessLookupError):
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WITHIN_S
    for child in running:
        assert child.process is not None
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            click.echo(f"{child.name} did not stop in {STOP_WITHIN_S:g} s: killed", err=True)
            child.process.kill()
            child.process.wait()
