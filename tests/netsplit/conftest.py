"""Fixtures: a network-namespace lab (:mod:`tests.netsplit.netns`) with a three-member etcd,
one member per namespace, and namespaces for brokers (:mod:`tests.netsplit.hosts`).

``net``: one lab and etcd shared by a test module (made once: a lab and an etcd take about
two seconds). Each test gets its own key prefix, starts its own brokers, and every cut is
healed after it, whatever its outcome. Everything skips without root or iproute2.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.cluster.etcd_harness import etcd_binary
from tests.netsplit.hosts import BROKER_NODES, ETCD_NODES, Net, NetEtcd
from tests.netsplit.netns import Lab, require_netns


@pytest.fixture(scope="module")
def shared_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    """The lab (``e1``..``e3``, ``b1``, ``b2``) and etcd, made once per module."""
    require_netns()
    etcd_binary()  # skip, or fail under CI, before making anything
    with Lab([*ETCD_NODES, *BROKER_NODES]) as lab:
        etcd = NetEtcd(lab, ETCD_NODES, tmp_path_factory.mktemp("netsplit-etcd"))
        etcd.start()
        yield Net(lab, etcd)


@pytest.fixture
def net(shared_net: Net) -> Iterator[Net]:
    """The module's lab, every cut healed after the test."""
    shared_net.lab.heal()
    yield shared_net
    shared_net.lab.heal()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses: ``/headrace-netsplit-<random>/``."""
    return f"/headrace-netsplit-{uuid.uuid4().hex[:12]}/"
