"""The ``headrace`` client commands take seed brokers and reach each topic's owner.

Two real brokers on loopback (:mod:`tests.client.static_cluster`); the commands run
in-process through click's runner on a worker thread (each makes its own event loop, as
from a shell), given ``--broker DEAD,B1``: a seed that listens nowhere, then a broker
that does not own the topic.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.cli import cli
from tests.broker.test_serve_process import free_port
from tests.client.conftest import read_partition
from tests.client.static_cluster import static_cluster

pytestmark = pytest.mark.timeout(120)


async def headrace(seeds: str, *args: str, stdin: str = "") -> Result:
    """``headrace ARGS --broker SEEDS`` in-process, off the brokers' loop."""
    argv = [*args, "--broker", seeds]
    return await asyncio.to_thread(CliRunner().invoke, cli, argv, input=stdin)


@pytest.mark.asyncio
async def test_cli_commands_reach_the_owner_through_seeds(tmp_path: Path) -> None:
    """``orders`` is owned by b2; every command is given a dead seed and b1. produce,
    consume, topics describe, lag, seek and dlq count all succeed, and the records are in
    b2's log."""
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("orders", "b2")
        seeds = f"127.0.0.1:{free_port()},{cluster.address('b1')}"
        made = await headrace(seeds, "produce", "orders", stdin="a\nb\nc\n")
        assert made.exit_code == 0, made.output
        values = [v for _, v, _ in await read_partition(cluster.brokers["b2"], "orders", 0)]
        assert values == [b"a", b"b", b"c"]

        got = await headrace(seeds, "consume", "orders", "-s", "cli", "--count", "3")
        assert got.exit_code == 0, got.output
        assert got.stdout.split() == ["a", "b", "c"]

        described = await headrace(seeds, "topics", "describe", "orders", "--json")
        assert described.exit_code == 0, described.output
        [topic] = json.loads(described.stdout)
        assert [p["head"] for p in topic["partitions"]] == [3]

        lag = await headrace(seeds, "lag", "-t", "orders", "--json")
        assert lag.exit_code == 0, lag.output
        assert [(r["subscription"], r["lag"]) for r in json.loads(lag.stdout)] == [("cli", 0)]

        sought = await headrace(seeds, "seek", "orders", "-s", "cli", "--to", "earliest")
        assert sought.exit_code == 0, sought.output
        counted = await headrace(seeds, "dlq", "count", "orders", "-s", "cli")
        assert counted.exit_code == 0, counted.output
        assert counted.stdout.strip().startswith("0")


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("127.0.0.1:1,garbage", "entry 2 of 2, 'garbage', is not HOST:PORT"),
        ("a:1,b:99999", "entry 2 of 2, 'b:99999', is not HOST:PORT"),
    ],
)
def test_a_bad_seed_is_a_usage_error_naming_it(value: str, named: str) -> None:
    """A list of seeds with one bad entry: exit 2 before any connection, naming the
    entry and its place."""
    done = CliRunner().invoke(cli, ["topics", "list", "--broker", value])
    assert done.exit_code == 2
    assert named in done.stderr
