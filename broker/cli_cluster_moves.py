"""``headrace cluster reassign`` and ``headrace cluster rebalance``: move replicated topics.

Role: parse arguments, read the cluster from etcd and write an operator's request: a
topic record's ``reassign_to`` (:func:`cluster.moves.request`, a compare-and-set on the
record as read). The controller carries each request out step by step, fenced by its
token (:mod:`cluster.moves`): the topic serves throughout. etcd is found as ``headrace
cluster config`` finds it: ``--cluster-etcd H:P[,H:P...]`` (env
``HEADRACE_CLUSTER_ETCD``), else the ``[cluster]`` table of ``--config FILE``.

- ``reassign TOPIC --replicas a,b,c [--throttle BYTES_PER_S]``: move TOPIC to that
  replica set (its first the preferred leader): the new replicas are added and catch up
  (the leader sends each at most BYTES_PER_S until it is in sync), leadership moves to
  the first of the set, the replicas left out are dropped and delete their copy.
- ``reassign TOPIC --cancel``: stop TOPIC's reassignment and go back to the replica set
  it started from (Kafka's KIP-455 cancel): leadership back to an original in-sync
  replica if an added one leads, the added replicas dropped, the throttle cleared.
- ``reassign --status [--json]``: every reassignment running, with its next step (a
  cancelled one says so).
- ``rebalance [--dry-run] [--json] [--throttle BYTES_PER_S] [--max-moves N]``: move
  replicas from the brokers holding the most to those holding the fewest (a new empty
  broker, ``cluster.replicas.replica_moves``), each a reassignment under the throttle, at
  most N running at once (run it again once they end for the next ones); then reorder
  replica sets so preferred leadership is spread over the live brokers
  (``cluster.replicas.rebalance_moves``) and move leadership to each topic's preferred
  leader where it is alive and in sync; ``--dry-run`` prints the moves and writes
  nothing.

Exit codes: 0 success, 1 error (one line on stderr), 2 usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from broker.auth.cluster_tokens import etcd_tls
from broker.cli_cluster_config import _cluster, _etcd_options
from broker.cli_output import table
from cluster.errors import ClusterError
from cluster.etcd import EtcdStore
from cluster.moves import MAX_MOVES, REBALANCE_THROTTLE, cancel, request
from cluster.records import Keys, TopicRecord, TopicState
from cluster.replicas import (
    cancel_step,
    is_cancelling,
    preferred_leader_moves,
    reassignment_step,
    rebalance_moves,
    replica_moves,
)
from cluster.state import ClusterState
from cluster.view import View

T = TypeVar("T")


def _run(
    cluster_etcd: str | None,
    config_path: str | None,
    action: Callable[[EtcdStore, Keys, ClusterState], Awaitable[T]],
) -> T:
    """Connect, read the cluster once, run ``action``, close; errors: one line, exit 1."""
    cluster = _cluster(cluster_etcd, config_path)

    async def go() -> T:
        store = await EtcdStore.connect(list(cluster.etcd or ()), tls=etcd_tls(cluster))
        async with store:
            keys = Keys(cluster.prefix)
            view = View(store, keys)
            await view.start()
            try:
                return await action(store, keys, view.state)
            finally:
                await view.aclose()

    try:
        return asyncio.run(go())
    except (ClusterError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc


@click.command("reassign")
@click.argument("topic", required=False)
@click.option(
    "--replicas",
    metavar="NODE,NODE[,...]",
    help="The new replica set, its first the preferred leader.",
)
@click.option(
    "--throttle",
    type=click.IntRange(min=0),
    default=0,
    metavar="BYTES_PER_S",
    help="Bytes per second the leader sends each new replica while it catches up (0: no limit).",
)
@click.option("--status", "status_only", is_flag=True, help="Show the reassignments running.")
@click.option(
    "--cancel",
    "cancel_it",
    is_flag=True,
    help="Stop TOPIC's reassignment: back to the replica set it started from.",
)
@click.option("--json", "as_json", is_flag=True, help="With --status: one JSON document.")
@_etcd_options
def reassign(  # noqa: PLR0917 - click passes every option as an argument
    topic: str | None,
    replicas: str | None,
    throttle: int,
    status_only: bool,
    cancel_it: bool,
    as_json: bool,
    cluster_etcd: str | None,
    config_path: str | None,
) -> None:
    """Move a topic to another replica set (the controller does it step by step; the
    topic serves throughout; a topic of one copy is made replicated first), cancel that,
    or show the reassignments running."""
    if cancel_it:
        if topic is None or replicas or status_only:
            raise click.UsageError("--cancel takes TOPIC only")
        _cancel(topic, cluster_etcd, config_path)
        return
    if status_only:
        rows = _run(cluster_etcd, config_path, lambda _s, _k, state: _status(state, topic))
        click.echo(json.dumps({"reassignments": rows}) if as_json else status_text(rows))
        return
    if topic is None or not replicas:
        raise click.UsageError("give TOPIC and --replicas a,b,c (or --status)")
    target = [n.strip() for n in replicas.split(",")]

    async def ask(store: EtcdStore, keys: Keys, _state: ClusterState) -> TopicRecord:
        before, _after = await request(store, keys, topic, target, throttle)
        return before

    before = _run(cluster_etcd, config_path, ask)
    click.echo(
        f"topic {topic}: reassignment from {','.join(before.effective_replicas())} to "
        f"{','.join(target)} requested; follow it with `headrace cluster reassign --status`"
    )


def _cancel(topic: str, cluster_etcd: str | None, config_path: str | None) -> None:
    async def ask(store: EtcdStore, keys: Keys, _state: ClusterState) -> TopicRecord:
        _before, after = await cancel(store, keys, topic)
        return after

    after = _run(cluster_etcd, config_path, ask)
    back = (
        ",".join(after.reassign_to) if after.reassign_to else ",".join(after.effective_replicas())
    )
    click.echo(
        f"topic {topic}: reassignment cancelled, going back to {back}; follow it with "
        "`headrace cluster reassign --status`"
    )


async def _status(state: ClusterState, only: str | None) -> list[dict[str, Any]]:
    alive = set(state.brokers)
    rows = []
    for name in sorted(state.topics):
        record = state.topics[name].record
        if not record.reassign_to or (only is not None and name != only):
            continue
        cancelling = is_cancelling(record)
        if cancelling:
            step = cancel_step(record, alive)
        else:
            step = reassignment_step(record, record.reassign_to, alive)
        rows.append(
            {
                "topic": name,
                "leader": record.owner,
                "replicas": ",".join(record.effective_replicas()),
                "isr": ",".join(record.effective_isr()),
                "target": ",".join(record.reassign_to),
                "from": ",".join(record.reassign_from),
                "cancelled": cancelling,
                "throttle": record.reassign_throttle,
                "next": step.kind.value,
                "waiting_for": ",".join(step.waiting_for),
            }
        )
    return rows


def status_text(rows: list[dict[str, Any]]) -> str:
    """``reassign --status``'s human form."""
    if not rows:
        return "no reassignment is running"
    fields = ["topic", "leader", "replicas", "isr", "target", "cancelled", "next", "waiting_for"]
    shown = [{**row, "cancelled": "yes" if row["cancelled"] else "no"} for row in rows]
    return table(shown, fields)


@click.command("rebalance")
@click.option("--dry-run", is_flag=True, help="Print the moves; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.option(
    "--throttle",
    type=click.IntRange(min=0),
    default=REBALANCE_THROTTLE,
    show_default=True,
    metavar="BYTES_PER_S",
    help="Bytes per second the leader sends each moved replica while it catches up (0: no limit).",
)
@click.option(
    "--max-moves",
    type=click.IntRange(min=1),
    default=MAX_MOVES,
    show_default=True,
    metavar="N",
    help="Replica moves (reassignments) running at once, those running already included.",
)
@_etcd_options
def rebalance(  # noqa: PLR0917 - click passes every option as an argument
    dry_run: bool,
    as_json: bool,
    throttle: int,
    max_moves: int,
    cluster_etcd: str | None,
    config_path: str | None,
) -> None:
    """Move replicas toward even counts over the live brokers, spread preferred
    leadership and move leadership to preferred leaders (the controller does each move;
    the topics serve throughout)."""

    async def go(store: EtcdStore, keys: Keys, state: ClusterState) -> list[dict[str, Any]]:
        moves = plan_rebalance(state, max_moves)
        if not dry_run:
            for move in moves:
                moving = move["kind"] == "replicas"
                target = move["after"].split(",")
                await request(store, keys, move["topic"], target, throttle if moving else 0)
        return moves

    moves = _run(cluster_etcd, config_path, go)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "moves": moves}))
        return
    if not moves:
        click.echo("balanced: no move to make")
        return
    click.echo(table(moves, ["topic", "kind", "leader", "before", "after"]))
    click.echo(
        f"{len(moves)} move(s) {'not written (dry run)' if dry_run else 'requested'}"
        + ("" if dry_run else "; follow them with `headrace cluster reassign --status`")
    )


def plan_rebalance(state: ClusterState, max_moves: int = MAX_MOVES) -> list[dict[str, Any]]:
    """The rebalance's moves: replica moves first (kind ``replicas``,
    ``cluster.replicas.replica_moves``, at most ``max_moves`` reassignments running),
    then (kind ``leader``) each other topic whose replica order changes for balance or
    whose leader is not its preferred one (alive and in sync); topics with a
    reassignment running are left alone."""
    alive = set(state.brokers)
    everything = [t.record for t in state.topics.values()]
    shifts = replica_moves(everything, alive, max_moves)
    shifted = {m.topic for m in shifts}
    moves: list[dict[str, Any]] = [
        {
            "topic": m.topic,
            "kind": "replicas",
            "leader": state.topics[m.topic].record.owner,
            "before": ",".join(state.topics[m.topic].record.effective_replicas()),
            "after": ",".join(m.replicas),
        }
        for m in shifts
    ]
    records = [
        t.record
        for t in state.topics.values()
        if t.record.state is TopicState.READY
        and len(t.record.effective_replicas()) > 1
        and not t.record.reassign_to
        and t.record.name not in shifted
    ]
    after = {r.name: r.effective_replicas() for r in records}
    for move in rebalance_moves(records, alive):
        after[move.topic] = move.replicas
    reordered = [r.replace(replicas=after[r.name]) for r in records]
    leaders = {name for name, _to in preferred_leader_moves(reordered, alive)}
    for record in sorted(records, key=lambda r: r.name):
        if after[record.name] != record.effective_replicas() or record.name in leaders:
            moves.append(
                {
                    "topic": record.name,
                    "kind": "leader",
                    "leader": record.owner,
                    "before": ",".join(record.effective_replicas()),
                    "after": ",".join(after[record.name]),
                }
            )
    return moves
