"""A cluster member's state as metrics: the :class:`~broker.metrics.ClusterSample` of a
running :class:`~cluster.member.ClusterMember`, taken on its event loop for the scrape.

Role: :func:`member_sample` reads the member through its public surface (session, view,
claims, controller); :func:`loop_sampler` is what :meth:`broker.metrics.BrokerMetrics.
watch_cluster` gets: the scrape runs on the exporter's thread, and the member's dicts are
changed by tasks on the loop, so the sample is taken on the loop
(``run_coroutine_threadsafe``) and handed over whole. A loop too busy to answer within
``timeout_s`` gives no cluster families for that scrape (a gap, not a wrong value).

Wiring (cluster mode, once the member joined)::

    metrics.set_node(config.cluster.node_id)
    metrics.watch_cluster(loop_sampler(member, asyncio.get_running_loop()))

``etcd_reachable``: etcd answered a keepalive sent within the last half TTL (keepalives
go every TTL/6, so about three in a row were lost or unanswered); ``session_alive``: the
write rule's ``may_write`` (:mod:`cluster.session`).

:func:`lag_sampler` does the same for the followers' lag in the replicated topics the
broker leads (``headrace_replication_lag_*``, :meth:`BrokerMetrics.watch_replication`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.metrics import ClusterSample, ReplicaLagSample
from cluster.member import ClusterMember
from cluster.routes import Me, offline_topics
from cluster.session import margin_for

if TYPE_CHECKING:
    from broker.cluster_node import ClusterNode

logger = logging.getLogger(__name__)


def member_sample(member: ClusterMember, now: float | None = None) -> ClusterSample:
    """``member``'s state now (call on its event loop).

    Args:
        member: a started member.
        now: monotonic seconds, on the session's clock (default :func:`time.monotonic`).
    """
    session = member.session
    at = time.monotonic() if now is None else now
    alive = session.lease != 0 and session.may_write(at)
    # may_write(t) holds while t is before (last acknowledged send + TTL - margin)
    reachable = session.may_write(at + session.ttl_s / 2 - margin_for(session.ttl_s))
    state = member.view.state
    claimed = member.claimed
    owned = [t.record for name, t in state.topics.items() if name in claimed]
    owned = [r for r in owned if r.owner == member.node_id]
    me = Me(member.node_id, claimed, alive, member.local.exists)
    return ClusterSample(
        session_alive=alive,
        session_age_s=session.age_s(),
        sessions=session.generation,
        is_controller=member.controller.is_controller,
        owned_topics=len(owned),
        owned_partitions=sum(r.partitions for r in owned),
        etcd_reachable=reachable,
        offline=tuple((t.topic, t.owner_node, t.reason) for t in offline_topics(state, me)),
        replication=tuple(
            (r.name, len(r.effective_replicas()), len(r.effective_isr()), r.min_insync)
            for r in owned
            if len(r.effective_replicas()) > 1
        ),
        leader_elections=member.replicas.elections_won,
        unclean_elections=member.replicas.unclean_elections,
        unclean_records_lost=tuple(sorted(member.replicas.records_given_up.items())),
    )


def loop_sampler(
    member: ClusterMember, loop: asyncio.AbstractEventLoop, timeout_s: float = 1.0
) -> Callable[[], ClusterSample | None]:
    """A sampler safe to call from the exporter's thread: the sample is taken on ``loop``."""

    async def take() -> ClusterSample:
        return member_sample(member)

    def sample() -> ClusterSample | None:
        if loop.is_closed():
            return None
        future = asyncio.run_coroutine_threadsafe(take(), loop)
        try:
            return future.result(timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            future.cancel()
            logger.debug("cluster metrics skipped at this scrape: %r", exc)
            return None

    return sample


def lag_sampler(
    node: ClusterNode, loop: asyncio.AbstractEventLoop, timeout_s: float = 1.0
) -> Callable[[], list[ReplicaLagSample] | None]:
    """Each follower's lag in the replicated topics ``node`` leads, taken on ``loop``
    (safe to call from the exporter's thread)."""

    async def take() -> list[ReplicaLagSample]:
        return replica_lag(node)

    def sample() -> list[ReplicaLagSample] | None:
        if loop.is_closed():
            return None
        future = asyncio.run_coroutine_threadsafe(take(), loop)
        try:
            return future.result(timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            future.cancel()
            logger.debug("replication lag skipped at this scrape: %r", exc)
            return None

    return sample


def replica_lag(node: ClusterNode) -> list[ReplicaLagSample]:
    """Each follower's lag in the replicated topics ``node`` leads (call on its loop)."""
    samples: list[ReplicaLagSample] = []
    roles = node.replicas.roles() if node.replicas is not None else {}
    for name in sorted(roles):
        leader = node.replica_leader(name)
        if leader is None:
            continue
        samples.extend(
            ReplicaLagSample(name, lag.partition, lag.node, lag.lag_records, lag.lag_s)
            for lag in leader.follower_lag()
        )
        samples.extend(  # the state log, and the worst of the dead-letter queues
            ReplicaLagSample(name, -1, lag.node, lag.lag_records, lag.lag_s, lag.kind)
            for lag in leader.log_lag()
        )
    return samples
