"""Channels: every gRPC channel the client library opens, built with the same options.

Role: one place that says how a client connects: message size limits, and how fast a
channel reconnects after the broker went away. gRPC's own reconnect backoff starts at 1 s
and grows by 1.6x up to 120 s, so a client could stay away for tens of seconds after the
broker is back (22.8 s after a 45 s outage, measured). Every channel here caps it at
``reconnect_backoff_max_s`` (default 1 s): after any outage the client is back within
about that long (plus jitter) of the broker serving again.

Options set (gRPC channel arguments, milliseconds):
    ``grpc.initial_reconnect_backoff_ms``  the first pause: 100, or the cap if lower
    ``grpc.max_reconnect_backoff_ms``      the cap: ``reconnect_backoff_max_s``
    ``grpc.min_reconnect_backoff_ms``      the least time one connection attempt gets
                                           (gRPC's connect timeout): the cap as well, so a
                                           slow handshake is not cut short
    ``grpc.use_local_subchannel_pool``     1: connections of this channel only (below)

Each channel also keeps its own connections (``grpc.use_local_subchannel_pool``). By
default gRPC shares them between channels with the same target and options, so a client
made just after a broker restart inherited another client's reconnect backoff, and its
first call failed UNAVAILABLE ("connection refused") while the broker was serving.

Example: ``reconnect_backoff_max_s=0.5`` and a 20 s outage: attempts every 0.1, 0.16,
0.26, 0.41, then 0.5 s (each +-20 % jitter); the first attempt after the broker is back
comes at most ~0.6 s later. gRPC's default attempts near 1, 2.6, 5.2, 9.3, 15.8, 26 s;
measured on loopback it came back 6.4 s after a 20 s outage and 22.3 s after a 45 s one
(capped at 0.5 s: 0.3 and 0.3 s).

Security: ``tls_ca`` (a PEM bundle of the CA certificates to trust) turns TLS on;
``tls_cert`` and ``tls_key`` (PEM) add a client certificate for a broker that requires one
(mutual TLS). ``token`` is sent as ``authorization: Bearer <token>`` on every call, by a
client interceptor on the channel, with or without TLS (without TLS it crosses the network
in clear text: use it so only on loopback). Everything is checked when the channel is made:
a missing or unreadable file, a certificate without its key, a client certificate without
``tls_ca``, or a token that is not printable ASCII raises :class:`ValueError` naming the
argument.

Imports ``grpc`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import grpc

#: Default of every client's ``reconnect_backoff_max_s``, seconds.
DEFAULT_RECONNECT_BACKOFF_MAX_S = 1.0
#: Largest message a client sends or receives, bytes (a 16 MiB batch and then some).
MAX_MESSAGE_BYTES = 64 << 20
_INITIAL_BACKOFF_MS = 100
_MAX_BACKOFF_S = 3600.0

Options = list[tuple[str, int]]


def channel_options(reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S) -> Options:
    """The options of every client channel (see the module docstring).

    Raises:
        ValueError: ``reconnect_backoff_max_s`` is not from 0.001 to 3,600 seconds.
    """
    if not 0.001 <= reconnect_backoff_max_s <= _MAX_BACKOFF_S:
        raise ValueError(
            f"reconnect_backoff_max_s must be from 0.001 to {_MAX_BACKOFF_S:g} seconds, "
            f"not {reconnect_backoff_max_s!r}"
        )
    cap_ms = round(reconnect_backoff_max_s * 1000)
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", min(_INITIAL_BACKOFF_MS, cap_ms)),
        ("grpc.min_reconnect_backoff_ms", cap_ms),
        ("grpc.max_reconnect_backoff_ms", cap_ms),
        ("grpc.use_local_subchannel_pool", 1),
    ]


class _TlsFiles(NamedTuple):
    root_certificates: bytes
    private_key: bytes | None
    certificate_chain: bytes | None


def check_security(
    token: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> None:
    """Check the security arguments of a client without opening anything.

    Raises:
        ValueError: Naming the argument: a token that cannot be sent, a file that cannot
            be read, ``tls_cert`` without ``tls_key`` (or the reverse), or either without
            ``tls_ca``.
    """
    _bearer(token)
    _read_tls(tls_ca, tls_cert, tls_key)


def _bearer(token: str | None) -> str | None:
    """The ``authorization`` metadata value for ``token``; None without one."""
    if token is None:
        return None
    if not token or not all(" " < ch <= "~" for ch in token):
        raise ValueError(
            "token must be non-empty printable ASCII with no spaces (as `headrace tokens "
            "create` prints it); check for a stray newline or quote"
        )
    return f"Bearer {token}"


def _read_tls(tls_ca: str | None, tls_cert: str | None, tls_key: str | None) -> _TlsFiles | None:
    """The PEM files' bytes; None when TLS is off (no ``tls_ca``)."""
    if (tls_cert is None) != (tls_key is None):
        given, missing = ("tls_cert", "tls_key") if tls_key is None else ("tls_key", "tls_cert")
        raise ValueError(f"{given} needs {missing}: a client certificate comes with its key")
    if tls_ca is None:
        if tls_cert is not None:
            raise ValueError("tls_cert and tls_key need tls_ca: set the CA that signed the broker")
        return None
    return _TlsFiles(
        _read_pem("tls_ca", tls_ca),
        _read_pem("tls_key", tls_key) if tls_key is not None else None,
        _read_pem("tls_cert", tls_cert) if tls_cert is not None else None,
    )


def _read_pem(argument: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ValueError(f"{argument}: cannot read {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in data:
        raise ValueError(f"{argument}: {path} is not a PEM file (no -----BEGIN line)")
    return data


def _credentials(tls: _TlsFiles) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=tls.root_certificates,
        private_key=tls.private_key,
        certificate_chain=tls.certificate_chain,
    )


class _CallDetails(NamedTuple):
    """A ``grpc.ClientCallDetails`` that can be built (the grpc class is abstract)."""

    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


def _with_header(metadata: Any, header: tuple[str, str]) -> list[tuple[str, str | bytes]]:
    return [*(tuple(item) for item in metadata or ()), header]


class _AioBearer:
    """Adds ``authorization: Bearer <token>`` to the calls of a ``grpc.aio`` channel.
    Task-safe: holds one immutable header.

    One subclass per call shape, each given to the channel: ``grpc.aio`` files an
    interceptor under the first shape it is an instance of (an ``elif`` chain), so one
    class deriving from all four would be run on unary-unary calls only, and the
    consumer's Subscribe stream would go without the token.
    """

    def __init__(self, value: str) -> None:
        self._header = ("authorization", value)

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*_with_header(details.metadata, self._header))
        return grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=details.timeout,
            metadata=metadata,
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )


class _AioBearerUU(_AioBearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioBearerUS(_AioBearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioBearerSU(_AioBearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _AioBearerSS(_AioBearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


def _aio_interceptors(token: str | None) -> list[grpc.aio.ClientInterceptor] | None:
    """The bearer interceptors, one per call shape; None without a token."""
    bearer = _bearer(token)
    if bearer is None:
        return None
    return [kind(bearer) for kind in (_AioBearerUU, _AioBearerUS, _AioBearerSU, _AioBearerSS)]


class _BlockingBearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """:class:`_AioBearer` for blocking channels. Thread-safe: one immutable header."""

    def __init__(self, value: str) -> None:
        self._header = ("authorization", value)

    def _call(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        metadata = _with_header(details.metadata, self._header)
        new = _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )
        return continuation(new, request)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._call(continuation, details, request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._call(continuation, details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._call(continuation, details, requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._call(continuation, details, requests)


def aio_channel(
    broker: str,
    reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
    *,
    token: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``broker`` (``host:port``) with the client's options:
    TLS when ``tls_ca`` is set, the bearer ``token`` on every call (module docstring).
    Pass it as ``channel=`` to share one connection between clients.

    Raises:
        ValueError: A bad option (see :func:`check_security`).
    """
    options = channel_options(reconnect_backoff_max_s)
    interceptors = _aio_interceptors(token)
    tls = _read_tls(tls_ca, tls_cert, tls_key)
    if tls is None:
        return grpc.aio.insecure_channel(broker, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(
        broker, _credentials(tls), options=options, interceptors=interceptors
    )


def blocking_channel(
    broker: str,
    reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
    *,
    token: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> grpc.Channel:
    """:func:`aio_channel` for blocking code."""
    options = channel_options(reconnect_backoff_max_s)
    bearer = _bearer(token)
    tls = _read_tls(tls_ca, tls_cert, tls_key)
    if tls is None:
        channel = grpc.insecure_channel(broker, options=options)
    else:
        channel = grpc.secure_channel(broker, _credentials(tls), options=options)
    return grpc.intercept_channel(channel, _BlockingBearer(bearer)) if bearer else channel
