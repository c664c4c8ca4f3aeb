"""Replication between brokers that serve TLS (issue 37): real etcd, three real ``headrace
serve`` processes with certificates made by the test (one CA, one certificate per broker
for 127.0.0.1 with both the server and the client extended key usage).

What is checked, from the outside (the brokers' TLS port, the producer's acks, the
partition files on each broker's disk, a follower's log):

- TLS, and mutual TLS (``--tls-client-ca``: every caller, the brokers included, shows a
  certificate): a factor-3 topic's acknowledged records reach all three replicas' disks;
  the leader SIGKILLed, a follower leads, takes new records, and the remaining follower
  copies them too (the followers dialled their leaders over TLS, or nothing would reach
  them: the port serves nothing else);
- a broker whose ``[cluster] peer_tls_ca`` is a CA that did not sign the others' certificates
  copies nothing, says in its log that its fetch failed on the certificate (once per
  leader it follows, not once per retry), and stays out of the in-sync set while the
  other two go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.auth.cluster_tokens import to_record
from broker.auth.grants import make_grant
from broker.auth.tokens import mint
from client import AsyncAdminClient, AsyncProducer, ConnectionOptions, FailedPrecondition
from cluster.etcd import EtcdStore
from cluster.records import Keys
from cluster.tokens import EtcdTokens
from proto import cluster_pb2 as _cluster
from proto import cluster_pb2_grpc as _cluster_grpc
from tests._certs import Pair, issue, make_ca
from tests.cluster.broker_processes import ClusterBroker
from tests.cluster.etcd_harness import EtcdCluster
from tests.cluster.replica_checker import Acked, check_acknowledged, read_replica

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(150)]

TOPIC = "secured"


@dataclass(frozen=True)
class Certs:
    """The test's PKI: the cluster's CA, each broker's certificate, a client's, and a CA
    that signed none of them."""

    ca: str
    brokers: dict[str, Pair]
    client: Pair
    wrong_ca: str
    token: str | None = None

    def client_options(self) -> ConnectionOptions:
        """The client keywords for TLS with a client certificate (accepted with or
        without mutual TLS: a server that does not ask for it never sees it), and the
        token when the brokers need one."""
        options: ConnectionOptions = {
            "tls_ca": self.ca,
            "tls_cert": self.client.cert,
            "tls_key": self.client.key,
        }
        if self.token is not None:
            options["token"] = self.token
        return options

    def channel(self, address: str) -> grpc.aio.Channel:
        """A TLS channel to a broker, as the test's client (with its token, if any)."""
        credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca).read_bytes(),
            private_key=Path(self.client.key).read_bytes(),
            certificate_chain=Path(self.client.cert).read_bytes(),
        )
        if self.token is not None:
            bearer = grpc.access_token_call_credentials(self.token)
            credentials = grpc.composite_channel_credentials(credentials, bearer)
        return grpc.aio.secure_channel(address, credentials)


async def _with_token(certs: Certs, etcd: EtcdCluster, prefix: str) -> Certs:
    """``certs`` with an admin token made in the cluster's etcd (``[cluster] tokens``),
    as ``headrace tokens create --cluster-etcd`` makes one."""
    token, entry = mint("ops", [make_grant("admin", "*")], "2026-12-06T00:00:00Z")
    async with await EtcdStore.connect(etcd.endpoints, timeout_s=3.0) as store:
        await EtcdTokens(store, Keys(prefix)).create(to_record(entry))
    return dataclasses.replace(certs, token=token)


def _certs(directory: Path, count: int = 3) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca, wrong = make_ca(directory, "cluster-ca"), make_ca(directory, "other-ca")
    brokers = {f"b{i + 1}": issue(directory, ca, f"b{i + 1}", peer=True) for i in range(count)}
    client = issue(directory, ca, "client", client=True)
    return Certs(ca.pem, brokers, client, wrong.pem)


def _tls_broker(
    root: Path,
    node_id: str,
    etcd: EtcdCluster,
    prefix: str,
    certs: Certs,
    *,
    mutual: bool,
    peer_ca: str | None,
) -> ClusterBroker:
    """A cluster broker serving TLS with its own certificate (``mutual``: requiring client
    certificates of the cluster's CA), ``[cluster] peer_tls_ca = peer_ca`` when given,
    and the cluster's tokens when ``certs`` has one."""
    broker = ClusterBroker(root, node_id, etcd, prefix)
    pair = certs.brokers[node_id]
    broker.command += ["--tls-cert", pair.cert, "--tls-key", pair.key]
    if mutual:
        broker.command += ["--tls-client-ca", certs.ca]
    if certs.token is not None:
        broker.command += ["--cluster-tokens"]
    config = root / node_id / "headrace.toml"
    extra = "replica_lag_time_max_ms = 1000\n"
    if peer_ca is not None:
        extra += f'peer_tls_ca = "{peer_ca}"\n'
    config.write_text(config.read_text() + extra)  # the file ends in [cluster]
    return broker


async def _wait_serving(broker: ClusterBroker, certs: Certs, within_s: float = 30.0) -> None:
    """Ask the broker's health service over TLS until it says SERVING."""
    assert broker.process is not None
    deadline = time.monotonic() + within_s
    request = health_pb2.HealthCheckRequest()
    while time.monotonic() < deadline and broker.process.poll() is None:
        async with certs.channel(broker.address) as channel:
            with contextlib.suppress(grpc.RpcError):
                got = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=0.5)
                if got.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        await asyncio.sleep(0.05)
    raise AssertionError(f"broker {broker.node_id} did not serve:\n{broker.log.read_text()}")


@contextlib.asynccontextmanager
async def _tls_cluster(
    root: Path,
    etcd: EtcdCluster,
    prefix: str,
    certs: Certs,
    *,
    mutual: bool,
    peer_ca: Mapping[str, str | None],
) -> AsyncIterator[dict[str, ClusterBroker]]:
    brokers = {
        node: _tls_broker(root, node, etcd, prefix, certs, mutual=mutual, peer_ca=ca)
        for node, ca in peer_ca.items()
    }
    try:
        for broker in brokers.values():
            broker.spawn()
        for broker in brokers.values():
            await _wait_serving(broker, certs)
        yield brokers
    finally:
        for broker in brokers.values():
            with contextlib.suppress(Exception):
                broker.stop()
            broker.kill()


async def _create(seeds: str, certs: Certs, name: str) -> None:
    """Create a factor-3 topic of one partition, min_insync 2, asked again while the
    answering broker does not see three brokers alive yet."""
    deadline = time.monotonic() + 15.0
    async with AsyncAdminClient(seeds, **certs.client_options()) as admin:
        while True:
            try:
                await admin.create_topic(
                    name, 1, replication_factor=3, min_insync_replicas=2, exist_ok=True
                )
                return
            except FailedPrecondition:
                assert time.monotonic() < deadline, "three brokers never seen alive"
                await asyncio.sleep(0.1)


async def _route(broker: ClusterBroker, certs: Certs, name: str) -> _cluster.TopicRoute:
    async with certs.channel(broker.address) as channel:
        got = await _cluster_grpc.ClusterStub(channel).Lookup(
            _cluster.LookupRequest(topics=[name]), timeout=5
        )
    [route] = got.routes
    assert isinstance(route, _cluster.TopicRoute)
    return route


async def _wait_route(
    broker: ClusterBroker, certs: Certs, name: str, within_s: float, **wanted: object
) -> _cluster.TopicRoute:
    """Ask ``broker`` until ``name``'s route is online with the ``wanted`` fields
    (``isr`` compared as a set, ``not_owner`` an owner other than the one given)."""
    deadline = time.monotonic() + within_s
    while True:
        with contextlib.suppress(grpc.RpcError):
            route = await _route(broker, certs, name)
            ok = route.online
            if "isr" in wanted:
                ok = ok and set(route.isr) == wanted["isr"]
            if "not_owner" in wanted:
                ok = ok and route.owner_node not in ("", wanted["not_owner"])
            if ok:
                return route
        assert time.monotonic() < deadline, f"{name} never {wanted} at {broker.node_id}"
        await asyncio.sleep(0.1)


async def _publish(seeds: str, certs: Certs, topic: str, values: list[bytes], acked: Acked) -> None:
    async with AsyncProducer(seeds, delivery_timeout_s=30.0, **certs.client_options()) as p:
        for value in values:
            meta = await p.publish(topic, value)
            acked.add(meta.partition, len(acked), meta.offset, value)


async def _on_disk(brokers: list[ClusterBroker], topic: str, acked: Acked, within_s: float) -> None:
    """Wait until every acked record is at its offset in each broker's partition files."""
    deadline = time.monotonic() + within_s
    for broker in brokers:
        while True:
            try:
                check_acknowledged(acked, read_replica(broker.data_dir, topic))
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


@pytest.mark.parametrize(
    ("mutual", "tokens"),
    [(False, False), (True, False), (True, True)],
    ids=["tls", "mutual-tls", "mutual-tls-tokens"],
)
async def test_factor_3_replicates_over_tls_and_fails_over(
    etcd: EtcdCluster, prefix: str, tmp_path: Path, mutual: bool, tokens: bool
) -> None:
    """Scenario: three brokers serving TLS (with ``mutual``: requiring client certificates
    of the cluster's CA; the brokers trust tls_client_ca for each other, else
    ``[cluster] peer_tls_ca`` names the CA; with ``tokens``: ``--cluster-tokens``, so each
    fetch carries the cluster's internal credential as its bearer token, inside TLS); a
    factor-3 topic gets 40 records, then its leader is SIGKILLed and the topic gets 40
    more.
    Expected: the first 40 at their acked offsets on all three disks, the three in the
    in-sync set; a follower leads after the kill and the 80 records are at their offsets
    on both survivors' disks."""
    certs = _certs(tmp_path / "pki")
    if tokens:
        certs = await _with_token(certs, etcd, prefix)
    peer_ca: dict[str, str | None] = dict.fromkeys(("b1", "b2", "b3"), None if mutual else certs.ca)
    async with _tls_cluster(
        tmp_path, etcd, prefix, certs, mutual=mutual, peer_ca=peer_ca
    ) as brokers:
        every = list(brokers.values())
        seeds = ",".join(b.address for b in every)
        await _create(seeds, certs, TOPIC)
        first = every[0]
        acked = Acked()
        await _publish(seeds, certs, TOPIC, [f"a{i}".encode() for i in range(40)], acked)
        await _on_disk(every, TOPIC, acked, within_s=15.0)
        route = await _wait_route(first, certs, TOPIC, 15.0, isr=set(brokers))
        old = route.owner_node

        brokers[old].kill()
        survivors = [b for b in every if b.node_id != old]
        route = await _wait_route(survivors[0], certs, TOPIC, 15.0, not_owner=old)
        assert route.owner_node in {b.node_id for b in survivors}
        seeds = ",".join(b.address for b in survivors)
        await _publish(seeds, certs, TOPIC, [f"b{i}".encode() for i in range(40)], acked)
        assert len(acked) == 80
        await _on_disk(survivors, TOPIC, acked, within_s=15.0)


async def test_follower_with_wrong_ca_is_refused_and_says_why(
    etcd: EtcdCluster, prefix: str, tmp_path: Path
) -> None:
    """Scenario: three brokers serving TLS; b3's ``[cluster] peer_tls_ca`` is a CA that
    signed none of the brokers' certificates. Factor-3 topics are made until one is led
    by b1 or b2, and 20 records are published to it.
    Expected: the records are acked (b1 and b2 in sync) and on b1's and b2's disks, never
    on b3's; b3 leaves the in-sync set; b3's log says its fetch from the leader failed on
    the certificate, once per leader it follows (not once per retry)."""
    certs = _certs(tmp_path / "pki")
    peer_ca = {"b1": certs.ca, "b2": certs.ca, "b3": certs.wrong_ca}
    async with _tls_cluster(
        tmp_path, etcd, prefix, certs, mutual=False, peer_ca=peer_ca
    ) as brokers:
        b1, b2, b3 = brokers["b1"], brokers["b2"], brokers["b3"]
        seeds = ",".join(b.address for b in (b1, b2, b3))
        chosen = None
        for n in range(6):
            name = f"secured-{n}"
            await _create(seeds, certs, name)
            route = await _wait_route(b1, certs, name, 15.0)
            if route.owner_node != "b3":
                chosen = name
                break
        assert chosen is not None, "b3 led every topic"
        await _wait_route(b1, certs, chosen, 15.0, isr={"b1", "b2"})
        acked = Acked()
        await _publish(seeds, certs, chosen, [f"w{i}".encode() for i in range(20)], acked)
        await _on_disk([b1, b2], chosen, acked, within_s=15.0)
        await asyncio.sleep(1.0)  # b3's fetches go on failing meanwhile
        assert not any(log.records() for log in read_replica(b3.data_dir, chosen).values())
        route = await _route(b1, certs, chosen)
        assert "b3" not in route.isr
    text = b3.log.read_text()
    lines = text.splitlines()
    failures = [line for line in lines if f"{chosen}: fetching from" in line]
    followed = [line for line in lines if f"topic {chosen}: following" in line]
    assert failures, text[-3000:]
    for line in failures:
        assert "Tls handshake failed" in line, line
        assert "CERTIFICATE_VERIFY_FAILED" in line, line
    # Said once per leader followed (a new leader or epoch is a new follower), never once
    # per retry: b3 retried for seconds.
    assert len(failures) <= len(followed), (failures, followed)
