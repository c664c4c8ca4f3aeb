"""The ``headrace`` command line.

Role: one entry point with subcommands: ``serve`` runs a broker; ``topics``
(:mod:`broker.cli_topics`) and ``seek`` (:mod:`broker.cli_seek`) talk to one, and so do
``produce`` (:mod:`broker.cli_produce`), ``consume`` (:mod:`broker.cli_consume`), ``lag``
(:mod:`broker.cli_lag`) and ``dlq`` (:mod:`broker.cli_dlq`), all sharing
:mod:`broker.cli_client`'s connection options and errors; ``tokens`` edits the bearer
tokens file (:mod:`broker.cli_tokens`); ``cluster status|local`` look at a cluster and run
one on loopback (:mod:`broker.cli_cluster`); ``wal inspect`` reads a partition directory offline
(``DATA_DIR/topics/TOPIC/PARTITION``, or ``--data-dir DATA_DIR TOPIC PARTITION``; a path
that is not one is answered with that layout). ``serve`` prints a banner once the broker
listens: the bound addresses, the data directory and the quickstart's first steps
(:data:`TOUR`), so ``make run`` needs no banner of its own.

Conventions (docs/quickstart.md): exit code 0 on success, 1 on error, 2 on usage errors;
errors are one clear line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import shutil
import sys
from dataclasses import asdict

import click
import uvloop

from broker.config import BrokerConfig, parse_address
from broker.config_cluster import check_cluster
from broker.errors import (
    ConfigError,
    FileLimitError,
    InsecureListenError,
    ListenError,
    TlsSetupError,
    TokensFileError,
    TopicMetadataError,
)
from broker.logs import LogFormat
from broker.logs import configure as configure_logging
from proto.names import NAME_RULE, is_valid_name
from wal.errors import DataDirLockedError, WalIOError
from wal.inspect import inspect_dir
from wal.naming import LOG_SUFFIX

#: Subcommands imported only when they run (``module:attribute``): ``serve`` does not load
#: the client library, and the client commands do not load the broker. That keeps a restart
#: after a crash fast (imports are most of it) and a client command quick to start.
_LAZY = {
    "topics": "broker.cli_topics:topics",
    "produce": "broker.cli_produce:produce",
    "consume": "broker.cli_consume:consume",
    "lag": "broker.cli_lag:lag",
    "seek": "broker.cli_seek:seek",
    "dlq": "broker.cli_dlq:dlq",
    "subscriptions": "broker.cli_subscriptions:subscriptions",
    "tokens": "broker.cli_tokens:tokens",
    "cluster": "broker.cli_cluster:cluster",
}


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - 40 ms, only when asked

    try:
        found = version("headrace")
    except PackageNotFoundError:  # running from a source tree that is not installed
        found = "0+unknown"
    click.echo(f"headrace, version {found}")
    ctx.exit()


class _Cli(click.Group):
    """The top group: loads the :data:`_LAZY` subcommands when they are asked for, and
    turns an argument that is not UTF-8 into one error line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *_LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _LAZY.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except UnicodeEncodeError as exc:
            # argv bytes that are not UTF-8 reach Python as lone surrogates, which gRPC
            # cannot send: say which argument, not a traceback.
            shown = repr(exc.object[:60]) if isinstance(exc.object, str) else "an argument"
            raise click.ClickException(
                f"{shown} is not UTF-8 text; names, keys and values sent to the broker must be"
            ) from exc


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-V",
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
def cli() -> None:
    """Headrace: a durable message broker."""


@cli.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML file.")
@click.option("--data-dir", help="Where topics live. [default: ./data]")
@click.option("--listen", help="gRPC host:port. [default: 127.0.0.1:50051]")
@click.option("--metrics-listen", help="Prometheus host:port. [default: 127.0.0.1:9464]")
@click.option("--tls-cert", help="PEM server certificate chain ([security] tls_cert).")
@click.option("--tls-key", help="PEM private key of --tls-cert ([security] tls_key).")
@click.option(
    "--tls-client-ca", help="PEM CAs of client certificates: mutual TLS ([security] tls_client_ca)."
)
@click.option(
    "--tokens-file", help="Require bearer tokens from this file ([security] tokens_file)."
)
@click.option(
    "--insecure",
    is_flag=True,
    default=None,
    help="Serve on a non-loopback address without TLS plus tokens (or client certificates).",
)
@click.option(
    "--cluster-etcd",
    metavar="HOST:PORT[,HOST:PORT...]",
    help="Join a cluster through these etcd endpoints ([cluster] etcd); needs --node-id.",
)
@click.option(
    "--node-id", help="This broker's unique, stable name in the cluster ([cluster] node_id)."
)
@click.option(
    "--advertise",
    metavar="HOST:PORT",
    help="Where other brokers and clients call this one ([cluster] advertise; default: --listen).",
)
@click.option(
    "--cluster-tokens",
    is_flag=True,
    default=None,
    help="Require bearer tokens kept in the cluster's etcd ([cluster] tokens; `headrace tokens "
    "create --cluster-etcd`); not with --tokens-file.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
)
@click.option(
    "--log-format",
    type=click.Choice([f.value for f in LogFormat]),
    help="text, or json: one JSON object per line ([broker] log_format; default text).",
)
def serve(  # noqa: PLR0917 - click passes every option as an argument
    config_path: str | None,
    data_dir: str | None,
    listen: str | None,
    metrics_listen: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    tokens_file: str | None,
    insecure: bool | None,
    cluster_etcd: str | None,
    node_id: str | None,
    advertise: str | None,
    cluster_tokens: bool | None,
    log_level: str,
    log_format: str | None,
) -> None:
    """Run a broker until SIGINT or SIGTERM.

    On an address other hosts can reach it refuses to start without TLS and tokens (or
    client certificates), unless --insecure is given; see docs/operations/security.md.
    With --cluster-etcd (or [cluster] etcd) it joins a cluster as --node-id; etcd off
    loopback without [cluster] etcd TLS is refused the same way. With --cluster-tokens (or
    [cluster] tokens) every RPC needs a bearer token kept in that etcd.
    """
    try:
        config = BrokerConfig.load(
            config_path, data_dir=data_dir, listen=listen, metrics_listen=metrics_listen
        )
        security = config.security.replace(
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
            tokens_file=tokens_file,
            insecure=insecure,
        )
        cluster = config.cluster.replace(
            etcd=_endpoints(cluster_etcd),
            node_id=node_id,
            advertise=advertise,
            tokens=cluster_tokens,
        )
        config = config.replace(
            security=security, cluster=cluster, log_format=log_format and LogFormat(log_format)
        )
        check_cluster(
            config.cluster,
            config.listen,
            insecure=config.security.insecure,
            tokens_file=config.security.tokens_file,
            tls_cert=config.security.tls_cert,
            tls_client_ca=config.security.tls_client_ca,
        )
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    configure_logging(log_level, config.log_format)
    from broker.app import serve as run_broker  # noqa: PLC0415 - client commands never load it

    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    try:
        with runner:
            runner.run(
                run_broker(config, on_ready=lambda b: _print_banner(config, b.port, b.metrics_port))
            )
    except (
        ConfigError,
        DataDirLockedError,
        ListenError,
        FileLimitError,
        TlsSetupError,
        InsecureListenError,
        TokensFileError,
        TopicMetadataError,
    ) as exc:
        raise click.ClickException(str(exc)) from exc
    except WalIOError as exc:
        raise click.ClickException(
            f"cannot serve from data directory {config.data_dir}: {exc}; make it writable "
            "(or free space), or give another --data-dir"
        ) from exc
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise click.ClickException(f"cannot serve: {exc.strerror or exc}{where}") from exc


#: The first steps of the quickstart (docs/quickstart.md), which the serve banner suggests; a test
#: holds the two to the same text. ``{headrace}`` is the program as it was started.
TOUR = (
    "{headrace} topics create orders --partitions 3",
    "seq 5 | {headrace} produce orders",
    "{headrace} consume orders --subscription billing --count 3 --timeout 5",
    "{headrace} lag",
)


def _endpoints(flag: str | None) -> tuple[str, ...] | None:
    """``--cluster-etcd``'s comma-separated endpoints (blanks around each dropped)."""
    if flag is None:
        return None
    return tuple(e.strip() for e in flag.split(","))


def _print_banner(config: BrokerConfig, port: int, metrics_port: int) -> None:
    """Say on stderr, once the broker listens, where it is (the bound ports, not the
    configured ones, which may be 0) and what to try in another terminal."""
    address = _join(parse_address(config.listen)[0], port)
    metrics = (
        f"http://{_join(parse_address(config.metrics_listen)[0], metrics_port)}/metrics"
        if config.metrics_listen
        else "off"
    )
    headrace = _program()
    lines = [
        f"headrace: serving on {address}, data in {config.data_dir}, metrics {metrics}. "
        "Ctrl-C stops it.",
        "Try, in another terminal (docs/quickstart.md has more):",
    ]
    if address != BrokerConfig().listen:
        lines.append(f"  export HEADRACE_BROKER={address}")
    lines += [f"  {step.format(headrace=headrace)}" for step in TOUR]
    if config.log_format is LogFormat.JSON:  # stderr stays one JSON object per line
        logging.getLogger(__name__).info("%s", "\n".join(lines))
    else:
        click.echo("\n".join(lines), err=True)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _program() -> str:
    """How to run this ``headrace`` again: the path it was started by (``.venv/bin/headrace``
    under ``make run``), relative to the working directory when inside it."""
    started = sys.argv[0]
    if os.path.basename(started) != "headrace":
        return "headrace"  # python -m, or a test's entry point
    on_path = shutil.which("headrace")
    if on_path and os.path.realpath(on_path) == os.path.realpath(started):
        return "headrace"
    relative = os.path.relpath(started)
    return started if relative.startswith("..") else relative


@cli.group()
def wal() -> None:
    """Offline tools for a partition's write-ahead log (read-only)."""


@wal.command("inspect")
@click.argument("location", nargs=-1, required=True, metavar="DIRECTORY | TOPIC PARTITION")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="The broker's data directory; then name the partition as TOPIC PARTITION.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
def wal_inspect(location: tuple[str, ...], data_dir: str | None, as_json: bool) -> None:
    """Scan every segment of one partition's log fully and report damage. Changes nothing.

    The partition is a DIRECTORY, DATA_DIR/topics/TOPIC/PARTITION (e.g.
    ./data/topics/orders/0), or --data-dir DATA_DIR TOPIC PARTITION. Each segment's
    status is clean (the --json "clean" flag) or DAMAGED: and the problem. Exits 1 when
    any segment is damaged.
    """
    directory = _partition_dir(location, data_dir)
    try:
        reports = inspect_dir(directory)
    except OSError as exc:
        raise click.ClickException(f"cannot read {directory}: {exc.strerror or exc}") from exc
    if as_json:
        click.echo(json.dumps([asdict(r) | {"clean": r.is_clean} for r in reports]))
    else:
        from broker.cli_output import table  # noqa: PLC0415 - rich only for this table

        rows = [
            asdict(r) | {"status": "clean" if r.is_clean else f"DAMAGED: {r.problem}"}
            for r in reports
        ]
        click.echo(table(rows, _SEGMENT_FIELDS))
    if not all(r.is_clean for r in reports):
        sys.exit(1)


_SEGMENT_FIELDS = (
    "name",
    "size_bytes",
    "valid_bytes",
    "batches",
    "records",
    "next_offset",
    "status",
)
_LAYOUT = (
    "partitions live in DATA_DIR/topics/TOPIC/PARTITION, e.g. ./data/topics/orders/0 "
    "(or: headrace wal inspect --data-dir ./data orders 0)"
)


def _partition_dir(location: tuple[str, ...], data_dir: str | None) -> str:
    """The partition directory the arguments name; a usage error, with the layout and a
    guess where one fits, when they name none."""
    if data_dir is not None:
        if len(location) != 2 or not location[1].isdecimal() or len(location[1]) > 6:
            raise click.UsageError(  # six digits hold any partition a topic may have
                f"with --data-dir, name the partition as TOPIC PARTITION (e.g. orders 0), "
                f"not {' '.join(location)[:200]!r}"
            )
        topic, partition = location
        if not is_valid_name(topic):
            raise click.UsageError(f"{topic!r} is not a valid topic name: {NAME_RULE}")
        path = os.path.join(data_dir, "topics", topic, str(int(partition)))
    elif len(location) != 1:
        raise click.UsageError(
            f"expected one partition DIRECTORY, or --data-dir DIR TOPIC PARTITION; {_LAYOUT}"
        )
    else:
        path = location[0]
    if not os.path.isdir(path):
        raise click.UsageError(f"no partition directory at {path}; {_LAYOUT}{_guess(path)}")
    names = os.listdir(path)
    if not any(n.endswith(LOG_SUFFIX) for n in names):
        raise click.UsageError(f"{path} holds no log segments; {_LAYOUT}{_guess(path)}")
    return path


def _guess(path: str) -> str:
    """A partition directory the user may have meant: ``X/orders-0`` →
    ``X/topics/orders/0``, a data directory → its first partition, a topic directory →
    its first partition."""
    parent, name = os.path.split(path.rstrip(os.sep) or path)
    topic, dash, partition = name.rpartition("-")
    candidates = [os.path.join(parent, "topics", topic, partition)] if dash else []
    if os.path.isdir(path):
        topics = os.path.join(path, "topics")
        if os.path.isdir(topics):
            candidates += [os.path.join(topics, t, "0") for t in sorted(os.listdir(topics))]
        candidates += [
            os.path.join(path, p) for p in sorted(os.listdir(path), key=_number) if p.isdecimal()
        ]
    found = next((c for c in candidates if os.path.isdir(c)), None)
    return f"; did you mean {found}?" if found else ""


def _number(name: str) -> int:
    return int(name) if name.isdecimal() else -1


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="headrace")
