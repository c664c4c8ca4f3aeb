"""How a failed dispatch pass is logged: a fault is an ERROR with its traceback, once per
failing streak; a save a replicated topic cannot commit yet (its in-sync set below
``min_insync_replicas``, leadership lost) is the expected wait of a degraded topic, a
WARNING without a traceback (the long fault runs logged 59 tracebacks for it)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import grpc
import pytest

from broker.error_status import status_for
from broker.errors import ReplicationOutcomeUnknownError
from dispatcher.dispatch_loop import DispatchLoop
from dispatcher.errors import NotCommittedError


def _loop() -> SimpleNamespace:
    """The attributes ``_pass_failed`` reads and writes, as a loop of ``t/s`` has them."""
    return SimpleNamespace(
        last_error="", _topic="t", _name="s", _sub=SimpleNamespace(heartbeat_interval_s=0.5)
    )


def test_a_save_not_committed_is_a_warning_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: a pass fails with the broker's ReplicationOutcomeUnknownError (the state
    save of a replicated topic below min_insync), twice in a row.
    Expected: one WARNING naming the subscription and the reason, no traceback, no ERROR;
    ``last_error`` holds the reason."""
    loop = _loop()
    exc = ReplicationOutcomeUnknownError("t", 0, 7, "the in-sync set fell below 2")
    with caplog.at_level(logging.INFO, logger="dispatcher.dispatch_loop"):
        DispatchLoop._pass_failed(loop, exc)  # type: ignore[arg-type]
        DispatchLoop._pass_failed(loop, exc)  # type: ignore[arg-type]
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    (record,) = caplog.records
    assert record.exc_info is None
    assert "t/s: dispatch waits for its state to commit" in record.getMessage()
    assert "in-sync set fell below 2" in record.getMessage()
    assert loop.last_error == str(exc)


def test_any_other_failure_is_an_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: a pass fails with an OSError. Expected: one ERROR with the traceback."""
    loop = _loop()
    with caplog.at_level(logging.INFO, logger="dispatcher.dispatch_loop"):
        DispatchLoop._pass_failed(loop, OSError(5, "EIO"))  # type: ignore[arg-type]
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None


def test_the_broker_error_is_still_unavailable_to_a_client() -> None:
    """Scenario: ReplicationOutcomeUnknownError, now also a dispatcher NotCommittedError,
    through the status table. Expected: UNAVAILABLE (outcome unknown), as before."""
    exc = ReplicationOutcomeUnknownError("t", 0, 7, "leadership was lost")
    assert isinstance(exc, NotCommittedError)
    assert status_for(exc)[0] is grpc.StatusCode.UNAVAILABLE
