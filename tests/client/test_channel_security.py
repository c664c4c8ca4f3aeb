"""client._channel's security: the bearer token reaches the server on every call shape,
on grpc.aio and blocking channels, with and without TLS; bad values fail at construction.

The server here is a test-only one: an interceptor records the ``authorization`` metadata
of every call, and echo methods answer the four call shapes (the real token check belongs
to the broker's auth interceptor, tested with it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from client import (
    AdminClient,
    AsyncAdminClient,
    AsyncConsumer,
    AsyncFetcher,
    AsyncProducer,
    ClientError,
    Consumer,
    Fetcher,
    Producer,
    check_security,
)
from client._channel import aio_channel, blocking_channel
from tests._certs import Pki

TOKEN = "hr_0123456789ab_" + "A" * 43
DEADLINE_S = 5.0


class Recorder(grpc.aio.ServerInterceptor):
    """Records (method, authorization value or None) of every call the server gets."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        found = dict(details.invocation_metadata or ()).get("authorization")
        self.seen.append((details.method, found))
        return await continuation(details)


async def _uu(request: bytes, context: Any) -> bytes:
    return request


async def _us(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield request
    yield request


async def _su(requests: AsyncIterator[bytes], context: Any) -> bytes:
    return b"".join([r async for r in requests])


async def _ss(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for r in requests:
        yield r


ECHO = grpc.method_handlers_generic_handler(
    "test.Echo",
    {
        "UU": grpc.unary_unary_rpc_method_handler(_uu),
        "US": grpc.unary_stream_rpc_method_handler(_us),
        "SU": grpc.stream_unary_rpc_method_handler(_su),
        "SS": grpc.stream_stream_rpc_method_handler(_ss),
    },
)


@asynccontextmanager
async def recording_server(pki: Pki | None = None) -> AsyncIterator[tuple[str, Recorder]]:
    """An echo server on 127.0.0.1 (TLS with the test CA's server certificate when ``pki``)
    and its recorder."""
    recorder = Recorder()
    server = grpc.aio.server(interceptors=[recorder])
    server.add_generic_rpc_handlers([ECHO])
    if pki is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        creds = grpc.ssl_server_credentials(
            [(Path(pki.server.key).read_bytes(), Path(pki.server.cert).read_bytes())]
        )
        port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    try:
        yield f"127.0.0.1:{port}", recorder
    finally:
        await server.stop(None)


async def _four_aio_calls(channel: Any) -> list[Any]:
    uu = channel.unary_unary("/test.Echo/UU")
    us = channel.unary_stream("/test.Echo/US")
    su = channel.stream_unary("/test.Echo/SU")
    ss = channel.stream_stream("/test.Echo/SS")

    async def two() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"

    return [
        await uu(b"x", timeout=DEADLINE_S),
        [r async for r in us(b"y", timeout=DEADLINE_S)],
        await su(two(), timeout=DEADLINE_S),
        [r async for r in ss(two(), timeout=DEADLINE_S)],
    ]


EXPECTED = [b"x", [b"y", b"y"], b"ab", [b"a", b"b"]]
METHODS = ["/test.Echo/UU", "/test.Echo/US", "/test.Echo/SU", "/test.Echo/SS"]


@pytest.mark.asyncio
@pytest.mark.parametrize("tls", [False, True])
async def test_aio_channel_sends_the_token_on_all_four_call_shapes(pki: Pki, tls: bool) -> None:
    """Scenario: an aio channel with a token (plain, then TLS) makes a unary-unary,
    unary-stream, stream-unary and stream-stream call. Expected: each answers as without
    the interceptor, and the server saw 'Bearer <token>' on every one."""
    async with recording_server(pki if tls else None) as (address, recorder):
        channel = aio_channel(address, token=TOKEN, tls_ca=pki.ca if tls else None)
        async with channel:
            assert await _four_aio_calls(channel) == EXPECTED
    assert recorder.seen == [(m, f"Bearer {TOKEN}") for m in METHODS]


@pytest.mark.asyncio
async def test_no_token_sends_no_authorization(pki: Pki) -> None:
    """Scenario: a channel without a token. Expected: no authorization metadata at all."""
    async with recording_server() as (address, recorder), aio_channel(address) as channel:
        assert await _four_aio_calls(channel) == EXPECTED
    assert recorder.seen == [(m, None) for m in METHODS]


def _four_blocking_calls(channel: Any) -> list[Any]:
    def two() -> Iterator[bytes]:
        yield b"a"
        yield b"b"

    return [
        channel.unary_unary("/test.Echo/UU")(b"x", timeout=DEADLINE_S),
        list(channel.unary_stream("/test.Echo/US")(b"y", timeout=DEADLINE_S)),
        channel.stream_unary("/test.Echo/SU")(two(), timeout=DEADLINE_S),
        list(channel.stream_stream("/test.Echo/SS")(two(), timeout=DEADLINE_S)),
    ]


@pytest.mark.asyncio
@pytest.mark.parametrize("tls", [False, True])
async def test_blocking_channel_sends_the_token_on_all_four_call_shapes(
    pki: Pki, tls: bool
) -> None:
    """Scenario: as above with a blocking channel (the sync Fetcher's), run off the loop.
    Expected: the same answers; 'Bearer <token>' on every call."""
    import asyncio

    async with recording_server(pki if tls else None) as (address, recorder):
        channel = blocking_channel(address, token=TOKEN, tls_ca=pki.ca if tls else None)
        with channel:
            got = await asyncio.to_thread(_four_blocking_calls, channel)
    assert got == EXPECTED
    assert recorder.seen == [(m, f"Bearer {TOKEN}") for m in METHODS]


@pytest.mark.asyncio
async def test_every_client_class_sends_its_token(pki: Pki) -> None:
    """Scenario: each client class, given a token and the CA, calls the echo server over
    TLS (which does not implement the broker's methods, so the calls fail; the producer
    fails on the DescribeTopic before its Publish, the consumer on its Subscribe stream).
    Expected: the server saw 'Bearer <token>' on a call from each of them."""
    import asyncio

    async with recording_server(pki) as (address, recorder):
        security: dict[str, Any] = {"token": TOKEN, "tls_ca": pki.ca}
        async with AsyncAdminClient(address, timeout_s=DEADLINE_S, **security) as admin:
            with pytest.raises(ClientError):
                await admin.list_topics()
        async with AsyncFetcher(address, timeout_s=DEADLINE_S, **security) as fetcher:
            with pytest.raises(ClientError):
                await fetcher.fetch("t", 0, 0)
        async with AsyncProducer(address, delivery_timeout_s=DEADLINE_S, **security) as producer:
            with pytest.raises(ClientError):
                await producer.publish("t", b"v", partition=0)
        consumer = AsyncConsumer("t", "s", broker=address, connect_timeout=1, **security)
        with pytest.raises(ClientError):
            await consumer.start()
        await consumer.aclose()

        def sync_calls() -> None:
            with (
                AdminClient(address, timeout_s=DEADLINE_S, **security) as admin,
                pytest.raises(ClientError),
            ):
                admin.list_topics()
            with (
                Fetcher(address, timeout_s=DEADLINE_S, **security) as fetcher,
                pytest.raises(ClientError),
            ):
                fetcher.fetch("t", 0, 0)

        await asyncio.to_thread(sync_calls)
    methods = {m.rsplit("/", 1)[1] for m, _ in recorder.seen}
    assert {"ListTopics", "Fetch", "DescribeTopic", "Subscribe"} <= methods
    assert recorder.seen
    assert all(value == f"Bearer {TOKEN}" for _, value in recorder.seen)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"token": "abc\n"}, "token must be non-empty printable ASCII"),
        ({"token": "two words"}, "token must be"),
        ({"token": ""}, "token must be"),
        ({"token": "tökén"}, "token must be"),
        ({"tls_ca": "/nonexistent/ca.pem"}, "tls_ca: cannot read /nonexistent/ca.pem"),
        ({"tls_ca": "CA", "tls_cert": "c.pem"}, "tls_cert needs tls_key"),
        ({"tls_ca": "CA", "tls_key": "c.key"}, "tls_key needs tls_cert"),
        ({"tls_cert": "CLIENT", "tls_key": "KEY"}, "need tls_ca"),
        ({"tls_ca": "NOT_PEM"}, "is not a PEM file"),
    ],
)
def test_bad_security_arguments_are_value_errors(
    pki: Pki, tmp_path: Path, kwargs: dict[str, str], problem: str
) -> None:
    """Scenario: each bad token or TLS argument, checked directly and at construction of
    every client class. Expected: ValueError naming the argument, before any connection."""
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    files = {
        "CA": pki.ca,
        "CLIENT": pki.client.cert,
        "KEY": pki.client.key,
        "NOT_PEM": str(not_pem),
    }
    args: dict[str, Any] = {k: files.get(v, v) for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=problem):
        check_security(**args)
    for make in (
        lambda: Producer("127.0.0.1:1", **args),
        lambda: Consumer("t", "s", broker="127.0.0.1:1", **args),
        lambda: AdminClient("127.0.0.1:1", **args),
        lambda: Fetcher("127.0.0.1:1", **args),
    ):
        with pytest.raises(ValueError, match=problem):
            make()


@pytest.mark.asyncio
async def test_async_classes_check_at_construction() -> None:
    """Scenario: each async client class with a token holding a newline.
    Expected: ValueError at construction."""
    for make in (
        lambda: AsyncProducer("127.0.0.1:1", token="a\nb"),
        lambda: AsyncConsumer("t", "s", broker="127.0.0.1:1", token="a\nb"),
        lambda: AsyncAdminClient("127.0.0.1:1", token="a\nb"),
        lambda: AsyncFetcher("127.0.0.1:1", token="a\nb"),
    ):
        with pytest.raises(ValueError, match="token must be"):
            make()
