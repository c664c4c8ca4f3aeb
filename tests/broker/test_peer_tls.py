"""TLS between brokers: ``broker.tls.load_peer_tls`` (which CA a cluster member trusts for
its peers, its own certificate as its client identity, the file checks) and
``broker.replica.manager.Channels`` dialling a real TLS (and mutual TLS) broker on
loopback, as a follower dials its leader."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.app import Broker
from broker.certs import allows_client_auth
from broker.cli import cli
from broker.config import SecurityConfig
from broker.config_cluster import ClusterConfig
from broker.errors import TlsSetupError
from broker.replica.manager import Channels
from broker.tls import PeerTls, load_peer_tls, load_server_tls
from tests._certs import Pair, Pki, issue, make_ca
from tests.broker.conftest import broker_config
from tests.broker.test_serve_process import free_port

DEADLINE_S = 5.0
CLUSTER = ClusterConfig(etcd=("127.0.0.1:2379",), node_id="b1")


def _security(pki: Pki, **changes: str) -> SecurityConfig:
    return SecurityConfig(tls_cert=pki.server.cert, tls_key=pki.server.key).replace(**changes)


def _peer(pki: Pki, ca: str, identity: Pair | None = None, name: str | None = None) -> PeerTls:
    identity = identity or pki.server
    return PeerTls(
        Path(ca).read_bytes(),
        Path(identity.cert).read_bytes(),
        Path(identity.key).read_bytes(),
        name,
        "test",
    )


def test_the_peer_ca_is_peer_tls_ca_else_tls_client_ca(pki: Pki, tmp_path: Path) -> None:
    """Scenario: a cluster member serving TLS with [cluster] peer_tls_ca (and also
    tls_client_ca), with tls_client_ca only; a single broker serving TLS; a member not
    serving TLS. Expected: peer_tls_ca's bytes when set, else tls_client_ca's, the
    broker's own chain and key as its client identity, peer_server_name passed on; None
    (plain text) for the single broker and the plain member."""
    other = tmp_path / "peers-ca.pem"
    other.write_bytes(Path(pki.wrong_ca).read_bytes())
    cluster = ClusterConfig(
        etcd=CLUSTER.etcd, node_id="b1", peer_tls_ca=str(other), peer_server_name="b.internal"
    )
    ca = make_ca(tmp_path, "cluster-ca")
    mine = issue(tmp_path, ca, "b1", peer=True)
    security = SecurityConfig(tls_cert=mine.cert, tls_key=mine.key, tls_client_ca=ca.pem)
    server = load_server_tls(security)
    peer = load_peer_tls(cluster, security, server)
    assert peer is not None
    assert server is not None
    assert peer.root_ca == other.read_bytes()
    assert (peer.chain, peer.key) == (server.chain, server.key)
    assert peer.ca_setting == "[cluster] peer_tls_ca"
    assert peer.options() == [("grpc.ssl_target_name_override", "b.internal")]

    peer = load_peer_tls(CLUSTER, security, server)
    assert peer is not None
    assert peer.root_ca == Path(ca.pem).read_bytes()
    assert peer.ca_setting == "[security] tls_client_ca"
    assert peer.options() == []

    assert load_peer_tls(ClusterConfig(), security, server) is None
    assert load_peer_tls(CLUSTER, SecurityConfig(), None) is None


def test_client_auth_usage_is_read_from_the_certificate(pki: Pki, tmp_path: Path) -> None:
    """Scenario: the extended key usage of a server-only certificate, a client one, a
    broker's (both), and a CA certificate (no such extension).
    Expected: False for the server-only one, True for the others."""
    ca = make_ca(tmp_path, "cluster-ca")
    both = issue(tmp_path, ca, "b1", peer=True)
    assert not allows_client_auth(Path(pki.server.cert).read_bytes())
    assert allows_client_auth(Path(pki.client.cert).read_bytes())
    assert allows_client_auth(Path(both.cert).read_bytes())
    assert allows_client_auth(Path(pki.ca).read_bytes())


def test_mutual_tls_refuses_a_certificate_without_client_auth(pki: Pki) -> None:
    """Scenario: a cluster member requiring client certificates (tls_client_ca) whose own
    certificate has serverAuth only; the same without tls_client_ca (peer_tls_ca).
    Expected: TlsSetupError at start naming tls_cert and clientAuth (its peers would
    refuse it as their client); without mutual TLS it loads."""
    security = _security(pki, tls_client_ca=pki.ca)
    with pytest.raises(TlsSetupError) as caught:
        load_peer_tls(CLUSTER, security, load_server_tls(security))
    message = str(caught.value)
    assert message.startswith(f"[security] tls_cert = {pki.server.cert}: "), message
    assert "lacks clientAuth" in message, message
    cluster = ClusterConfig(etcd=CLUSTER.etcd, node_id="b1", peer_tls_ca=pki.ca)
    assert load_peer_tls(cluster, _security(pki), load_server_tls(_security(pki))) is not None


def test_peer_tls_ca_problems_name_the_cluster_key(pki: Pki, tmp_path: Path) -> None:
    """Scenario: [cluster] peer_tls_ca missing, empty, and a leaf certificate (no CA).
    Expected: TlsSetupError, one line starting ``[cluster] peer_tls_ca = <path>:`` with
    the problem."""
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    cases = [
        (str(tmp_path / "missing.pem"), "cannot read it"),
        (str(empty), "holds no"),
        (pki.client.cert, "holds no CA certificate"),
    ]
    security = _security(pki)
    server = load_server_tls(security)
    for path, problem in cases:
        cluster = ClusterConfig(etcd=CLUSTER.etcd, node_id="b1", peer_tls_ca=path)
        with pytest.raises(TlsSetupError) as caught:
            load_peer_tls(cluster, security, server)
        message = str(caught.value)
        assert message.startswith(f"[cluster] peer_tls_ca = {path}: "), message
        assert problem in message, message
        assert "\n" not in message


@asynccontextmanager
async def _serving(tmp_path: Path, security: SecurityConfig) -> AsyncIterator[str]:
    async with Broker(broker_config(tmp_path / "data", security=security)) as broker:
        yield f"127.0.0.1:{broker.port}"


async def _health(channels: Channels, address: str) -> str:
    """``SERVING``, or the code and details of the failure (the follower logs those)."""
    channel = channels.get(address)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        got = await stub.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    finally:
        await channel.close()
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(got.status))


@pytest.mark.asyncio
async def test_channels_dial_a_tls_broker(pki: Pki, tmp_path: Path) -> None:
    """Scenario: a broker serving TLS with the test CA's certificate for 127.0.0.1 and
    localhost; Channels trusting that CA, another CA, that CA with the name ``localhost``
    and with ``broker.internal``; plain-text Channels.
    Expected: SERVING with the right CA, with or without the name ``localhost``; the wrong
    CA fails UNAVAILABLE naming CERTIFICATE_VERIFY_FAILED; a name not in the certificate
    fails UNAVAILABLE; plain text fails UNAVAILABLE (the port serves TLS only)."""
    async with _serving(tmp_path, _security(pki)) as address:
        assert await _health(Channels(_peer(pki, pki.ca)), address) == "SERVING"
        assert await _health(Channels(_peer(pki, pki.ca, name="localhost")), address) == "SERVING"
        wrong = await _health(Channels(_peer(pki, pki.wrong_ca)), address)
        assert wrong.startswith("UNAVAILABLE"), wrong
        assert "CERTIFICATE_VERIFY_FAILED" in wrong, wrong
        other_name = await _health(Channels(_peer(pki, pki.ca, name="broker.internal")), address)
        assert other_name.startswith("UNAVAILABLE"), other_name
        plain = await _health(Channels(), address)
        assert plain.startswith("UNAVAILABLE"), plain


@pytest.mark.asyncio
async def test_channels_present_the_broker_certificate_under_mutual_tls(
    pki: Pki, tmp_path: Path
) -> None:
    """Scenario: a broker requiring client certificates of the test CA; Channels whose
    identity is a certificate of that CA with the clientAuth usage, one of another CA,
    and the server certificate whose only extended key usage is serverAuth.
    Expected: SERVING for the first; UNAVAILABLE for the other two (the handshake is
    refused: a broker's certificate must allow clientAuth to call a mutual-TLS peer)."""
    async with _serving(tmp_path, _security(pki, tls_client_ca=pki.ca)) as address:
        good = Channels(_peer(pki, pki.ca, identity=pki.client))
        assert await _health(good, address) == "SERVING"
        stranger = await _health(Channels(_peer(pki, pki.ca, identity=pki.wrong_client)), address)
        assert stranger.startswith("UNAVAILABLE"), stranger
        server_only = await _health(Channels(_peer(pki, pki.ca)), address)
        assert server_only.startswith("UNAVAILABLE"), server_only


def test_serve_stops_on_a_server_only_certificate_under_mutual_tls(
    pki: Pki, tmp_path: Path
) -> None:
    """Scenario: `headrace serve` in cluster mode with --tls-client-ca and the test CA's
    server certificate (serverAuth only), no etcd listening.
    Expected: exit 1 with one line naming tls_cert and clientAuth, before etcd is asked
    and before the data directory is made."""
    data = tmp_path / "data"
    args = ["serve", "--data-dir", str(data), "--metrics-listen", ""]
    args += ["--cluster-etcd", f"127.0.0.1:{free_port()}", "--node-id", "b1"]
    args += ["--tls-cert", pki.server.cert, "--tls-key", pki.server.key]
    args += ["--tls-client-ca", pki.ca]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert f"[security] tls_cert = {pki.server.cert}: " in result.output
    assert "lacks clientAuth" in result.output
    assert "cannot join" not in result.output
    assert "Traceback" not in result.output
    assert not data.exists()
