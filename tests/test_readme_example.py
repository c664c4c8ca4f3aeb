"""The docs' first Python program runs as printed, against a real broker, twice in a row.

The program is ``docs/examples/client_quickstart.py``, which the Python client guide
(``docs/client/guide.md``) includes with a snippet. A new user's first program is that
example: it must work as pasted, print a handful of
lines rather than flood the terminal, and still work the second time (the topic exists
then, and the subscription has a cursor).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.test_serve_process import free_port, wait_serving

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = '"127.0.0.1:50051"'


EXAMPLE = ROOT / "docs" / "examples" / "client_quickstart.py"
GUIDE = ROOT / "docs" / "client" / "guide.md"


def python_example() -> str:
    """The example file, which the guide must include as it is."""
    assert '--8<-- "docs/examples/client_quickstart.py"' in GUIDE.read_text()
    return EXAMPLE.read_text()


@pytest.fixture
def broker_address(tmp_path: Path) -> Iterator[str]:
    """A `headrace serve` process for one test."""
    port = free_port()
    serve = ["serve", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from broker.cli import main; main()",
            *serve,
            "--metrics-listen",
            "",
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_serving(port, time.monotonic() + 20)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def test_the_python_example_runs_twice_and_prints_a_few_lines(broker_address: str) -> None:
    """Scenario: the guide's Python example, its broker address pointed at a test broker,
    run twice. Expected: exit 0 both times; at most 5 lines each, the first saying where
    hello was stored and the last that the consumer got this run's hello."""
    code = python_example()
    assert code.count(DEFAULT) == 1, "the example names its broker once, as BROKER"
    code = code.replace(DEFAULT, repr(broker_address))
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, (run, done.stderr)
        lines = done.stdout.splitlines()
        assert len(lines) <= 5, (run, lines)
        assert lines[0].startswith("hello is at ")
        assert lines[1] == "sent 10000 more in bulk"
        assert lines[-1].startswith("audit got this run's hello at delivery ")
