"""Headrace at replication factor 3 for the ``replication`` scenario, and its failover.

Owns :class:`R3Cluster` (a real three-member etcd and three ``headrace serve
--cluster-etcd`` brokers on loopback, each on its own data directory, fsync ``always``),
:class:`HeadraceR3` (the system the scenario measures: :class:`HeadraceSystem`'s phases
through the public client, against topics of factor 3 and ``min_insync_replicas`` 2), and
:func:`measure_failover` (the failover rows' attempts).

- The cluster: etcd members ``e0``..``e2`` (heartbeat 100 ms, election 1 s, as the
  tests' harness runs them), then brokers ``b1``..``b3`` with ``max_unacked`` 20,000 (as
  ``bench pubsub``), the session TTL asked, no metrics listener, warnings only.
- Topics are created through the seed list with ``replication_factor`` 3 and
  ``min_insync_replicas`` 2; timing starts only once every replica of every topic is in
  the in-sync set (as JetStream's timing starts once both followers are current). The
  clients get every broker as a seed and route each topic to its leader themselves, so no
  publish pays a hop once the route is learned.
- A publish is acknowledged once the high watermark passed it: every replica in the
  in-sync set (all three while they keep up, never fewer than 2) has it synced.
- Failover (:func:`measure_failover`): one topic of one partition, factor 3 /
  ``min_insync`` 2; an idempotent producer (``linger_ms`` 0) sends at
  :data:`FAILOVER_RATE` msg/s throughout, each send time and acknowledgement time noted.
  An attempt's figure (:class:`Attempt`) is the time from the event to the first
  acknowledgement on the new leader: of a record the application handed to the producer
  at or after a SIGKILL (the dead leader acknowledges nothing), or, for the graceful
  kinds (the old leader serves until it hands over), at or after the moment the topic's
  record in etcd named the new leader (polled every :data:`POLL_S`). Beside it, that
  moment (so the figure splits into "the cluster elected" and "the client found it") and
  the longest pause between two acknowledgements from half a second before the event to
  the figure's (what a writer saw stall). Three kinds, in this order, on one cluster:

  - transfer: the bench does what an operator tool would: it reads the topic's record
    and the leader's broker key in etcd and calls
    :func:`cluster.replica_txn.transfer_leadership` with the leader's epoch and session
    to an in-sync follower; the old leader sees the record change and steps down (its
    pending acknowledgements end "outcome unknown"; the producer resends them to the
    new leader, which answers retries as duplicates).
  - graceful: SIGTERM of the leader: its controlled shutdown hands the topic to an
    in-sync follower before its server stops.
  - SIGKILL of the leader: a follower is elected once its session lapses.

  A stopped broker is restarted and the next attempt waits until all three replicas
  are in sync again.

Depends on the client library, on :mod:`cluster` (the transfer) and on ``etcd``
on the PATH.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import itertools
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench._headrace_pubsub import (
    E2E_TOPIC,
    MAX_UNACKED,
    PARTITIONS,
    TOPIC,
    HeadraceSystem,
    probe_admin,
)
from bench._server_process import ServerFailedError, ServerProcess, distinct_ports
from broker.cli_cluster import INSTALL_ETCD, _etcd_healthy
from client import AsyncAdminClient, AsyncProducer, FailedPrecondition, RecordFuture, TopicInfo
from cluster.etcd import EtcdStore
from cluster.records import Keys, TopicRecord, decode
from cluster.replica_txn import transfer_leadership

BROKERS = 3
FACTOR = 3
MIN_INSYNC = 2
#: The brokers' session TTL when nothing else is asked: the broker's default.
DEFAULT_TTL_S = 10
#: The etcd key prefix of the bench's cluster (the broker's default).
PREFIX = "/headrace/"
#: How long the cluster may take to start, and a topic to have every replica in sync.
START_WITHIN_S = 60.0
#: The failover topic, and the rate its producer sends at (msg/s).
FAILOVER_TOPIC = "bench-failover"
FAILOVER_RATE = 1000.0
#: How often the failover watcher reads the topic's record in etcd, seconds.
POLL_S = 0.01
#: The most an attempt may take, past the TTL, before the bench gives up on it.
ATTEMPT_SLACK_S = 60.0


def config_text(ttl_s: int) -> str:
    """A broker's TOML: ``bench pubsub``'s ``max_unacked``, fsync ``always``, the TTL."""
    return (
        f'[broker]\nmax_unacked = {MAX_UNACKED}\n\n[wal]\nfsync = "always"\n\n'
        f'[cluster]\nsession_ttl_s = {ttl_s}\nprefix = "{PREFIX}"\n'
    )


def etcd_argv(
    binary: str, name: str, data_dir: Path, *, client: int, peer: int, initial: str
) -> list[str]:
    """One member of the bench's three-member etcd (``initial``: the initial cluster)."""
    return [
        binary,
        f"--name={name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls=http://127.0.0.1:{client}",
        f"--advertise-client-urls=http://127.0.0.1:{client}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster={initial}",
        "--initial-cluster-state=new",
        "--initial-cluster-token=headrace-bench",
        "--heartbeat-interval=100",
        "--election-timeout=1000",
    ]


def broker_argv(
    config: Path, data_dir: Path, address: str, endpoints: str, node_id: str
) -> list[str]:
    """``headrace serve`` in cluster mode: quiet, no metrics listener."""
    return [
        sys.executable,
        "-c",
        "from broker.cli import main; main()",
        "serve",
        "--config", str(config),
        "--data-dir", str(data_dir),
        "--listen", address,
        "--metrics-listen", "",
        "--log-level", "WARNING",
        "--cluster-etcd", endpoints,
        "--node-id", node_id,
        "--advertise", address,
    ]  # fmt: skip


class R3Cluster:
    """Three etcd members and three brokers on loopback, in ``root`` (module docstring).

    Not task-safe: one task drives it.
    """

    def __init__(self, root: Path, ttl_s: int = DEFAULT_TTL_S) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise ServerFailedError(INSTALL_ETCD)
        self.ttl_s = ttl_s
        ports = distinct_ports(2 * BROKERS + BROKERS)
        clients, peers, brokers = ports[:BROKERS], ports[BROKERS:-BROKERS], ports[-BROKERS:]
        initial = ",".join(f"e{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
        self.endpoints = [f"127.0.0.1:{p}" for p in clients]
        self.etcd = [
            ServerProcess(
                etcd_argv(
                    etcd, f"e{i}", root / f"e{i}", client=clients[i], peer=peers[i], initial=initial
                ),
                root / f"e{i}.log",
            )
            for i in range(BROKERS)
        ]
        config = root / "headrace.toml"
        config.write_text(config_text(ttl_s))
        self.addresses = {f"b{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(brokers)}
        self.brokers = {
            node: ServerProcess(
                broker_argv(config, root / node, address, ",".join(self.endpoints), node),
                root / f"{node}.log",
            )
            for node, address in self.addresses.items()
        }

    @property
    def seeds(self) -> str:
        """Every broker's address, comma-separated."""
        return ",".join(self.addresses.values())

    async def start(self) -> None:
        """Start etcd, wait until every member is healthy, then the brokers, and wait
        until each serves. Stops whatever started when one fails."""
        try:
            for member in self.etcd:
                member.start()
            for member, endpoint in zip(self.etcd, self.endpoints, strict=True):
                probe = functools.partial(asyncio.to_thread, _healthy, endpoint)
                await _until(probe, START_WITHIN_S, member)
            for broker in self.brokers.values():
                broker.start()
            for node in self.brokers:
                await self.wait_serving(node)
        except BaseException:
            self.stop()
            raise

    async def wait_serving(self, node: str) -> None:
        """Wait until broker ``node`` answers an admin call."""
        address = self.addresses[node]
        await _until(lambda: probe_admin(address), START_WITHIN_S, self.brokers[node])

    async def create_topic(self, name: str, partitions: int) -> None:
        """Create ``name`` with factor 3 and ``min_insync`` 2; wait until every replica
        is in sync.

        A broker serves before its view shows the others alive, so the answering broker
        may refuse factor 3 (FAILED_PRECONDITION, "needs 3 live brokers and 2 are up";
        seen in 2 of about 20 runs): asked again every 100 ms until :data:`START_WITHIN_S`,
        ``exist_ok`` for a resend after a lost answer.
        """
        deadline = time.monotonic() + START_WITHIN_S
        async with AsyncAdminClient(self.seeds) as admin:
            while True:
                try:
                    await admin.create_topic(
                        name,
                        partitions,
                        replication_factor=FACTOR,
                        min_insync_replicas=MIN_INSYNC,
                        exist_ok=True,
                    )
                    break
                except FailedPrecondition:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
        await self.wait_in_sync(name)

    async def wait_in_sync(self, name: str, within_s: float = START_WITHIN_S) -> TopicInfo:
        """Wait until ``name`` is led and all three replicas are in its in-sync set."""
        deadline = time.monotonic() + within_s
        info: TopicInfo | None = None
        while True:
            with contextlib.suppress(Exception):  # a broker starting or going: ask again
                async with AsyncAdminClient(self.seeds) as admin:
                    info = await admin.describe_topic(name)
                if info.leader and not info.offline and len(info.isr) == FACTOR:
                    return info
            if time.monotonic() > deadline:
                raise ServerFailedError(f"{name}: not all replicas in sync: {info}")
            await asyncio.sleep(0.05)

    def pid(self, node: str) -> int:
        """Broker ``node``'s process id."""
        return self.brokers[node].pid

    def stop(self) -> None:
        """SIGTERM every broker, then every etcd member (SIGKILL after 10 s each)."""
        for process in (*self.brokers.values(), *self.etcd):
            with contextlib.suppress(Exception):
                process.stop()


def _healthy(endpoint: str) -> None:
    if not _etcd_healthy(endpoint):
        raise ServerFailedError(f"etcd at {endpoint} is not healthy yet")


async def _until(
    probe: Callable[[], Awaitable[object]], within_s: float, process: ServerProcess
) -> None:
    deadline = time.monotonic() + within_s
    while True:
        if process.exit_code() is not None:
            raise ServerFailedError(
                f"{process.argv[0]} exited ({process.exit_code()}):\n{process.log_tail()}"
            )
        try:
            await probe()
        except Exception as exc:  # not serving yet
            if time.monotonic() > deadline:
                raise ServerFailedError(f"not serving after {within_s:g} s: {exc!r}") from exc
        else:
            return
        await asyncio.sleep(0.05)


class HeadraceR3(HeadraceSystem):
    """Headrace at factor 3 / ``min_insync_replicas`` 2 over :class:`R3Cluster`, measured
    by :class:`HeadraceSystem`'s own phases with the seed list as the address."""

    system = "headrace-r3"
    replicas = FACTOR
    acked = "in-sync replicas synced (>= 2 of 3)"

    def __init__(self, data_dir: Path) -> None:
        # Not HeadraceSystem.__init__: it would build the one server this class replaces.
        self.version = importlib.metadata.version("headrace")
        self.cluster = R3Cluster(data_dir)
        self._address = self.cluster.seeds

    async def start(self) -> None:
        await self.cluster.start()
        for name, partitions in ((TOPIC, PARTITIONS), (E2E_TOPIC, 1)):
            await self.cluster.create_topic(name, partitions)

    async def broker_pids(self) -> tuple[int, list[int]]:
        """The process ids of the publish topic's leader and of its two followers (the
        CPU rows of ``bench replication``); the topic is in sync once started."""
        info = await self.cluster.wait_in_sync(TOPIC)
        followers = [self.cluster.pid(node) for node in info.replicas if node != info.leader]
        return self.cluster.pid(info.leader), followers

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.cluster.stop)


# ---------------------------------------------------------------------------------------
# Failover


@dataclass(slots=True)
class Attempt:
    """One failover, in seconds from the event: ``acked_s`` to the first acknowledged
    publish on the new leader, ``elected_s`` to the record in etcd naming the new leader,
    and ``pause_s``, the longest time no publish was acknowledged from half a second before
    the event to that first acknowledgement (what a writer saw stall); who led before and
    after."""

    acked_s: float
    elected_s: float
    old: str
    new: str
    pause_s: float = 0.0


@dataclass(slots=True)
class _Sends:
    """The failover producer's records: send times, and acknowledgement times by send
    time; failures."""

    acked: list[tuple[float, float]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def first_ack_of_sent_after(self, event: float) -> float | None:
        """When the first record sent at or after ``event`` was acknowledged."""
        times = [acked for sent, acked in self.acked if sent >= event]
        return min(times) if times else None

    def longest_pause(self, start: float, end: float) -> float:
        """The longest time between two acknowledgements (by arrival) from ``start`` to
        ``end`` (both counted as arrivals)."""
        times = sorted({start, end, *(a for _, a in self.acked if start <= a <= end)})
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def _send_forever(producer: AsyncProducer, sends: _Sends, stop: asyncio.Event) -> None:
    """Paced sends at :data:`FAILOVER_RATE` until ``stop``; each outcome noted."""
    interval = 1.0 / FAILOVER_RATE
    payload = b"f" * 100
    due = time.perf_counter()
    while not stop.is_set():
        sent = time.perf_counter()
        future = await producer.send(FAILOVER_TOPIC, payload)

        def settled(f: RecordFuture, sent: float = sent) -> None:
            if f.cancelled() or f.exception() is not None:
                sends.failed.append(repr(f.exception()))
            else:
                sends.acked.append((sent, time.perf_counter()))

        future.add_done_callback(settled)
        due += interval
        await asyncio.sleep(max(0.0, due - time.perf_counter()))


async def _record(store: EtcdStore, name: str) -> tuple[TopicRecord, int]:
    key = Keys(PREFIX).topic(name)
    kv = await store.get(key)
    if kv is None:
        raise ServerFailedError(f"topic {name} has no record in etcd")
    return decode(key, kv.value, TopicRecord), kv.mod_revision


async def _elected(store: EtcdStore, name: str, old: str, event: float) -> tuple[float, str]:
    """Poll the topic's record until another broker leads it; (seconds since ``event``,
    the new leader)."""
    while True:
        with contextlib.suppress(Exception):  # etcd busy: poll again
            record, _ = await _record(store, name)
            if record.owner and record.owner != old:
                return time.perf_counter() - event, record.owner
        await asyncio.sleep(POLL_S)


async def _first_ack(sends: _Sends, event: float, within_s: float) -> float:
    deadline = event + within_s
    while (acked := sends.first_ack_of_sent_after(event)) is None:
        if time.perf_counter() > deadline:
            raise ServerFailedError(f"no publish acknowledged {within_s:g} s after the event")
        await asyncio.sleep(0.005)
    return acked - event


async def _stop_attempt(
    cluster: R3Cluster, store: EtcdStore, sends: _Sends, *, kill: bool
) -> Attempt:
    """The leader stopped under the producer, then restarted. SIGKILL: the first record
    sent at or after the kill that is acknowledged can only be the new leader's. SIGTERM:
    a controlled shutdown, the old leader serves until it hands the topic over, so the
    figure is the first acknowledgement of a record sent once etcd named the new leader."""
    old = (await cluster.wait_in_sync(FAILOVER_TOPIC)).leader
    await asyncio.sleep(0.5)  # steady sending before the event
    process = cluster.brokers[old]
    event = time.perf_counter()
    os.kill(process.pid, signal.SIGKILL if kill else signal.SIGTERM)
    elected = asyncio.create_task(_elected(store, FAILOVER_TOPIC, old, event))
    try:
        if kill:
            acked_s = await _first_ack(sends, event, cluster.ttl_s + ATTEMPT_SLACK_S)
        elected_s, new = await asyncio.wait_for(elected, cluster.ttl_s + ATTEMPT_SLACK_S)
        if not kill:
            acked_s = elected_s + await _first_ack(sends, event + elected_s, ATTEMPT_SLACK_S)
    finally:
        elected.cancel()
    pause_s = sends.longest_pause(event - 0.5, event + acked_s)
    await asyncio.to_thread(process.stop)  # reaps it (SIGKILL after 10 s)
    process.start()
    await cluster.wait_serving(old)
    return Attempt(acked_s, elected_s, old, new, pause_s)


async def _kill_attempt(cluster: R3Cluster, store: EtcdStore, sends: _Sends) -> Attempt:
    return await _stop_attempt(cluster, store, sends, kill=True)


async def _sigterm_attempt(cluster: R3Cluster, store: EtcdStore, sends: _Sends) -> Attempt:
    return await _stop_attempt(cluster, store, sends, kill=False)


async def _transfer_attempt(cluster: R3Cluster, store: EtcdStore, sends: _Sends) -> Attempt:
    info = await cluster.wait_in_sync(FAILOVER_TOPIC)
    await asyncio.sleep(0.5)
    record, revision = await _record(store, FAILOVER_TOPIC)
    leader_key = await store.get(Keys(PREFIX).broker(record.owner))
    if leader_key is None:
        raise ServerFailedError(f"leader {record.owner} has no session")
    to = next(n for n in record.replicas if n != record.owner and n in info.isr)
    event = time.perf_counter()
    result = await transfer_leadership(
        store,
        Keys(PREFIX),
        FAILOVER_TOPIC,
        record,
        revision,
        leader=record.owner,
        epoch=record.epoch,
        leader_lease=leader_key.lease,
        to=to,
    )
    if not result.outcome.is_won():
        raise ServerFailedError(f"transfer {record.owner} -> {to}: {result.reason}")
    elected_s = time.perf_counter() - event
    acked_s = elected_s + await _first_ack(sends, event + elected_s, ATTEMPT_SLACK_S)
    pause_s = sends.longest_pause(event - 0.5, event + acked_s)
    return Attempt(acked_s, elected_s, record.owner, to, pause_s)


@dataclass(slots=True)
class Failover:
    """Every attempt of both kinds, the TTL they ran under, the producer's failures, and
    why the attempts stopped early ("" when every attempt ran)."""

    ttl_s: int
    transfer: list[Attempt] = field(default_factory=list)
    graceful: list[Attempt] = field(default_factory=list)
    sigkill: list[Attempt] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stopped: str = ""


async def measure_failover(root: Path, ttl_s: int, attempts: int) -> Failover:
    """``attempts`` leadership transfers, then ``attempts`` leader SIGTERMs, then
    ``attempts`` leader SIGKILLs (each stopped broker restarted before the next attempt),
    under a producer sending throughout, on a
    fresh cluster in ``root`` (module docstring). An attempt that fails ends the
    measurement: the attempts before it are kept and :attr:`Failover.stopped` says why.

    Raises:
        ServerFailedError: the cluster did not start or the topic was never in sync.
    """
    cluster = R3Cluster(root, ttl_s)
    await cluster.start()
    got = Failover(ttl_s)
    try:
        await cluster.create_topic(FAILOVER_TOPIC, 1)
        store = await EtcdStore.connect(cluster.endpoints)
        sends = _Sends()
        stop = asyncio.Event()
        try:
            async with AsyncProducer(
                cluster.seeds, linger_ms=0, delivery_timeout_s=ttl_s + ATTEMPT_SLACK_S
            ) as producer:
                sender = asyncio.create_task(_send_forever(producer, sends, stop))
                try:
                    for kind, attempt in (
                        (got.transfer, _transfer_attempt),
                        (got.graceful, _sigterm_attempt),
                        (got.sigkill, _kill_attempt),
                    ):
                        for _ in range(attempts):
                            kind.append(await attempt(cluster, store, sends))
                except ServerFailedError as exc:
                    got.stopped = str(exc)
                finally:
                    stop.set()
                    await asyncio.gather(sender, return_exceptions=True)
        finally:
            await store.aclose()
            got.failed = sends.failed
    finally:
        await asyncio.to_thread(cluster.stop)
    return got
