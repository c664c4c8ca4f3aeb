"""The in-process fan-out CPU harness (``bench.fanout_cpu``): a small run over a real log
and real subscriptions delivers every record to every subscription and reports CPU time
per delivery; bad arguments are refused."""

from __future__ import annotations

import pytest

from bench import fanout_cpu


@pytest.mark.asyncio
async def test_every_record_reaches_every_subscription() -> None:
    """Scenario: 30 one-record appends, 4 subscriptions, acks every 10 ms.
    Expected: 120 deliveries, at least one pass each, some main-thread CPU, and a report
    line that names the CPU per delivery."""
    result = await fanout_cpu.measure(records=30, subscriptions=4, ack_interval_s=0.01)
    assert result.deliveries == 120
    assert result.passes >= 4
    assert result.cpu_s > 0
    assert result.line().startswith("cpu_us_per_delivery=")


def test_the_command_line_refuses_zero_records(capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: ``--records 0``. Expected: a usage error (exit 2) that names the option."""
    with pytest.raises(SystemExit) as info:
        fanout_cpu.main(["--records", "0"])
    assert info.value.code == 2
    assert "--records" in capsys.readouterr().err


def test_an_unpaced_run_delivers_everything(capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: ``--records 5 --subscriptions 2 --unpaced`` (acks at once, no heartbeat or
    cursor flush during the run). Expected: one report line with all 10 deliveries."""
    fanout_cpu.main(["--records", "5", "--subscriptions", "2", "--unpaced"])
    line = capsys.readouterr().out
    assert line.startswith("cpu_us_per_delivery=")
    assert " deliveries=10 " in line
