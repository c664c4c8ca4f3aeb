"""What every ``headrace`` command that talks to a broker as a client shares: the
connection options, the one-line errors, the reachability check, the confirmation of a
destructive command, a record's bytes as JSON. The commands are each in their own module:
``topics`` (:mod:`broker.cli_topics`), ``seek`` (:mod:`broker.cli_seek`), ``produce``
(:mod:`broker.cli_produce`), ``consume`` (:mod:`broker.cli_consume`), ``dlq``
(:mod:`broker.cli_dlq`), ``lag`` (:mod:`broker.cli_lag`), ``subscriptions``
(:mod:`broker.cli_subscriptions`) and ``cluster`` (:mod:`broker.cli_cluster`).

Role: every client command takes ``--broker HOST:PORT`` (env ``HEADRACE_BROKER``),
``--token`` (env ``HEADRACE_TOKEN``) and ``--tls-ca``, ``--tls-cert``, ``--tls-key`` (env
``HEADRACE_TLS_CA``, ``HEADRACE_TLS_CERT``, ``HEADRACE_TLS_KEY``), all added by
:func:`broker_option` and handed to the command as one :class:`Target`, and runs its
client calls through :func:`run`. Client errors print one line on stderr and exit 1 (a
failed TLS handshake says which option to check; an HTTP server at the address, such as a
broker's metrics listener, is named as one: :mod:`broker.cli_probe`); usage errors exit 2
(click), bad security options included.

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
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import click
import grpc
from grpc_health.v1.health_pb2 import HealthCheckRequest
from grpc_health.v1.health_pb2_grpc import HealthStub

from client import (
    DEFAULT_BROKER,
    ClientError,
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
