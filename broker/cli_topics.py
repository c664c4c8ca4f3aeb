"""``headrace topics``: create, list, describe and delete topics from the command line.

Role: the four commands over :class:`client.AsyncAdminClient`, and how a topic is shown:
a table row per partition (:data:`TOPIC_FIELDS`; in a cluster also its owner and state,
:data:`CLUSTER_TOPIC_FIELDS`), or JSON (:func:`topic_doc`); ``describe`` of a cluster's
topic adds its replication (:func:`replication_text`) and, answered by its leader, each
follower's lag (:func:`followers_text`). The connection options, the one-line errors and
the confirmation of ``delete`` are :mod:`broker.cli_client`'s, shared by every client
command; tables and counted nouns are :mod:`broker.cli_output`'s.

Imports the client library and the CLI's shared modules; never the broker's servers.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click

from broker.cli_client import Target, broker_option, confirm, require_terminal, run
from broker.cli_output import plural, table
from broker.cli_params import TOPIC_NAME
from client import AlreadyExists, AsyncAdminClient, TopicInfo


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
