"""The quickstart (docs/quickstart.md) as a newcomer runs it: its shell steps against a real
`headrace serve`, each compared with the output the page shows.

Each step is a ```sh block followed by a ```text block. The commands run as written, with
`.venv/bin/headrace` pointed at this interpreter's environment and ``HEADRACE_BROKER`` at a
broker on a free port (the page's broker is on the default address). What may differ from
the page is listed here, explicitly, per step:

- step 1 (the banner): the address and the data directory; the "Try ..." line's pointer;
- step 4 (consume): which three of the five values come, since the records' partitions
  depend on how unkeyed records are spread; the summary line is exact;
- step 5 (lag): per row, which partition holds the lag (cursor, head, lag, age, rates,
  drain, state and reason); the header, the rows' topic, subscription, partition, type,
  consumers and in-flight, and the total row's lag are exact.
- "Dead-letter a record": which of the two waiting records is dead-lettered (its value,
  partition and offset) and the time it was; the order of the last consume's two values.
  Every other line is exact.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.test_serve_process import free_port, wait_serving

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"
STEP = re.compile(r"^## (\d)\. .*?^```sh\n(.*?)^```\n.*?^```text\n(.*?)^```$", re.M | re.S)
BIN = Path(sys.executable).parent


def steps() -> dict[int, tuple[str, str]]:
    """``{number: (command, shown output)}`` of the page's numbered steps."""
    return {int(m[1]): (m[2].strip(), m[3]) for m in STEP.finditer(PAGE.read_text())}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A `headrace serve` in ``tmp_path`` as `make run` starts it (data in ./data),
    metrics off; yields its address and what it printed on stderr once serving."""
    port = free_port()
    log = tmp_path / "serve.err"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [BIN / "headrace", "serve", "--listen", f"127.0.0.1:{port}", "--metrics-listen", ""],
            cwd=tmp_path,
            stderr=err,
        )
    try:
        wait_serving(port, time.monotonic() + 20)
        yield f"127.0.0.1:{port}", log.read_text()
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C, as the page says
        assert proc.wait(timeout=15) == 0
        assert "headrace stopped" in log.read_text()


def run(command: str, address: str, cwd: Path) -> str:
    """``command`` as the page writes it, in bash; stdout then stderr, as a terminal shows
    a command that writes its summary to stderr last."""
    done = subprocess.run(
        ["bash", "-c", command.replace(".venv/bin/", f"{BIN}/")],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        env=os.environ | {"HEADRACE_BROKER": address},
    )
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout + done.stderr


def test_the_page_has_five_steps_each_with_its_output() -> None:
    """Scenario: the quickstart page. Expected: steps 1 to 5, each a command and the
    output it prints; step 1 is `make run`."""
    found = steps()
    assert sorted(found) == [1, 2, 3, 4, 5]
    assert found[1][0] == "make run"


def test_the_quickstart_prints_what_the_page_shows(served: tuple[str, str], tmp_path: Path) -> None:
    """Scenario: steps 2 to 5 of the page run in order against a fresh broker, and the
    broker's banner for step 1. Expected: each prints the page's output, but for the
    variations the module docstring lists."""
    address, banner = served
    shown = steps()
    _check_banner(shown[1][1], banner, address)
    for n in (2, 3):
        assert run(shown[n][0], address, tmp_path) == shown[n][1], n
    consumed = run(shown[4][0], address, tmp_path)
    _check_consume(shown[4][1], consumed)
    _check_lag(shown[5][1], run(shown[5][0], address, tmp_path))
    waiting = {"1", "2", "3", "4", "5"} - set(consumed.splitlines()[:-1])
    commands, page = dead_letter_section()
    got = "".join(run(command, address, tmp_path) for command in commands)
    _check_dead_letter(page, got, waiting)


def dead_letter_section() -> tuple[list[str], str]:
    """The commands (one per line) and the shown output of "Dead-letter a record"."""
    text = PAGE.read_text()
    section = text[text.index("## Dead-letter a record") :]
    found = re.search(r"^```sh\n(.*?)^```\n\n```text\n(.*?)^```$", section, re.M | re.S)
    assert found is not None
    return found[1].strip().splitlines(), found[2]


def _check_dead_letter(page: str, got: str, waiting: set[str]) -> None:
    want, have = page.splitlines(), got.splitlines()
    assert len(have) == len(want), have
    rejected = have[0]
    assert rejected in waiting
    for i in (1, 2, 4, 7):  # the reject's summary, the table's head, the replay, the summary
        assert have[i] == want[i], (want[i], have[i])
    row = have[3].split()
    assert row[0] == "0"  # the first entry of the queue
    assert row[3:6] == ["1", "bad", "price"]  # one attempt, the --reason
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", row[6])
    assert row[7:] == ["no", rejected]
    assert set(have[5:7]) == waiting, "the other waiting record, and the replayed one"


def _check_banner(page: str, banner: str, address: str) -> None:
    first, try_line, *commands = page.splitlines()
    expected = first.replace("127.0.0.1:50051", address).replace(
        "metrics http://127.0.0.1:9464/metrics", "metrics off"
    )
    assert expected in banner
    assert try_line.split(" (")[0] in banner  # "Try, in another terminal"
    for command in commands:
        assert command.replace(".venv/bin/", f"{BIN}/") in banner


def _check_consume(page: str, got: str) -> None:
    *values, summary = page.splitlines()
    *got_values, got_summary = got.splitlines()
    assert got_summary == summary
    assert len(got_values) == len(values) == 3
    assert len(set(got_values)) == 3
    assert set(got_values) <= {"1", "2", "3", "4", "5"}


def _check_lag(page: str, got: str) -> None:
    page_rows, got_rows = page.splitlines(), got.splitlines()
    assert got_rows[0] == page_rows[0]
    assert len(got_rows) == len(page_rows)
    head = page_rows[0].split()
    fixed = ("topic", "subscription", "partition", "type", "consumers", "in_flight")
    for page_row, got_row in zip(page_rows[1:], got_rows[1:], strict=True):
        want, have = page_row.split(), got_row.split()
        if want[2] == "total":  # no cursor or head: lag sits where cursor does
            assert have[:4] == want[:4]
            assert have[4] == want[4] == "2", "two of the five records wait"
            continue
        for column in fixed:
            i = head.index(column)
            assert have[i] == want[i], (column, page_row, got_row)


def test_every_command_of_the_longer_tour_runs(served: tuple[str, str], tmp_path: Path) -> None:
    """Scenario: the longer tour's commands, one by one in order (comments stripped),
    against a fresh broker, with no terminal on stdin. Expected: each exits 0 but the
    last, `topics delete orders`, which asks first: with nobody to ask it exits 2 and
    deletes nothing, as the page says (`--yes` then deletes the topic)."""
    address, _ = served
    text = PAGE.read_text()
    tour = text[text.index("## The longer tour") :]
    block = tour[tour.index("```sh\n") + 6 : tour.index("\n```", tour.index("```sh\n"))]
    commands = [line.split("  #")[0].rstrip() for line in block.splitlines()]
    assert commands[-1] == ".venv/bin/headrace topics delete orders"
    for command in commands[:-1]:
        run(command, address, tmp_path)
    asked = subprocess.run(
        [BIN / "headrace", "topics", "delete", "orders", "--broker", address],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    assert asked.returncode == 2
    assert "not asking" in asked.stderr
    assert "orders" in run(".venv/bin/headrace topics list", address, tmp_path)
    run(".venv/bin/headrace topics delete orders --yes", address, tmp_path)
    assert "orders" not in run(".venv/bin/headrace topics list", address, tmp_path)


def test_the_readme_quickstart_is_the_pages() -> None:
    """Scenario: the README's five-step quickstart beside docs/quickstart.md's. Expected:
    the same commands in the same order, and the same output for each (the README shows
    only the banner's first line for step 1), so the README's output is checked by the
    tests above too."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quickstart") : readme.index("## Features")]
    pairs = re.findall(r"^```sh\n(.*?)^```\n\n```text\n(.*?)^```$", section, re.M | re.S)
    shown = steps()
    assert [command.strip() for command, _ in pairs] == [shown[n][0] for n in range(1, 6)]
    assert pairs[0][1] == shown[1][1].splitlines(keepends=True)[0]
    assert [output for _, output in pairs[1:]] == [shown[n][1] for n in range(2, 6)]
