"""``headrace consume``: read a subscription and print each record, then settle it.

Role: attach an :class:`~client.AsyncConsumer` to ``TOPIC``'s subscription (created if new,
at ``--from``), print each record as text or JSON lines, and ack it, or with ``--nack`` or
``--dead-letter`` settle it the other way (with ``--reason``); stop after ``--count``
records or ``--timeout`` seconds without one. The connection options, the one-line errors
and the reachability check are :mod:`broker.cli_client`'s, as for every client command.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from dataclasses import dataclass
from typing import Any

import click

from broker.cli_client import (
    Target,
    add_record_bytes,
    broker_option,
    connect_timeout_option,
    reachable_channel,
    run,
)
from broker.cli_output import plural
from broker.cli_params import SUBSCRIPTION_NAME, TOPIC_NAME
from client import AsyncAdminClient, AsyncConsumer, Message, NotFound


@click.command()
@click.argument("topic", type=TOPIC_NAME)
@click.option(
    "--subscription",
    "-s",
    required=True,
    type=SUBSCRIPTION_NAME,
    help="Subscription name (created if new).",
)
@click.option(
    "--type",
    "type_",
    type=click.Choice(["exclusive", "failover", "shared", "key_shared"]),
    default="exclusive",
    show_default=True,
)
@click.option(
    "--from",
    "start",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where a new subscription starts.",
)
@click.option("--count", type=click.IntRange(1), help="Exit after N records.")
@click.option(
    "--timeout",
    type=float,
    callback=lambda _ctx, _param, value: _positive_seconds(value),
    metavar="SECONDS",
    help="Idle timeout: stop once this many seconds pass without a new record (exit 0, "
    "with a note on stderr of how many of --count arrived).",
)
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--nack",
    is_flag=True,
    help="Nack what was printed instead of acking it: the broker sends it again after the "
    "subscription's backoff, and after max_deliveries applies its poison policy.",
)
@click.option(
    "--dead-letter",
    is_flag=True,
    help="Reject what was printed: the subscription's poison policy applies to it now "
    "(by default, into its dead-letter queue; see `headrace dlq peek`).",
)
@click.option(
    "--reason",
    metavar="TEXT",
    help="Why, with --nack or --dead-letter: kept with the record and shown by `dlq peek`.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Attach even when a Spark query commits to the subscription (its committer in "
    "`subscriptions describe`); this consumer then moves the query's cursor.",
)
@connect_timeout_option("before subscribing")
@broker_option
def consume(  # noqa: PLR0917 - click passes every option as an argument
    topic: str,
    subscription: str,
    type_: str,
    start: str,
    count: int | None,
    timeout: float | None,
    output: str,
    nack: bool,
    dead_letter: bool,
    reason: str | None,
    force: bool,
    connect_timeout: float,
    target: Target,
) -> None:
    """Print records of TOPIC through a subscription, one value per line, and ack them.

    A record is acknowledged only after it was written to stdout. Runs until --count
    records were printed, until --timeout seconds pass without a new record, or until
    interrupted (Ctrl-C acks what was printed, then exits). It asks the broker for no more
    than --count records ahead; records it received but did not print are given back
    uncounted on exit, so the next consumer gets them as first deliveries. A broker that
    does not answer within --connect-timeout is an error (exit 1) before subscribing.

    With --nack or --dead-letter, what was printed is nacked or rejected instead of
    acked. A subscription that a Spark query commits to is refused unless --force.
    """
    settle = _settle_choice(nack, dead_letter, reason)
    out = sys.stdout.buffer
    printed = 0
    idle = False
    queued: bool | None = None  # --dead-letter: did the queue take them (None: not asked)
    prefetch = min(count, CONSUME_PREFETCH) if count is not None else CONSUME_PREFETCH

    async def go() -> None:
        nonlocal printed, idle, queued
        async with reachable_channel(target, connect_timeout):
            pass  # the broker answers; the consumer makes its own connection
        if not dead_letter:
            await consume_into()
            return
        # One admin connection counts the queue before and after: an interrupted consume
        # (Ctrl-C) does not wait, the summary then says only that the policy applies.
        async with AsyncAdminClient(**target.kwargs()) as admin:
            before = await _dead_letters(admin, topic, subscription)
            await consume_into()
            if printed:
                queued = await _await_dead_letters(admin, topic, subscription, before + printed)

    async def consume_into() -> None:
        nonlocal printed, idle
        async with AsyncConsumer(
            topic,
            subscription,
            **target.kwargs(),
            type=type_,
            initial_position=start,
            receive_queue=prefetch,
            connect_timeout=connect_timeout,
            force=force,
        ) as consumer:
            while count is None or printed < count:
                want = count - printed if count is not None else CONSUME_PREFETCH
                try:
                    batch = await consumer.receive_batch(want, timeout=timeout)
                except TimeoutError:
                    idle = True
                    return
                for message in batch:
                    out.write(_render(message, output))
                out.flush()
                if settle is None:
                    consumer.ack_many(batch)
                else:
                    for message in batch:
                        consumer.nack(message, reason=reason or "", dead_letter=settle.reject)
                printed += len(batch)

    run(go, target)
    if idle:
        of = f" of {count}" if count is not None else ""
        click.echo(f"stopped after {timeout:g}s without a record; got {printed}{of}", err=True)
    if settle is None:
        click.echo(f"consumed {plural(printed, 'record')} from {topic}", err=True)
    else:
        click.echo(settle.summary(printed, topic, subscription, queued), err=True)


async def _dead_letters(admin: AsyncAdminClient, topic: str, subscription: str) -> int:
    """How many entries the subscription's dead-letter queue holds (0 for a new one)."""
    try:
        return await admin.count_dead_letters(topic, subscription)
    except NotFound:
        return 0


#: How long ``consume --dead-letter`` waits for its rejects to reach the dead-letter queue.
DEAD_LETTER_WAIT_S = 5.0


async def _await_dead_letters(
    admin: AsyncAdminClient, topic: str, subscription: str, want: int
) -> bool:
    """Wait until the dead-letter queue holds ``want`` entries; False after
    ``DEAD_LETTER_WAIT_S``. A reject is applied on the subscription's next pass, after the
    stream that carried it has closed; waiting here means a `dlq peek` run next sees it."""
    deadline = asyncio.get_running_loop().time() + DEAD_LETTER_WAIT_S
    while await _dead_letters(admin, topic, subscription) < want:
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


@dataclass(frozen=True, slots=True)
class _Settle:
    """How ``consume`` settles what it printed when not by an ack."""

    reject: bool  # dead_letter: the poison policy now; else a nack (sent again later)

    def summary(self, count: int, topic: str, subscription: str, queued: bool | None) -> str:
        """The line on stderr once done; ``queued``: whether the rejects were seen in the
        dead-letter queue (None when nothing was rejected)."""
        records = plural(count, "record")
        if self.reject and queued is False:
            return (
                f"rejected {records} from {topic}: not in the dead-letter queue of "
                f"{subscription} after {DEAD_LETTER_WAIT_S:g}s; its poison policy may drop or "
                f"block them, or the queue evicts (headrace lag --topic {topic} shows BLOCKED)"
            )
        if self.reject:
            return (
                f"rejected {records} from {topic}: the poison policy of {subscription} "
                f"applies (by default its dead-letter queue: headrace dlq peek {topic} -s "
                f"{subscription})"
            )
        return f"nacked {records} from {topic}: {subscription} sends them again after its backoff"


def _settle_choice(nack: bool, dead_letter: bool, reason: str | None) -> _Settle | None:
    """``--nack`` / ``--dead-letter`` (at most one), ``--reason`` only with one of them."""
    if nack and dead_letter:
        raise click.UsageError("--nack and --dead-letter exclude each other; give one")
    if reason is not None and not (nack or dead_letter):
        raise click.UsageError("--reason goes with --nack or --dead-letter")
    return _Settle(dead_letter) if nack or dead_letter else None


#: The most records ``consume`` lets the broker send ahead (the client's default
#: ``receive_queue``); with ``--count N`` it asks for at most N.
CONSUME_PREFETCH = 1_000


def _positive_seconds(value: float | None) -> float | None:
    """``--timeout``: a finite number of seconds above 0 (else a usage error, exit 2)."""
    if value is None:
        return None
    if not (math.isfinite(value) and value > 0):
        raise click.BadParameter(
            f"must be a positive number of seconds, like 5 or 0.5; got {value:g}",
            param_hint="--timeout",
        )
    return value


def _render(message: Message, output: str) -> bytes:
    if output == "text":
        return message.value + b"\n"
    doc: dict[str, Any] = {
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
        "timestamp_ms": message.timestamp_ms,
        "redelivery_count": message.redelivery_count,
    }
    add_record_bytes(doc, message.key, message.value, message.headers)
    return json.dumps(doc).encode() + b"\n"
