"""The etcd harness itself: three members become healthy, one elected leader; a killed
member comes back on its data directory."""

from __future__ import annotations

from tests.cluster.etcd_harness import EtcdCluster


def test_three_members_healthy_with_one_leader(own_etcd: EtcdCluster) -> None:
    """A fresh cluster: every member answers /health and exactly one is the leader; a
    value put through one member is read through another."""
    assert all(m.is_healthy() for m in own_etcd.members)
    assert own_etcd.leader() in own_etcd.members
    own_etcd.etcdctl("put", "k", "v", member=own_etcd.members[0])
    assert own_etcd.etcdctl("get", "k", "--print-value-only", member=own_etcd.members[2]) == "v\n"


def test_leader_killed_and_restarted(own_etcd: EtcdCluster) -> None:
    """SIGKILL the leader: another member leads; the killed one restarts healthy on its
    data directory and still holds what was written before."""
    own_etcd.etcdctl("put", "k", "before")
    old = own_etcd.leader()
    own_etcd.kill(old)
    assert not old.is_healthy()
    assert own_etcd.leader() is not old
    own_etcd.restart(old)
    assert old.is_healthy()
    assert own_etcd.etcdctl("get", "k", "--print-value-only", member=old) == "before\n"
