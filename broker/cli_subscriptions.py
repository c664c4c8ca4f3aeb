"""``headrace subscriptions``: list, describe and delete subscriptions from the command line.

Role: ``list``, ``describe`` and ``delete`` over :class:`client.AsyncAdminClient`, in the
style of :mod:`broker.cli_client` (whose ``--broker``, ``--token`` and ``--tls-*`` options
and error handling they share): client errors print one line on stderr and exit 1; usage
errors exit 2 (click). ``delete`` asks for confirmation, as ``dlq purge`` does, unless
``--yes``; while consumers are attached it is refused unless ``--force``.

A subscription's one-word state is the most urgent of its partitions' states (``BLOCKED``
over ``STALLED`` over ``NO_CONSUMER`` over ``LAGGING`` over ``CAUGHT_UP``): the word that
says whether someone has to act.

In a cluster ``list`` shows the subscriptions of every broker's topics with their owner
(:meth:`client.AsyncAdminClient.subscription_listing`), and one ``OFFLINE`` row per topic
whose owner could not be asked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from broker.cli_client import Target, broker_option, confirm, require_terminal, run
from broker.cli_output import plural, table
from broker.cli_params import SUBSCRIPTION_NAME, TOPIC_NAME
from client import AsyncAdminClient, OfflineTopic, SubscriptionInfo, SubscriptionListing
from proto.shown import shown_text

LIST_FIELDS = ("topic", "subscription", "type", "mode", "consumers", "lag", "state")
PARTITION_FIELDS = (
    "partition",
    "cursor",
    "head",
    "lag",
    "in_flight",
    "oldest_unacked_age_s",
    "state",
    "reason",
)
#: The state of a cluster topic whose owner could not be asked (its subscriptions are
#: unknown).
OFFLINE = "OFFLINE"
#: Partition states, most urgent first.
_URGENCY = ("BLOCKED", "STALLED", "NO_CONSUMER", "LAGGING", "CAUGHT_UP")


@click.group()
def subscriptions() -> None:
    """List, describe and delete subscriptions."""


@subscriptions.command("list")
@click.option("--topic", "-t", type=TOPIC_NAME, help="Only this topic's subscriptions.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@broker_option
def list_(topic: str | None, as_json: bool, target: Target) -> None:
    """Show every subscription: type, mode, consumers, total lag and state.

    In a cluster: the subscriptions of every broker's topics, with their owner, whichever
    broker is asked; a topic whose owner cannot be asked now is one OFFLINE row saying
    why (its subscriptions are unknown), and the command still exits 0.
    """

    async def go() -> SubscriptionListing:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.subscription_listing(topic)

    listing = run(go, target)
    rows = [summary(s) for s in listing.subscriptions] + [offline(g) for g in listing.offline]
    cluster = bool(listing.offline) or any(s.owner for s in listing.subscriptions)
    if as_json:
        click.echo(json.dumps(rows))
    elif not rows:
        click.echo("no subscriptions" + (f" on topic {topic}" if topic else ""))
    else:
        unknown = dict.fromkeys(("subscription", "type", "mode", "consumers", "lag"), "-")
        shown = [
            unknown | {"topic": r["topic"], "state": OFFLINE, **_about(r)}
            if r["state"] == OFFLINE
            else {**r, "consumers": len(r["consumers"])}
            for r in rows
        ]
        click.echo(table(shown, (*LIST_FIELDS, "owner", "reason") if cluster else LIST_FIELDS))


@subscriptions.command("describe")
@click.argument("topic", type=TOPIC_NAME)
@click.argument("subscription", type=SUBSCRIPTION_NAME)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@broker_option
def describe(topic: str, subscription: str, as_json: bool, target: Target) -> None:
    """Show one subscription: its consumers and, per partition, cursor, head and lag."""

    async def go() -> SubscriptionInfo:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.describe_subscription(topic, subscription)

    info = run(go, target)
    doc = {**summary(info), "committer": info.committer, "partitions": partition_rows(info)}
    if as_json:
        click.echo(json.dumps(doc))
        return
    for field in ("topic", "subscription", "type", "mode", "lag", "state"):
        click.echo(f"{field}: {'-' if doc[field] is None else shown_text(str(doc[field]))}")
    names = ", ".join(shown_text(c) for c in info.consumers)  # as the broker sent them
    click.echo(f"consumers: {names or '(none)'}")
    if info.committer:  # a reader that pulls by offset (Spark) acks to it
        click.echo(f"committer: {shown_text(info.committer)} (consumers attach only with --force)")
    else:
        click.echo("committer: (none)")
    click.echo(table(doc["partitions"], PARTITION_FIELDS))


@subscriptions.command("delete")
@click.argument("topic", type=TOPIC_NAME)
@click.argument("subscription", type=SUBSCRIPTION_NAME)
@click.option("--force", is_flag=True, help="Detach attached consumers and delete anyway.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@broker_option
def delete(topic: str, subscription: str, force: bool, yes: bool, target: Target) -> None:
    """Delete a subscription: its cursors, attempt counts and dead-letter queue.

    Asks first unless --yes. Refused while consumers are attached unless --force, which
    detaches them (their streams end). A consumer that subscribes with the name later
    starts a new subscription at its initial position.
    """

    async def held() -> tuple[SubscriptionInfo, int]:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            info = await admin.describe_subscription(topic, subscription)
            return info, await admin.count_dead_letters(topic, subscription)

    async def go() -> list[str]:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.delete_subscription(topic, subscription, force)

    if not yes:
        require_terminal(f"delete subscription {topic}/{subscription}")
        info, dead = run(held, target)
        confirm(_question(info, dead, force))
    detached = run(go, target)
    tail = f"; detached {_consumers(detached)}" if detached else ""
    click.echo(f"deleted subscription {subscription} of topic {topic}{tail}")


def _about(row: dict[str, Any]) -> dict[str, Any]:
    return {"owner": row["owner"], "reason": row["reason"]}


def _consumers(names: Sequence[str]) -> str:
    """``consumer w1`` or ``consumers w1, w2``."""
    return f"{'consumer' if len(names) == 1 else 'consumers'} {', '.join(names)}"


def _question(info: SubscriptionInfo, dead: int, force: bool) -> str:
    """The confirmation question; refuses at once when consumers block the delete."""
    name = f"{info.topic}/{info.subscription}"
    consumers = ", ".join(info.consumers)
    if info.consumers and not force:
        raise click.ClickException(
            f"subscription {name} has {plural(len(info.consumers), 'consumer')} attached "
            f"({consumers}); stop them, or use --force to detach them and delete anyway"
        )
    detach = f" and detach {_consumers(info.consumers)}" if info.consumers else ""
    return (
        f"delete subscription {name} (lag {info.lag}, {plural(dead, 'dead letter')}){detach}? "
        "Its "
        "cursors and dead letters cannot be brought back"
    )


def summary(info: SubscriptionInfo) -> dict[str, Any]:
    """One subscription as a row: ``topic, subscription, type, mode`` (or ``None``),
    ``consumers`` (names),
    ``lag`` (over every partition) and ``state`` (the most urgent partition state); in a
    cluster also ``owner`` (its topic's owner) and ``reason`` (``""``)."""
    row = {
        "topic": info.topic,
        "subscription": info.subscription,
        "type": info.type,
        "mode": info.mode,
        "consumers": list(info.consumers),
        "lag": info.lag,
        "state": state_of(info),
    }
    if info.owner:
        row |= {"owner": info.owner, "reason": ""}
    return row


def offline(gone: OfflineTopic) -> dict[str, Any]:
    """The row of a topic whose owner could not be asked: state :data:`OFFLINE`, its
    owner, why in ``reason``, everything else unknown (``None``; no consumers)."""
    return {
        "topic": gone.topic,
        "subscription": None,
        "type": None,
        "mode": None,
        "consumers": [],
        "lag": None,
        "state": OFFLINE,
        "owner": gone.owner,
        "reason": gone.message,
    }


def partition_rows(info: SubscriptionInfo) -> list[dict[str, Any]]:
    """Per partition: cursor, head, lag, in-flight records, age of the oldest, state."""
    return [
        {
            "partition": p.partition,
            "cursor": p.cursor,
            "head": p.head,
            "lag": p.lag,
            "in_flight": p.in_flight,
            "oldest_unacked_age_s": round(p.oldest_unacked_age_s, 3),
            "state": p.state,
            "reason": p.reason,
        }
        for p in info.partitions
    ]


def state_of(info: SubscriptionInfo) -> str:
    """The most urgent state of the subscription's partitions."""
    states = {p.state for p in info.partitions}
    return next((s for s in _URGENCY if s in states), "CAUGHT_UP")
