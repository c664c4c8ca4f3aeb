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
import importlib
import json
import logging
import sys
from dataclasses import asdict

import click
import uvloop

import broker._grpc_env  # noqa: F401 - first of ours: sets gRPC's log level before grpc loads
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

#: Subcommands imported only when they run (``module:attribute``): ``serve`` does not load
#: the client library, and the client commands do not load the broker. That keeps a restart
#: after a crash fast (imports are most of it) and a client command quick to start.
_LAZY = {
    "topics": "broker.cli_client:topics",
    "produce": "broker.cli_client:produce",
    "consume": "broker.cli_client:consume",
    "lag": "broker.cli_client:lag",
    "seek": "broker.cli_client:seek",
    "dlq": "broker.cli_dlq:dlq",
    "subscriptions": "broker.cli_subscriptions:subscriptions",
    "tokens": "broker.cli_tokens:tokens",
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
    from broker.app import serve as run_broker  # noqa: PLC0415 - client commands never load it

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


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="headrace")
