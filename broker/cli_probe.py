"""What answers at a ``--broker`` address that does not speak gRPC.

Role: when gRPC cannot talk to the address because the peer's first bytes are not an
HTTP/2 frame, find out whether an HTTP/1 server answered, and whether it is a Headrace
broker's metrics listener, so the unreachable-broker line
(:func:`broker.cli_client.unreachable`) can name it instead of gRPC's words.

Why probe: gRPC reports an HTTP/1 server only as ``failed parsing http/2 (expected
settings frame as the first frame, got frame type 79)``: the first bytes of the HTTP
answer read as a frame header (79 is the ``O`` of ``<!DOCTYPE``, the error page Python's
HTTP server sends to HTTP/2's preface). Nothing in it says what answered. One ``GET
/metrics`` over HTTP/1.0 does: an answer that starts ``HTTP/`` is an HTTP server, and one
whose body holds ``headrace_`` metric names is a broker's ``--metrics-listen``. The probe
runs only on that error path, once, within a second.

Example::

    >>> listener_of(b"HTTP/1.0 200 OK\\r\\n\\r\\n# HELP headrace_wal_appends_total ...")
    <Listener.HEADRACE_METRICS: 'headrace-metrics'>
    >>> listener_of(b"\\x00\\x00\\x06\\x04\\x00") is None  # not HTTP/1
    True
"""

from __future__ import annotations

import enum
import socket
import time

#: How long the probe may take in all, seconds: it runs after a failure, before the
#: command exits.
PROBE_TIMEOUT_S = 1.0
#: The most bytes the probe reads of the answer (metric names come first).
PROBE_MAX_BYTES = 64 << 10


class Listener(enum.Enum):
    """What kind of HTTP/1 server answered."""

    HEADRACE_METRICS = "headrace-metrics"  # a broker's Prometheus /metrics listener
    HTTP = "http"  # some other HTTP/1 server

    def is_headrace_metrics(self) -> bool:
        """Whether it is a Headrace broker's metrics listener."""
        return self is Listener.HEADRACE_METRICS


def listener_of(answer: bytes) -> Listener | None:
    """What answered ``GET /metrics`` with ``answer``: None when it is not HTTP/1."""
    if not answer.startswith(b"HTTP/"):
        return None
    _head, _, body = answer.partition(b"\r\n\r\n")
    return Listener.HEADRACE_METRICS if b"headrace_" in body else Listener.HTTP


def probe_http(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> Listener | None:
    """Ask ``address`` (``HOST:PORT``, an IPv6 host in brackets) for ``/metrics`` over
    HTTP/1.0 and say what answered; None when nothing HTTP answered within
    ``timeout_s`` (a refused connection, silence, or another protocol)."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    deadline = time.monotonic() + timeout_s
    request = f"GET /metrics HTTP/1.0\r\nHost: {address}\r\nAccept: text/plain\r\n\r\n"
    answer = b""
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.sendall(request.encode())
            while len(answer) < PROBE_MAX_BYTES and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = sock.recv(PROBE_MAX_BYTES - len(answer))
                if not chunk:
                    break
                answer += chunk
    except (OSError, ValueError):
        pass  # judge what arrived before the silence or the reset
    return listener_of(answer)
