"""Fixtures: a real three-member etcd on loopback (see :mod:`tests.cluster.etcd_harness`).

``etcd``: one cluster shared by the module's tests, each test under its own key prefix
(so they never see each other's keys). ``own_etcd``: a cluster of the test's own, for tests
that kill, freeze or compact it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from cluster.etcd import EtcdStore
from tests.cluster.etcd_harness import EtcdCluster, etcd_binary


def _running(root: Path) -> Iterator[EtcdCluster]:
    etcd_binary()  # skip, or fail under CI, before making anything
    cluster = EtcdCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A healthy 3-member etcd shared by one test module; do not kill or freeze it."""
    yield from _running(tmp_path_factory.mktemp("etcd"))


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A healthy 3-member etcd of this test's own: it may kill, freeze or compact it."""
    yield from _running(tmp_path / "etcd")


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses: ``/headrace-test-<random>/``."""
    return f"/headrace-test-{uuid.uuid4().hex[:12]}/"


@pytest_asyncio.fixture
async def store(etcd: EtcdCluster, prefix: str) -> AsyncIterator[EtcdStore]:
    """An :class:`EtcdStore` on the shared cluster; the test's prefix is cleared after."""
    async with await EtcdStore.connect(etcd.endpoints, timeout_s=3.0) as opened:
        yield opened
        await opened.delete_prefix(prefix)
