"""Fixtures shared by the dispatcher's tests: real logs on real files."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from wal import LogWriter


@pytest_asyncio.fixture
async def writers(tmp_path: Path) -> AsyncIterator[list[LogWriter]]:
    """Two open logs (the partitions 0 and 1 of a topic), closed after the test."""
    opened = [await LogWriter.open(str(tmp_path / "logs" / str(p))) for p in range(2)]
    yield opened
    for w in opened:
        await w.aclose()
