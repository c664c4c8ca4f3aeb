"""broker.tls and TLS on the broker's port: file checks at start, TLS and mutual TLS over
real gRPC on loopback, health on the same port."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from broker.app import Broker
from broker.config import SecurityConfig
from broker.errors import TlsSetupError
from broker.tls import load_server_tls
from proto import admin_pb2, admin_pb2_grpc
from tests._certs import Pair, Pki
from tests.broker.conftest import broker_config

#: Bound on every call here: a handshake failure must fail fast, never hang.
DEADLINE_S = 5.0


def _security(pki: Pki, server: Pair | None = None, **changes: str) -> SecurityConfig:
    server = server or pki.server
    return SecurityConfig(tls_cert=server.cert, tls_key=server.key).replace(**changes)


def test_good_files_load(pki: Pki) -> None:
    """Scenario: the test CA's server certificate and key, and the CA for clients.
    Expected: loaded; the expiry is the certificate's (about 30 days away)."""
    tls = load_server_tls(_security(pki, tls_client_ca=pki.ca))
    assert tls is not None
    assert tls.client_ca == Path(pki.ca).read_bytes()
    left = tls.not_after - dt.datetime.now(dt.UTC)
    assert dt.timedelta(days=29) < left < dt.timedelta(days=31)


def test_no_tls_loads_nothing() -> None:
    """Scenario: no [security] TLS settings. Expected: None (plain TCP)."""
    assert load_server_tls(SecurityConfig()) is None


def test_bad_files_are_one_line_naming_setting_and_file(pki: Pki, tmp_path: Path) -> None:
    """Scenario: each way a TLS file can be wrong. Expected: TlsSetupError, one line, with
    the setting, the path and the problem."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    empty_ca = tmp_path / "empty-ca.pem"
    empty_ca.write_text("")
    cases = [
        (_security(pki, tls_cert=str(tmp_path / "missing.pem")), "tls_cert", "cannot read it"),
        (_security(pki, tls_key=str(tmp_path / "missing.key")), "tls_key", "cannot read it"),
        (_security(pki, tls_cert=str(garbage)), "tls_cert", "no -----BEGIN CERTIFICATE"),
        (_security(pki, pki.expired_server), "tls_cert", "expired on"),
        (_security(pki, tls_key=pki.client.key), "tls_key", "not an unencrypted PEM private key"),
        (_security(pki, tls_client_ca=str(empty_ca)), "tls_client_ca", "no"),
    ]
    for security, setting, problem in cases:
        with pytest.raises(TlsSetupError) as caught:
            load_server_tls(security)
        message = str(caught.value)
        assert message.startswith(f"[security] {setting} = "), message
        assert problem in message, message
        assert caught.value.setting == setting
        assert "\n" not in message


def test_not_yet_valid_is_refused(pki: Pki) -> None:
    """Scenario: the clock says a year ago, before the certificate's start.
    Expected: TlsSetupError saying when it becomes valid."""
    earlier = dt.datetime.now(dt.UTC) - dt.timedelta(days=365)
    with pytest.raises(TlsSetupError, match="not valid before"):
        load_server_tls(_security(pki), now=earlier)


@pytest.mark.asyncio
async def test_expired_certificate_stops_the_start_before_the_data_dir(
    pki: Pki, tmp_path: Path
) -> None:
    """Scenario: start a broker whose certificate expired yesterday.
    Expected: TlsSetupError ('expired on ... renew it'); no data directory was made."""
    config = broker_config(tmp_path / "data", security=_security(pki, pki.expired_server))
    with pytest.raises(TlsSetupError, match=r"expired on .* renew it"):
        await Broker(config).start()
    assert not (tmp_path / "data").exists()


@asynccontextmanager
async def _tls_broker(tmp_path: Path, security: SecurityConfig) -> AsyncIterator[str]:
    async with Broker(broker_config(tmp_path / "data", security=security)) as broker:
        yield f"127.0.0.1:{broker.port}"


def _creds(ca: str, client: Pair | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        Path(ca).read_bytes(),
        Path(client.key).read_bytes() if client else None,
        Path(client.cert).read_bytes() if client else None,
    )


async def _health(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    got = await stub.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
    return int(got.status)


@pytest.mark.asyncio
async def test_tls_serves_admin_and_health_and_refuses_plain_tcp(pki: Pki, tmp_path: Path) -> None:
    """Scenario: a TLS broker; a TLS channel trusting the test CA, then a plain one.
    Expected: health SERVING, reflection listing both services, and ListTopics over TLS;
    the plain channel fails UNAVAILABLE within the deadline."""
    async with _tls_broker(tmp_path, _security(pki)) as address:
        async with grpc.aio.secure_channel(address, _creds(pki.ca)) as channel:
            assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = reflect.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                timeout=DEADLINE_S,
            )
            answer = await call.read()
            names = {s.name for s in answer.list_services_response.service}
            assert {"headrace.v1.Broker", "headrace.v1.Admin"} <= names
            admin = admin_pb2_grpc.AdminStub(channel)
            got = await admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=DEADLINE_S)
            assert list(got.topics) == []
        async with grpc.aio.insecure_channel(address) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _health(plain)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("client", "works"),
    [("client", True), (None, False), ("wrong_client", False)],
)
async def test_mutual_tls_requires_a_client_certificate_from_the_ca(
    pki: Pki, tmp_path: Path, client: str | None, works: bool
) -> None:
    """Scenario: a broker with tls_client_ca; clients with the CA's client certificate,
    with none, and with one from another CA. Expected: only the first is served; the
    others fail UNAVAILABLE within the deadline (the handshake is refused)."""
    pair = getattr(pki, client) if client else None
    async with (
        _tls_broker(tmp_path, _security(pki, tls_client_ca=pki.ca)) as address,
        grpc.aio.secure_channel(address, _creds(pki.ca, pair)) as channel,
    ):
        if works:
            assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
        else:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _health(channel)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.asyncio
async def test_server_chain_with_intermediate_file_copy(pki: Pki, tmp_path: Path) -> None:
    """Scenario: tls_cert is the leaf followed by the CA (a full chain file).
    Expected: the broker starts and serves clients that trust the CA."""
    chain = tmp_path / "chain.pem"
    shutil.copy(pki.server.cert, chain)
    with chain.open("ab") as f:
        f.write(Path(pki.ca).read_bytes())
    async with (
        _tls_broker(tmp_path, _security(pki, tls_cert=str(chain))) as address,
        grpc.aio.secure_channel(address, _creds(pki.ca)) as channel,
    ):
        assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
