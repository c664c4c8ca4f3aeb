"""``make demo`` works: the end-to-end pipeline with a broker SIGKILL midway ends with
every order counted once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.spark_connector.conftest import ROOT

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_the_demo_counts_every_order_once_across_a_broker_kill() -> None:
    """Scenario: the demo with 4,000 orders at 400/s, so that the broker is killed while
    orders still flow. Expected: exit 0, the broker was killed, the lag reached 0, and the
    final line says nothing was lost or counted twice."""
    done = subprocess.run(
        [sys.executable, "-m", "spark_connector.demo", "--orders", "4000", "--rate", "400"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "5. SIGKILL the broker mid-run" in done.stdout
    assert "4. lag      0" in done.stdout
    assert "OK: 4,000 orders produced, 4,000 counted" in done.stdout
