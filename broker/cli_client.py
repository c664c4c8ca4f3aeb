"""The ``headrace`` commands that talk to a broker as a client: ``topics``, ``produce``,
``consume`` and ``seek`` (``dlq`` is in :mod:`broker.cli_dlq`, ``lag`` in
:mod:`broker.cli_lag`).

Role: parse arguments, call the :mod:`client` library, print. Every command takes
``--broker HOST:PORT`` (env ``HEADRACE_BROKER``), ``--token`` (env ``HEADRACE_TOKEN``) and
``--tls-ca``, ``--tls-cert``, ``--tls-key`` (env ``HEADRACE_TLS_CA``, ``HEADRACE_TLS_CERT``,
``HEADRACE_TLS_KEY``), all added by :func:`broker_option` and handed to the command as one
:class:`Target`. Client errors print one line on stderr and exit 1 (a failed TLS handshake
says which option to check); usage errors exit 2 (click), bad security options included.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import math
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, TypeVar

import click

from client import (
    DEFAULT_BROKER,
    AsyncAdminClient,
    AsyncConsumer,
    AsyncProducer,
    ClientError,
    Message,
    SubscriptionInfo,
    TopicInfo,
    Unavailable,
    check_security,
)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how a command connects: the broker, the bearer token, the TLS files."""

    broker: str
    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of every client class."""
        return {
            "broker": self.broker,
            "token": self.token,
            "tls_ca": self.tls_ca,
            "tls_cert": self.tls_cert,
            "tls_key": self.tls_key,
        }


_CONNECTION_OPTIONS = (
    click.option(
        "--broker",
        envvar="HEADRACE_BROKER",
        default=DEFAULT_BROKER,
        show_default=True,
        help="Broker host:port (env HEADRACE_BROKER).",
    ),
    click.option("--token", envvar="HEADRACE_TOKEN", help="Bearer token (env HEADRACE_TOKEN)."),
    click.option(
        "--tls-ca",
        envvar="HEADRACE_TLS_CA",
        help="PEM CA bundle that signed the broker's certificate; turns TLS on "
        "(env HEADRACE_TLS_CA).",
    ),
    click.option(
        "--tls-cert",
        envvar="HEADRACE_TLS_CERT",
        help="PEM client certificate, for mutual TLS (env HEADRACE_TLS_CERT).",
    ),
    click.option(
        "--tls-key", envvar="HEADRACE_TLS_KEY", help="PEM key of --tls-cert (env HEADRACE_TLS_KEY)."
    ),
)


def broker_option(command: F) -> F:
    """Add ``--broker``, ``--token``, ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` to a
    command, checked (a bad one is a usage error) and passed as ``target=Target(...)``."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        target = Target(
            *(kwargs.pop(k) for k in ("broker", "token", "tls_ca", "tls_cert", "tls_key"))
        )
        try:
            check_security(target.token, target.tls_ca, target.tls_cert, target.tls_key)
        except ValueError as exc:
            raise click.UsageError(str(exc).replace("tls_", "--tls-")) from exc
        return command(*args, target=target, **kwargs)

    for option in reversed(_CONNECTION_OPTIONS):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


def run(make: Callable[[], Coroutine[Any, Any, T]], target: Target) -> T:
    """Run a client coroutine; turn client errors into one line and exit code 1."""
    try:
        return asyncio.run(make())
    except ClientError as exc:
        raise click.ClickException(explain(exc, target)) from exc
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def explain(error: ClientError, target: Target) -> str:
    """The one line for ``error``: gRPC's words for a failed TLS handshake are replaced by
    what failed and which option to check."""
    message = str(error)
    if not isinstance(error, Unavailable):
        return message
    if "handshake" in message.lower():
        cause = message.rsplit("OPENSSL_internal:", 1)[-1].strip().removesuffix(": OK")
        return (
            f"TLS handshake with {target.broker} failed ({cause}); check that --tls-ca is "
            "the CA that signed the broker's certificate, that the broker serves TLS, and "
            "--tls-cert/--tls-key if it requires client certificates"
        )
    if target.tls_ca is None:
        return f"{message} (if the broker serves TLS, pass --tls-ca)"
    return message


@click.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


@topics.command("create")
@click.argument("name")
@click.option("--partitions", type=click.IntRange(1, 10_000), default=1, show_default=True)
@broker_option
def topics_create(name: str, partitions: int, target: Target) -> None:
    """Create topic NAME."""

    async def go() -> TopicInfo:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.create_topic(name, partitions)

    info = run(go, target)
    click.echo(f"created topic {info.name} with {len(info.partitions)} partition(s)")


@topics.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@broker_option
def topics_list(as_json: bool, target: Target) -> None:
    """List topics with their partitions and heads."""

    async def go() -> list[TopicInfo]:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.list_topics()

    _print_topics(run(go, target), as_json)


@topics.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@broker_option
def topics_describe(name: str, as_json: bool, target: Target) -> None:
    """Show topic NAME's partitions: offsets, bytes, segments."""

    async def go() -> TopicInfo:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.describe_topic(name)

    _print_topics([run(go, target)], as_json)


@topics.command("delete")
@click.argument("name")
@broker_option
def topics_delete(name: str, target: Target) -> None:
    """Delete topic NAME and all its data."""

    async def go() -> None:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            await admin.delete_topic(name)

    run(go, target)
    click.echo(f"deleted topic {name}")


def _print_topics(infos: list[TopicInfo], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([asdict(t) for t in infos]))
        return
    click.echo(
        f"{'topic':<30}{'partition':>10}{'first':>14}{'head':>14}{'bytes':>14}{'segments':>10}"
    )
    for t in infos:
        for p in t.partitions:
            click.echo(
                f"{t.name:<30}{p.partition:>10}{p.first_offset:>14}{p.head:>14}"
                f"{p.size_bytes:>14}{p.segments:>10}"
            )


@click.command()
@click.argument("topic")
@click.option("--key", help="Key of every record (picks the partition).")
@click.option("--count", type=click.IntRange(1), help="Send N generated records, not stdin.")
@broker_option
def produce(topic: str, key: str | None, count: int | None, target: Target) -> None:
    """Publish each line of stdin (or --count generated records) as one record.

    Exits 0 only after every record was acknowledged.
    """
    values = (f"record-{i}".encode() for i in range(count)) if count else _stdin_lines()
    encoded_key = key.encode() if key is not None else None

    async def go() -> int:
        async with AsyncProducer(**target.kwargs()) as producer:
            futures = [await producer.send(topic, v, key=encoded_key) for v in values]
            await asyncio.gather(*futures)
            return len(futures)

    sent = run(go, target)
    click.echo(f"produced {sent} record(s) to {topic}", err=True)


def _stdin_lines() -> Iterator[bytes]:
    for line in sys.stdin.buffer:
        yield line.rstrip(b"\r\n")


@click.command()
@click.argument("topic")
@click.option("--subscription", "-s", required=True, help="Subscription name (created if new).")
@click.option(
    "--type",
    "type_",
    type=click.Choice(["exclusive", "failover", "shared", "key_shared"]),
    default="exclusive",
    show_default=True,
)
@click.option(
    "--from",
    "start",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where a new subscription starts.",
)
@click.option("--count", type=click.IntRange(1), help="Exit after N records.")
@click.option(
    "--timeout",
    type=float,
    callback=lambda _ctx, _param, value: _positive_seconds(value),
    metavar="SECONDS",
    help="Idle timeout: stop once this many seconds pass without a new record (exit 0, "
    "with a note on stderr of how many of --count arrived).",
)
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@broker_option
def consume(  # noqa: PLR0917 - click passes every option as an argument
    topic: str,
    subscription: str,
    type_: str,
    start: str,
    count: int | None,
    timeout: float | None,
    output: str,
    target: Target,
) -> None:
    """Print records of TOPIC through a subscription, one value per line, and ack them.

    A record is acknowledged only after it was written to stdout. Runs until --count
    records were printed, until --timeout seconds pass without a new record, or until
    interrupted (Ctrl-C acks what was printed, then exits). It asks the broker for no more
    than --count records ahead; records it received but did not print are given back
    uncounted on exit, so the next consumer gets them as first deliveries.
    """
    out = sys.stdout.buffer
    printed = 0
    idle = False
    prefetch = min(count, CONSUME_PREFETCH) if count is not None else CONSUME_PREFETCH

    async def go() -> None:
        nonlocal printed, idle
        async with AsyncConsumer(
            topic,
            subscription,
            **target.kwargs(),
            type=type_,
            initial_position=start,
            receive_queue=prefetch,
        ) as consumer:
            while count is None or printed < count:
                want = count - printed if count is not None else CONSUME_PREFETCH
                try:
                    batch = await consumer.receive_batch(want, timeout=timeout)
                except TimeoutError:
                    idle = True
                    return
                for message in batch:
                    out.write(_render(message, output))
                out.flush()
                consumer.ack_many(batch)
                printed += len(batch)

    run(go, target)
    if idle:
        of = f" of {count}" if count is not None else ""
        click.echo(f"stopped after {timeout:g}s without a record; got {printed}{of}", err=True)
    click.echo(f"consumed {printed} record(s) from {topic}", err=True)


#: The most records ``consume`` lets the broker send ahead (the client's default
#: ``receive_queue``); with ``--count N`` it asks for at most N.
CONSUME_PREFETCH = 1_000


def _positive_seconds(value: float | None) -> float | None:
    """``--timeout``: a finite number of seconds above 0 (else a usage error, exit 2)."""
    if value is None:
        return None
    if not (math.isfinite(value) and value > 0):
        raise click.BadParameter(
            f"must be a positive number of seconds, like 5 or 0.5; got {value:g}",
            param_hint="--timeout",
        )
    return value


def _render(message: Message, output: str) -> bytes:
    if output == "text":
        return message.value + b"\n"
    doc: dict[str, Any] = {
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
        "timestamp_ms": message.timestamp_ms,
        "redelivery_count": message.redelivery_count,
    }
    add_record_bytes(doc, message.key, message.value, message.headers)
    return json.dumps(doc).encode() + b"\n"


def add_record_bytes(
    doc: dict[str, Any], key: bytes | None, value: bytes, headers: Mapping[str, bytes]
) -> None:
    """Put a record's key, value and headers in ``doc``, losing nothing: each as UTF-8
    text when it is text; otherwise the key or value is null beside a ``key_base64`` or
    ``value_base64`` field, and a header's value is ``{"base64": ...}``."""
    for name, raw in (("key", key), ("value", value)):
        doc[name] = as_text(raw)
        if raw is not None and doc[name] is None:
            doc[f"{name}_base64"] = base64.b64encode(raw).decode()
    doc["headers"] = {
        k: text if (text := as_text(v)) is not None else {"base64": base64.b64encode(v).decode()}
        for k, v in headers.items()
    }


def as_text(raw: bytes | None) -> str | None:
    """``raw`` as text when it is UTF-8; None otherwise (the caller adds base64)."""
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def table(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> str:
    """``rows`` as aligned text columns, one per field, under an upper-case header."""
    widths = {f: max(len(f), *(len(str(r[f])) for r in rows)) for f in fields}
    lines = ["  ".join(f.upper().ljust(widths[f]) for f in fields).rstrip()]
    for r in rows:
        lines.append("  ".join(str(r[f]).ljust(widths[f]) for f in fields).rstrip())
    return "\n".join(lines)


@click.command()
@click.argument("topic", required=False)
@click.option("--subscription", "-s", required=True)
@click.option(
    "--to",
    "position",
    required=True,
    help="earliest, latest, an OFFSET (same on every partition), or an ISO-8601 TIMESTAMP "
    "such as 2026-11-21T10:00:00Z.",
)
@broker_option
def seek(topic: str | None, subscription: str, position: str, target: Target) -> None:
    """Move a subscription's cursors. TOPIC may be left out when the subscription name is
    used by one topic only."""
    kwargs = _seek_target(position)

    async def go() -> SubscriptionInfo:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            name = topic or await _topic_of(admin, subscription)
            return await admin.seek(name, subscription, **kwargs)

    info = run(go, target)
    cursors = ", ".join(f"{p.partition}:{p.cursor}" for p in info.partitions)
    click.echo(f"{info.topic}/{info.subscription} now at partition:cursor {cursors}")


def _seek_target(target: str) -> dict[str, Any]:
    if target in ("earliest", "latest"):
        return {target: True}
    with contextlib.suppress(ValueError):
        offset = int(target)
        if offset < 0:
            raise click.BadParameter(f"offset {offset} is negative", param_hint="--to")
        return {"offset": offset}
    try:
        when = datetime.fromisoformat(target)
    except ValueError:
        raise click.BadParameter(
            f"{target!r} is not earliest, latest, an offset or an ISO-8601 time",
            param_hint="--to",
        ) from None
    if when.tzinfo is None:
        raise click.BadParameter(
            f"{target!r} has no time zone; add one, e.g. Z or +01:00", param_hint="--to"
        )
    return {"timestamp_ms": int(when.timestamp() * 1000)}


async def _topic_of(admin: AsyncAdminClient, subscription: str) -> str:
    topics = sorted(
        {s.topic for s in await admin.list_subscriptions() if s.subscription == subscription}
    )
    if len(topics) == 1:
        return topics[0]
    if not topics:
        raise click.ClickException(f"no topic has a subscription named {subscription!r}")
    raise click.ClickException(
        f"subscription {subscription!r} exists on topics {', '.join(topics)}; name the topic"
    )
