"""``headrace cluster config show|set|unset``: the cluster's configuration defaults in etcd.

Role: parse arguments, check each value by the TOML file's own rules
(:mod:`broker.cluster_defaults`), and read or change the one document
(:mod:`cluster.config_defaults`) by compare-and-set. No broker is contacted: every broker
watches the document and uses it for the topics created after a change (within about a
second). etcd is ``--cluster-etcd H:P[,H:P...]`` (env ``HEADRACE_CLUSTER_ETCD``), else the
``[cluster]`` table (endpoints, prefix, etcd TLS files) of ``--config FILE``, as
``headrace tokens`` finds it.

- ``show [--json]``: every key, its cluster value (``-``: not set, each broker's file
  decides) and the file table (``broker`` or ``wal``) whose key it overrides, or, for the
  cluster-only keys (``replication_factor``, ``min_insync_replicas``), the built-in value
  that applies when it is not set; ``--json`` prints one JSON object
  ``{key: value or null}``.
- ``set KEY=VALUE...``: all checked first; one bad value changes nothing and is one line
  on stderr naming the key and what is allowed (exit 1).
- ``unset KEY...``: each broker's file decides that key again.

Exit codes: 0 success, 1 error (one line on stderr), 2 usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import msgspec

from broker.auth.cluster_tokens import etcd_tls
from broker.cli_output import table
from broker.cluster_defaults import BUILTIN, TABLES, check_key, parse_value
from broker.config import BrokerConfig
from broker.config_cluster import ClusterConfig
from broker.errors import ConfigError
from cluster.config_defaults import EtcdDefaults
from cluster.errors import ClusterError
from cluster.etcd import EtcdStore
from cluster.records import DefaultsRecord, Keys

T = TypeVar("T")


def _etcd_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--cluster-etcd",
        envvar="HEADRACE_CLUSTER_ETCD",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="The cluster's etcd endpoints (env HEADRACE_CLUSTER_ETCD).",
    )(command)
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="A broker's TOML file: its [cluster] etcd, prefix and etcd TLS files.",
    )(command)


def _cluster(cluster_etcd: str | None, config_path: str | None) -> ClusterConfig:
    """The etcd to reach: ``--cluster-etcd`` wins over ``--config``."""
    if cluster_etcd:
        try:
            endpoints = tuple(e.strip() for e in cluster_etcd.split(","))
            return ClusterConfig(etcd=endpoints, node_id="config-cli")
        except ConfigError as exc:
            raise click.UsageError(f"--cluster-etcd: {exc}") from exc
    if config_path:
        try:
            config = BrokerConfig.from_toml(config_path)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from exc
        if config.cluster.enabled:
            return config.cluster
        raise click.UsageError(f"{config_path} does not set [cluster] etcd")
    raise click.UsageError("no etcd: pass --cluster-etcd H:P[,H:P...] or --config FILE")


def _run(cluster: ClusterConfig, action: Callable[[EtcdDefaults], Awaitable[T]]) -> T:
    """Connect, run ``action``, close; a cluster error becomes one line, exit code 1."""

    async def go() -> T:
        store = await EtcdStore.connect(list(cluster.etcd or ()), tls=etcd_tls(cluster))
        async with store:
            return await action(EtcdDefaults(store, Keys(cluster.prefix)))

    try:
        return asyncio.run(go())
    except (ClusterError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


@click.group("config")
def config() -> None:
    """Show and change the cluster's defaults for new topics (kept in etcd; every broker
    uses them within about a second)."""


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_etcd_options
def show(as_json: bool, cluster_etcd: str | None, config_path: str | None) -> None:
    """Every cluster default: its value, or - when each broker's file decides."""
    record = _run(_cluster(cluster_etcd, config_path), lambda d: d.read())
    click.echo(show_text(record) if not as_json else json.dumps(show_document(record)))


def show_document(record: DefaultsRecord) -> dict[str, Any]:
    """``show --json``: every key, ``null`` when not set cluster-wide."""
    return msgspec.structs.asdict(record)


def show_text(record: DefaultsRecord) -> str:
    """``show``'s table: key, cluster value, the file table it stands for (a cluster-only
    key: its built-in value)."""
    rows = [
        {"key": key, "value": "-" if value is None else json.dumps(value), "over": _over(key)}
        for key, value in show_document(record).items()
    ]
    return table(rows, ["key", "value", "over"])


def _over(key: str) -> str:
    if key == "unclean_leader_election":  # the one cluster-only switch
        return "built-in false"
    return f"built-in {BUILTIN[key]}" if key in BUILTIN else TABLES[key]


@config.command("set")
@click.argument("assignments", nargs=-1, required=True, metavar="KEY=VALUE...")
@_etcd_options
def set_(assignments: tuple[str, ...], cluster_etcd: str | None, config_path: str | None) -> None:
    """Set cluster defaults (checked by the config file's rules; all or nothing)."""
    values: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep:
            raise click.UsageError(f"{assignment!r} is not KEY=VALUE")
        try:
            values[key.strip()] = parse_value(key.strip(), text.strip())
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc
    cluster = _cluster(cluster_etcd, config_path)
    stored = _run(cluster, lambda d: d.change(values))
    click.echo(f"set {_listed(values)}; cluster defaults now: {_listed(stored.set_values())}")


@config.command("unset")
@click.argument("keys", nargs=-1, required=True, metavar="KEY...")
@_etcd_options
def unset(keys: tuple[str, ...], cluster_etcd: str | None, config_path: str | None) -> None:
    """Remove cluster defaults: each broker's file decides those keys again."""
    try:
        for key in keys:
            check_key(key)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    stored = _run(_cluster(cluster_etcd, config_path), lambda d: d.change({}, keys))
    click.echo(f"unset {', '.join(keys)}; cluster defaults now: {_listed(stored.set_values())}")


def _listed(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in values.items()) or "none"
