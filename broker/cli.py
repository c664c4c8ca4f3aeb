"""The ``headrace`` command line.

Role: one entry point with subcommands: ``serve`` runs a broker; ``topics``, ``produce``,
``consume``, ``lag`` and ``seek`` talk to one (:mod:`broker.cli_client`), and so does
``dlq`` (:mod:`broker.cli_dlq`); ``tokens`` edits the bearer tokens file
(:mod:`broker.cli_tokens`); ``wal inspect`` reads a partition directory offline.

Conventions (DESIGN section 4): exit code 0 on success, 1 on error, 2 on usage errors;
errors are one clear line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version

import click
import uvloop

import broker._grpc_env  # noqa: F401 - first of ours: sets gRPC's log level before grpc loads
from broker.app import serve as run_broker
from broker.cli_client import consume, lag, produce, seek, topics
from broker.cli_dlq import dlq
from broker.cli_tokens import tokens
from broker.config import BrokerConfig, ConfigError
from broker.errors import (
    FileLimitError,
    InsecureListenError,
    ListenError,
    TlsSetupError,
    TokensFileError,
)
from wal.errors import DataDirLockedError, WalIOError
from wal.inspect import inspect_dir


def _version() -> str:
    try:
        return version("headrace")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


class _Cli(click.Group):
    """The top group; also turns an argument that is not UTF-8 into one error line."""

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
@click.version_option(_version(), "-V", "--version", prog_name="headrace")
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
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
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
    log_level: str,
) -> None:
    """Run a broker until SIGINT or SIGTERM.

    On an address other hosts can reach it refuses to start without TLS and tokens (or
    client certificates), unless --insecure is given; see README "Security".
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
        config = config.replace(security=security)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    try:
        with runner:
            runner.run(run_broker(config))
    except (
        DataDirLockedError,
        ListenError,
        FileLimitError,
        TlsSetupError,
        InsecureListenError,
        TokensFileError,
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


@cli.group()
def wal() -> None:
    """Offline tools for a partition's write-ahead log (read-only)."""


@wal.command("inspect")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, readable=True))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
def wal_inspect(directory: str, as_json: bool) -> None:
    """Scan every segment in DIRECTORY fully and report damage. Changes nothing.

    Exits 1 when any segment is damaged.
    """
    try:
        reports = inspect_dir(directory)
    except OSError as exc:
        raise click.ClickException(f"cannot read {directory}: {exc.strerror or exc}") from exc
    if as_json:
        click.echo(json.dumps([asdict(r) | {"clean": r.is_clean} for r in reports]))
    else:
        click.echo(
            f"{'segment':<26}{'bytes':>12}{'valid':>12}{'batches':>9}"
            f"{'records':>10}{'next offset':>13}  status"
        )
        for r in reports:
            status = "ok" if r.is_clean else f"DAMAGED: {r.problem}"
            click.echo(
                f"{r.name:<26}{r.size_bytes:>12}{r.valid_bytes:>12}{r.batches:>9}"
                f"{r.records:>10}{r.next_offset:>13}  {status}"
            )
    if not all(r.is_clean for r in reports):
        sys.exit(1)


cli.add_command(topics)
cli.add_command(produce)
cli.add_command(consume)
cli.add_command(lag)
cli.add_command(seek)
cli.add_command(dlq)
cli.add_command(tokens)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="headrace")
