"""``headrace lag``: which subscription is behind, why, for how long, and how fast it drains.

Role: ask the broker for every subscription's per-partition lag (``ListSubscriptions``),
filter it (``--topic``, ``--subscription``, ``--state``), and print it (in a cluster, of
every broker's topics, plus one ``OFFLINE`` row per topic whose owner could not be asked:
:meth:`client.AsyncAdminClient.subscription_listing`): ``--json`` as one
flat JSON array with a row per (topic, partition, subscription) (DESIGN section 4's fields
plus ``ingress_rate``, ``ack_rate``, ``drain_s`` and ``trend``); otherwise as a table
grouped by (topic, subscription), each group closed by a ``total`` row (lag and rates
summed, oldest age the maximum, drain the slowest partition's, state the worst). The
broker measures the rates and the trend (:mod:`dispatcher.lag`) and chooses the state and
reason (:mod:`dispatcher.diagnosis`); this module only shapes and prints them.

Exit codes: 0, 1 (the broker cannot be reached or refused), 2 (usage: a bad ``--state``),
and 3 with ``--fail-on-stalled`` when a printed row is STALLED or BLOCKED (the output is
printed first, so cron mails show why).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import Any

import click

from broker.cli_client import Target, broker_option, run
from broker.cli_output import table
from broker.cli_params import SUBSCRIPTION_NAME, TOPIC_NAME
from client import AsyncAdminClient, OfflineTopic, SubscriptionInfo, SubscriptionListing

#: The states, best first: a group's total shows its worst.
STATES = ("CAUGHT_UP", "LAGGING", "NO_CONSUMER", "STALLED", "BLOCKED")
#: The state of a cluster topic whose owner could not be asked: one row per such topic,
#: every figure null (its subscriptions are unknown, not absent), the reason saying why.
OFFLINE = "OFFLINE"
#: States that need someone to act: ``--fail-on-stalled`` exits 3 on them.
STUCK = frozenset({"STALLED", "BLOCKED"})
#: The exit code of ``--fail-on-stalled`` when a row is STALLED or BLOCKED.
EXIT_STALLED = 3

#: The fields of each JSON row, in order (DESIGN section 4, then the rate fields).
LAG_FIELDS = (
    "topic",
    "partition",
    "subscription",
    "type",
    "cursor",
    "head",
    "lag",
    "oldest_unacked_age_s",
    "consumers",
    "in_flight",
    "state",
    "reason",
    "ingress_rate",
    "ack_rate",
    "drain_s",
    "trend",
)
#: The table's columns; ``trend`` is added in ``--watch``. ``age_s`` is
#: ``oldest_unacked_age_s``, ``in/s`` and ``ack/s`` the ingress and ack rates.
TABLE_FIELDS = (
    "topic",
    "subscription",
    "partition",
    "type",
    "cursor",
    "head",
    "lag",
    "age_s",
    "consumers",
    "in_flight",
    "in/s",
    "ack/s",
    "drain",
    "state",
    "reason",
)


def parse_states(
    _ctx: click.Context, _param: click.Parameter, values: Sequence[str]
) -> frozenset[str]:
    """``--state`` values (repeated, or comma lists, any case) as a set of state names.

    Raises:
        click.BadParameter: a value is not one of the five states (exit 2).
    """
    found = set()
    for value in values:
        for item in value.split(","):
            name = item.strip().upper()
            if name not in (*STATES, OFFLINE):
                raise click.BadParameter(
                    f"{item.strip()!r} is not a state; use {', '.join((*STATES, OFFLINE))} (repeat "
                    "--state or separate states with commas)"
                )
            found.add(name)
    return frozenset(found)


@click.command()
@click.option("--topic", "-t", type=TOPIC_NAME, help="Only this topic.")
@click.option("--subscription", "-s", type=SUBSCRIPTION_NAME, help="Only this subscription.")
@click.option(
    "--state",
    "states",
    multiple=True,
    callback=parse_states,
    metavar="STATE[,STATE]",
    help=f"Only rows in these states ({', '.join((*STATES, OFFLINE))}); repeatable.",
)
@click.option(
    "--watch", is_flag=True, help="Refresh every second until interrupted; shows the trend."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@click.option(
    "--fail-on-stalled",
    is_flag=True,
    help=f"Exit {EXIT_STALLED} when a shown row is STALLED or BLOCKED (after printing); "
    "with --watch, judged on the last refresh.",
)
@broker_option
def lag(  # noqa: PLR0917 - click passes every option as an argument
    topic: str | None,
    subscription: str | None,
    states: frozenset[str],
    watch: bool,
    as_json: bool,
    fail_on_stalled: bool,
    target: Target,
) -> None:
    """Show each subscription's cursor, head, lag, rates, state and reason per partition.

    In a cluster: the subscriptions of every broker's topics, whichever broker is asked; a
    topic whose owner cannot be asked now shows as one OFFLINE row saying why.

    Exit codes: 0 ok, 1 error, 2 usage, 3 with --fail-on-stalled when a shown row is
    STALLED or BLOCKED.
    """

    async def fetch() -> SubscriptionListing:
        async with AsyncAdminClient(**target.kwargs()) as admin:
            return await admin.subscription_listing(topic)

    found: list[dict[str, Any]] = []
    try:
        while True:
            listing = run(fetch, target)
            subs = [s for s in listing.subscriptions if subscription in (None, s.subscription)]
            rows = lag_rows(subs) + offline_rows(listing.offline)
            found = [r for r in rows if not states or r["state"] in states]
            if as_json:
                click.echo(json.dumps(found))
            else:
                if watch:
                    click.clear()
                click.echo(render(found, trend=watch) if found else "no subscriptions")
            if not watch:
                break
            time.sleep(1)
    except KeyboardInterrupt:
        # Ctrl-C is how --watch ends, wherever it lands (the sleep, clearing, drawing): a
        # normal stop, not click's "Aborted!" and exit 1. A fetch it cuts exits 130 in run().
        if not watch:
            raise
    if fail_on_stalled and any(r["state"] in STUCK for r in found):
        raise SystemExit(EXIT_STALLED)


def lag_rows(subs: Iterable[SubscriptionInfo]) -> list[dict[str, Any]]:
    """One row per (topic, partition, subscription), with :data:`LAG_FIELDS`."""
    return [
        {
            "topic": s.topic,
            "partition": p.partition,
            "subscription": s.subscription,
            "type": s.type,
            "cursor": p.cursor,
            "head": p.head,
            "lag": p.lag,
            "oldest_unacked_age_s": round(p.oldest_unacked_age_s, 3),
            "consumers": len(s.consumers),
            "in_flight": p.in_flight,
            "state": p.state,
            "reason": p.reason,
            "ingress_rate": round(p.ingress_rate, 3),
            "ack_rate": round(p.ack_rate, 3),
            "drain_s": None if p.drain_s is None else round(p.drain_s, 3),
            "trend": p.trend,
        }
        for s in subs
        for p in s.partitions
    ]


def offline_rows(offline: Iterable[OfflineTopic]) -> list[dict[str, Any]]:
    """One :data:`OFFLINE` row per topic whose owner could not be asked: every field of
    :data:`LAG_FIELDS` null but ``topic``, ``state`` and ``reason`` (the message)."""
    return [
        {**dict.fromkeys(LAG_FIELDS), "topic": g.topic, "state": OFFLINE, "reason": g.message}
        for g in offline
    ]


def render(rows: Sequence[dict[str, Any]], *, trend: bool = False) -> str:
    """``rows`` as a table grouped by (topic, subscription), a total row after each;
    :data:`OFFLINE` rows last, with dashes for what is unknown."""
    fields = list(TABLE_FIELDS)
    if trend:
        fields.insert(fields.index("drain") + 1, "trend")
    known = [r for r in rows if r["state"] != OFFLINE]
    ordered = sorted(known, key=lambda r: (r["topic"], r["subscription"], r["partition"]))
    shown: list[dict[str, Any]] = []
    for _key, group in groupby(ordered, key=lambda r: (r["topic"], r["subscription"])):
        members = list(group)
        shown.extend(_cells(r) for r in members)
        shown.append(_cells(totals(members)))
    unknown = sorted((r for r in rows if r["state"] == OFFLINE), key=lambda r: r["topic"])
    shown += [{**dict.fromkeys(fields, "-"), **_known(r)} for r in unknown]
    return table(shown, fields)


def _known(row: dict[str, Any]) -> dict[str, Any]:
    return {"topic": row["topic"], "state": row["state"], "reason": row["reason"]}


def totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The total row of one (topic, subscription) group of JSON rows: lag, in-flight and
    rates summed, oldest age the maximum, drain the slowest partition's (never if any
    partition never drains), state the worst, trend growing if any partition grows (else
    shrinking if any shrinks), and the worst row's reason."""
    first = rows[0]
    worst = max(rows, key=lambda r: (STATES.index(r["state"]), r["lag"]))
    drains = [r["drain_s"] for r in rows]
    trends = {r["trend"] for r in rows}
    return {
        **first,
        "partition": "total",
        "cursor": "",
        "head": "",
        "lag": sum(r["lag"] for r in rows),
        "oldest_unacked_age_s": max(r["oldest_unacked_age_s"] for r in rows),
        "in_flight": sum(r["in_flight"] for r in rows),
        "ingress_rate": sum(r["ingress_rate"] for r in rows),
        "ack_rate": sum(r["ack_rate"] for r in rows),
        "drain_s": None if None in drains else max(drains),
        "trend": next((t for t in ("growing", "shrinking") if t in trends), "steady"),
        "state": worst["state"],
        "reason": worst["reason"] if len(rows) == 1 else _worst_reason(worst),
    }


def _worst_reason(worst: dict[str, Any]) -> str:
    if not worst["reason"]:
        return ""
    return f"partition {worst['partition']}: {worst['reason']}"


def _cells(row: dict[str, Any]) -> dict[str, Any]:
    """A JSON row as table cells: rates to one decimal, drain as a duration."""
    return {
        **row,
        "in/s": f"{row['ingress_rate']:.1f}",
        "ack/s": f"{row['ack_rate']:.1f}",
        "age_s": f"{row['oldest_unacked_age_s']:.1f}",
        "drain": duration(row["drain_s"], row["lag"]),
    }


def duration(seconds: float | None, lag: int) -> str:
    """A drain time for people: ``-`` when caught up, ``never`` when it does not drain at
    the current rates, else ``45s``, ``12m05s`` or ``3h20m``."""
    if lag == 0:
        return "-"
    if seconds is None:
        return "never"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
