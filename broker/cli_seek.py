"""``headrace seek``: move a subscription's cursors from the command line.

Role: parse ``--to`` (``earliest``, ``latest``, an offset, or an ISO-8601 time with a time
zone; a bad one is a usage error before anything is sent), find the topic when only the
subscription is named (refused when the name is on several topics, or when a topic whose
owner cannot be asked may hold it too), call :meth:`client.AsyncAdminClient.seek` and
print the new cursors. The connection options and the one-line errors are
:mod:`broker.cli_client`'s, shared by every client command.

Imports the client library and the CLI's shared modules; never the broker's servers.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

import click

from broker.cli_client import INT64_MAX, Target, broker_option, run
from broker.cli_params import SUBSCRIPTION_NAME, TOPIC_NAME
from client import AsyncAdminClient, SubscriptionInfo


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
