"""A ``--broker`` address where an HTTP/1 server answers, not gRPC: the pure reading of
the probe's answer, and every client command, as real processes, pointed at a real
broker's metrics listener and at a plain HTTP server."""

from __future__ import annotations

import http.server
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from broker.cli_probe import Listener, listener_of, probe_http
from broker.config import BrokerConfig
from client import DEFAULT_BROKER
from tests._certs import Pki
from tests.broker.test_cli_client import CLI
from tests.broker.test_serve_process import free_port, wait_serving


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n# HELP headrace_x_total a\n", "m"),
        (b"HTTP/1.1 404 Not Found\r\n\r\n<html>nothing here</html>", "http"),
        (b"HTTP/1.1 200 OK\r\nX-Note: headrace_in_a_header\r\n\r\nhello", "http"),
        (b"\x00\x00\x12\x04\x00\x00\x00\x00\x00", None),  # an HTTP/2 SETTINGS frame
        (b"<!DOCTYPE HTML>\n<html>", None),  # a page with no status line
        (b"SSH-2.0-OpenSSH_9.6\r\n", None),
        (b"", None),
    ],
    ids=["headrace-metrics", "other-http", "name-only-in-a-header", "http2", "no-status", "ssh",
         "silence"],
)  # fmt: skip
def test_listener_of_reads_the_answer(answer: bytes, expected: str | None) -> None:
    """Scenario: answers to the probe's ``GET /metrics``. Expected: an HTTP/1 status line
    with headrace_ metric names in the body is a broker's metrics listener, any other
    HTTP/1 answer an HTTP server, anything else (HTTP/2, SSH, silence) None."""
    want = {"m": Listener.HEADRACE_METRICS, "http": Listener.HTTP, None: None}[expected]
    assert listener_of(answer) is want


@dataclass(frozen=True)
class Served:
    """A `headrace serve` process with a metrics listener."""

    grpc: str
    metrics: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`headrace serve` listening for gRPC and for metrics, each on a free port."""
    data = tmp_path_factory.mktemp("probe")
    grpc_port, metrics_port = free_port(), free_port()
    args = ["serve", "--data-dir", str(data / "d"), "--listen", f"127.0.0.1:{grpc_port}"]
    args += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
    proc = subprocess.Popen([*CLI, *args], stderr=subprocess.DEVNULL)
    try:
        wait_serving(grpc_port, time.monotonic() + 20)
        yield Served(f"127.0.0.1:{grpc_port}", f"127.0.0.1:{metrics_port}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def headrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


METRICS_LINE = (
    "Error: cannot reach a broker at {address}: it answers HTTP/1, not gRPC, so it is a "
    "Headrace broker's metrics listener (serve --metrics-listen, default {metrics}); "
    "--broker (env HEADRACE_BROKER) takes the broker's gRPC address (serve --listen, "
    "default {grpc})"
)


@pytest.mark.parametrize(
    "command",
    [
        ("produce", "t", "--count", "1"),
        ("consume", "t", "-s", "s", "--count", "1"),
        ("lag",),
        ("topics", "list"),
        ("seek", "t", "-s", "s", "--to", "earliest"),
        ("dlq", "count", "t", "-s", "s"),
        ("subscriptions", "list"),
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_every_command_names_the_metrics_listener(served: Served, command: tuple[str, ...]) -> None:
    """Scenario: a client command given the broker's metrics address as --broker (it used
    to say "failed parsing http/2 ..." and suggest --tls-ca). Expected: exit 1 within a few
    seconds and one line saying that address is a broker's metrics listener, with the
    defaults of both listeners; no TLS hint."""
    started = time.monotonic()
    done = headrace(*command, "--broker", served.metrics)
    assert time.monotonic() - started < 10
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line == METRICS_LINE.format(
        address=served.metrics, metrics=BrokerConfig().metrics_listen, grpc=DEFAULT_BROKER
    )
    assert "--tls-ca" not in line


def test_tls_to_the_metrics_listener_names_it_too(served: Served, pki: Pki) -> None:
    """Scenario: `topics list --tls-ca CA` at the metrics address (TLS to a plain-text
    HTTP server: "WRONG_VERSION_NUMBER"). Expected: the same metrics-listener line, not
    the TLS handshake advice."""
    done = headrace("topics", "list", "--broker", served.metrics, "--tls-ca", pki.ca)
    assert done.returncode == 1
    assert done.stderr.startswith(f"Error: cannot reach a broker at {served.metrics}: it answers")
    assert "metrics listener" in done.stderr
    assert "handshake" not in done.stderr


@pytest.fixture
def plain_http() -> Iterator[str]:
    """An HTTP/1 server that is not a broker (Python's, serving an empty directory)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_another_http_server_is_named_as_one(plain_http: str) -> None:
    """Scenario: `produce` and `lag` at an HTTP server that is not a broker. Expected: one
    line saying it looks like an HTTP server, perhaps a metrics listener, and where the
    gRPC listener is by default."""
    for command in (("produce", "t", "--count", "1"), ("lag",)):
        done = headrace(*command, "--broker", plain_http)
        assert done.returncode == 1
        [line] = done.stderr.splitlines()
        assert line.startswith(
            f"Error: cannot reach a broker at {plain_http}: it answers HTTP/1, not gRPC, so it "
            "looks like an HTTP server, perhaps a broker's metrics listener"
        )
        assert line.endswith(f"(serve --listen, default {DEFAULT_BROKER})")


def test_the_probe_finds_no_http_at_grpc_or_a_closed_port(served: Served) -> None:
    """Scenario: the probe at the broker's gRPC address, at its metrics address and at a
    closed port. Expected: None, the metrics listener, None; each within the timeout."""
    started = time.monotonic()
    assert probe_http(served.grpc) is None
    assert probe_http(served.metrics) is Listener.HEADRACE_METRICS
    assert probe_http(f"127.0.0.1:{free_port()}") is None
    assert time.monotonic() - started < 3.5


def test_a_broker_at_the_grpc_address_still_works(served: Served) -> None:
    """Scenario: the same commands at the gRPC address. Expected: they succeed (the probe
    is only on the error path)."""
    assert headrace("topics", "create", "t", "--broker", served.grpc).returncode == 0
    done = headrace("produce", "t", "--count", "2", "--broker", served.grpc)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "produced 2 records to t\n"
