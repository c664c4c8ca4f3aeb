"""The ``headrace`` commands that talk to a broker as a client: ``topics`` and ``seek``
(``produce`` is in :mod:`broker.cli_produce`, ``consume`` in :mod:`broker.cli_consume`,
``dlq`` in :mod:`broker.cli_dlq`, ``lag`` in :mod:`broker.cli_lag`), and what they all
share: the connection options, the one-line errors, the reachability check, a record's
bytes as JSON.

Role: parse arguments, call the :mod:`client` library, print. Every command takes
``--broker HOST:PORT`` (env ``HEADRACE_BROKER``), ``--token`` (env ``HEADRACE_TOKEN``) and
``--tls-ca``, ``--tls-cert``, ``--tls-key`` (env ``HEADRACE_TLS_CA``, ``HEADRACE_TLS_CERT``,
``HEADRACE_TLS_KEY``), all added by :func:`broker_option` and handed to the command as one
:class:`Target`. Client errors print one line on stderr and exit 1 (a failed TLS handshake
says which option to check; an HTTP server at the address, such as a broker's metrics
listener, is named as one: :mod:`broker.cli_probe`); usage errors exit 2 (click), bad
security options included.

Checked before anything is sent (:mod:`broker.cli_params`): ``--broker`` is ``HOST:PORT``,
topic and subscription names follow the broker's rule. ``produce`` and ``consume`` first
check that a broker answers (:func:`check_reachable`) instead of retrying a wrong address
for their delivery or connect timeout. A destructive command (``topics delete``, ``dlq
purge``) asks at a terminal (:func:`confirm`) and refuses without one
(:func:`require_terminal`) unless ``--yes``. Tables and counted nouns come from
:mod:`broker.cli_output`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click
import grpc
from grpc_health.v1.health_pb2 import HealthCheckRequest
from grpc_health.v1.health_pb2_grpc import HealthStub

# ``table`` stays importable from here: the lag and subscription commands use it.
from broker.cli_output import plural, table
from broker.cli_params import SUBSCRIPTION_NAME, TOPIC_NAME
from client import (
    DEFAULT_BROKER,
    AlreadyExists,
    AsyncAdminClient,
    ClientError,
    SubscriptionInfo,
    TopicInfo,
    Unavailable,
    check_security,
    parse_brokers,
)
from client._channel import aio_channel
from proto.shown import shown_text

#: How long ``produce`` waits for a broker to answer before it gives up, seconds.
DEFAULT_CONNECT_TIMEOUT_S = 5.0

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: The largest offset or sequence the wire carries (protobuf int64).
INT64_MAX = 2**63 - 1
#: The largest count a request carries (protobuf int32).
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how a command connects: the broker (or seeds ``h1:p1,h2:p2``), the bearer
    token, the TLS files."""

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


if TYPE_CHECKING:  # generic in click 8.2 and later; plain at run time, for click 8.1
    _StrType = click.ParamType[str, Any]
else:
    _StrType = click.ParamType


class BrokerAddress(_StrType):
    """``--broker``: ``HOST:PORT`` of a broker, or seed brokers ``HOST:PORT,HOST:PORT``
    (the command finds each topic's owner from them). Each entry is checked by the client
    library's rule (:func:`client.parse_brokers`: ``HOST`` a host name, an IPv4 address or
    an IPv6 address in brackets; ``PORT`` 1 to 65535), while the command line is parsed:
    a bad one is a usage error (exit 2) naming it and its place. Converted to the seeds
    joined by commas."""

    name = "HOST:PORT[,HOST:PORT...]"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        try:
            return ",".join(parse_brokers(str(value)))
        except ValueError as exc:
            self.fail(str(exc).removeprefix("broker "), param, ctx)


BROKER_ADDRESS = BrokerAddress()

_CONNECTION_OPTIONS = (
    click.option(
        "--broker",
        envvar="HEADRACE_BROKER",
        default=DEFAULT_BROKER,
        show_default=True,
        type=BROKER_ADDRESS,
        help="Broker HOST:PORT, an IPv6 host in brackets, or seed brokers of a cluster "
        "separated by commas: each topic's calls go to its owner (env HEADRACE_BROKER).",
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
    what failed and which option to check. The broker's words are escaped: a control
    character in them never reaches the terminal."""
    message = shown_text(str(error), 1_000)
    if not isinstance(error, Unavailable):
        return message
    if "handshake" in message.lower():
        cause = message.rsplit("OPENSSL_internal:", 1)[-1].strip().removesuffix(": OK")
        if cause.startswith("WRONG_VERSION_NUMBER") and (line := http_instead(target)):
            return line  # TLS to a plain-text HTTP server
        return (
            f"TLS handshake with {target.broker} failed ({cause}); check that --tls-ca is "
            "the CA that signed the broker's certificate, that the broker serves TLS, and "
            "--tls-cert/--tls-key if it requires client certificates"
        )
    if "failed to connect to all addresses" in message:
        return unreachable(target, message.rsplit(": ", 1)[-1].strip(" []").lower())
    if target.tls_ca is None:
        return f"{message} (if the broker serves TLS, pass --tls-ca)"
    return message


def unreachable(target: Target, cause: str) -> str:
    """The one line for a broker that did not answer at ``target``'s address; the TLS
    hint only where TLS could be why (not a refused connection or an unknown host). Where
    the answer was not HTTP/2 and an HTTP/1 server is there, the line says so instead
    (:func:`http_instead`)."""
    if cause.startswith("failed parsing http/2") and (line := http_instead(target)):
        return line
    tls_hint = not target.tls_ca and not cause.startswith(("connection refused", "domain"))
    # A TLS broker that requires client certificates closes the connection of a client
    # without one (or with one it does not trust): the client sees only "socket closed".
    mtls_hint = bool(target.tls_ca) and cause.startswith("socket closed")
    return (
        f"cannot reach a broker at {target.broker} ({cause}); check that `headrace serve` "
        "is running there and that --broker (env HEADRACE_BROKER) names its address"
        + (", and pass --tls-ca if it serves TLS" if tls_hint else "")
        + (
            ", and that --tls-cert/--tls-key are a client certificate the broker trusts if "
            "it requires one (--tls-client-ca)"
            if mtls_hint
            else ""
        )
    )


def http_instead(target: Target) -> str | None:
    """The line for an address where an HTTP/1 server answers, not gRPC: a broker's
    metrics listener, or what may be one (:func:`broker.cli_probe.probe_http`); None when
    none does."""
    from broker.cli_probe import probe_http  # noqa: PLC0415 - only on this error path
    from broker.config import BrokerConfig  # noqa: PLC0415 - the broker's defaults, as above

    listener = probe_http(target.broker.split(",")[0])
    if listener is None:
        return None
    metrics = f"serve --metrics-listen, default {BrokerConfig().metrics_listen}"
    what = (
        f"it is a Headrace broker's metrics listener ({metrics})"
        if listener.is_headrace_metrics()
        else f"it looks like an HTTP server, perhaps a broker's metrics listener ({metrics})"
    )
    return (
        f"cannot reach a broker at {target.broker}: it answers HTTP/1, not gRPC, so {what}; "
        f"--broker (env HEADRACE_BROKER) takes the broker's gRPC address (serve --listen, "
        f"default {DEFAULT_BROKER})"
    )


@click.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


@topics.command("create")
@click.argument("name", type=TOPIC_NAME)
@click.option(
    "--partitions",
    type=click.IntRange(1, 10_000),
    default=None,
    help="How many partitions. Default: the broker's default_partitions (the cluster's "
    "in cluster mode).",
)
@click.option(
    "--exist-ok", is_flag=True, help="Succeed if the topic exists with this many partitions."
)
@click.option(
    "--replication-factor",
    type=click.IntRange(1, None),
    default=None,
    help="Copies of the topic, each on another broker (cluster mode). Default: the "
    "cluster's replication_factor (3 unless `cluster config` sets it), at most the live "
    "brokers; 1 on a single broker.",
)
@click.option(
    "--min-insync-replicas",
    type=click.IntRange(1, None),
    default=None,
    help="In-sync replicas a publish needs. Default: the cluster's min_insync_replicas "
    "(2 unless `cluster config` sets it), at most the factor.",
)
@broker_option
def topics_create(
    name: str,
    partitions: int | None,
    *,
    exist_ok: bool,
    replication_factor: int | None,
    min_insync_replicas: int | None,
    target: Target,
) -> None:
    """Create topic NAME."""

    async def go() -> tuple[TopicInfo, bool]:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            try:
                made = await admin.create_topic(
                    name,
                    partitions,
                    replication_factor=replication_factor,
                    min_insync_replicas=min_insync_replicas,
                )
                return made, True
            except AlreadyExists:
                if not exist_ok:
                    raise
            # as the client's exist_ok, which refuses another partition count
            return await admin.create_topic(name, partitions, exist_ok=True), False

    info, created = run(go, target)
    counted = plural(len(info.partitions), "partition")
    if len(info.replicas) > 1:
        counted += f", replicas {','.join(info.replicas)} (leader {info.leader})"
    if created:
        click.echo(f"created topic {info.name} with {counted}")
    else:
        click.echo(f"topic {info.name} exists already with {counted}; nothing changed")


@topics.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@broker_option
def topics_list(as_json: bool, target: Target) -> None:
    """List topics with their partitions and heads.

    In a cluster: every broker's topics, each with its owner's figures, whichever broker
    is asked; a topic whose owner cannot be asked now is listed with its owner and state
    (e.g. OFFLINE) and no figures, and said on stderr (exit 0 all the same).
    """

    async def go() -> list[TopicInfo]:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.list_topics()

    infos = run(go, target)
    for t in infos:
        if t.offline:
            click.echo(f"topic {t.name}: not read from its owner {t.owner} ({t.offline})", err=True)
    if not infos and not as_json:
        click.echo("no topics")
        return
    _print_topics(infos, as_json)


@topics.command("describe")
@click.argument("name", type=TOPIC_NAME)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@broker_option
def topics_describe(name: str, as_json: bool, target: Target) -> None:
    """Show topic NAME's partitions: offsets, bytes, segments, fsync policy; in a cluster
    also its leader, epoch, replicas, in-sync replicas and min_insync, and (answered by
    a replicated topic's leader) each follower's lag per partition."""

    async def go() -> TopicInfo:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.describe_topic(name)

    info = run(go, target)
    _print_topics([info], as_json)
    if not as_json and _clustered(info):
        click.echo(replication_text(info))
        lag = followers_text(info)
        if lag:
            click.echo(lag)


def followers_text(info: TopicInfo) -> str:
    """``topics describe``'s follower table (its leader's view), or ``""`` when the
    answer holds no follower (another broker answered, or one replica): a row per
    partition and follower; then a table of the topic's other logs, per kind (``state``:
    the subscription-state log; ``dlq``: the dead-letter queue it is furthest behind in)
    and follower."""
    rows = [
        {
            "partition": p.partition,
            "follower": f.node,
            "fetch_offset": f.fetch_offset,
            "lag_records": f.lag_records,
            "lag_s": round(f.lag_s, 1),
            "in_sync": "yes" if f.in_sync else "NO",
        }
        for p in info.partitions
        for f in p.followers
    ]
    logs = [
        {
            "log": f.log,
            "follower": f.node,
            "lag_records": f.lag_records,
            "lag_s": round(f.lag_s, 1),
            "in_sync": "yes" if f.in_sync else "NO",
        }
        for f in info.log_followers
    ]
    if not rows:
        return ""
    text = table(rows, ("partition", "follower", "fetch_offset", "lag_records", "lag_s", "in_sync"))
    if logs:
        text += "\n" + table(logs, ("log", "follower", "lag_records", "lag_s", "in_sync"))
    return text


def replication_text(info: TopicInfo) -> str:
    """``topics describe``'s lines under the table for a cluster's topic: leader and
    epoch, replicas, the in-sync set (naming the replicas out of it), min_insync."""
    out = [r for r in info.replicas if r not in info.isr]
    isr = ", ".join(info.isr)
    if out:
        isr += f"  (under-replicated: {', '.join(out)} not in sync)"
    rows = [
        ("leader", f"{info.leader} (epoch {info.epoch})"),
        ("replicas", ", ".join(info.replicas)),
        ("isr", isr),
        ("min_insync", str(info.min_insync_replicas)),
    ]
    return "\n".join(f"{key:<11}{value}" for key, value in rows)


@topics.command("delete")
@click.argument("name", type=TOPIC_NAME)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@broker_option
def topics_delete(name: str, yes: bool, target: Target) -> None:
    """Delete topic NAME with all its records and subscriptions. Asks first unless --yes."""

    async def held() -> TopicInfo:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.describe_topic(name)

    async def go() -> None:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            await admin.delete_topic(name)

    if not yes:
        require_terminal(f"delete topic {name}")
        info = run(held, target)
        records = sum(p.head - p.first_offset for p in info.partitions)
        confirm(
            f"delete topic {name}, its {plural(len(info.partitions), 'partition')} holding "
            f"{plural(records, 'record')}, and its subscriptions? It cannot be undone"
        )
    run(go, target)
    click.echo(f"deleted topic {name}")


def require_terminal(action: str) -> None:
    """Refuse (a usage error) to ask whether to ``action`` when nobody can answer: stdin is
    not a terminal (a script, a pipe, cron), and a destructive command must not take its
    "yes" from whatever stdin holds."""
    if not stdin_is_terminal():
        raise click.UsageError(
            f"not asking whether to {action}: stdin is not a terminal; pass --yes to do it "
            "without asking"
        )


def confirm(question: str) -> None:
    """Ask ``question`` on stderr; anything but yes aborts with exit 1 ("Aborted!")."""
    click.confirm(question, abort=True, err=True)


def stdin_is_terminal() -> bool:
    """Whether stdin is a terminal a person can answer a question at."""
    isatty = getattr(sys.stdin, "isatty", None)
    return bool(isatty and isatty())


TOPIC_FIELDS = ("topic", "partition", "first", "head", "bytes", "segments", "fsync")
#: The columns a cluster adds: the owner's node id, and ``online`` or why the figures are
#: not the owner's (the reason upper-cased: ``OFFLINE``, ``UNREACHABLE``, ``CREATING``...).
CLUSTER_TOPIC_FIELDS = (*TOPIC_FIELDS, "owner", "state")


REPLICATION_FIELDS = ("leader", "epoch", "replicas", "isr", "min_insync_replicas")
"""The keys a cluster's topic adds to its JSON (a single broker's is as it was)."""


def topic_doc(info: TopicInfo) -> dict[str, Any]:
    """One topic as JSON: a single broker's as ever; in a cluster with ``owner`` and
    ``offline`` (listings: ``""`` when the owner answered, else why not) and the
    replication keys (:data:`REPLICATION_FIELDS`: leader, epoch, replicas, isr,
    min_insync_replicas); a partition's ``followers`` (node, fetch_offset, lag_records,
    lag_s, in_sync) and the topic's ``log_followers`` (log, node, lag_records, lag_s,
    in_sync) only when the topic's leader answered."""
    doc = asdict(info)
    for partition in doc["partitions"]:
        if not partition["followers"]:  # only a replicated topic's leader fills them
            del partition["followers"]
    if not doc["log_followers"]:
        del doc["log_followers"]
    if not info.owner:
        del doc["owner"], doc["offline"]
    if not _clustered(info):
        for key in REPLICATION_FIELDS:
            del doc[key]
    return doc


def _clustered(info: TopicInfo) -> bool:
    """Whether ``info`` comes from a cluster that says its replication (a single broker
    names itself ``local``; a broker before issue 37 names no leader)."""
    return info.leader not in ("", "local")


def _print_topics(infos: list[TopicInfo], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([topic_doc(t) for t in infos]))
        return
    rows = [
        {
            "topic": t.name,
            "partition": p.partition,
            "first": "-" if t.offline else p.first_offset,
            "head": "-" if t.offline else p.head,
            "bytes": "-" if t.offline else p.size_bytes,
            "segments": "-" if t.offline else p.segments,
            "fsync": "-" if t.offline else t.fsync,
            "owner": t.owner,
            "state": t.offline.upper() or "online",
        }
        for t in infos
        for p in t.partitions
    ]
    cluster = any(t.owner for t in infos)
    click.echo(table(rows, CLUSTER_TOPIC_FIELDS if cluster else TOPIC_FIELDS))


def connect_timeout_option(before: str) -> Callable[[F], F]:
    """``--connect-timeout``: how long a command waits for the broker to answer
    ``before`` it starts (see :func:`reachable_channel`)."""
    return click.option(
        "--connect-timeout",
        type=click.FloatRange(0, 3600, min_open=True),
        default=DEFAULT_CONNECT_TIMEOUT_S,
        show_default=True,
        help=f"Seconds to wait for the broker to answer {before}.",
    )


@contextlib.asynccontextmanager
async def reachable_channel(
    target: Target, timeout_s: float
) -> AsyncIterator[tuple[grpc.aio.Channel, Target]]:
    """A channel to the first of ``target``'s seed brokers where a server answers (see
    :func:`check_reachable`; each seed in turn), with ``target`` reordered so that seed
    comes first (give both to a client: ``channel=`` stands for the first seed); closed
    on the way out. When no seed answers, the error names the last one tried."""
    seeds = target.broker.split(",")
    for i, seed in enumerate(seeds):
        one = replace(target, broker=seed)
        channel = aio_channel(**one.kwargs())
        try:
            await check_reachable(channel, one, timeout_s)
        except click.ClickException:
            await channel.close()
            if i + 1 == len(seeds):
                raise
            continue
        try:
            rest = [s for s in seeds if s != seed]
            yield channel, replace(target, broker=",".join([seed, *rest]))
        finally:
            await channel.close()
        return


async def check_reachable(channel: grpc.aio.Channel, target: Target, timeout_s: float) -> None:
    """Return once a server answers on ``channel`` (one ``grpc.health.v1`` check, which
    needs no token); raise a one-line :class:`click.ClickException` naming the address and
    what to check when none does within ``timeout_s``.

    The check does not wait for a connection that failed (gRPC's fail-fast call): a
    refused connection or an unknown host ends it at once, an unroutable address after
    ``timeout_s``. Any answer but ``UNAVAILABLE`` or ``DEADLINE_EXCEEDED`` (even an
    error) means something is there.
    """
    try:
        await HealthStub(channel).Check(HealthCheckRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        code, details = exc.code(), exc.details() or ""
        if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return
        if "handshake" in details.lower():
            raise click.ClickException(explain(Unavailable(details, code), target)) from exc
        cause = (
            f"no answer within {timeout_s:g} s"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED
            else details.rsplit(": ", 1)[-1].strip(" []").lower()
        )
        raise click.ClickException(unreachable(target, cause)) from exc


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


@click.command()
@click.argument("topic", required=False, type=TOPIC_NAME)
@click.option("--subscription", "-s", required=True, type=SUBSCRIPTION_NAME)
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
        if offset > INT64_MAX:
            raise click.BadParameter(
                f"offset {offset} is past the largest offset ({INT64_MAX}); use latest",
                param_hint="--to",
            )
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
    listing = await admin.subscription_listing()
    topics = sorted({s.topic for s in listing.subscriptions if s.subscription == subscription})
    if listing.offline and len(topics) < 2:  # an unread topic may hold the name too
        unread = ", ".join(g.topic for g in listing.offline)
        found = f"exists on topic {topics[0]}" if topics else "is on no topic read"
        raise click.ClickException(
            f"subscription {subscription!r} {found}, and the owners of topics {unread} "
            "cannot be asked now; name the topic"
        )
    if len(topics) == 1:
        return topics[0]
    if not topics:
        raise click.ClickException(f"no topic has a subscription named {subscription!r}")
    raise click.ClickException(
        f"subscription {subscription!r} exists on topics {', '.join(topics)}; name the topic"
    )
