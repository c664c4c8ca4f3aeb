"""The client commands' --token and --tls-* options (and their HEADRACE_* variables) as
real processes: every command against a real TLS broker, mutual TLS, one-line errors for a
failed handshake, and the token reaching the server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests._certs import Pki
from tests.broker.test_cli_client import CLI
from tests.broker.test_serve_process import free_port
from tests.client.test_channel_security import recording_server

TIMEOUT_S = 60


def _wait_tls(address: str, pki: Pki, deadline: float) -> None:
    creds = grpc.ssl_channel_credentials(
        Path(pki.ca).read_bytes(),
        Path(pki.client.key).read_bytes(),
        Path(pki.client.cert).read_bytes(),
    )
    while time.monotonic() < deadline:
        with grpc.secure_channel(address, creds) as channel:
            try:
                got = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=0.5
                )
            except grpc.RpcError:
                time.sleep(0.05)
                continue
            if got.status == health_pb2.HealthCheckResponse.SERVING:
                return
    raise AssertionError(f"TLS broker at {address} did not serve")


def _tls_serve(tmp_path: Path, pki: Pki, *extra: str) -> Iterator[str]:
    address = f"127.0.0.1:{free_port()}"
    with (tmp_path / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [*CLI, "serve", "--data-dir", str(tmp_path / "d"), "--listen", address,
             "--metrics-listen", "", "--tls-cert", pki.server.cert,
             "--tls-key", pki.server.key, *extra],
            stderr=log,
        )  # fmt: skip
        try:
            _wait_tls(address, pki, time.monotonic() + 20)
            yield address
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def tls_address(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[str]:
    """A `headrace serve --tls-cert --tls-key` process for the module."""
    yield from _tls_serve(tmp_path_factory.mktemp("cli-tls"), pki)


@pytest.fixture(scope="module")
def mtls_address(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[str]:
    """The same, requiring client certificates from the test CA."""
    yield from _tls_serve(tmp_path_factory.mktemp("cli-mtls"), pki, "--tls-client-ca", pki.ca)


def headrace(
    *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    return subprocess.run(
        [*CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env=clean | (env or {}),
    )


def test_every_client_command_over_tls(tls_address: str, pki: Pki) -> None:
    """Scenario: each client command (topics, produce, consume, lag, seek, every dlq
    command) against a TLS broker; the CA comes from HEADRACE_TLS_CA, the broker from
    HEADRACE_BROKER. Expected: every one exits 0, with its usual output."""
    env = {"HEADRACE_TLS_CA": pki.ca, "HEADRACE_BROKER": tls_address}
    commands: list[tuple[list[str], str]] = [
        (["topics", "create", "tls-t", "--partitions", "2"], "created topic tls-t"),
        (["topics", "list"], "tls-t"),
        (["topics", "describe", "tls-t", "--json"], '"name": "tls-t"'),
        (["produce", "tls-t", "--count", "3"], ""),
        (["consume", "tls-t", "-s", "s1", "--count", "3"], "record-"),
        (["lag", "--json", "--topic", "tls-t"], '"subscription": "s1"'),
        (["seek", "tls-t", "-s", "s1", "--to", "earliest"], "tls-t/s1 now at"),
        (["dlq", "peek", "tls-t", "-s", "s1"], "no dead letters"),
        (["dlq", "count", "tls-t", "-s", "s1"], "0"),
        (["dlq", "ack", "tls-t", "-s", "s1", "--up-to", "0"], "acked 0"),
        (["dlq", "purge", "tls-t", "-s", "s1", "--yes"], ""),
        (["dlq", "replay", "tls-t", "-s", "s1"], ""),
        (["topics", "delete", "tls-t"], "deleted topic tls-t"),
    ]
    for args, expected in commands:
        done = headrace(*args, env=env)
        assert done.returncode == 0, (args, done.stderr)
        assert expected in done.stdout, (args, done.stdout)


def test_flags_work_as_well_as_variables(tls_address: str, pki: Pki) -> None:
    """Scenario: `topics list --broker A --tls-ca CA` with no variables. Expected: exit 0."""
    done = headrace("topics", "list", "--broker", tls_address, "--tls-ca", pki.ca)
    assert done.returncode == 0, done.stderr


def test_wrong_ca_is_one_clear_line(tls_address: str, pki: Pki) -> None:
    """Scenario: --tls-ca names a CA that did not sign the broker's certificate.
    Expected: exit 1 and exactly one stderr line: the handshake failed, why, and which
    options to check (no gRPC core log line beside it)."""
    done = headrace("topics", "list", "--broker", tls_address, "--tls-ca", pki.wrong_ca)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Error: TLS handshake with {tls_address} failed (")
    assert "CERTIFICATE_VERIFY_FAILED" in lines[0]
    assert "check that --tls-ca is the CA that signed the broker's certificate" in lines[0]


def test_plain_client_to_a_tls_broker_hints_at_tls_ca(tls_address: str) -> None:
    """Scenario: no --tls-ca against a TLS broker. Expected: exit 1, one line suggesting
    --tls-ca."""
    done = headrace("topics", "list", "--broker", tls_address)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].endswith("(if the broker serves TLS, pass --tls-ca)")


def test_mutual_tls_with_and_without_a_client_certificate(mtls_address: str, pki: Pki) -> None:
    """Scenario: a broker requiring client certificates; `topics list` with the client
    certificate from HEADRACE_TLS_CERT/KEY, then without. Expected: exit 0, then exit 1
    with one line."""
    env = {"HEADRACE_BROKER": mtls_address, "HEADRACE_TLS_CA": pki.ca}
    with_cert = env | {"HEADRACE_TLS_CERT": pki.client.cert, "HEADRACE_TLS_KEY": pki.client.key}
    assert headrace("topics", "list", env=with_cert).returncode == 0
    done = headrace("topics", "list", env=env)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--token", "two words"], "token must be non-empty printable ASCII"),
        (["--tls-ca", "/nonexistent/ca.pem"], "--tls-ca: cannot read /nonexistent/ca.pem"),
        (["--tls-ca", "CA", "--tls-cert", "CERT"], "--tls-cert needs --tls-key"),
    ],
)
def test_bad_security_options_are_usage_errors(pki: Pki, args: list[str], problem: str) -> None:
    """Scenario: a token with a space, an unreadable CA, a certificate without its key.
    Expected: exit 2 naming the option, before any connection."""
    args = [{"CA": pki.ca, "CERT": pki.client.cert}.get(a, a) for a in args]
    done = headrace("topics", "list", "--broker", "127.0.0.1:1", *args)
    assert done.returncode == 2
    assert problem in done.stderr


@pytest.mark.asyncio
async def test_the_token_reaches_the_server(pki: Pki) -> None:
    """Scenario: `topics list` and `consume` with --token, and `produce` with
    HEADRACE_TOKEN, over TLS to a server that records the authorization metadata (it
    implements no method, so the commands fail). Expected: the server saw 'Bearer <token>'
    on every call, the consumer's Subscribe stream included."""
    async with recording_server(pki) as (address, recorder):
        base = ["--broker", address, "--tls-ca", pki.ca]
        runs = [
            (["topics", "list", *base, "--token", "hr_tok_1"], {}),
            (["consume", "t", "-s", "s", "--count", "1", *base, "--token", "hr_tok_1"], {}),
            (["produce", "t", "--count", "1", *base], {"HEADRACE_TOKEN": "hr_tok_1"}),
        ]
        for args, env in runs:
            done = await asyncio.to_thread(headrace, *args, env=env)
            assert done.returncode == 1, done.stderr
    methods = {m.rsplit("/", 1)[1] for m, _ in recorder.seen}
    assert {"ListTopics", "Subscribe", "DescribeTopic"} <= methods
    assert all(value == "Bearer hr_tok_1" for _, value in recorder.seen)
