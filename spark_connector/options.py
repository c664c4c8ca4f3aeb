"""Parse and check the ``.option()`` strings of the source and the sink.

Role: turn Spark's string options into frozen :class:`SourceOptions` / :class:`SinkOptions`
once, on the driver, so that a bad option fails ``load()`` (or ``start()``) with a message
that names it, and the reader and writer only ever see valid values.

Option names are matched without regard to case, as Spark does. An unknown option is an
error that lists the known ones: a misspelt ``maxRecordsPerTriger`` must not be ignored.

Offsets given in JSON follow Spark's Kafka source: ``{"0": 23, "1": -2}`` maps partition
numbers to offsets, where ``-2`` means the earliest retained offset and ``-1`` the head.
Partitions not named start at the earliest offset (``startingOffsets``) or end at the head
(``endingOffsets``).

Security: ``token`` is sent as a bearer token on every call; ``tlsCa`` (a PEM CA bundle)
turns TLS on, and ``tlsCert`` with ``tlsKey`` add a client certificate (mutual TLS). The
files are read once here, on the driver, so that a missing one fails ``load()``; the
executors open them again, so each path must exist on every executor too.

Imports neither ``asyncio``, ``os`` nor ``time``; the one I/O is reading the TLS files
through :func:`client.check_security`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from client import check_security, parse_brokers
from proto.names import NAME_RULE, is_valid_name
from proto.shown import shown, shown_text
from spark_connector.errors import OptionError

DEFAULT_BROKER = "127.0.0.1:50051"
#: JSON offset meaning "the earliest retained offset", as in Spark's Kafka source.
EARLIEST = -2
#: JSON offset meaning "the head" (the next offset to be written).
LATEST = -1

SOURCE_OPTIONS = (
    "broker",
    "topic",
    "subscription",
    "token",
    "tlsCa",
    "tlsCert",
    "tlsKey",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "maxRecordsPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "includeHeaders",
)
SINK_OPTIONS = ("broker", "topic", "token", "tlsCa", "tlsCert", "tlsKey")
#: Our option names of the client's security arguments.
SECURITY_OPTIONS = {"token": "token", "tls_ca": "tlsCa", "tls_cert": "tlsCert", "tls_key": "tlsKey"}
#: The most tasks ``minPartitions`` may ask one read to be cut into: each is a Spark task
#: the driver plans and tracks, so a typo of extra zeros must not ask for millions.
MAX_MIN_PARTITIONS = 100_000
#: Options Spark itself passes to a source or sink along with the user's; not ours to check.
SPARK_OPTIONS = frozenset({"checkpointlocation", "path"})

#: A starting position: "acked", "earliest", "latest", or offsets per partition.
Start = str | dict[int, int]
#: An ending position: "latest" or offsets per partition.
End = str | dict[int, int]


class ClientSecurity(TypedDict):
    """The token and TLS keyword arguments every client class takes."""

    token: str | None
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What a read asks for; every field checked.

    Attributes:
        broker: ``host:port`` of the broker, or seed brokers of a cluster separated by
            commas (each topic is read from and acked at its owner). Default
            ``127.0.0.1:50051``.
        topic: The topic to read. Required.
        subscription: Whose cursor a stream starts from (``startingOffsets=acked``) and
            acks Spark's commits to. A stream without one reads from ``startingOffsets``
            (default earliest) and acks nothing: the broker neither shows its lag nor
            keeps its records from retention (the reader warns). Batch reads never ack.
        token: Bearer token for the broker, or ``None``.
        tls_ca: PEM CA bundle that signed the broker's certificate (TLS on), or ``None``.
        tls_cert: PEM client certificate for mutual TLS, or ``None``; with ``tls_key``.
        tls_key: PEM private key of ``tls_cert``, or ``None``.
        starting: ``"acked"`` (streams' default), ``"earliest"`` (batch default),
            ``"latest"``, or a partition -> offset dict (``EARLIEST``/``LATEST`` allowed).
        ending: ``"latest"`` (default) or a partition -> offset dict; batch reads only.
        starting_timestamp_ms: Start at the first record at or after this time, ms since
            the epoch, on every partition; instead of ``starting``.
        max_records_per_trigger: Records one micro-batch reads at most, over all
            partitions, or ``None`` for no limit.
        min_partitions: Spark tasks one read is split into at least (large offset ranges
            are cut), or ``None`` for one task per topic partition.
        fail_on_data_loss: Fail the query when records it has not read are gone. Default
            true; false skips ahead and logs what was skipped.
        include_headers: Whether rows carry the ``headers`` column. Default true.
    """

    topic: str
    broker: str = DEFAULT_BROKER
    subscription: str | None = None
    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    starting: Start = "acked"
    ending: End = "latest"
    starting_timestamp_ms: int | None = None
    max_records_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = True

    def security(self) -> ClientSecurity:
        """The token and TLS keyword arguments of every client class."""
        return _client_security(self)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """What a write asks for.

    Attributes:
        broker: ``host:port`` of the broker, or seed brokers of a cluster separated by
            commas (each topic is read from and acked at its owner). Default
            ``127.0.0.1:50051``.
        topic: The topic rows are published to. Required; it must exist.
        token: Bearer token for the broker, or ``None``.
        tls_ca: PEM CA bundle that signed the broker's certificate (TLS on), or ``None``.
        tls_cert: PEM client certificate for mutual TLS, or ``None``; with ``tls_key``.
        tls_key: PEM private key of ``tls_cert``, or ``None``.
    """

    topic: str
    broker: str = DEFAULT_BROKER
    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def security(self) -> ClientSecurity:
        """The token and TLS keyword arguments of every client class."""
        return _client_security(self)


def parse_source(options: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
    """Check a read's options.

    Args:
        options: Spark's options (names in any case).
        streaming: ``readStream`` (True) or ``read`` (False); the defaults and the allowed
            options differ. ``None`` (``DataSource.schema()``, which Spark calls before it
            says which) checks only what both share.

    Raises:
        OptionError: An option is unknown, missing, malformed, or not allowed here.
    """
    given = _canonical(options, SOURCE_OPTIONS)
    topic = _name(given, "topic", _required(given, "topic"))
    subscription = given.get("subscription")
    if subscription is not None and not subscription.strip():
        raise OptionError("subscription", "must not be empty")
    if subscription is not None:
        _name(given, "subscription", subscription)
    starting = _starting(given, streaming=streaming, has_subscription=subscription is not None)
    timestamp = _int(given, "startingTimestamp", minimum=0)
    if timestamp is not None and "startingOffsets" in given:
        raise OptionError(
            "startingTimestamp", "give either startingOffsets or startingTimestamp, not both"
        )
    if streaming and "endingOffsets" in given:
        raise OptionError("endingOffsets", "applies to batch reads (spark.read) only")
    if streaming is False and "maxRecordsPerTrigger" in given:
        raise OptionError("maxRecordsPerTrigger", "applies to streams (spark.readStream) only")
    return SourceOptions(
        topic=topic,
        broker=_broker(given),
        subscription=subscription,
        **_security(given),
        starting=starting,
        ending=_ending(given),
        starting_timestamp_ms=timestamp,
        max_records_per_trigger=_int(given, "maxRecordsPerTrigger", minimum=1),
        min_partitions=_int(given, "minPartitions", minimum=1, maximum=MAX_MIN_PARTITIONS),
        fail_on_data_loss=_bool(given, "failOnDataLoss", default=True),
        include_headers=_bool(given, "includeHeaders", default=True),
    )


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    """Check a write's options. Raises :class:`OptionError`."""
    given = _canonical(options, SINK_OPTIONS)
    topic = _name(given, "topic", _required(given, "topic"))
    return SinkOptions(topic=topic, broker=_broker(given), **_security(given))


def _client_security(options: SourceOptions | SinkOptions) -> ClientSecurity:
    return ClientSecurity(
        token=options.token,
        tls_ca=options.tls_ca,
        tls_cert=options.tls_cert,
        tls_key=options.tls_key,
    )


def _security(given: dict[str, str]) -> ClientSecurity:
    """``token``, ``tlsCa``, ``tlsCert``, ``tlsKey`` as the client's arguments, checked:
    the token can be sent, the files can be read, a certificate comes with its key."""
    args = ClientSecurity(
        token=given.get("token"),
        tls_ca=given.get("tlsCa"),
        tls_cert=given.get("tlsCert"),
        tls_key=given.get("tlsKey"),
    )
    try:
        check_security(**args)
    except ValueError as exc:
        problem = str(exc)
        for name, option in SECURITY_OPTIONS.items():
            problem = problem.replace(name, option)
        option = next((o for o in SECURITY_OPTIONS.values() if problem.startswith(o)), "tlsCa")
        raise OptionError(option, problem.removeprefix(option).lstrip(": ")) from exc
    return args


#: Spark's Kafka source and sink options that have another name here.
KAFKA_NAMES = {
    "kafka.bootstrap.servers": "broker",
    "subscribe": "topic",
    "maxoffsetspertrigger": "maxRecordsPerTrigger",
    "startingoffsetsbytimestamp": "startingOffsets (JSON) or startingTimestamp",
    "kafka.group.id": "subscription",
    "groupidprefix": "subscription",
}


def _canonical(options: Mapping[str, str], known: tuple[str, ...]) -> dict[str, str]:
    by_lower = {name.lower(): name for name in known}
    out: dict[str, str] = {}
    for name, value in options.items():
        canonical = by_lower.get(name.lower())
        if canonical is None and name.lower() in SPARK_OPTIONS:
            continue
        if canonical is None:
            ours = KAFKA_NAMES.get(name.lower())
            hint = f" (Spark's Kafka name; here it is {ours})" if ours else ""
            raise OptionError(
                name, f"is not a headrace option{hint}; the options are {', '.join(known)}"
            )
        out[canonical] = str(value)
    return out


def _required(given: dict[str, str], name: str) -> str:
    value = given.get(name, "").strip()
    if not value:
        raise OptionError(name, f"is required, e.g. .option({shown(name)}, 'orders')")
    return value


def _broker(given: dict[str, str]) -> str:
    """The ``broker`` option: one ``HOST:PORT`` or seed brokers ``h1:p1,h2:p2`` (the
    client's rule, :func:`client.parse_brokers`), joined back with commas."""
    value = given.get("broker", DEFAULT_BROKER).strip()
    try:
        return ",".join(parse_brokers(value))
    except ValueError as exc:
        raise OptionError(
            "broker",
            f"expected HOST:PORT such as 127.0.0.1:50051, or seeds HOST:PORT,HOST:PORT; "
            f"got {shown(value)}: {str(exc).removeprefix('broker ')}",
        ) from None


def _int(given: dict[str, str], name: str, *, minimum: int, maximum: int = 2**63 - 1) -> int | None:
    raw = given.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(name, f"expected a whole number, got {shown(raw)}") from None
    if not minimum <= value <= maximum:
        raise OptionError(name, f"must be from {minimum} to {maximum}, got {value}")
    return value


def _bool(given: dict[str, str], name: str, *, default: bool) -> bool:
    raw = given.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(name, f"expected true or false, got {shown(raw)}")
    return value == "true"


def _name(given: dict[str, str], option: str, name: str) -> str:
    """``name``, checked against the broker's name rule, so a bad one fails ``load()``
    (not the query's first batch); a comma names two topics, which a source cannot read."""
    if not is_valid_name(name):
        more = "; a query reads one topic: use one source per topic" if "," in name else ""
        raise OptionError(option, f"{shown(name)} is not a valid {option} name: {NAME_RULE}{more}")
    return name


def _starting(given: dict[str, str], *, streaming: bool | None, has_subscription: bool) -> Start:
    raw = given.get("startingOffsets")
    if raw is None:
        return "acked" if streaming and has_subscription else "earliest"
    value = raw.strip()
    if value.lower() == "acked":
        if not has_subscription:
            raise OptionError(
                "startingOffsets", "'acked' starts at a subscription's cursor: set 'subscription'"
            )
        return "acked"
    if value.lower() in ("earliest", "latest"):
        if value.lower() == "latest" and streaming is False:
            raise OptionError(
                "startingOffsets", "'latest' would read nothing in a batch read; use earliest"
            )
        return value.lower()
    return _offsets_json("startingOffsets", value, allow=(EARLIEST, LATEST))


def _ending(given: dict[str, str]) -> End:
    raw = given.get("endingOffsets")
    if raw is None or raw.strip().lower() == "latest":
        return "latest"
    return _offsets_json("endingOffsets", raw.strip(), allow=(LATEST,))


def _offsets_json(name: str, raw: str, *, allow: tuple[int, ...]) -> dict[int, int]:
    words = "'acked', 'earliest', 'latest'" if name == "startingOffsets" else "'latest'"
    hint = f'expected {words} or JSON such as {{"0": 23, "1": -2}}'
    try:
        doc = json.loads(raw)
    except ValueError:
        raise OptionError(name, f"{hint}, got {shown(raw)}") from None
    if not isinstance(doc, dict) or not doc:
        raise OptionError(name, f"{hint}, got {shown(raw)}")
    out: dict[int, int] = {}
    for key, offset in doc.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise OptionError(name, f"partition {shown(key)} is not a partition number; {hint}")
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise OptionError(
                name, f"offset {shown_text(repr(offset))} of partition {key} is not a whole number"
            )
        if offset < 0 and offset not in allow:
            special = " or ".join(
                f"{a} ({'earliest' if a == EARLIEST else 'latest'})" for a in allow
            )
            raise OptionError(name, f"offset {offset} of partition {key}: use >= 0, or {special}")
        out[int(key)] = offset
    return out
