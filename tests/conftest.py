"""Shared fixtures: a fresh partition directory and small-segment configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._certs import Pki, make_pki
from wal import LogConfig


@pytest.fixture
def wal_dir(tmp_path: Path) -> str:
    """An empty directory for one partition's log."""
    path = tmp_path / "partition-0"
    return str(path)


@pytest.fixture
def small_config() -> LogConfig:
    """Segments that roll at ~512 B and an index entry every ~100 B (STYLE rule 31)."""
    return LogConfig(segment_bytes=512, index_interval_bytes=100)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Test-made certificates (a CA, server, client, expired, wrong CA): see tests._certs."""
    return make_pki(tmp_path_factory.mktemp("pki"))
