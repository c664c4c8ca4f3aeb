"""What a replica of a replicated topic does next (issue 37), pure.

Role: :func:`decide` turns one topic record, as this broker's view holds it, and what
this broker knows of itself (its claim in this session, whether it holds the topic's
local data, who is alive) into one :class:`Decision`. The member's shell
(:mod:`cluster.replica_member`) carries it out: the etcd writes through
:mod:`cluster.replica_txn` and the member's claim, the local work through the broker's
:class:`~cluster.local.LocalTopics` hook.

A topic is *replicated* when its record names its replicas (placed with a factor of 2 or
more; a reassignment may take it down to one replica and back up, and it stays on this
path, its leader committing alone); a factor-1 record (no ``replicas``) never comes here
(:func:`is_replicated`): its path is issue 36's.

Rules, in order (``me`` a replica; the first that applies):

=========================================  ===========================================
the record / this broker                   decision
=========================================  ===========================================
``me`` not among the replicas              ``STOP`` (no role; the data stays)
``deleting``                               ``DELETE`` (stop, delete locally; the
                                           leader also removes the key)
``placing``                                ``WAIT``
``creating``, local data missing           ``CREATE`` (then ``CLAIM`` if leader)
``creating``, data here, leader            ``CLAIM`` (``ready``, epoch + 1)
``creating``, data here, follower          ``WAIT`` (follow once ``ready``)
``ready``, leader, claimed this epoch      ``LEAD`` (pass the record on: isr changes)
``ready``, leader, data missing            ``MISSING`` (never recreated empty)
``ready``, leader, in the isr              ``CLAIM`` (a restart, a new session)
``ready``, follower, data missing          ``CREATE`` (empty, then ``FOLLOW``)
``ready``, follower, leader alive          ``FOLLOW`` the leader's address
``ready``, leader dead, me eligible        ``ELECT`` at ``rank`` (stagger)
``ready``, leader dead, no isr alive,      ``ELECT`` unclean, at ``rank`` among the
me out of sync, ``unclean`` allowed        alive out-of-sync replicas
``ready``, leader dead, me not eligible    ``WAIT``
=========================================  ===========================================

Eligible: in the isr (``cluster.replicas.election_rank``) and not ``fresh`` (a replica
that made its files empty while the record counted it in sync has nothing the isr
promises: it waits until the leader takes it out and lets it back in). Unclean
(``cluster.replicas.unclean_rank``): only when the cluster allows it
(``unclean_leader_election``, off by default) and no member of the isr is alive; the
member's shell waits a grace period before such an election (an in-sync replica that
comes back first takes it cleanly).

Worked example: ``t`` is ``owner b1, epoch 4, replicas (b1, b2, b3), isr (b1, b2, b3)``.
b1's broker key goes. b2 decides ``ELECT`` rank 0, b3 ``ELECT`` rank 1: b3 waits one
election step before it tries, so b2 usually wins (epoch 5, isr (b2, b3)); b3's next
decision is ``FOLLOW`` b2. b1 returns: ``owner`` is b2, so b1 decides ``FOLLOW`` b2.

Imports neither asyncio, os nor time.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from cluster.records import TopicRecord, TopicState
from cluster.replicas import election_rank, unclean_rank


class Step(enum.Enum):
    """What a replica does next (module table)."""

    STOP = "stop"
    DELETE = "delete"
    WAIT = "wait"
    CREATE = "create"
    CLAIM = "claim"
    LEAD = "lead"
    MISSING = "missing"
    FOLLOW = "follow"
    ELECT = "elect"

    def is_write(self) -> bool:
        """Whether the step writes etcd (it needs a session that may write)."""
        return self in (Step.CLAIM, Step.ELECT, Step.DELETE)


@dataclass(frozen=True, slots=True)
class Decision:
    """One step for one topic.

    Attributes:
        step: what to do.
        address: the leader's address (``FOLLOW``).
        rank: the place among the election's candidates, 0 first (``ELECT``).
        then_claim: after ``CREATE``, this broker is the leader of a ``creating`` topic.
        unclean: ``ELECT`` as an out-of-sync replica (records only the isr had are lost).
    """

    step: Step
    address: str = ""
    rank: int = 0
    then_claim: bool = False
    unclean: bool = False


def is_replicated(record: TopicRecord) -> bool:
    """Whether ``record`` names its replicas (else it is issue 36's factor 1). A replicated
    topic reassigned down to one replica stays replicated: its leader keeps its role and
    commit gate (the high watermark is then its durable end), its subscription state stays
    in the ``state`` log, and the replicas dropped delete their copies."""
    return bool(record.replicas)


def decide(
    record: TopicRecord,
    me: str,
    *,
    alive: Mapping[str, str],
    claimed: int | None,
    holds: bool,
    fresh: bool = False,
    unclean: bool = False,
) -> Decision:
    """The next step of replica ``me`` for ``record`` (module table).

    Args:
        record: the topic as the view holds it (replicated).
        me: this broker's node id.
        alive: ``node_id -> address`` of every live broker.
        claimed: the epoch this broker claimed ``record`` at in its current session.
        holds: whether the topic's local data (this id) is here.
        fresh: this broker made the topic's files empty while the record counted it in
            sync (it may not win an election until it left the isr and came back).
        unclean: the cluster allows an unclean election (``unclean_leader_election``).
    """
    if me not in record.effective_replicas():
        return Decision(Step.STOP)
    state = record.state
    leader = record.owner == me
    if state is TopicState.DELETING:
        return Decision(Step.DELETE)
    if state is TopicState.PLACING or state is TopicState.FAILED:
        return Decision(Step.WAIT)
    if state is TopicState.CREATING:
        if not holds:
            return Decision(Step.CREATE, then_claim=leader)
        return Decision(Step.CLAIM if leader else Step.WAIT)
    if leader:
        return _leader(record, me, claimed=claimed, holds=holds)
    if not holds:
        return Decision(Step.CREATE)
    address = alive.get(record.owner)
    if address is not None:
        return Decision(Step.FOLLOW, address=address)
    if fresh:
        return Decision(Step.WAIT)
    rank = election_rank(record, me)
    if rank is not None:
        return Decision(Step.ELECT, rank=rank)
    rank = unclean_rank(record, me, alive) if unclean else None
    if rank is not None:
        return Decision(Step.ELECT, rank=rank, unclean=True)
    return Decision(Step.WAIT)


def _leader(record: TopicRecord, me: str, *, claimed: int | None, holds: bool) -> Decision:
    if claimed == record.epoch:
        return Decision(Step.LEAD)
    if not holds:
        return Decision(Step.MISSING)
    if me in record.effective_isr():
        return Decision(Step.CLAIM)
    return Decision(Step.WAIT)
