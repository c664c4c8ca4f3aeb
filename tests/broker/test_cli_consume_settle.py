"""`headrace consume --dead-letter | --nack [--reason TEXT]` against a real `headrace serve`.

Issue 34, finding 9: the quickstart's dead-letter steps had nothing to show. `consume
--dead-letter` rejects what it printed (the protocol's ``Nack.dead_letter``: the poison
policy applies now), so `dlq peek` shows the record with the reason and `dlq replay`
puts it back; `consume --nack` makes the broker send what it printed again later. Every
command runs as its own process, as a user types it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.test_cli_client import headrace
from tests.broker.test_serve_process import free_port, wait_serving
from tests.docs.test_quickstart import BIN


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A `headrace serve` process on a free port with its data in ``tmp_path``; its
    address."""
    port = free_port()
    with (tmp_path / "serve.err").open("w") as err:
        proc = subprocess.Popen(
            [
                BIN / "headrace",
                "serve",
                "--data-dir",
                str(tmp_path / "data"),
                "--listen",
                f"127.0.0.1:{port}",
                "--metrics-listen",
                "",
            ],
            stderr=err,
        )
    try:
        wait_serving(port, time.monotonic() + 20)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0


def ok(address: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``headrace ARGS`` that must exit 0."""
    done = headrace(address, *args, stdin=stdin)
    assert done.returncode == 0, (args, done.stderr)
    return done


def test_dead_letter_shows_in_dlq_peek_and_replay_puts_it_back(served: str) -> None:
    """Scenario: three records on one partition; `consume --count 1 --dead-letter --reason
    "bad price"` prints the first; `dlq count`, `dlq peek --json`; a plain consume of the
    rest; `dlq replay`; a plain consume again.
    Expected: the reject's summary names the poison policy and the peek command; the
    queue holds the record (value, partition 0, offset 0, 1 attempt, reason "bad price");
    the next consume gets the other two only (the rejected one is not redelivered); the
    replay empties the queue and the record comes back as a new one at offset 3."""
    ok(served, "topics", "create", "orders", "--partitions", "1")
    ok(served, "produce", "orders", stdin="bad\ngood-1\ngood-2\n")
    got = ok(
        served, "consume", "orders", "-s", "billing", "--count", "1", "--dead-letter",
        "--reason", "bad price",
    )  # fmt: skip
    assert got.stdout == "bad\n"
    assert got.stderr.splitlines()[-1] == (
        "rejected 1 record from orders: the poison policy of billing applies (by default "
        "its dead-letter queue: headrace dlq peek orders -s billing)"
    )
    assert ok(served, "dlq", "count", "orders", "-s", "billing").stdout == "1\n"
    [entry] = json.loads(ok(served, "dlq", "peek", "orders", "-s", "billing", "--json").stdout)
    assert (entry["value"], entry["partition"], entry["offset"]) == ("bad", 0, 0)
    assert (entry["attempts"], entry["reason"]) == (1, "bad price")
    table = ok(served, "dlq", "peek", "orders", "-s", "billing").stdout
    assert "bad price" in table.splitlines()[1]

    rest = ok(served, "consume", "orders", "-s", "billing", "--count", "3", "--timeout", "2")
    assert rest.stdout == "good-1\ngood-2\n"

    replayed = ok(served, "dlq", "replay", "orders", "-s", "billing")
    assert "replayed 1 dead letter of orders/billing; 0 remain" in replayed.stdout
    assert ok(served, "dlq", "count", "orders", "-s", "billing").stdout == "0\n"
    again = ok(served, "consume", "orders", "-s", "billing", "--count", "1", "--output", "json")
    doc = json.loads(again.stdout)
    assert (doc["value"], doc["offset"]) == ("bad", 3)


def test_nack_sends_the_record_again(served: str) -> None:
    """Scenario: one record; `consume --count 1 --nack --reason retry-me`, then a plain
    consume as JSON.
    Expected: the nack's summary says the subscription sends it again; the second
    consume gets the same offset with redelivery_count 1; the queue stays empty."""
    ok(served, "topics", "create", "jobs")
    ok(served, "produce", "jobs", stdin="job-1\n")
    nacked = ok(
        served, "consume", "jobs", "-s", "w", "--count", "1", "--nack", "--reason", "retry-me"
    )
    assert nacked.stdout == "job-1\n"
    assert "nacked 1 record from jobs: w sends them again after its backoff" in nacked.stderr
    again = ok(
        served, "consume", "jobs", "-s", "w", "--count", "1", "--timeout", "20", "--output",
        "json",
    )  # fmt: skip
    doc = json.loads(again.stdout)
    assert (doc["value"], doc["offset"], doc["redelivery_count"]) == ("job-1", 0, 1)
    assert ok(served, "dlq", "count", "jobs", "-s", "w").stdout == "0\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nack", "--dead-letter"], "--nack and --dead-letter exclude each other"),
        (["--reason", "why"], "--reason goes with --nack or --dead-letter"),
    ],
)
def test_settle_options_that_do_not_fit_are_a_usage_error(
    served: str, args: list[str], message: str
) -> None:
    """Scenario: `consume` with both --nack and --dead-letter, or --reason alone.
    Expected: exit 2 with the rule on stderr, before subscribing (no subscription is
    made)."""
    ok(served, "topics", "create", "orders")
    done = headrace(served, "consume", "orders", "-s", "billing", "--count", "1", *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert ok(served, "subscriptions", "list", "--json").stdout.strip() == "[]"


def test_a_dead_letter_under_the_drop_policy_says_it_is_not_in_the_queue(
    tmp_path: Path,
) -> None:
    """Scenario: a broker whose `[dispatch] poison_policy` is "drop"; `consume --count 1
    --dead-letter` on a one-record topic. `consume --dead-letter` waits (up to 5 s) for its
    rejects to reach the dead-letter queue, so that a `dlq peek` run next sees them.
    Expected: the record is printed; the summary says it is not in the queue after 5 s and
    why that may be; the queue holds nothing; the record is not delivered again."""
    config = tmp_path / "broker.toml"
    config.write_text('[dispatch]\npoison_policy = "drop"\n')
    port = free_port()
    proc = subprocess.Popen(
        [
            BIN / "headrace", "serve", "--config", str(config), "--data-dir",
            str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}", "--metrics-listen", "",
        ],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_serving(port, time.monotonic() + 20)
        address = f"127.0.0.1:{port}"
        ok(address, "topics", "create", "jobs")
        ok(address, "produce", "jobs", stdin="poison\n")
        got = ok(address, "consume", "jobs", "-s", "w", "--count", "1", "--dead-letter")
        assert got.stdout == "poison\n"
        assert got.stderr.splitlines()[-1] == (
            "rejected 1 record from jobs: not in the dead-letter queue of w after 5s; its "
            "poison policy may drop or block them, or the queue evicts (headrace lag --topic "
            "jobs shows BLOCKED)"
        )
        assert ok(address, "dlq", "count", "jobs", "-s", "w").stdout == "0\n"
        rest = ok(address, "consume", "jobs", "-s", "w", "--count", "1", "--timeout", "1")
        assert rest.stdout == ""
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
