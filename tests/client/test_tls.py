"""The client library over TLS and mutual TLS against a real broker on loopback, and the
errors a client sees for a server it must not trust (wrong CA, expired certificate):
clear, and within a bounded wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.app import Broker
from broker.config import SecurityConfig
from client import (
    AdminClient,
    AsyncAdminClient,
    AsyncConsumer,
    AsyncFetcher,
    AsyncProducer,
    Consumer,
    Fetcher,
    Producer,
    Unavailable,
)
from tests._certs import Pair, Pki
from tests.broker.conftest import broker_config

#: A failed handshake must be reported within this, seconds (not hang).
BOUND_S = 10.0


@asynccontextmanager
async def tls_broker(tmp_path: Path, pki: Pki, *, mtls: bool = False) -> AsyncIterator[str]:
    security = SecurityConfig(
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca if mtls else None,
    )
    async with Broker(broker_config(tmp_path / "data", security=security)) as broker:
        yield f"127.0.0.1:{broker.port}"


async def _round_trip(address: str, topic: str, security: dict[str, Any]) -> None:
    async with AsyncAdminClient(address, **security) as admin:
        await admin.create_topic(topic, 1)
    async with AsyncProducer(address, **security) as producer:
        sent = await producer.publish(topic, b"hello", partition=0)
        assert sent.offset == 0
    async with AsyncFetcher(address, **security) as fetcher:
        fetched = await fetcher.fetch(topic, 0, 0)
        assert fetched.high_water_mark == 1
    async with AsyncConsumer(topic, "s", broker=address, **security) as consumer:
        [message] = await consumer.receive_batch(1)
        assert message.value == b"hello"
        consumer.ack(message)


@pytest.mark.asyncio
async def test_async_clients_over_tls(pki: Pki, tmp_path: Path) -> None:
    """Scenario: a TLS broker; admin creates a topic, the producer publishes, the fetcher
    reads it, the consumer receives it, all with tls_ca (and a token, sent but unchecked).
    Expected: every step works as over plain TCP."""
    async with tls_broker(tmp_path, pki) as address:
        await _round_trip(address, "tls", {"tls_ca": pki.ca, "token": "hr_0_x"})


@pytest.mark.asyncio
async def test_async_clients_over_mutual_tls(pki: Pki, tmp_path: Path) -> None:
    """Scenario: the same against a broker that requires client certificates, with the
    test CA's client certificate. Expected: every step works."""
    security = {"tls_ca": pki.ca, "tls_cert": pki.client.cert, "tls_key": pki.client.key}
    async with tls_broker(tmp_path, pki, mtls=True) as address:
        await _round_trip(address, "mtls", security)


def _sync_round_trip(address: str, security: dict[str, Any]) -> bytes:
    with AdminClient(address, **security) as admin:
        admin.create_topic("sync", 1)
    with Producer(address, **security) as producer:
        producer.publish("sync", b"blocking", partition=0)
    with Fetcher(address, **security) as fetcher:
        assert fetcher.fetch("sync", 0, 0).high_water_mark == 1
    with Consumer("sync", "s", broker=address, **security) as consumer:
        message = consumer.receive(timeout=BOUND_S)
        consumer.ack(message)
        return message.value


@pytest.mark.asyncio
async def test_sync_clients_over_mutual_tls(pki: Pki, tmp_path: Path) -> None:
    """Scenario: the blocking twins against a mutual-TLS broker, from a thread.
    Expected: the record published is the record consumed."""
    security = {"tls_ca": pki.ca, "tls_cert": pki.client.cert, "tls_key": pki.client.key}
    async with tls_broker(tmp_path, pki, mtls=True) as address:
        got = await asyncio.to_thread(_sync_round_trip, address, security)
    assert got == b"blocking"


@pytest.mark.asyncio
async def test_mutual_tls_without_a_client_certificate_fails_fast(pki: Pki, tmp_path: Path) -> None:
    """Scenario: a client with tls_ca only, against a broker requiring client certificates.
    Expected: Unavailable within the bound (the broker ends the handshake)."""
    async with tls_broker(tmp_path, pki, mtls=True) as address:
        started = time.monotonic()
        async with AsyncAdminClient(address, tls_ca=pki.ca, timeout_s=3) as admin:
            with pytest.raises(Unavailable):
                await admin.list_topics()
        assert time.monotonic() - started < BOUND_S


@pytest.mark.asyncio
async def test_wrong_ca_fails_fast_with_a_certificate_error(pki: Pki, tmp_path: Path) -> None:
    """Scenario: the client trusts another CA than the one that signed the broker.
    Expected: Unavailable within the bound, whose message says the certificate could not
    be verified."""
    async with tls_broker(tmp_path, pki) as address:
        started = time.monotonic()
        async with AsyncAdminClient(address, tls_ca=pki.wrong_ca, timeout_s=3) as admin:
            with pytest.raises(Unavailable) as caught:
                await admin.list_topics()
        assert time.monotonic() - started < BOUND_S
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


@asynccontextmanager
async def _raw_tls_server(server: Pair) -> AsyncIterator[str]:
    """A gRPC server with ``server``'s certificate and no services: the broker itself
    refuses to start with an expired one, so this stands in for a stale deployment."""
    grpc_server = grpc.aio.server()
    creds = grpc.ssl_server_credentials(
        [(Path(server.key).read_bytes(), Path(server.cert).read_bytes())]
    )
    port = grpc_server.add_secure_port("127.0.0.1:0", creds)
    await grpc_server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await grpc_server.stop(None)


@pytest.mark.asyncio
async def test_expired_server_certificate_fails_fast(pki: Pki) -> None:
    """Scenario: a server presenting a certificate that expired yesterday, signed by the
    trusted CA. Expected: Unavailable within the bound, saying the certificate expired."""
    async with _raw_tls_server(pki.expired_server) as address:
        started = time.monotonic()
        async with AsyncAdminClient(address, tls_ca=pki.ca, timeout_s=3) as admin:
            with pytest.raises(Unavailable) as caught:
                await admin.list_topics()
        assert time.monotonic() - started < BOUND_S
    assert "expired" in str(caught.value).lower()
