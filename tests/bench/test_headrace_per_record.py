"""The per-record rows of ``bench pubsub`` against a real ``headrace serve`` process.

Scenario: a real broker (subprocess, fsync ``always``, real files, gRPC over 127.0.0.1),
driven by :class:`~bench._headrace_pubsub.HeadraceSystem` at a tiny size. Expected: each
per-record path reports a positive time, so its row is a sane, finite rate, and the consume
path got back records the two send paths wrote (it would time out otherwise).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import pytest

from bench._headrace_pubsub import HeadraceSystem, _check_acknowledged
from bench._measure import per_second
from bench._pubsub_system import PerRecordSystem
from bench._server_process import ServerFailedError
from client import RecordMetadata, Unavailable

COUNT = 300
PAYLOAD = b"p" * 100


def test_headrace_per_record_paths_report_positive_rates(tmp_path: Path) -> None:
    """Async send, blocking send, and consume+ack async and blocking, one record at a
    time, all acknowledged."""
    system = HeadraceSystem(tmp_path)
    assert isinstance(system, PerRecordSystem)

    async def scenario() -> list[float]:
        await system.start()
        try:
            return [
                await system.send_per_record(COUNT, PAYLOAD),
                await system.sync_send_per_record(COUNT, PAYLOAD),
                await asyncio.wait_for(system.consume_per_record(2 * COUNT), timeout=30),
                await asyncio.wait_for(system.sync_consume_per_record(2 * COUNT), timeout=30),
            ]
        finally:
            await system.stop()

    seconds = asyncio.run(scenario())
    assert all(s > 0 for s in seconds)
    assert all(per_second(COUNT, s) > 0 for s in seconds)


def test_an_unacknowledged_send_fails_the_phase() -> None:
    """A send whose future failed, or never finished, makes the row an error, not a rate."""
    done: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
    done.set_result(RecordMetadata("t", 0, 0, False))
    failed: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
    failed.set_exception(Unavailable("broker gone"))
    pending: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
    _check_acknowledged([done])
    with pytest.raises(ServerFailedError, match=r"2 of 3 records .*broker gone"):
        _check_acknowledged([done, failed, pending])
