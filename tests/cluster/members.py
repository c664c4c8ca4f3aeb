"""Starting cluster members for tests: N brokers (in-process ClusterMembers with
in-memory local topics) on one etcd under one prefix, each with its own EtcdStore."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cluster.etcd import EtcdStore
from cluster.local import MemoryTopics
from cluster.member import ClusterMember, MemberConfig

TTL = 2


async def start_member(
    endpoints: list[str], prefix: str, node: str, local: MemoryTopics | None = None
) -> ClusterMember:
    """A started member ``node`` at a made-up address ``127.0.0.1:70<n>``, TTL 2 s."""
    store = await EtcdStore.connect(endpoints, timeout_s=2.0)
    config = MemberConfig(node, f"127.0.0.1:{7000 + int(node[1:])}", TTL, prefix, "test")
    member = ClusterMember(store, config, local or MemoryTopics())
    await member.start()
    return member


async def stop_member(member: ClusterMember) -> None:
    """Leave cleanly (lease revoked) and close the member's store."""
    with contextlib.suppress(Exception):
        await member.aclose()
    await member.store.aclose()


@asynccontextmanager
async def members(
    endpoints: list[str], prefix: str, count: int
) -> AsyncIterator[list[ClusterMember]]:
    """``count`` started members b1..bN; all stopped at the end."""
    started: list[ClusterMember] = []
    try:
        for i in range(1, count + 1):
            started.append(await start_member(endpoints, prefix, f"b{i}"))
        yield started
    finally:
        for member in started:
            await stop_member(member)
