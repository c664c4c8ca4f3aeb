"""`headrace topics`, `produce`, `consume`, `lag` and `seek` as real processes against a
real broker."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from broker.cli_client import add_record_bytes
from tests.broker.test_serve_process import free_port, wait_serving

CLI = [sys.executable, "-c", "from broker.cli import main; main()"]


@pytest.fixture(scope="module")
def broker_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `headrace serve` process for the module."""
    data = tmp_path_factory.mktemp("cli-broker")
    port = free_port()
    with (data / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [
                *CLI,
                "serve",
                "--data-dir",
                str(data / "d"),
                "--listen",
                f"127.0.0.1:{port}",
                "--metrics-listen",
                "",
            ],
            stderr=log,
        )
        try:
            wait_serving(port, time.monotonic() + 20)
            yield f"127.0.0.1:{port}"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)


def headrace(address: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args, "--broker", address],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_create_produce_describe_delete(broker_address: str) -> None:
    """Scenario: create a topic, produce three stdin lines and --count 5, describe as JSON,
    list, delete. Expected: exit 0 each time; the head is 8; the topic is gone after."""
    made = headrace(broker_address, "topics", "create", "cli-orders", "--partitions", "1")
    assert made.returncode == 0, made.stderr
    assert "created topic cli-orders" in made.stdout
    sent = headrace(broker_address, "produce", "cli-orders", stdin="a\nb\nc\n")
    assert sent.returncode == 0, sent.stderr
    assert "produced 3 records" in sent.stderr
    assert headrace(broker_address, "produce", "cli-orders", "--count", "5").returncode == 0
    described = headrace(broker_address, "topics", "describe", "cli-orders", "--json")
    [info] = json.loads(described.stdout)
    assert info["partitions"][0]["head"] == 8
    listed = headrace(broker_address, "topics", "list")
    assert "cli-orders" in listed.stdout
    assert headrace(broker_address, "topics", "delete", "cli-orders", "--yes").returncode == 0
    gone = headrace(broker_address, "topics", "describe", "cli-orders")
    assert gone.returncode == 1


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("topics", "describe", "no-such-topic"), 1, "does not exist"),
        (("produce", "no-such-topic", "--count", "1"), 1, "does not exist"),
        (("topics", "create", "bad/name"), 2, "not a valid topic name"),
        (("topics", "create", "x", "--partitions", "0"), 2, "--partitions"),
        (("produce", "x", "--count", "zero"), 2, "--count"),
        (("consume", "no-such-topic", "-s", "s", "--count", "1"), 1, "does not exist"),
        (("consume", "x"), 2, "--subscription"),
        (("consume", "x", "-s", "s", "--from", "middle"), 2, "--from"),
        (("seek", "x", "-s", "s", "--to", "yesterday"), 2, "ISO-8601"),
        (("seek", "x", "-s", "s", "--to", "2026-11-21T10:00:00"), 2, "no time zone"),
        (("seek", "-s", "nobody-has-this", "--to", "earliest"), 1, "no topic has"),
    ],
    ids=[
        "missing-describe",
        "missing-produce",
        "bad-name",
        "zero-partitions",
        "bad-count",
        "consume-missing-topic",
        "consume-no-subscription",
        "consume-bad-from",
        "seek-bad-time",
        "seek-naive-time",
        "seek-unknown-subscription",
    ],
)
def test_errors_are_one_line_with_the_right_exit_code(
    broker_address: str, args: tuple[str, ...], code: int, words: str
) -> None:
    """Scenario: each kind of bad command. Expected: exit 1 for errors from the broker, 2
    for usage errors; the message names the problem; no traceback."""
    done = headrace(broker_address, *args)
    assert done.returncode == code
    assert words in done.stderr
    assert "Traceback" not in done.stderr


def test_unreachable_broker_is_a_clear_error() -> None:
    """A broker address nobody listens on: exit 1 and a one-line error, no traceback."""
    done = headrace(f"127.0.0.1:{free_port()}", "topics", "list")
    assert done.returncode == 1
    assert done.stderr.startswith("Error:")
    assert "Traceback" not in done.stderr


def test_consume_lag_and_seek(broker_address: str) -> None:
    """Scenario: produce 5 records, consume 3, check lag, consume the rest, seek back to
    offset 1 and consume again. Expected: values in order, acks move the cursor, lag JSON
    carries every DESIGN field, the seek replays from offset 1."""
    assert headrace(broker_address, "topics", "create", "cli-walk").returncode == 0
    lines = "".join(f"line-{i}\n" for i in range(5))
    assert headrace(broker_address, "produce", "cli-walk", stdin=lines).returncode == 0

    got = headrace(broker_address, "consume", "cli-walk", "-s", "walk", "--count", "3")
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == ["line-0", "line-1", "line-2"]

    shown = headrace(broker_address, "lag", "--topic", "cli-walk", "--json")
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    assert set(row) >= {
        "topic", "partition", "subscription", "type", "cursor", "head", "lag",
        "oldest_unacked_age_s", "consumers", "in_flight", "state", "reason",
    }  # fmt: skip
    assert (row["cursor"], row["head"], row["lag"], row["state"]) == (3, 5, 2, "NO_CONSUMER")
    assert row["oldest_unacked_age_s"] >= 0
    table = headrace(broker_address, "lag", "-s", "walk")
    assert "NO_CONSUMER" in table.stdout
    assert table.stdout.split()[:5] == ["topic", "subscription", "partition", "type", "cursor"]

    rest = headrace(
        broker_address, "consume", "cli-walk", "-s", "walk", "--count", "2", "--output", "json"
    )
    assert [json.loads(x)["value"] for x in rest.stdout.splitlines()] == ["line-3", "line-4"]
    [row] = json.loads(headrace(broker_address, "lag", "-s", "walk", "--json").stdout)
    assert (row["lag"], row["state"]) == (0, "CAUGHT_UP")

    moved = headrace(broker_address, "seek", "-s", "walk", "--to", "1")
    assert moved.returncode == 0, moved.stderr
    assert "partition:cursor 0:1" in moved.stdout
    again = headrace(broker_address, "consume", "cli-walk", "-s", "walk", "--count", "1")
    assert again.stdout.splitlines() == ["line-1"]


def test_json_output_keeps_bytes_that_are_not_text() -> None:
    """Scenario: a record whose key is text, whose value and one header are not UTF-8,
    rendered for ``consume --output json`` and ``dlq peek --json``. Expected: text stays
    text; the value is null beside ``value_base64``; the binary header is
    ``{"base64": ...}``, not null, so nothing is lost."""
    doc: dict[str, object] = {}
    add_record_bytes(doc, b"k-1", b"\xff\x00v", {"trace": b"abc", "sig": b"\xfe\x01"})
    assert doc == {
        "key": "k-1",
        "value": None,
        "value_base64": base64.b64encode(b"\xff\x00v").decode(),
        "headers": {"trace": "abc", "sig": {"base64": base64.b64encode(b"\xfe\x01").decode()}},
    }
    no_key: dict[str, object] = {}
    add_record_bytes(no_key, None, b"v", {})
    assert no_key == {"key": None, "value": "v", "headers": {}}
