"""``headrace tokens create|list|revoke``: manage the bearer tokens of a broker.

Role: parse arguments and change the tokens file through :class:`broker.auth.TokensFile`;
no broker is contacted (a running broker rereads the file within a second). The file is
``--tokens-file PATH``, else ``[security] tokens_file`` of ``--config FILE``.

Cluster mode: with ``--cluster-etcd H:P[,H:P...]`` (or a ``--config`` whose ``[cluster]
etcd`` is set, with its ``prefix`` and etcd TLS files) the tokens live in etcd instead, one
key per token (:mod:`cluster.tokens`), same format, only the hash stored; every broker of
the cluster watches them, so a token works on every broker at once and a revocation
reaches every broker within about a second. ``--tokens-file`` wins over both.

``create`` prints the token on stdout once, alone on its line (``TOKEN=$(headrace tokens
create ...)``); the file keeps only its hash, so it cannot be shown again. ``list`` never
shows a secret or a hash, only ids. Exit codes: 0 success, 1 error (one line on stderr),
2 usage.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from broker.auth import Grant, TokenEntry, TokenSet, TokensFile, mint, parse_grant
from broker.auth.cluster_tokens import etcd_tls, to_entry, to_record
from broker.auth.grants import make_grant
from broker.cli_output import table
from broker.config import BrokerConfig
from broker.config_cluster import ClusterConfig
from broker.errors import ConfigError, TokensFileError
from cluster.errors import ClusterError
from cluster.etcd import EtcdStore
from cluster.records import Keys
from cluster.tokens import EtcdTokens

T = TypeVar("T")
_ROLES = click.Choice(["admin", "produce", "consume"])


def _file_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--cluster-etcd",
        envvar="HEADRACE_CLUSTER_ETCD",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="Keep the tokens in this cluster's etcd (env HEADRACE_CLUSTER_ETCD).",
    )(command)
    command = click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="The broker's TOML file: its [cluster] etcd when set, else its [security] "
        "tokens_file.",
    )(command)
    return click.option(
        "--tokens-file",
        envvar="HEADRACE_TOKENS_FILE",
        type=click.Path(dir_okay=False),
        help="The tokens file (env HEADRACE_TOKENS_FILE); wins over --config.",
    )(command)


class _Etcd:
    """The tokens of a cluster, in its etcd: where, and how to reach it."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster
        self.path = f"etcd {','.join(cluster.etcd or ())} ({cluster.prefix}tokens/)"

    def run(self, action: Callable[[EtcdTokens], Awaitable[T]]) -> T:
        """Connect, run ``action``, close; a cluster error becomes one line, exit code 1."""

        async def go() -> T:
            endpoints = list(self.cluster.etcd or ())
            store = await EtcdStore.connect(endpoints, tls=etcd_tls(self.cluster))
            async with store:
                return await action(EtcdTokens(store, Keys(self.cluster.prefix)))

        try:
            return asyncio.run(go())
        except (ClusterError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc


def _tokens_file(
    tokens_file: str | None, config_path: str | None, cluster_etcd: str | None = None
) -> TokensFile | _Etcd:
    if tokens_file:
        return TokensFile(tokens_file)
    if cluster_etcd:
        try:
            endpoints = tuple(e.strip() for e in cluster_etcd.split(","))
            return _Etcd(ClusterConfig(etcd=endpoints, node_id="tokens-cli"))
        except ConfigError as exc:
            raise click.UsageError(f"--cluster-etcd: {exc}") from exc
    if config_path:
        try:
            config = BrokerConfig.from_toml(config_path)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from exc
        if config.cluster.enabled:
            return _Etcd(config.cluster)
        if config.security.tokens_file:
            return TokensFile(config.security.tokens_file)
        raise click.UsageError(
            f"{config_path} sets neither [cluster] etcd nor [security] tokens_file"
        )
    raise click.UsageError(
        "no tokens file: pass --tokens-file PATH or --config FILE (or --cluster-etcd H:P "
        "for a cluster's tokens in etcd)"
    )


def _run(action: Callable[[], T]) -> T:
    """Run a file operation; its errors become one line and exit code 1."""
    try:
        return action()
    except (TokensFileError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
def tokens() -> None:
    """Create, list and revoke bearer tokens (in the tokens file, or a cluster's etcd; no
    broker needed)."""


def _grants(
    role: str | None, topics: str | None, subs: str | None, more: tuple[str, ...]
) -> list[Grant]:
    if (role is None) != (topics is None):
        raise click.UsageError("--role and --topics go together")
    if subs is not None and role is None:
        raise click.UsageError("--subscriptions needs --role consume (or admin) and --topics")
    try:
        grants = [make_grant(role, topics, subs or "*")] if role and topics else []
        grants += [parse_grant(text) for text in more]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if not grants:
        raise click.UsageError("give a grant: --role ROLE --topics PATTERN, or --grant")
    return grants


@tokens.command("create")
@click.option("--name", required=True, help="Who or what the token is for (unique).")
@click.option("--role", type=_ROLES, help="The role of the first grant.")
@click.option("--topics", help="Topic name pattern of that grant (glob: orders.*).")
@click.option("--subscriptions", help="Subscription pattern (consume, admin). [default: *]")
@click.option(
    "--grant",
    "more",
    multiple=True,
    metavar="ROLE:TOPICS[:SUBS]",
    help="Another grant; repeatable.",
)
@_file_options
def create(  # click passes keywords
    *,
    name: str,
    role: str | None,
    topics: str | None,
    subscriptions: str | None,
    more: tuple[str, ...],
    tokens_file: str | None,
    config_path: str | None,
    cluster_etcd: str | None,
) -> None:
    """Create a token and print it once (the file, or etcd, keeps only its hash)."""
    grants = _grants(role, topics, subscriptions, more)
    store = _tokens_file(tokens_file, config_path, cluster_etcd)
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    made: list[tuple[str, TokenEntry]] = []

    def add(current: TokenSet) -> TokenSet:
        made.append(mint(name, grants, created, (e.id for e in current.entries)))
        return current.added(made[-1][1])

    if isinstance(store, _Etcd):

        async def put(tokens: EtcdTokens) -> None:
            current = TokenSet(to_entry(r) for r in await tokens.list())
            add(current)  # the name checked here too; etcd checks it again atomically
            await tokens.create(to_record(made[-1][1]))

        store.run(put)
    else:
        _run(lambda: store.update(add))
    token, entry = made[-1]
    click.echo(token)
    click.echo(
        f"created token {entry.label} with {', '.join(map(str, grants))} in {store.path}; "
        "it is shown only this once",
        err=True,
    )


@tokens.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@_file_options
def list_(
    as_json: bool, tokens_file: str | None, config_path: str | None, cluster_etcd: str | None
) -> None:
    """List tokens: id, name, grants, creation time, state. Never secrets or hashes."""
    store = _tokens_file(tokens_file, config_path, cluster_etcd)
    if isinstance(store, _Etcd):

        async def read(tokens: EtcdTokens) -> tuple[TokenEntry, ...]:
            return tuple(to_entry(r) for r in await tokens.list())

        entries = store.run(read)
    else:
        file = store
        entries = _run(lambda: file.load(missing_ok=True)).entries
    if as_json:
        click.echo(json.dumps([_entry_json(e) for e in entries]))
        return
    if not entries:
        if isinstance(store, TokensFile) and not os.path.exists(store.path):
            click.echo(
                f"no tokens: {store.path} does not exist (`headrace tokens create` makes it)"
            )
        else:
            click.echo("no tokens")
        return
    rows = [
        {
            "id": e.id,
            "name": e.name,
            "state": "revoked" if e.revoked else "active",
            "created": e.created,
            "grants": " ".join(map(str, e.grants)),
        }
        for e in entries
    ]
    click.echo(table(rows, ("id", "name", "state", "created", "grants")))


def _entry_json(entry: TokenEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "name": entry.name,
        "grants": [
            {"role": g.role.value, "topics": g.topics, "subscriptions": g.subscriptions}
            for g in entry.grants
        ],
        "created": entry.created,
        "revoked": entry.revoked,
    }


@tokens.command("revoke")
@click.argument("token", metavar="ID|NAME")
@_file_options
def revoke(
    token: str, tokens_file: str | None, config_path: str | None, cluster_etcd: str | None
) -> None:
    """Revoke a token by id or name; a running broker refuses it within a second."""
    store = _tokens_file(tokens_file, config_path, cluster_etcd)
    if isinstance(store, _Etcd):

        async def mark_revoked(tokens: EtcdTokens) -> tuple[TokenEntry, bool]:
            record, already = await tokens.revoke(token)
            return to_entry(record), already

        entry, was = store.run(mark_revoked)
        click.echo(f"revoked token {entry.label}{' (it was already revoked)' if was else ''}")
        return
    found: list[TokenEntry] = []

    def mark(current: TokenSet) -> TokenSet:
        entry = current.find(token)
        if entry is None:
            raise ValueError(f"no token with id or name {token!r} in {store.path}")
        found.append(entry)
        return current.revoked(entry.id)

    _run(lambda: store.update(mark))
    already = " (it was already revoked)" if found[0].revoked else ""
    click.echo(f"revoked token {found[0].label}{already}")
