"""``headrace dlq``: a subscription's dead-letter queue from the command line.

Role: ``peek``, ``count``, ``ack``, ``purge`` and ``replay`` over
:class:`client.AsyncAdminClient`, in the style of :mod:`broker.cli_client` (whose
``--broker``, ``--token`` and ``--tls-*`` options and error handling they share): client
errors print one line on stderr and exit 1; usage errors exit 2 (click). Each names the
queue by ``TOPIC --subscription S``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from broker.cli_client import (
    INT32_MAX,
    INT64_MAX,
    Target,
    add_record_bytes,
    as_text,
    broker_option,
    confirm,
    require_terminal,
    run,
)
from broker.cli_output import plural, table
from broker.cli_params import SUBSCRIPTION_NAME, TOPIC_NAME
from client import AsyncAdminClient, DeadLetterEntry, ReplayResult
from proto.shown import shown_text

_PREVIEW = 40  # characters of a value shown in the peek table
_REASON = 40  # characters of a reason shown in the peek table
PEEK_FIELDS = (
    "sequence",
    "partition",
    "offset",
    "attempts",
    "reason",
    "dead_lettered",
    "truncated",
    "value",
)

subscription_option = click.option(
    "--subscription",
    "-s",
    required=True,
    type=SUBSCRIPTION_NAME,
    help="The subscription whose queue it is.",
)
topic_argument = click.argument("topic", type=TOPIC_NAME)


@click.group()
def dlq() -> None:
    """Peek at, count, ack, purge and replay a subscription's dead-letter queue."""


@dlq.command("peek")
@topic_argument
@subscription_option
@click.option("--from", "start", type=click.IntRange(0, INT64_MAX), help="Start at this sequence.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--reason", help="Only entries whose failure reason contains this text.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@broker_option
def peek(  # noqa: PLR0917 - click passes every option as an argument
    topic: str,
    subscription: str,
    start: int | None,
    limit: int,
    reason: str | None,
    as_json: bool,
    target: Target,
) -> None:
    """Show dead letters, oldest first. Removes nothing."""

    async def go() -> list[DeadLetterEntry]:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.peek_dead_letters(
                topic, subscription, from_sequence=start, limit=limit, reason=reason
            )

    entries = run(go, target)
    if as_json:
        click.echo(json.dumps([entry_doc(e) for e in entries]))
    elif not entries:
        click.echo(f"no dead letters in {topic}/{subscription}")
    else:
        click.echo(table([_row(e) for e in entries], PEEK_FIELDS))


@dlq.command("count")
@topic_argument
@subscription_option
@broker_option
def count(topic: str, subscription: str, target: Target) -> None:
    """Print how many dead letters there are.

    Prints a bare number: the entries TOPIC's subscription's queue holds.
    """

    async def go() -> int:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.count_dead_letters(topic, subscription)

    click.echo(str(run(go, target)))


@dlq.command("ack")
@topic_argument
@subscription_option
@click.option(
    "--up-to",
    "up_to",
    type=click.IntRange(0, INT64_MAX),
    required=True,
    help="Remove every entry with a sequence at or below this one (inclusive).",
)
@broker_option
def ack(topic: str, subscription: str, up_to: int, target: Target) -> None:
    """Remove dead letters up to a sequence (inclusive)."""

    async def go() -> int:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.ack_dead_letters(topic, subscription, up_to)

    acked = run(go, target)
    click.echo(f"acked {_letters(acked)} of {topic}/{subscription} up to sequence {up_to}")


@dlq.command("purge")
@topic_argument
@subscription_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@broker_option
def purge(topic: str, subscription: str, yes: bool, target: Target) -> None:
    """Remove every dead letter. Asks first unless --yes."""

    async def held() -> int:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.count_dead_letters(topic, subscription)

    async def go() -> int:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.purge_dead_letters(topic, subscription)

    if not yes:
        require_terminal(f"purge the dead letters of {topic}/{subscription}")
        entries = run(held, target)
        confirm(
            f"remove all {_letters(entries)} of {topic}/{subscription}? They cannot be brought back"
        )
    purged = run(go, target)
    click.echo(f"purged {_letters(purged)} of {topic}/{subscription}")


@dlq.command("replay")
@topic_argument
@subscription_option
@click.option(
    "--limit",
    type=click.IntRange(1, INT32_MAX),
    help="Replay at most N entries. [default: all]",
)
@click.option(
    "--up-to",
    "up_to",
    type=click.IntRange(0, INT64_MAX),
    help="Only entries up to this sequence.",
)
@click.option(
    "--rate",
    type=click.IntRange(1, 100_000),
    help="Most records published per second. [default: the broker's, 1000]",
)
@broker_option
def replay(  # noqa: PLR0917 - click passes every option as an argument
    topic: str,
    subscription: str,
    limit: int | None,
    up_to: int | None,
    rate: int | None,
    target: Target,
) -> None:
    """Publish dead letters back to their original topic.

    Publishes entries of TOPIC's subscription's queue to their original topic and
    partition, oldest first, with x-replay-count incremented, and removes them once that
    is durable.

    Stops at the first entry it must skip (replayed too often already, or truncated); that
    entry and the ones after it stay, and the skip is reported.
    """

    async def go() -> ReplayResult:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.replay_dead_letters(
                topic, subscription, limit=limit, up_to_sequence=up_to, rate_per_s=rate
            )

    result = run(go, target)
    click.echo(
        f"replayed {_letters(result.replayed)} of {topic}/{subscription}; "
        f"{result.remaining} {'remains' if result.remaining == 1 else 'remain'}"
    )
    for skipped in result.skipped:
        click.echo(f"stopped at entry {skipped.sequence}: {shown_text(skipped.reason)}")


def entry_doc(entry: DeadLetterEntry) -> dict[str, Any]:
    """One entry as JSON: bytes as UTF-8 text, or null plus a ``*_base64`` field."""
    doc: dict[str, Any] = {
        "sequence": entry.sequence,
        "topic": entry.topic,
        "partition": entry.partition,
        "offset": entry.offset,
        "subscription": entry.subscription,
        "timestamp_ms": entry.timestamp_ms,
        "attempts": entry.attempts,
        "reason": entry.reason,
        "attempt_times_ms": list(entry.attempt_times_ms),
        "dead_lettered_ms": entry.dead_lettered_ms,
        "truncated": entry.truncated,
        "original_size": entry.original_size,
        "replay_count": entry.replay_count,
    }
    add_record_bytes(doc, entry.key, entry.value, entry.headers)
    return doc


def _letters(count: int) -> str:
    return plural(count, "dead letter")


def _row(entry: DeadLetterEntry) -> dict[str, Any]:
    when = datetime.fromtimestamp(entry.dead_lettered_ms / 1000, UTC)
    return {
        "sequence": entry.sequence,
        "partition": entry.partition,
        "offset": entry.offset,
        "attempts": entry.attempts,
        "reason": _clip(shown_text(entry.reason), _REASON),
        "dead_lettered": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "truncated": "yes" if entry.truncated else "no",
        "value": preview(entry.value),
    }


def preview(value: bytes) -> str:
    """The start of a value on one line: text when it is UTF-8, else a bytes literal."""
    text = as_text(value)
    return _clip(repr(value)[2:-1] if text is None else shown_text(text), _PREVIEW)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
