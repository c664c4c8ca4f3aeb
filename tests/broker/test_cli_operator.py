"""What a new operator meets first, as real processes: ``headrace serve``'s banner,
``produce`` to a broker that is not there, ``topics delete`` and ``dlq purge`` asking at a
terminal, the tables, and ``wal inspect`` given the wrong path or a damaged log."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._certs import Pki
from tests.broker.test_cli_security import _tls_serve
from tests.broker.test_serve_process import free_port, wait_serving

CLI = [sys.executable, "-c", "from broker.cli import main; main()"]


class Served:
    """A `headrace serve` process: its address and data directory."""

    def __init__(self, address: str, data_dir: Path) -> None:
        self.address = address
        self.data_dir = data_dir


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A `headrace serve` process for the module."""
    data = tmp_path_factory.mktemp("operator") / "data"
    port = free_port()
    args = ["serve", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen([*CLI, *args, "--metrics-listen", ""], stderr=subprocess.DEVNULL)
    try:
        wait_serving(port, time.monotonic() + 20)
        yield Served(f"127.0.0.1:{port}", data)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def headrace(
    *args: str, broker: str | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run ``headrace args`` (with ``--broker``, when given) to its end."""
    return subprocess.run(
        [*CLI, *args, *(["--broker", broker] if broker else [])],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def at_terminal(*args: str, answer: str) -> tuple[int, str, str]:
    """Run ``headrace args`` with a terminal (a pty) as stdin, typing ``answer``."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*CLI, *args], stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        os.write(controller, answer.encode() + b"\n")
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(terminal)
        os.close(controller)
    return proc.returncode, out.decode(), err.decode()


def exists(served: Served, topic: str) -> bool:
    return headrace("topics", "describe", topic, broker=served.address).returncode == 0


def test_produce_to_a_closed_port_fails_fast_naming_the_address() -> None:
    """Scenario: `produce` to a port nothing listens on. Expected: exit 1 within a few
    seconds (it was ~30 s of silence) and one error line naming the address, the cause
    and what to check."""
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = headrace("produce", "orders", "--count", "3", broker=address)
    took = time.monotonic() - started
    assert done.returncode == 1
    assert took < 5, took
    [line] = done.stderr.splitlines()
    assert line == (
        f"Error: cannot reach a broker at {address} (connection refused); check that "
        "`headrace serve` is running there and that --broker (env HEADRACE_BROKER) names "
        "its address"
    )


def test_produce_to_a_server_that_never_answers_gives_up_after_the_timeout() -> None:
    """Scenario: a TCP listener that accepts and never speaks gRPC; `produce
    --connect-timeout 0.5`. Expected: exit 1 after about half a second, saying there was
    no answer within 0.5 s and naming the address."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        started = time.monotonic()
        done = headrace("produce", "t", "--count", "1", "--connect-timeout", "0.5", broker=address)
        took = time.monotonic() - started
    assert done.returncode == 1
    assert 0.4 < took < 5, took
    assert f"cannot reach a broker at {address} (no answer within 0.5 s)" in done.stderr


def test_consume_from_a_closed_port_gives_up_after_the_connect_timeout() -> None:
    """Scenario: `consume --count 1 --timeout 2 --connect-timeout 0.5` against a port
    where nothing listens. Expected: exit 1 within a few seconds with one line naming the
    address (before: 30 s of reconnect warnings, then advice to raise a connect_timeout
    the command did not have)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    started = time.monotonic()
    done = headrace(
        "consume", "t", "-s", "s", "--count", "1", "--timeout", "2", "--connect-timeout",
        "0.5", broker=address,
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 1
    assert took < 10, took
    assert f"cannot reach a broker at {address}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_topics_delete_asks_at_a_terminal_and_refuses_unattended(served: Served) -> None:
    """Scenario: topic "doomed" with 3 records; `topics delete` at a terminal answered "n",
    then piped (no terminal), then at a terminal answered "y"; topic "gone" deleted with
    --yes. Expected: "n" exits 1 and keeps the topic, the prompt naming the partitions and
    records; piped exits 2 saying to pass --yes and keeps it; "y" deletes it; --yes
    deletes without a question."""
    for name in ("doomed", "gone"):
        assert headrace("topics", "create", name, broker=served.address).returncode == 0
    assert headrace("produce", "doomed", stdin="a\nb\nc\n", broker=served.address).returncode == 0

    code, _, err = at_terminal("topics", "delete", "doomed", "--broker", served.address, answer="n")
    assert code == 1
    assert "delete topic doomed, its 1 partition holding 3 records, and its subscriptions?" in err
    assert exists(served, "doomed")

    piped = headrace("topics", "delete", "doomed", broker=served.address, stdin="y\n")
    assert piped.returncode == 2
    assert "pass --yes" in piped.stderr
    assert exists(served, "doomed")

    code, out, _ = at_terminal("topics", "delete", "doomed", "--broker", served.address, answer="y")
    assert (code, out) == (0, "deleted topic doomed\n")
    assert not exists(served, "doomed")

    forced = headrace("topics", "delete", "gone", "--yes", broker=served.address)
    assert (forced.returncode, forced.stdout, forced.stderr) == (0, "deleted topic gone\n", "")
    assert not exists(served, "gone")


def test_dlq_purge_asks_at_a_terminal(served: Served) -> None:
    """Scenario: a subscription with an empty dead-letter queue; `dlq purge` at a terminal
    answered "n", then "y". Expected: "n" exits 1 after the question; "y" purges, saying
    "0 dead letters"."""
    address = served.address
    assert headrace("topics", "create", "dlq-t", broker=address).returncode == 0
    assert headrace("produce", "dlq-t", "--count", "1", broker=address).returncode == 0
    assert headrace("consume", "dlq-t", "-s", "s", "--count", "1", broker=address).returncode == 0
    purge = ("dlq", "purge", "dlq-t", "-s", "s", "--broker", address)
    code, _, err = at_terminal(*purge, answer="n")
    assert code == 1
    assert "remove all 0 dead letters of dlq-t/s?" in err
    code, out, _ = at_terminal(*purge, answer="y")
    assert (code, out) == (0, "purged 0 dead letters of dlq-t/s\n")


def test_topics_create_exist_ok_and_counted_nouns(served: Served) -> None:
    """Scenario: create "once" with 1 partition, again with --exist-ok, again with
    --exist-ok and 2 partitions; produce one record. Expected: "1 partition" (not "1
    partition(s)"); the second exits 0 saying the topic exists already (it said "created");
    the third exits 1 naming both counts; "produced 1 record"."""
    first = headrace("topics", "create", "once", broker=served.address)
    assert first.stdout == "created topic once with 1 partition\n"
    again = headrace("topics", "create", "once", "--exist-ok", broker=served.address)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "topic once exists already with 1 partition; nothing changed\n"
    other = headrace(
        "topics", "create", "once", "--partitions", "2", "--exist-ok", broker=served.address
    )
    assert other.returncode == 1
    assert "exists with 1 partitions, not the 2 asked for" in other.stderr
    sent = headrace("produce", "once", stdin="x\n", broker=served.address)
    assert sent.stderr == "produced 1 record to once\n"


def test_topics_list_and_describe_are_one_table_style(served: Served) -> None:
    """Scenario: topic "tabled" with 2 partitions and 12 records on partition 0; `topics
    list` and `topics describe`, piped. Expected: the same header, lower-case as in
    --json's names; numbers right-aligned under their header."""
    address = served.address
    assert (
        headrace("topics", "create", "tabled", "--partitions", "2", broker=address).returncode == 0
    )
    assert (
        headrace("produce", "tabled", "--key", "k", "--count", "12", broker=address).returncode == 0
    )
    listed = headrace("topics", "list", broker=address).stdout.splitlines()
    head, *rows = headrace("topics", "describe", "tabled", broker=address).stdout.splitlines()
    assert head == listed[0]
    assert head.split() == ["topic", "partition", "first", "head", "bytes", "segments", "fsync"]
    heads = [r.split()[3] for r in rows]
    assert sorted(heads) == ["0", "12"]
    right = head.index("head") + len("head")
    assert all(r[:right].endswith(h) for r, h in zip(rows, heads, strict=True))


def test_wal_inspect_finds_the_partition_or_says_where_partitions_live(
    served: Served, tmp_path: Path
) -> None:
    """Scenario: topic "walled" with 2 records; `wal inspect` on the README's old path
    DATA/walled-0, on the data directory, on the partition directory, by --data-dir TOPIC
    PARTITION, and on a copy whose segment has junk appended. Expected: the wrong paths
    exit 2 with the layout and the directory meant; the right ones exit 0 with one segment
    of 2 records whose status is "clean", the word --json uses; the damaged copy exits 1
    and says DAMAGED."""
    address = served.address
    assert headrace("topics", "create", "walled", broker=address).returncode == 0
    assert headrace("produce", "walled", stdin="a\nb\n", broker=address).returncode == 0
    data = served.data_dir
    partition = data / "topics" / "walled" / "0"

    for wrong in (data / "walled-0", data):
        done = headrace("wal", "inspect", str(wrong))
        assert done.returncode == 2
        assert "partitions live in DATA_DIR/topics/TOPIC/PARTITION" in done.stderr
        assert re.search(r"did you mean .*/topics/[\w.-]+/0\?", done.stderr), done.stderr
    assert f"did you mean {partition}?" in headrace("wal", "inspect", str(data / "walled-0")).stderr

    for args in ((str(partition),), ("--data-dir", str(data), "walled", "0")):
        done = headrace("wal", "inspect", *args)
        assert done.returncode == 0, done.stderr
        head, row = done.stdout.splitlines()
        assert head.split()[:5] == ["name", "size_bytes", "valid_bytes", "batches", "records"]
        assert row.split()[4:] == ["2", "2", "clean"]
    # the table's word is the --json flag's name
    [doc] = json.loads(headrace("wal", "inspect", str(partition), "--json").stdout)
    assert (doc["clean"], doc["problem"]) == (True, "")

    copy = tmp_path / "copy"
    shutil.copytree(partition, copy)
    [segment] = copy.glob("*.log")
    with segment.open("ab") as f:
        f.write(b"\x01" * 80)
    damaged = headrace("wal", "inspect", str(copy))
    assert damaged.returncode == 1
    assert "DAMAGED" in damaged.stdout


def test_serve_prints_its_real_addresses_and_what_to_try(tmp_path: Path) -> None:
    """Scenario: `headrace serve` on port 0 for gRPC and metrics, data in tmp. Expected:
    once it listens, stderr names the bound gRPC port (which answers health checks), the
    metrics URL (which serves headrace_ metrics), the data directory, the exported
    HEADRACE_BROKER and the tour's steps."""
    data = tmp_path / "d"
    args = ["serve", "--data-dir", str(data), "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*CLI, *args, "--metrics-listen", "127.0.0.1:0", "--log-level", "WARNING"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        banner = "".join(proc.stderr.readline() for _ in range(7))
        found = re.search(
            r"serving on 127\.0\.0\.1:(\d+), data in (.+), metrics (http://\S+/metrics)\.",
            banner,
        )
        assert found, banner
        port, data_dir, metrics = found.groups()
        wait_serving(int(port), time.monotonic() + 10)
        with urllib.request.urlopen(metrics, timeout=10) as got:
            assert b"headrace_" in got.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)  # and close the pipe
    assert data_dir == str(data)
    assert f"export HEADRACE_BROKER=127.0.0.1:{port}" in banner
    assert "  headrace topics create orders --partitions 3\n" in banner
    assert "  seq 5 | headrace produce orders\n" in banner
    assert "  headrace consume orders --subscription billing --count 3 --timeout 5\n" in banner


def test_make_run_passes_nothing_that_overrides_the_environment() -> None:
    """Scenario: `make -n run` in the checkout. Expected: the serve command has no
    --data-dir, --listen or other option of its own (HEADRACE_DATA_DIR and the config
    apply), and make prints no banner of its own."""
    root = Path(__file__).resolve().parents[2]
    shown = subprocess.run(
        ["make", "-n", "-s", "run"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    [serve] = [line for line in shown.splitlines() if "headrace serve" in line]
    assert serve.strip() == ".venv/bin/headrace serve"
    assert "echo" not in shown.split("headrace serve")[0].split("touch")[-1]


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[str]:
    """A `headrace serve --tls-cert --tls-key` process for the module."""
    yield from _tls_serve(tmp_path_factory.mktemp("operator-tls"), pki)


def test_produce_with_the_wrong_ca_fails_fast_naming_tls(tls_broker: str, pki: Pki) -> None:
    """Scenario: `produce` to a TLS broker with a --tls-ca that did not sign its
    certificate. Expected: exit 1 within a few seconds (not the producer's 30 s of
    retries), one line saying the TLS handshake failed and which option to check."""
    started = time.monotonic()
    done = headrace("produce", "t", "--count", "1", "--tls-ca", pki.wrong_ca, broker=tls_broker)
    assert time.monotonic() - started < 5
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith(f"Error: TLS handshake with {tls_broker} failed (")
    assert "check that --tls-ca is the CA that signed the broker's certificate" in line


def test_produce_in_plain_text_to_a_tls_broker_hints_at_tls_ca(tls_broker: str) -> None:
    """Scenario: `produce` without --tls-ca to a TLS broker. Expected: exit 1 within a few
    seconds, one line naming the address and suggesting --tls-ca."""
    started = time.monotonic()
    done = headrace("produce", "t", "--count", "1", broker=tls_broker)
    assert time.monotonic() - started < 5
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith(f"Error: cannot reach a broker at {tls_broker} (")
    assert line.endswith("and pass --tls-ca if it serves TLS")
