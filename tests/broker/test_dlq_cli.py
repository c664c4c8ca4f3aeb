"""`headrace dlq peek|count|ack|purge|replay` as real processes against a real broker.

The broker runs in the test's event loop, so the tests can fill a dead-letter queue
directly; each command runs as a subprocess on a worker thread meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from broker.app import Broker
from broker.cli_dlq import PEEK_FIELDS
from dispatcher.dead_letter_records import HEADER_REPLAY_COUNT
from tests.broker.test_cli_client import headrace
from tests.broker.test_dlq_admin import SUB, TOPIC, dead_letters, letter, records, subscribed
from tests.broker.test_serve_process import free_port
from tests.client.conftest import address

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def cli(broker: Broker, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``headrace ARGS --broker <broker>`` without blocking the broker's loop."""
    return await asyncio.to_thread(headrace, address(broker), *args, stdin=stdin)


async def test_peek_count_ack_and_purge(broker: Broker) -> None:
    """Scenario: four dead letters (one with a binary value, one with a newline in its
    reason); count, peek as a table and as JSON with a reason filter and a start, ack up
    to 1, purge with a "y" piped in (no terminal), purge with --yes. Expected: exit 0 each
    time but the piped purge (exit 2, "pass --yes", nothing removed); the table has the
    documented columns and one line per entry; the JSON carries every field; counts follow
    each step."""
    await dead_letters(
        broker,
        [
            letter(0, "ack timeout"),
            letter(1, "parse error:\nbad json", key=b"k1"),
            letter(2, "ack timeout", value=b"\xff\x00binary"),
            letter(3, "nack"),
        ],
    )
    counted = await cli(broker, "dlq", "count", TOPIC, "-s", SUB)
    assert (counted.returncode, counted.stdout) == (0, "4\n")

    table = await cli(broker, "dlq", "peek", TOPIC, "--subscription", SUB)
    assert table.returncode == 0, table.stderr
    head, *rows = table.stdout.splitlines()
    assert head.split() == [*PEEK_FIELDS]
    assert len(rows) == 4
    assert rows[1].split()[:4] == ["1", "0", "1", "3"]
    assert "parse error:\\nbad json" in rows[1]
    assert "\\xff\\x00binary" in rows[2]
    assert rows[0].rstrip().endswith("v0")

    shown = await cli(broker, "dlq", "peek", TOPIC, "-s", SUB, "--reason", "parse", "--json")
    assert shown.returncode == 0, shown.stderr
    [doc] = json.loads(shown.stdout)
    assert (doc["sequence"], doc["key"], doc["value"], doc["reason"]) == (
        1,
        "k1",
        "v1",
        "parse error:\nbad json",
    )
    assert (doc["attempts"], doc["attempt_times_ms"], doc["truncated"]) == (3, [1, 2, 3], False)
    binary = await cli(
        broker, "dlq", "peek", TOPIC, "-s", SUB, "--from", "2", "--limit", "1", "--json"
    )
    [doc] = json.loads(binary.stdout)
    assert (doc["sequence"], doc["value"], doc["value_base64"]) == (2, None, "/wBiaW5hcnk=")

    acked = await cli(broker, "dlq", "ack", TOPIC, "-s", SUB, "--up-to", "1")
    assert acked.returncode == 0, acked.stderr
    assert "acked 2 dead letters" in acked.stdout
    refused = await cli(broker, "dlq", "purge", TOPIC, "-s", SUB, stdin="y\n")
    assert refused.returncode == 2  # no terminal to ask at: a piped "y" does not count
    assert "pass --yes" in refused.stderr
    assert (await cli(broker, "dlq", "count", TOPIC, "-s", SUB)).stdout == "2\n"
    purged = await cli(broker, "dlq", "purge", TOPIC, "-s", SUB, "--yes")
    assert purged.returncode == 0, purged.stderr
    assert "purged 2 dead letters" in purged.stdout
    empty = await cli(broker, "dlq", "peek", TOPIC, "-s", SUB)
    assert (empty.returncode, empty.stdout) == (0, f"no dead letters in {TOPIC}/{SUB}\n")


async def test_replay_reports_what_it_replayed_and_where_it_stopped(broker: Broker) -> None:
    """Scenario: entries 0 and 1 are fine, entry 2 is at max_replays; `dlq replay --rate
    1000`, then `--limit 1` after acking entry 2. Expected: exit 0; the first replays 2,
    says 1 remains and names entry 2 with the loop-guard reason; the records are on the
    original partition with x-replay-count 1; the queue then holds only entry 2, and
    after acking it the second replay has nothing to do."""
    dlq = await dead_letters(broker, [letter(0), letter(1)])
    await dlq.put([letter(2, headers=((HEADER_REPLAY_COUNT, b"%d" % dlq.config.max_replays),))])
    done = await cli(broker, "dlq", "replay", TOPIC, "-s", SUB, "--rate", "1000")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == f"replayed 2 dead letters of {TOPIC}/{SUB}; 1 remains"
    assert second.startswith("stopped at entry 2: ")
    assert "max_replays" in second
    assert await records(broker, TOPIC, 0) == [
        (None, b"v0", {HEADER_REPLAY_COUNT: b"1"}),
        (None, b"v1", {HEADER_REPLAY_COUNT: b"1"}),
    ]
    assert (await cli(broker, "dlq", "ack", TOPIC, "-s", SUB, "--up-to", "2")).returncode == 0
    again = await cli(broker, "dlq", "replay", TOPIC, "-s", SUB, "--limit", "1")
    assert again.stdout == f"replayed 0 dead letters of {TOPIC}/{SUB}; 0 remain\n"


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("dlq", "count", TOPIC, "-s", "nobody"), 1, "does not exist"),
        (("dlq", "peek", "no-topic", "-s", SUB), 1, "does not exist"),
        (("dlq", "replay", TOPIC, "-s", "nobody"), 1, "does not exist"),
        (("dlq", "purge", TOPIC, "-s", "nobody", "--yes"), 1, "does not exist"),
        (("dlq", "peek", TOPIC), 2, "--subscription"),
        (("dlq", "peek", TOPIC, "-s", SUB, "--limit", "0"), 2, "--limit"),
        (("dlq", "peek", TOPIC, "-s", SUB, "--from", "-1"), 2, "--from"),
        (("dlq", "ack", TOPIC, "-s", SUB), 2, "--up-to"),
        (("dlq", "ack", TOPIC, "-s", SUB, "--up-to", "x"), 2, "--up-to"),
        (("dlq", "replay", TOPIC, "-s", SUB, "--rate", "0"), 2, "--rate"),
        (("dlq", "replay", TOPIC, "-s", SUB, "--rate", "100001"), 2, "--rate"),
        (("dlq", "replay", TOPIC, "-s", SUB, "--limit", "0"), 2, "--limit"),
        (("dlq", "shred", TOPIC), 2, "No such command"),
    ],
    ids=[
        "count-unknown-subscription",
        "peek-unknown-topic",
        "replay-unknown-subscription",
        "purge-unknown-subscription",
        "peek-no-subscription",
        "peek-limit-0",
        "peek-negative-from",
        "ack-no-up-to",
        "ack-bad-up-to",
        "replay-rate-0",
        "replay-rate-too-high",
        "replay-limit-0",
        "unknown-command",
    ],
)
async def test_errors_are_one_line_with_the_right_exit_code(
    broker: Broker, args: tuple[str, ...], code: int, words: str
) -> None:
    """Scenario: each kind of bad `dlq` command. Expected: exit 1 for errors from the
    broker, 2 for usage errors; the message names the problem; no traceback."""
    await subscribed(broker)
    done = await cli(broker, *args)
    assert done.returncode == code
    assert words in done.stderr
    assert "Traceback" not in done.stderr


async def test_unreachable_broker_is_a_clear_error() -> None:
    """Scenario: `dlq count` against an address nobody listens on. Expected: exit 1 and a
    one-line error, no traceback."""
    done = await asyncio.to_thread(
        headrace, f"127.0.0.1:{free_port()}", "dlq", "count", TOPIC, "-s", SUB
    )
    assert done.returncode == 1
    assert done.stderr.startswith("Error:")
    assert "Traceback" not in done.stderr
