"""The ``headrace`` commands that talk to a broker as a client: ``topics`` and ``produce``.

Role: parse arguments, call the :mod:`client` library, print. Every command takes
``--broker HOST:PORT`` (env ``HEADRACE_BROKER``). Client errors print one line on stderr and
exit 1; usage errors exit 2 (click).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import asdict
from typing import Any, TypeVar

import click

from client import DEFAULT_BROKER, AsyncAdminClient, AsyncProducer, ClientError, TopicInfo

T = TypeVar("T")

broker_option = click.option(
    "--broker",
    envvar="HEADRACE_BROKER",
    default=DEFAULT_BROKER,
    show_default=True,
    help="Broker host:port (env HEADRACE_BROKER).",
)


def run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a client coroutine; turn client errors into one line and exit code 1."""
    try:
        return asyncio.run(make())
    except ClientError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


@topics.command("create")
@click.argument("name")
@click.option("--partitions", type=click.IntRange(1, 10_000), default=1, show_default=True)
@broker_option
def topics_create(name: str, partitions: int, broker: str) -> None:
    """Create topic NAME."""

    async def go() -> TopicInfo:
        async with AsyncAdminClient(broker) as admin:
            return await admin.create_topic(name, partitions)

    info = run(go)
    click.echo(f"created topic {info.name} with {len(info.partitions)} partition(s)")


@topics.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@broker_option
def topics_list(as_json: bool, broker: str) -> None:
    """List topics with their partitions and heads."""

    async def go() -> list[TopicInfo]:
        async with AsyncAdminClient(broker) as admin:
            return await admin.list_topics()

    _print_topics(run(go), as_json)


@topics.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@broker_option
def topics_describe(name: str, as_json: bool, broker: str) -> None:
    """Show topic NAME's partitions: offsets, bytes, segments."""

    async def go() -> TopicInfo:
        async with AsyncAdminClient(broker) as admin:
            return await admin.describe_topic(name)

    _print_topics([run(go)], as_json)


@topics.command("delete")
@click.argument("name")
@broker_option
def topics_delete(name: str, broker: str) -> None:
    """Delete topic NAME and all its data."""

    async def go() -> None:
        async with AsyncAdminClient(broker) as admin:
            await admin.delete_topic(name)

    run(go)
    click.echo(f"deleted topic {name}")


def _print_topics(infos: list[TopicInfo], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([asdict(t) for t in infos]))
        return
    click.echo(
        f"{'topic':<30}{'partition':>10}{'first':>14}{'head':>14}{'bytes':>14}{'segments':>10}"
    )
    for t in infos:
        for p in t.partitions:
            click.echo(
                f"{t.name:<30}{p.partition:>10}{p.first_offset:>14}{p.head:>14}"
                f"{p.size_bytes:>14}{p.segments:>10}"
            )


@click.command()
@click.argument("topic")
@click.option("--key", help="Key of every record (picks the partition).")
@click.option("--count", type=click.IntRange(1), help="Send N generated records, not stdin.")
@broker_option
def produce(topic: str, key: str | None, count: int | None, broker: str) -> None:
    """Publish each line of stdin (or --count generated records) as one record.

    Exits 0 only after every record was acknowledged.
    """
    values = (f"record-{i}".encode() for i in range(count)) if count else _stdin_lines()
    encoded_key = key.encode() if key is not None else None

    async def go() -> int:
        async with AsyncProducer(broker) as producer:
            futures = [await producer.send(topic, v, key=encoded_key) for v in values]
            await asyncio.gather(*futures)
            return len(futures)

    sent = run(go)
    click.echo(f"produced {sent} record(s) to {topic}", err=True)


def _stdin_lines() -> Iterator[bytes]:
    for line in sys.stdin.buffer:
        yield line.rstrip(b"\r\n")
