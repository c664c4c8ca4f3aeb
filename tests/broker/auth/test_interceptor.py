"""Token authentication and authorization over real gRPC on loopback, against a real broker.

The matrix: every RPC of both services with no token, an unknown token, a known id with a
wrong secret, a token revoked while the broker runs, a token of the wrong role, and the
right token; status code and message checked for each. The transport (server settings and
client channel) comes from one fixture, :func:`transport`, and every test of the module runs
twice: over plain TCP and over TLS (the test CA's server certificate; the client trusts
that CA). The matrix's assertions are the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from broker.app import Broker
from broker.auth import AuthInterceptor, TokenSet, TokensFile, mint, parse_grant
from broker.config import SecurityConfig
from broker.errors import TokensFileError
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests._certs import Pki
from tests.broker.conftest import Client, broker_config
from wal import encode_columns

in_module_loop = pytest.mark.asyncio(loop_scope="module")

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED
UNKNOWN_TOKEN = "hr_000000000000_" + "A" * 43


@dataclass(frozen=True)
class Transport:
    """How the matrix reaches the broker: extra ``[security]`` settings (beside
    tokens_file) and the client channel."""

    name: str
    security: dict[str, str] = field(default_factory=dict)
    channel: Callable[[str], grpc.aio.Channel] = grpc.aio.insecure_channel


def tls_transport(pki: Pki) -> Transport:
    """TLS with the test CA's server certificate for 127.0.0.1; the channel trusts the CA."""
    creds = grpc.ssl_channel_credentials(Path(pki.ca).read_bytes())
    return Transport(
        "tls",
        {"tls_cert": pki.server.cert, "tls_key": pki.server.key},
        lambda address: grpc.aio.secure_channel(address, creds),
    )


@pytest.fixture(scope="module", params=["plain", "tls"])
def transport(request: pytest.FixtureRequest, pki: Pki) -> Transport:
    """The transport of the whole matrix: plain TCP, then TLS, on 127.0.0.1."""
    return Transport("plain") if request.param == "plain" else tls_transport(pki)


def make_tokens(path: Path, grants: dict[str, str]) -> dict[str, str]:
    """Create one token per name (grants space-separated) in ``path``; name -> token."""
    printed: dict[str, str] = {}

    def change(tokens: TokenSet) -> TokenSet:
        for name, text in grants.items():
            parsed = [parse_grant(g) for g in text.split()]
            token, entry = mint(
                name, parsed, "2026-11-24T08:00:00Z", (e.id for e in tokens.entries)
            )
            printed[name] = token
            tokens = tokens.added(entry)
        return tokens

    TokensFile(str(path)).update(change)
    return printed


def revoke(path: Path, name: str) -> None:
    """Revoke ``name`` as ``headrace tokens revoke`` does (a new file renamed in)."""
    TokensFile(str(path)).update(lambda t: t.revoked(t.find(name).id))  # type: ignore[union-attr]


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def wait_refused(client: Client, token: str, message: str) -> float:
    """Call ListTopics with ``token`` until the broker refuses it with ``message``; the
    seconds that took (the broker looks at the tokens file about once a second)."""
    start = time.monotonic()
    while True:
        try:
            await client.admin.ListTopics(admin.ListTopicsRequest(), metadata=bearer(token))
        except grpc.RpcError as exc:
            if message in (exc.details() or ""):
                return time.monotonic() - start
            raise
        assert time.monotonic() - start < 10, "revocation not seen in 10 s"
        await asyncio.sleep(0.05)


@dataclass
class Setup:
    broker: Broker
    client: Client
    tokens: dict[str, str]
    tokens_file: Path
    revocation_s: float


GRANTS = {
    "admin": "admin:*",
    "producer": "produce:orders",
    "consumer": "consume:orders:billing consume:quiet",
    "elsewhere": "admin:other",
    "revoked": "admin:*",
    "streamer": "consume:quiet",
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(
    tmp_path_factory: pytest.TempPathFactory, transport: Transport
) -> AsyncIterator[Setup]:
    """A broker with auth on and topics orders (one record, subscription billing), quiet
    (empty), doomed (to delete) and other; token 'revoked' is revoked once it ran."""
    root = tmp_path_factory.mktemp("auth")
    tokens_file = root / "tokens.json"
    tokens = make_tokens(tokens_file, GRANTS)
    config = broker_config(root / "data").replace(
        security=SecurityConfig(tokens_file=str(tokens_file)).replace(**transport.security)
    )
    async with Broker(config) as broker, transport.channel(f"127.0.0.1:{broker.port}") as ch:
        client = Client(ch)
        md = bearer(tokens["admin"])
        for name in ("orders", "quiet", "doomed", "other"):
            await client.admin.CreateTopic(
                admin.CreateTopicRequest(name=name, partitions=1), metadata=md
            )
        await client.broker.Publish(pb.PublishRequest(topic="orders", batch=BATCH), metadata=md)
        await client.broker.AckUpTo(
            pb.AckUpToRequest(topic="orders", subscription="billing", offset=0), metadata=md
        )
        await client.admin.ListTopics(admin.ListTopicsRequest(), metadata=bearer(tokens["revoked"]))
        revoke(tokens_file, "revoked")
        took = await wait_refused(client, tokens["revoked"], "is revoked")
        yield Setup(broker, client, tokens, tokens_file, took)


BATCH = encode_columns([b"v"], timestamps_ms=1_700_000_000_000)
Md = tuple[tuple[str, str], ...]


async def publish_stream(c: Client, md: Md) -> Any:
    call = c.broker.PublishStream(metadata=md)
    await call.write(pb.PublishRequest(topic="orders", batch=BATCH, request_id=7))
    await call.done_writing()
    return [r async for r in call]


async def subscribe(c: Client, md: Md) -> Any:
    call = c.broker.Subscribe(metadata=md)
    await call.write(
        pb.SubscribeRequest(open=pb.OpenSubscription(topic="orders", subscription="billing"))
    )
    first = await call.read()
    call.cancel()
    return first


async def delete_subscription(c: Client, md: Md) -> Any:
    """Make subscription orders/scratch (AckUpTo; refused for tokens that may not) and
    delete it: billing stays for the other rows."""
    with contextlib.suppress(grpc.RpcError):
        await c.broker.AckUpTo(
            pb.AckUpToRequest(topic="orders", subscription="scratch", offset=0), metadata=md
        )
    request = admin.DeleteSubscriptionRequest(topic="orders", subscription="scratch")
    return await c.admin.DeleteSubscription(request, metadata=md)


@dataclass(frozen=True)
class Rpc:
    """One RPC of the matrix: how to call it, who may, and who may not (and why not)."""

    name: str
    call: Callable[[Client, Md], Awaitable[Any]]
    right: str
    wrong: str | None  # None: no token is refused for its role (a filtered list)
    denied: str = ""
    ok: Callable[[Any], bool] = lambda r: r is not None


def unary(service: str, method: str, request: Any) -> Callable[[Client, Md], Awaitable[Any]]:
    """A call of one unary RPC with a fixed request."""
    return lambda c, md: getattr(getattr(c, service), method)(request, metadata=md)


def on_billing(service: str, method: str, cls: Any, **kw: Any) -> Any:
    """A call of an RPC whose request names orders/billing."""
    return unary(service, method, cls(topic="orders", subscription="billing", **kw))


BILLING = "lacks role consume on subscription 'orders/billing'"
ADMIN_BILLING = "lacks role admin on subscription 'orders/billing'"
ORDERS = "lacks role consume on topic 'orders'"
Ad = admin

RPCS = [
    Rpc(
        "Publish",
        unary("broker", "Publish", pb.PublishRequest(topic="orders", batch=BATCH)),
        "producer", "consumer", "lacks role produce on topic 'orders'",
        lambda r: r.last_offset >= 1,
    ),
    Rpc(
        "PublishStream", publish_stream,
        "producer", "consumer", "lacks role produce on topic 'orders'",
        lambda r: r[0].request_id == 7 and r[0].error_code == 0,
    ),
    Rpc(
        "Subscribe", subscribe, "consumer", "producer", BILLING,
        lambda r: r.subscribed.topic == "orders",
    ),
    Rpc(
        "Fetch", unary("broker", "Fetch", pb.FetchRequest(topic="orders", offset=0)),
        "consumer", "producer", ORDERS, lambda r: len(r.batches) >= 1,
    ),
    Rpc(
        "AckUpTo", on_billing("broker", "AckUpTo", pb.AckUpToRequest, offset=0),
        "consumer", "producer", BILLING,
    ),
    Rpc(
        "CreateTopic",
        unary("admin", "CreateTopic", Ad.CreateTopicRequest(name="fresh", partitions=1)),
        "admin", "producer", "lacks role admin on topic 'fresh'", lambda r: r.name == "fresh",
    ),
    Rpc(
        "ListTopics", unary("admin", "ListTopics", Ad.ListTopicsRequest()), "consumer", None,
        ok=lambda r: [t.name for t in r.topics] == ["orders", "quiet"],
    ),
    Rpc(
        "DescribeTopic", unary("admin", "DescribeTopic", Ad.DescribeTopicRequest(name="orders")),
        "producer", "elsewhere", "lacks role produce or consume on topic 'orders'",
        lambda r: r.name == "orders",
    ),
    Rpc(
        "DeleteTopic", unary("admin", "DeleteTopic", Ad.DeleteTopicRequest(name="doomed")),
        "admin", "consumer", "lacks role admin on topic 'doomed'",
    ),
    Rpc(
        "ListSubscriptions",
        unary("admin", "ListSubscriptions", Ad.ListSubscriptionsRequest()), "consumer", None,
        ok=lambda r: [s.subscription for s in r.subscriptions] == ["billing"],
    ),
    Rpc(
        "DescribeSubscription",
        on_billing("admin", "DescribeSubscription", Ad.DescribeSubscriptionRequest),
        "consumer", "producer", BILLING,
    ),
    Rpc(
        "Seek", on_billing("admin", "Seek", Ad.SeekRequest, earliest=True),
        "consumer", "producer", BILLING,
    ),
    Rpc(
        "OffsetsForTime",
        unary("admin", "OffsetsForTime", Ad.OffsetsForTimeRequest(topic="orders")),
        "consumer", "producer", ORDERS, lambda r: len(r.offsets) == 1,
    ),
    Rpc(
        "PeekDeadLetters", on_billing("admin", "PeekDeadLetters", Ad.PeekDeadLettersRequest),
        "consumer", "producer", BILLING,
    ),
    Rpc(
        "CountDeadLetters", on_billing("admin", "CountDeadLetters", Ad.CountDeadLettersRequest),
        "consumer", "producer", BILLING, lambda r: r.count == 0,
    ),
    Rpc(
        "AckDeadLetters", on_billing("admin", "AckDeadLetters", Ad.AckDeadLettersRequest),
        "consumer", "producer", BILLING,
    ),
    Rpc(
        "PurgeDeadLetters", on_billing("admin", "PurgeDeadLetters", Ad.PurgeDeadLettersRequest),
        "admin", "consumer", ADMIN_BILLING,
    ),
    Rpc(
        "ReplayDeadLetters",
        on_billing("admin", "ReplayDeadLetters", Ad.ReplayDeadLettersRequest),
        "admin", "consumer", ADMIN_BILLING,
    ),
    Rpc(
        "DeleteSubscription", delete_subscription,
        "admin", "consumer", "lacks role admin on subscription 'orders/scratch'",
    ),
]  # fmt: skip


def test_the_matrix_covers_every_rpc() -> None:
    """Scenario: the RPCs of the matrix against both services' descriptors. Expected: the
    same set, so a new RPC needs a row here too."""
    names = {
        m.name
        for module in (pb, admin)
        for s in module.DESCRIPTOR.services_by_name.values()
        for m in s.methods
    }
    assert {r.name for r in RPCS} == names


async def refused(rpc: Rpc, setup: Setup, md: Md) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        await rpc.call(setup.client, md)
    return caught.value


def wrong_secret(token: str) -> str:
    return token[:-1] + ("A" if token[-1] != "A" else "B")


@in_module_loop
@pytest.mark.parametrize("rpc", RPCS, ids=lambda r: r.name)
async def test_no_token(setup: Setup, rpc: Rpc) -> None:
    """Scenario: the RPC with no authorization metadata. Expected: UNAUTHENTICATED, 'no
    bearer token: pass --token or HEADRACE_TOKEN'."""
    exc = await refused(rpc, setup, ())
    assert (exc.code(), exc.details()) == (
        UNAUTHENTICATED,
        "no bearer token: pass --token or HEADRACE_TOKEN",
    )


@in_module_loop
@pytest.mark.parametrize("rpc", RPCS, ids=lambda r: r.name)
@pytest.mark.parametrize("kind", ["unknown-id", "wrong-secret", "garbage"])
async def test_wrong_token(setup: Setup, rpc: Rpc, kind: str) -> None:
    """Scenario: the RPC with a token of an id the broker does not know, a known id with
    a wrong secret, or no token shape at all. Expected: UNAUTHENTICATED 'unknown token',
    the same for each (a wrong secret tells nothing about the id)."""
    token = {
        "unknown-id": UNKNOWN_TOKEN,
        "wrong-secret": wrong_secret(setup.tokens[rpc.right]),
        "garbage": "letmein",
    }[kind]
    exc = await refused(rpc, setup, bearer(token))
    assert exc.code() == UNAUTHENTICATED
    assert exc.details() == "unknown token; check --token or HEADRACE_TOKEN"


@in_module_loop
@pytest.mark.parametrize("rpc", RPCS, ids=lambda r: r.name)
async def test_revoked_token(setup: Setup, rpc: Rpc) -> None:
    """Scenario: the RPC with an admin token revoked (by rewriting the tokens file) after
    the broker started and the token had been used. Expected: UNAUTHENTICATED 'token
    hr_<id>_… is revoked', with no restart."""
    token = setup.tokens["revoked"]
    exc = await refused(rpc, setup, bearer(token))
    assert exc.code() == UNAUTHENTICATED
    assert exc.details() == f"token {token[:15]}_… is revoked; ask an admin for a new one"


@in_module_loop
@pytest.mark.parametrize("rpc", [r for r in RPCS if r.wrong], ids=lambda r: r.name)
async def test_wrong_role(setup: Setup, rpc: Rpc) -> None:
    """Scenario: the RPC with a valid token that lacks the role on the resource.
    Expected: PERMISSION_DENIED naming the token, the role needed and the resource."""
    assert rpc.wrong is not None
    token = setup.tokens[rpc.wrong]
    exc = await refused(rpc, setup, bearer(token))
    assert exc.code() == PERMISSION_DENIED
    assert (exc.details() or "").startswith(f"token {rpc.wrong!r} ({token[:15]}_…) {rpc.denied}; ")


@in_module_loop
@pytest.mark.parametrize("rpc", RPCS, ids=lambda r: r.name)
async def test_right_token(setup: Setup, rpc: Rpc) -> None:
    """Scenario: the RPC with a token that has the role on the resource (the narrowest one
    that does). Expected: success, with the RPC's normal answer (lists filtered to what
    the token may see)."""
    result = await rpc.call(setup.client, bearer(setup.tokens[rpc.right]))
    assert rpc.ok(result)


@in_module_loop
async def test_the_transport_is_the_one_named(setup: Setup, transport: Transport) -> None:
    """Scenario: a plain-TCP channel with the admin token to the matrix's broker.
    Expected: it works when the transport is plain; against TLS it is UNAVAILABLE (the
    broker serves TLS only, so the TLS rows really ran over TLS)."""
    md = bearer(setup.tokens["admin"])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{setup.broker.port}") as plain:
        call = Client(plain).admin.ListTopics(admin.ListTopicsRequest(), metadata=md, timeout=5)
        if transport.name == "plain":
            assert (await call).topics
            return
        with pytest.raises(grpc.RpcError) as caught:
            await call
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@in_module_loop
async def test_revocation_took_effect_within_about_a_second(setup: Setup) -> None:
    """Scenario: the time from the revoking rename to the first refusal. Expected: at most
    the recheck interval (1 s) plus slack for a loaded machine."""
    assert setup.revocation_s < 3.0


@in_module_loop
async def test_lists_show_each_token_only_its_topics(setup: Setup) -> None:
    """Scenario: ListTopics with the admin:other token and with admin:*. Expected: only
    'other' for the first; every topic for the second."""
    c = setup.client
    got = await c.admin.ListTopics(
        admin.ListTopicsRequest(), metadata=bearer(setup.tokens["elsewhere"])
    )
    assert [t.name for t in got.topics] == ["other"]
    got = await c.admin.ListTopics(
        admin.ListTopicsRequest(), metadata=bearer(setup.tokens["admin"])
    )
    assert {"orders", "quiet", "other"} <= {t.name for t in got.topics}


@in_module_loop
async def test_revoking_ends_an_open_stream_at_its_next_request(setup: Setup) -> None:
    """Scenario: a consumer's Subscribe stream is open (on an empty topic) when its token
    is revoked; it keeps granting credit. Expected: the stream ends with UNAUTHENTICATED
    'is revoked' without a restart or a new call."""
    c = setup.client
    call = c.broker.Subscribe(metadata=bearer(setup.tokens["streamer"]))
    await call.write(pb.SubscribeRequest(open=pb.OpenSubscription(topic="quiet", subscription="s")))
    assert (await call.read()).subscribed.topic == "quiet"
    revoke(setup.tokens_file, "streamer")
    deadline = time.monotonic() + 10
    while not call.done():
        assert time.monotonic() < deadline, "the stream outlived its revoked token by 10 s"
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):  # ended meanwhile
            await call.write(pb.SubscribeRequest(credit=1))
        await asyncio.sleep(0.1)
    assert await call.code() == UNAUTHENTICATED
    assert "is revoked" in await call.details()


@in_module_loop
async def test_a_cancelled_stream_lets_its_exclusive_subscription_go(setup: Setup) -> None:
    """Scenario: with auth on, a consumer of an exclusive subscription cancels its stream,
    and another opens it. Expected: the second is subscribed within 5 s (the guarded
    stream closes the servicer's, which detaches the first consumer)."""
    md = bearer(setup.tokens["consumer"])
    opening = pb.SubscribeRequest(open=pb.OpenSubscription(topic="quiet", subscription="excl"))
    first = setup.client.broker.Subscribe(metadata=md)
    await first.write(opening)
    assert (await first.read()).HasField("subscribed")
    first.cancel()
    deadline = time.monotonic() + 5
    while True:
        second = setup.client.broker.Subscribe(metadata=md)
        await second.write(opening)
        try:
            got = await second.read()
            break
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION  # noqa: PT017
            assert time.monotonic() < deadline, "the cancelled consumer was never detached"
            await asyncio.sleep(0.05)
    assert got.subscribed.subscription == "excl"
    second.cancel()


@in_module_loop
async def test_a_publish_stream_ends_at_its_first_denied_topic(setup: Setup) -> None:
    """Scenario: a producer's PublishStream sends a batch to orders (granted), then one to
    other (not granted). Expected: the first is answered and durable; then the stream ends
    with PERMISSION_DENIED naming 'other'."""
    c = setup.client
    before = (
        await c.broker.Fetch(
            pb.FetchRequest(topic="orders", offset=0), metadata=bearer(setup.tokens["admin"])
        )
    ).high_water_mark
    call = c.broker.PublishStream(metadata=bearer(setup.tokens["producer"]))
    await call.write(pb.PublishRequest(topic="orders", batch=BATCH, request_id=1))
    first = await call.read()
    assert (first.request_id, first.error_code, first.base_offset) == (1, 0, before)
    await call.write(pb.PublishRequest(topic="other", batch=BATCH, request_id=2))
    with pytest.raises(grpc.RpcError) as caught:
        await call.read()
    assert caught.value.code() == PERMISSION_DENIED
    assert "lacks role produce on topic 'other'" in (caught.value.details() or "")
    other = await c.broker.Fetch(
        pb.FetchRequest(topic="other", offset=0), metadata=bearer(setup.tokens["admin"])
    )
    assert other.high_water_mark == 0


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (
            (("authorization", "Bearer a"), ("authorization", "Bearer b")),
            "2 authorization headers; send exactly one",
        ),
        (
            (("authorization", "Basic dXNlcjpwdw=="),),
            "authorization header must be 'Bearer <token>'",
        ),
        ((("authorization", "Bearer " + "x" * 300),), "is not text of at most 256 characters"),
        ((("authorization-bin", b"Bearer x"),), "no bearer token"),
    ],
)
@in_module_loop
async def test_untrusted_metadata_is_refused_cleanly(
    setup: Setup, metadata: Any, message: str
) -> None:
    """Scenario: several authorization entries, another scheme, an overlong value, a
    binary header instead. Expected: UNAUTHENTICATED saying what is wrong; the broker
    keeps serving (the next good call succeeds)."""
    with pytest.raises(grpc.RpcError) as caught:
        await setup.client.admin.ListTopics(admin.ListTopicsRequest(), metadata=metadata)
    assert caught.value.code() == UNAUTHENTICATED
    assert message in (caught.value.details() or "")
    await setup.client.admin.ListTopics(
        admin.ListTopicsRequest(), metadata=bearer(setup.tokens["admin"])
    )


@pytest.mark.parametrize(
    ("path", "message_type"),
    [
        ("/headrace.v1.Admin/DescribeTopic", "headrace.v1.DescribeTopicRequest"),
        ("/headrace.v1.Broker/Publish", "headrace.v1.PublishRequest"),
    ],
)
@in_module_loop
async def test_a_request_that_does_not_parse_is_invalid_argument_with_a_token(
    setup: Setup, path: str, message_type: str
) -> None:
    """Scenario: a valid token's call whose bytes do not parse as the request (found by
    fuzzing a broker with tokens, issue 38: authorize read ``topic`` off the parser's
    Malformed marker, an AttributeError logged at ERROR and answered UNKNOWN).
    Expected: INVALID_ARGUMENT naming the message type, as without tokens; without a
    token the same bytes are UNAUTHENTICATED."""
    raw: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = setup.client.channel.unary_unary(
        path, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    with pytest.raises(grpc.RpcError) as caught:
        await raw(b"\x0a\xff", metadata=bearer(setup.tokens["admin"]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"request does not parse as {message_type}" in (caught.value.details() or "")
    with pytest.raises(grpc.RpcError) as caught:
        await raw(b"\x0a\xff")
    assert caught.value.code() == UNAUTHENTICATED


@in_module_loop
async def test_health_and_reflection_need_no_token(setup: Setup) -> None:
    """Scenario: a health check and a reflection listing with no token. Expected: SERVING,
    and the service list (load balancers and grpcurl work without credentials)."""
    ch = setup.client.channel
    health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    call = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    listed = await call.read()
    call.cancel()
    names = {s.name for s in listed.list_services_response.service}
    assert "headrace.v1.Broker" in names


@in_module_loop
async def test_failures_are_counted_by_reason(setup: Setup) -> None:
    """Scenario: one refusal of each kind. Expected: headrace_auth_failures_total goes up
    by exactly one for each reason."""
    registry = setup.broker.metrics.registry

    def count(reason: str) -> float:
        return registry.get_sample_value("headrace_auth_failures_total", {"reason": reason}) or 0.0

    c = setup.client
    for reason, md in [
        ("missing", ()),
        ("unknown", bearer(UNKNOWN_TOKEN)),
        ("revoked", bearer(setup.tokens["revoked"])),
        ("denied", bearer(setup.tokens["producer"])),
    ]:
        before = count(reason)
        with pytest.raises(grpc.RpcError):
            await c.admin.DeleteTopic(admin.DeleteTopicRequest(name="orders"), metadata=md)
        assert count(reason) == before + 1


class AbortedError(Exception):
    pass


class _Context:
    """The part of a grpc.aio servicer context that a refusal uses."""

    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        self.status = (code, message)
        raise AbortedError


@dataclass(frozen=True)
class _Details:
    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


@in_module_loop
async def test_an_rpc_missing_from_the_table_is_refused(tmp_path: Path) -> None:
    """Scenario: a method the servicers serve but the table has no row for, called with a
    valid admin token. Expected: PERMISSION_DENIED naming the method (fail closed), and
    the handler never runs."""
    path = tmp_path / "tokens.json"
    tokens = make_tokens(path, {"root": "admin:*"})
    store = TokensFile(str(path))
    reasons: list[str] = []
    ran: list[bool] = []

    async def behavior(request: Any, context: Any) -> str:
        ran.append(True)
        return "served"

    async def continuation(details: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(behavior)

    interceptor = AuthInterceptor(store, reasons.append)
    details = _Details("/headrace.v1.Admin/Unlisted", bearer(tokens["root"]))
    handler = await interceptor.intercept_service(continuation, details)  # type: ignore[arg-type]
    context = _Context()
    assert handler is not None
    assert handler.unary_unary is not None
    with pytest.raises(AbortedError):
        await handler.unary_unary(object(), context)  # type: ignore[arg-type]
    assert context.status is not None
    assert context.status[0] == PERMISSION_DENIED
    assert context.status[1] == (
        "method /headrace.v1.Admin/Unlisted has no authorization rule, so it is refused to "
        "every token; this is a broker bug: report it"
    )
    assert (ran, reasons) == ([], ["denied"])


@in_module_loop
async def test_a_broker_with_a_bad_tokens_file_does_not_start(tmp_path: Path) -> None:
    """Scenario: [security] tokens_file names a damaged file. Expected: start fails with
    TokensFileError naming the file before the data directory is made; a broker starts
    once the file is fixed."""
    path = tmp_path / "tokens.json"
    path.write_text('{"version": 1, "tokens": [{"id": 5}]}')
    config = broker_config(tmp_path / "data").replace(
        security=SecurityConfig(tokens_file=str(path))
    )
    with pytest.raises(
        TokensFileError, match=re.escape(f"tokens file {path}: not a tokens document")
    ):
        await Broker(config).start()
    assert not (tmp_path / "data").exists()
    path.unlink()
    make_tokens(path, {"root": "admin:*"})
    async with Broker(config) as broker:
        assert broker.port > 0
