"""The client commands' --token and --tls-* options (and their HEADRACE_* variables) as
real processes: every command against a real TLS broker, mutual TLS, one-line errors for a
failed handshake, and the token reaching the server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import AdminClient
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


@contextlib.contextmanager
def _serving(tmp_path: Path, pki: Pki, address: str, *args: str) -> Iterator[None]:
    """`headrace serve ARGS` (logging to serve.log) until it serves TLS at ``address``;
    SIGTERM at the end."""
    with (tmp_path / "serve.log").open("w") as log:
        proc = subprocess.Popen([*CLI, "serve", *args], stderr=log)
        try:
            _wait_tls(address, pki, time.monotonic() + 20)
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)


def _tls_serve(tmp_path: Path, pki: Pki, *extra: str) -> Iterator[str]:
    address = f"127.0.0.1:{free_port()}"
    with _serving(
        tmp_path, pki, address, "--data-dir", str(tmp_path / "d"), "--listen", address,
        "--metrics-listen", "", "--tls-cert", pki.server.cert, "--tls-key", pki.server.key,
        *extra,
    ):  # fmt: skip
        yield address


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
        (["topics", "delete", "tls-t", "--yes"], "deleted topic tls-t"),
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
    assert lines[0].startswith(f"Error: cannot reach a broker at {tls_address} (")
    assert lines[0].endswith(", and pass --tls-ca if it serves TLS")


def test_a_refused_connection_says_so_without_a_tls_hint() -> None:
    """Scenario: `topics list` against a port where nothing listens. Expected: exit 1, one
    line saying the connection was refused and what to check; no TLS hint (a refused
    connection is not TLS's doing), and none of gRPC's own words."""
    done = headrace("topics", "list", "--broker", "127.0.0.1:1")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "Error: cannot reach a broker at 127.0.0.1:1 (connection refused); check that "
        "`headrace serve` is running there and that --broker (env HEADRACE_BROKER) names its "
        "address"
    ]


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
    assert "--tls-cert/--tls-key are a client certificate the broker trusts" in done.stderr


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


# A broker with auth on: `headrace serve --config` whose [security] sets tls_cert, tls_key
# and tokens_file; its tokens made by `headrace tokens create --config` (processes).

SECURED_TOML = """\
[broker]
data_dir = "{data}"
listen = "{address}"
metrics_listen = ""
grace_seconds = 1.0
[security]
tls_cert = "{cert}"
tls_key = "{key}"
tokens_file = "{tokens}"
"""

#: Token name -> grant; each command below uses the narrowest token that may run it.
SECURED_GRANTS = {
    "admin": "admin:*",
    "producer": "produce:orders",
    "consumer": "consume:orders:billing",
    "elsewhere": "consume:other",
}


@dataclass(frozen=True)
class Secured:
    """A running TLS + tokens broker: its address, TOML file, CA and tokens by name."""

    address: str
    config: str
    ca: str
    tokens: dict[str, str]

    def state(self) -> tuple[object, ...]:
        """Every topic with its partitions' heads, and every subscription's cursors (the
        admin token's view, through the client library over TLS)."""
        with AdminClient(self.address, token=self.tokens["admin"], tls_ca=self.ca) as admin:
            topics = admin.list_topics()
            subscriptions = admin.list_subscriptions()
        cursors = [(s.topic, s.subscription, [(p.cursor, p.head) for p in s.partitions])
                   for s in subscriptions]  # fmt: skip
        return tuple(topics), tuple(map(repr, cursors))

    def run(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        """``headrace ARGS --broker --tls-ca [--token]`` with the token of that name."""
        extra = ["--token", self.tokens[token]] if token else []
        return headrace(*args, "--broker", self.address, "--tls-ca", self.ca, *extra)


def create_token(config: str, name: str, grant: str) -> str:
    """`headrace tokens create --config` as a process; the token it printed."""
    done = headrace("tokens", "create", "--name", name, "--grant", grant, "--config", config)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@contextlib.contextmanager
def secured_serve(tmp_path: Path, pki: Pki) -> Iterator[Secured]:
    """Write the TOML, create the tokens, serve it; topic 'orders' (2 partitions) exists."""
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "broker.toml"
    config.write_text(
        SECURED_TOML.format(data=tmp_path / "data", address=address, cert=pki.server.cert,
                            key=pki.server.key, tokens=tmp_path / "tokens.json")
    )  # fmt: skip
    tokens = {n: create_token(str(config), n, g) for n, g in SECURED_GRANTS.items()}
    secured = Secured(address, str(config), pki.ca, tokens)
    with _serving(tmp_path, pki, address, "--config", str(config)):
        made = secured.run("topics", "create", "orders", "--partitions", "2", token="admin")
        assert made.returncode == 0, made.stderr
        yield secured


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Secured]:
    """One TLS + tokens broker for the module's auth tests."""
    with secured_serve(tmp_path_factory.mktemp("cli-auth"), pki) as secured:
        yield secured


def test_every_client_command_with_a_token_over_tls(secured: Secured) -> None:
    """Scenario: each client command against the TLS + tokens broker, with --token and
    --tls-ca, each with the narrowest token that may run it; produce and the last delete
    take token, CA and broker from HEADRACE_TOKEN, HEADRACE_TLS_CA and HEADRACE_BROKER.
    Expected: every one exits 0 with its usual output."""
    commands: list[tuple[list[str], str, str]] = [
        (["topics", "create", "doomed", "--partitions", "1"], "admin", "created topic doomed"),
        (["topics", "list"], "consumer", "orders"),
        (["topics", "describe", "orders", "--json"], "producer", '"name": "orders"'),
        (["consume", "orders", "-s", "billing", "--count", "3"], "consumer", "record-"),
        (["lag", "--json", "--topic", "orders"], "consumer", '"subscription": "billing"'),
        (["seek", "orders", "-s", "billing", "--to", "earliest"], "consumer", "now at"),
        (["dlq", "peek", "orders", "-s", "billing"], "consumer", "no dead letters"),
        (["dlq", "count", "orders", "-s", "billing"], "consumer", "0"),
        (["dlq", "ack", "orders", "-s", "billing", "--up-to", "0"], "consumer", "acked 0"),
        (["dlq", "purge", "orders", "-s", "billing", "--yes"], "admin", ""),
        (["dlq", "replay", "orders", "-s", "billing"], "admin", ""),
    ]
    env = {"HEADRACE_BROKER": secured.address, "HEADRACE_TLS_CA": secured.ca}
    produced = headrace("produce", "orders", "--count", "3",
                        env=env | {"HEADRACE_TOKEN": secured.tokens["producer"]})  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    for args, token, expected in commands:
        done = secured.run(*args, token=token)
        assert done.returncode == 0, (args, done.stderr)
        assert expected in done.stdout, (args, done.stdout)
    deleted = headrace("topics", "delete", "doomed", "--yes",
                       env=env | {"HEADRACE_TOKEN": secured.tokens["admin"]})  # fmt: skip
    assert (deleted.returncode, deleted.stdout) == (0, "deleted topic doomed\n"), deleted.stderr


BILLING = "subscription 'orders/billing'"

#: Each client command, a token that lacks the role it needs, and the refusal's words.
REFUSALS: list[tuple[list[str], str, str]] = [
    (["topics", "create", "fresh", "--partitions", "1"], "producer",
     "lacks role admin on topic 'fresh'"),
    (["topics", "describe", "orders"], "elsewhere",
     "lacks role produce or consume on topic 'orders'"),
    (["topics", "delete", "orders", "--yes"], "consumer",
     "lacks role admin on topic 'orders'"),
    (["produce", "orders", "--count", "1"], "consumer", "lacks role produce on topic 'orders'"),
    (["consume", "orders", "-s", "billing", "--count", "1"], "producer",
     f"lacks role consume on {BILLING}"),
    (["lag", "--topic", "orders"], "elsewhere",
     "lacks role produce or consume on topic 'orders'"),
    (["seek", "orders", "-s", "billing", "--to", "earliest"], "producer",
     f"lacks role consume on {BILLING}"),
    (["dlq", "peek", "orders", "-s", "billing"], "producer", f"lacks role consume on {BILLING}"),
    (["dlq", "count", "orders", "-s", "billing"], "producer", f"lacks role consume on {BILLING}"),
    (["dlq", "ack", "orders", "-s", "billing", "--up-to", "0"], "producer",
     f"lacks role consume on {BILLING}"),
    (["dlq", "purge", "orders", "-s", "billing", "--yes"], "consumer",
     f"lacks role admin on {BILLING}"),
    (["dlq", "replay", "orders", "-s", "billing"], "consumer", f"lacks role admin on {BILLING}"),
]  # fmt: skip


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("args", [[*a] for a, _, _ in REFUSALS] + [["topics", "list"]],
                         ids=lambda a: " ".join(a[:2]))  # fmt: skip
def test_every_client_command_without_a_token_is_one_line(
    secured: Secured, args: list[str]
) -> None:
    """Scenario: each client command against the TLS + tokens broker with no token.
    Expected: exit 1 and one stderr line: no bearer token, pass --token or HEADRACE_TOKEN."""
    line = _one_error_line(secured.run(*args))
    assert line.endswith("no bearer token: pass --token or HEADRACE_TOKEN"), line


@pytest.mark.parametrize(("args", "token", "refusal"), REFUSALS,
                         ids=[" ".join(a[:2]) for a, _, _ in REFUSALS])  # fmt: skip
def test_every_client_command_with_the_wrong_role_names_role_and_resource(
    secured: Secured, args: list[str], token: str, refusal: str
) -> None:
    """Scenario: each client command with a valid token that lacks the role it needs.
    Expected: exit 1 and one stderr line naming the token, the role and the resource, with
    the grant to ask for; nothing changed (the topics and subscriptions, heads and cursors
    are as before)."""
    before = secured.state()
    line = _one_error_line(secured.run(*args, token=token))
    assert f"token {token!r} ({secured.tokens[token][:15]}_…) {refusal}; " in line, line
    assert "ask an admin for a grant (`headrace tokens create ... --grant " in line
    assert secured.state() == before
