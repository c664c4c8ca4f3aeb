"""`headrace subscriptions list|describe|delete` as real processes against a real broker.

The broker runs in the test's event loop, so the tests can attach consumers and fill a
dead-letter queue directly; each command runs as a subprocess on a worker thread meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from broker.app import Broker
from dispatcher import SubscriptionType
from tests.broker.test_cli_operator import at_terminal
from tests.broker.test_dlq_admin import SUB, TOPIC, letter
from tests.broker.test_dlq_cli import cli
from wal import encode_columns

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def two_subscriptions(broker: Broker) -> None:
    """``TOPIC`` (2 partitions, 3 records on partition 0) with ``SUB`` (two dead letters,
    consumer 'w1' attached) and 'audit' (shared, no consumer)."""
    topic = await broker.topics.create(TOPIC, 2)
    await topic.partition(0).writer.append(encode_columns([b"a", b"b", b"c"]))
    writers = [p.writer for p in topic.partitions]
    sub = await broker.subscriptions.subscribe(TOPIC, SUB, writers)
    await broker.subscriptions.subscribe(TOPIC, "audit", writers, type_=SubscriptionType.SHARED)
    dlq = await broker.subscriptions.dead_letter_queue(TOPIC, SUB)
    assert dlq is not None
    await dlq.put([letter(0), letter(1)])
    sub.attach("w1", 0)


async def test_list_and_describe(broker: Broker) -> None:
    """Scenario: two subscriptions; list as a table and as JSON, with and without --topic;
    describe one as text and JSON. Expected: exit 0; the table has the documented columns
    and one row per subscription with its consumer count, total lag and state; the JSON
    carries consumer names, lag 3 and per-partition rows."""
    await two_subscriptions(broker)
    shown = await cli(broker, "subscriptions", "list")
    assert shown.returncode == 0, shown.stderr
    head, *rows = shown.stdout.splitlines()
    assert head.split() == ["topic", "subscription", "type", "mode", "consumers", "lag", "state"]
    assert [r.split() for r in rows] == [
        [TOPIC, "audit", "shared", "at_least_once", "0", "3", "NO_CONSUMER"],
        [TOPIC, SUB, "exclusive", "at_least_once", "1", "3", "LAGGING"],
    ]
    listed = await cli(broker, "subscriptions", "list", "--topic", TOPIC, "--json")
    docs = json.loads(listed.stdout)
    assert [d["subscription"] for d in docs] == ["audit", SUB]
    assert docs[1] == {
        "topic": TOPIC,
        "subscription": SUB,
        "type": "exclusive",
        "mode": "at_least_once",
        "consumers": ["w1"],
        "lag": 3,
        "state": "LAGGING",
    }
    none = await cli(broker, "subscriptions", "list", "--topic", "quiet")
    assert none.returncode == 1
    assert "topic 'quiet'" in none.stderr

    described = await cli(broker, "subscriptions", "describe", TOPIC, SUB)
    assert described.returncode == 0, described.stderr
    assert "consumers: w1" in described.stdout
    assert "partition" in described.stdout
    doc = json.loads((await cli(broker, "subscriptions", "describe", TOPIC, SUB, "--json")).stdout)
    assert [(p["partition"], p["cursor"], p["head"], p["lag"]) for p in doc["partitions"]] == [
        (0, 0, 3, 3),
        (1, 0, 0, 0),
    ]


async def test_delete_asks_refuses_while_attached_and_forces(
    broker: Broker, tmp_path: Path
) -> None:
    """Scenario: delete 'audit' with a piped "y" (refused: pass --yes), then at a terminal
    answering no, then yes; delete SUB (consumer attached)
    without --force, then with --force --yes; delete it again. Expected: 'no' exits 1 and
    keeps it; 'yes' deletes it (exit 0); without --force exit 1 naming the consumer and
    --force, nothing changed; with --force exit 0 naming the detached consumer, queue gone;
    the last exits 1 with one NOT_FOUND line, no traceback."""
    await two_subscriptions(broker)
    address = f"127.0.0.1:{broker.port}"
    command = ("subscriptions", "delete", TOPIC, "audit", "--broker", address)
    piped = await cli(broker, "subscriptions", "delete", TOPIC, "audit", stdin="y\n")
    assert piped.returncode == 2  # a piped "y" is not an answer
    assert "pass --yes" in piped.stderr
    code, _, err = await asyncio.to_thread(at_terminal, *command, answer="n")
    assert code == 1
    assert f"delete subscription {TOPIC}/audit (lag 3, 0 dead letters)?" in err
    assert broker.subscriptions.get(TOPIC, "audit")
    code, out, err = await asyncio.to_thread(at_terminal, *command, answer="y")
    assert code == 0, err
    assert out == f"deleted subscription audit of topic {TOPIC}\n"

    busy = await cli(broker, "subscriptions", "delete", TOPIC, SUB, "--yes")
    assert busy.returncode == 1
    [line] = busy.stderr.splitlines()
    assert "'w1'" in line
    assert "use --force to detach them" in line
    asked = await asyncio.to_thread(
        at_terminal, "subscriptions", "delete", TOPIC, SUB, "--broker", address, answer="y"
    )
    assert asked[0] == 1
    assert "use --force" in asked[2]
    assert broker.subscriptions.get(TOPIC, SUB)

    forced = await cli(broker, "subscriptions", "delete", TOPIC, SUB, "--force", "--yes")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout == (f"deleted subscription {SUB} of topic {TOPIC}; detached consumer w1\n")
    assert not (Path(broker.config.data_dir) / "dlq" / TOPIC / SUB).exists()
    gone = await cli(broker, "subscriptions", "delete", TOPIC, SUB, "--yes")
    assert gone.returncode == 1
    [line] = gone.stderr.splitlines()
    assert f"subscription '{SUB}' on topic '{TOPIC}' does not exist" in line
    listed = await cli(broker, "subscriptions", "list")
    assert (listed.returncode, listed.stdout) == (0, "no subscriptions\n")


@pytest.mark.parametrize(
    "args",
    [
        ("subscriptions", "delete", TOPIC),
        ("subscriptions", "describe"),
        ("subscriptions", "list", "--bogus"),
        ("subscriptions", "frobnicate"),
    ],
)
async def test_usage_errors_exit_2(broker: Broker, args: tuple[str, ...]) -> None:
    """Scenario: a missing argument, an unknown option or subcommand. Expected: exit 2 and
    a usage message on stderr."""
    done = await cli(broker, *args)
    assert done.returncode == 2
    assert "Usage:" in done.stderr
