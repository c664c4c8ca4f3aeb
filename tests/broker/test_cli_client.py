"""`headrace topics` and `headrace produce` as real processes against a real broker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

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
    assert "produced 3 record(s)" in sent.stderr
    assert headrace(broker_address, "produce", "cli-orders", "--count", "5").returncode == 0
    described = headrace(broker_address, "topics", "describe", "cli-orders", "--json")
    [info] = json.loads(described.stdout)
    assert info["partitions"][0]["head"] == 8
    listed = headrace(broker_address, "topics", "list")
    assert "cli-orders" in listed.stdout
    assert headrace(broker_address, "topics", "delete", "cli-orders").returncode == 0
    gone = headrace(broker_address, "topics", "describe", "cli-orders")
    assert gone.returncode == 1


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("topics", "describe", "no-such-topic"), 1, "does not exist"),
        (("produce", "no-such-topic", "--count", "1"), 1, "does not exist"),
        (("topics", "create", "bad/name"), 1, "not a valid topic name"),
        (("topics", "create", "x", "--partitions", "0"), 2, "--partitions"),
        (("produce", "x", "--count", "zero"), 2, "--count"),
    ],
    ids=["missing-describe", "missing-produce", "bad-name", "zero-partitions", "bad-count"],
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
