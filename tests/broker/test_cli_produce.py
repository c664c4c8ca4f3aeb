"""``headrace produce`` as real processes against a real broker: lines of a slow pipe
published as they come; SIGINT and SIGTERM (the count of acknowledged lines, checked
against what a consumer then reads; a second signal that stops the wait); where records
without a key go (``--spread``, ``--partition``)."""

from __future__ import annotations

import json
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from broker.cli_produce import _acknowledged, spread_picker
from tests.broker.test_cli_client import CLI
from tests.broker.test_serve_process import free_port, wait_serving

#: Writes "1", "2", ... one line every 2 ms until its pipe closes.
FEEDER = """
import sys, time
i = 0
try:
    while True:
        i += 1
        sys.stdout.write(f"{i}\\n")
        sys.stdout.flush()
        time.sleep(0.002)
except (BrokenPipeError, KeyboardInterrupt):
    pass
"""


class Served:
    """A `headrace serve` process: its address and process."""

    def __init__(self, address: str, proc: subprocess.Popen[bytes]) -> None:
        self.address = address
        self.proc = proc


def _serve(data: str) -> Iterator[Served]:
    port = free_port()
    args = ["serve", "--data-dir", data, "--listen", f"127.0.0.1:{port}", "--metrics-listen", ""]
    proc = subprocess.Popen([*CLI, *args], stderr=subprocess.DEVNULL)
    try:
        wait_serving(port, time.monotonic() + 20)
        yield Served(f"127.0.0.1:{port}", proc)
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A `headrace serve` process for the module."""
    yield from _serve(str(tmp_path_factory.mktemp("produce") / "d"))


def headrace(address: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args, "--broker", address],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def heads(address: str, topic: str) -> list[int]:
    """Each partition's head (next offset) of ``topic``."""
    done = headrace(address, "topics", "describe", topic, "--json")
    assert done.returncode == 0, done.stderr
    [info] = json.loads(done.stdout)
    return [p["head"] for p in info["partitions"]]


def consumed_values(address: str, topic: str) -> list[int]:
    """Every record of ``topic``, read by a new subscription, as integers."""
    done = headrace(address, "consume", topic, "-s", "check", "--timeout", "2")
    assert done.returncode == 0, done.stderr
    return [int(v) for v in done.stdout.split()]


class Feeding:
    """A feeder process piping a line every 2 ms into `headrace produce TOPIC`."""

    def __init__(self, address: str, topic: str) -> None:
        self.feeder = subprocess.Popen([sys.executable, "-c", FEEDER], stdout=subprocess.PIPE)
        self.produce = subprocess.Popen(
            [*CLI, "produce", topic, "--broker", address],
            stdin=self.feeder.stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.feeder.stdout is not None
        self.feeder.stdout.close()  # the producer holds the read end

    def wait_published(self, address: str, topic: str, at_least: int) -> None:
        """Wait until ``at_least`` records are in the topic, while the pipe stays open."""
        deadline = time.monotonic() + 20
        while sum(heads(address, topic)) < at_least:
            assert time.monotonic() < deadline, "lines of the open pipe were not published"
            assert self.produce.poll() is None, self.produce.stderr
            time.sleep(0.1)

    def end(self, timeout: float = 20) -> tuple[int, str]:
        """The producer's exit code and stderr, and the feeder stopped."""
        try:
            _, err = self.produce.communicate(timeout=timeout)
        finally:
            self.feeder.kill()
            self.feeder.wait(timeout=5)
        return self.produce.returncode, err


ACKED = re.compile(r"lines 1 to (\d+) of the input were acknowledged: resume at line (\d+)")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_input_and_says_how_many_lines_a_consumer_gets(
    served: Served, signum: int, code: int
) -> None:
    """Scenario: a pipe feeds `produce` a line every 2 ms, on a 3-partition topic; once
    50 records are in the topic (the pipe still open), the signal. Expected: exit 130
    (SIGINT) or 143 (SIGTERM); stderr says lines 1 to N were acknowledged and to resume
    at N+1; a consumer then reads exactly the lines 1 to N, none twice, none later."""
    topic = f"fed-{signum}"
    assert headrace(served.address, "topics", "create", topic, "--partitions", "3").returncode == 0
    feeding = Feeding(served.address, topic)
    feeding.wait_published(served.address, topic, at_least=50)
    feeding.produce.send_signal(signum)
    code_seen, err = feeding.end()
    assert code_seen == code, err
    found = ACKED.search(err)
    assert found, err
    acked, resume = int(found[1]), int(found[2])
    assert acked >= 50
    assert resume == acked + 1
    assert f"interrupted by {signal.Signals(signum).name}: stopped reading input" in err
    assert sorted(consumed_values(served.address, topic)) == list(range(1, acked + 1))
    assert sum(heads(served.address, topic)) == acked


def test_a_second_sigint_stops_waiting_and_says_past_where_it_is_unknown(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Scenario: `produce` fed slowly; the broker is stopped (SIGSTOP), so acks stop; then
    SIGINT, and SIGINT again a second later. Expected: after the first, it keeps waiting
    and says for how many lines (and that a second Ctrl-C stops waiting); after the
    second, it exits 130 within seconds saying lines 1 to N were acknowledged and the M
    lines after them are unknown. Once the broker runs again, a consumer reads every line
    from 1 to N, and nothing past N + M."""
    for served in _serve(str(tmp_path_factory.mktemp("abandon") / "d")):
        address = served.address
        assert headrace(address, "topics", "create", "held", "--partitions", "3").returncode == 0
        feeding = Feeding(address, "held")
        feeding.wait_published(address, "held", at_least=50)
        served.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(0.5)  # lines keep coming: some are sent and not acknowledged
            feeding.produce.send_signal(signal.SIGINT)
            time.sleep(1.5)
            assert feeding.produce.poll() is None, "it did not wait for the sent lines"
            feeding.produce.send_signal(signal.SIGINT)
            started = time.monotonic()
            code, err = feeding.end(timeout=10)
            assert time.monotonic() - started < 5
        finally:
            served.proc.send_signal(signal.SIGCONT)
        assert code == 130, err
        assert re.search(r"SIGINT: stopped reading input; waiting for \d+ lines? to be", err), err
        assert "a second Ctrl-C or SIGTERM stops waiting" in err
        found = re.search(
            r"then stopped waiting at a second signal; lines 1 to (\d+) of the input were "
            r"acknowledged: resume at line \d+ \(tail -n \+\d+ FILE\); whether the (\d+) "
            r"lines? sent after them were written is unknown, so resuming there may repeat",
            err,
        )
        assert found, err
        acked, unknown = int(found[1]), int(found[2])
        assert acked >= 50
        assert unknown > 0
        values = consumed_values(address, "held")
        assert set(range(1, acked + 1)) <= set(values)
        assert max(values) <= acked + unknown


def test_a_signal_while_connecting_ends_it_at_once_saying_nothing_was_sent() -> None:
    """Scenario: `produce --count 3` to a listener that accepts and never answers, so it
    waits up to its 5 s connect timeout; SIGINT once it has connected. Expected: exit 130
    within a second of the signal and one line saying nothing was sent."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        produce = subprocess.Popen(
            [*CLI, "produce", "t", "--count", "3", "--broker", address],
            stderr=subprocess.PIPE,
            text=True,
        )
        mute.settimeout(20)
        held, _ = mute.accept()  # it is in its connection check
        produce.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, err = produce.communicate(timeout=10)
        held.close()
    assert time.monotonic() - started < 1.5
    assert produce.returncode == 130
    assert err == "interrupted by SIGINT before anything was sent; nothing was produced\n"


def test_lines_of_an_open_pipe_are_published_before_it_closes(served: Served) -> None:
    """Scenario: one line written to `produce`'s stdin, which stays open. Expected: a
    consumer gets the line while `produce` still runs (it used to block the event loop
    in the read, so nothing went out before the pipe closed); once stdin closes,
    `produce` exits 0 having produced 1 record."""
    assert headrace(served.address, "topics", "create", "open-pipe").returncode == 0
    produce = subprocess.Popen(
        [*CLI, "produce", "open-pipe", "--broker", served.address],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert produce.stdin is not None
        produce.stdin.write(b"first\n")
        produce.stdin.flush()
        got = headrace(
            served.address, "consume", "open-pipe", "-s", "s", "--count", "1", "--timeout", "10"
        )
        assert got.stdout == "first\n", got.stderr
        assert produce.poll() is None
    finally:
        _, err = produce.communicate(timeout=20)
    assert produce.returncode == 0, err
    assert err == b"produced 1 record to open-pipe\n"


def test_records_without_a_key_go_round_robin_by_default(served: Served) -> None:
    """Scenario: `seq 6` and then `seq 5` (each line arriving at once, one batch) to a
    3-partition topic, without --spread; then the same 5 with --spread sticky to
    another. Expected: round-robin puts 2 of the 6 on each partition and the next 5 at
    most one more on each (4, 4, 3 in some order); sticky puts all 5 on one partition."""
    for topic in ("rr", "sticky"):
        made = headrace(served.address, "topics", "create", topic, "--partitions", "3")
        assert made.returncode == 0
    assert headrace(served.address, "produce", "rr", stdin="1\n2\n3\n4\n5\n6\n").returncode == 0
    assert heads(served.address, "rr") == [2, 2, 2]
    assert headrace(served.address, "produce", "rr", stdin="1\n2\n3\n4\n5\n").returncode == 0
    assert sorted(heads(served.address, "rr")) == [3, 4, 4]
    done = headrace(
        served.address, "produce", "sticky", "--spread", "sticky", stdin="1\n2\n3\n4\n5\n"
    )
    assert done.returncode == 0, done.stderr
    assert sorted(heads(served.address, "sticky")) == [0, 0, 5]


def test_partition_puts_every_record_there_and_is_checked(served: Served) -> None:
    """Scenario: --partition 2 on a 3-partition topic, with and without --key; then
    --partition 3, and --spread beside --key or --partition. Expected: all 4 records on
    partition 2; partition 3 is a usage error (exit 2) naming the topic's 3 partitions
    0 to 2; --spread with --key or --partition is a usage error saying there is nothing
    to spread."""
    assert (
        headrace(served.address, "topics", "create", "pinned", "--partitions", "3").returncode == 0
    )
    assert (
        headrace(served.address, "produce", "pinned", "--partition", "2", "--count", "3").returncode
        == 0
    )
    keyed = headrace(
        served.address, "produce", "pinned", "--partition", "2", "--key", "k", stdin="x\n"
    )
    assert keyed.returncode == 0, keyed.stderr
    assert heads(served.address, "pinned") == [0, 0, 4]

    beyond = headrace(served.address, "produce", "pinned", "--partition", "3", "--count", "1")
    assert beyond.returncode == 2
    assert (
        "Invalid value for --partition: topic 'pinned' has 3 partitions, 0 to 2; there is no "
        "partition 3"
    ) in beyond.stderr
    for given in (("--key", "k"), ("--partition", "0")):
        both = headrace(served.address, "produce", "pinned", *given, "--spread", "sticky")
        assert both.returncode == 2
        assert f"with {given[0]} it has nothing to spread" in both.stderr
    assert heads(served.address, "pinned") == [0, 0, 4]


def test_help_names_the_exit_codes_of_a_signal() -> None:
    """Scenario: `produce --help`. Expected: it says what Ctrl-C does and names exit codes
    130 and 143, and the --partition and --spread options."""
    shown = subprocess.run([*CLI, "produce", "--help"], capture_output=True, text=True, check=True)
    text = " ".join(shown.stdout.split())
    assert "130 after SIGINT, 143 after SIGTERM" in text
    assert "resume at line N+1" in text
    assert "--partition" in text
    assert "[round-robin|sticky]" in text


@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_round_robin_cycles_from_a_random_start(partitions: int) -> None:
    """Scenario: the round-robin picker over 30 random sources, each asked for 2.5 rounds
    of partitions. Expected: each record on the next partition, wrapping, from the
    source's first draw; the starts cover every partition (no run always begins at 0);
    the sticky picker leaves the choice to the producer (None)."""
    rounds = partitions * 5 // 2
    starts = set()
    for seed in range(30):
        start = random.Random(seed).randrange(partitions)
        starts.add(start)
        pick = spread_picker("round-robin", partitions, random.Random(seed))
        assert [pick() for _ in range(rounds)] == [(start + i) % partitions for i in range(rounds)]
    assert starts == set(range(partitions))
    assert spread_picker("sticky", partitions, random.Random(0))() is None


@pytest.mark.parametrize(
    ("count", "noun", "expected"),
    [
        (0, "line", "no line was acknowledged: resume at line 1 (tail -n +1 FILE)"),
        (1, "line", "line 1 of the input was acknowledged: resume at line 2 (tail -n +2 FILE)"),
        (
            7,
            "line",
            "lines 1 to 7 of the input were acknowledged: resume at line 8 (tail -n +8 FILE)",
        ),
        (0, "record", "no record was acknowledged"),
        (3, "record", "3 records (record-0 to record-2) acknowledged"),
    ],
)
def test_the_acknowledged_words(count: int, noun: str, expected: str) -> None:
    """Scenario: how many of the first lines (or --count records) were acknowledged.
    Expected: the words, with the line to resume at for stdin."""
    assert _acknowledged(count, noun) == expected
