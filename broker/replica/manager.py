"""ReplicaManager: which replicated topics this broker leads and which it follows.

Role: the broker's end of the cluster member's role calls (``cluster.local.LocalTopics``
``lead`` / ``follow`` / ``stop``, through ``broker.cluster_node.BrokerTopics``). It holds
one :class:`~broker.replica.leader.LeaderTopic` or one
:class:`~broker.replica.fetcher.FollowerTopic` per replicated topic, and carries out the
switch between them; the Replication servicer finds the led topics through
:meth:`ReplicaManager.leader`.

Switch-over, in this order (each a rule the data path depends on):

- become leader: stop the follower first (its append in flight runs to its end, so the
  log is whole batches), then ``LeaderTopic.start`` (the epoch assigned in every
  partition, commits held); only then is the leader findable (:meth:`leader`) and the
  topic's subscriptions opened (``on_leading``). The member counts the claim after
  :meth:`lead` returns, so no publish of the new epoch is served before.
- become follower: the topic stops being served first (``on_not_leading`` closes its
  subscriptions' streams: consumers get the refusal and look the leader up), the leader
  is closed (its pending acks are answered "outcome unknown"), then the follower starts.
- a new record at the epoch led: passed on (``LeaderTopic.update``); a leader of an
  older epoch (a claim in a new session) is replaced by a new one, and so is a follower
  of another leader or epoch (the old one closed first).

Factor-1 topics never reach this class.

Task-safety: the member's reconcile task makes every role call; a lock per topic keeps a
call that awaits (a switch) whole against another; :meth:`leader` is a map read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc

from broker.partition import Partition
from broker.replica.fetcher import FollowerTopic
from broker.replica.leader import LeaderTopic
from broker.tls import PeerTls
from broker.topics import Topic, TopicRegistry
from cluster.local import ChangeIsr
from cluster.records import TopicRecord

logger = logging.getLogger(__name__)

LAG_TIME_MAX_MS = 10_000
"""A follower not caught up for this long leaves the in-sync set (ms; Kafka's
``replica.lag.time.max.ms``)."""


class LeaderRole(Protocol):
    """What the manager needs of a :class:`~broker.replica.leader.LeaderTopic`."""

    async def start(self) -> None: ...

    def update(self, record: TopicRecord) -> None: ...

    async def aclose(self) -> None: ...


class FollowerRole(Protocol):
    """What the manager needs of a :class:`~broker.replica.fetcher.FollowerTopic`."""

    async def start(self) -> None: ...

    def update(self, record: TopicRecord, leader_address: str) -> None: ...

    async def aclose(self) -> None: ...


MakeLeader = Callable[[Topic, TopicRecord, ChangeIsr], LeaderRole]
"""Build the leader of a topic at the record's epoch."""

MakeFollower = Callable[[Topic, TopicRecord, str], FollowerRole]
"""Build the follower of a topic whose leader is at the address."""

TopicHook = Callable[[str], Awaitable[None]]
"""Called with a topic's name at a switch (subscriptions opened or closed)."""


async def _nothing(_name: str) -> None:
    return None


async def _no_isr_change(_isr: tuple[str, ...]) -> bool:
    return False


@dataclass(slots=True)
class _Role:
    """One topic's role here: exactly one of ``leader`` and ``follower``."""

    epoch: int
    leader: LeaderRole | None = None
    follower: FollowerRole | None = None
    address: str = ""


class ReplicaManager:
    """This broker's leaders and followers of replicated topics.

    Args:
        topics: the broker's topics (a replica's local files are made by the member
            before any role call).
        make_leader: builds a leader (tests pass fakes); see :data:`MakeLeader`.
        make_follower: builds a follower; see :data:`MakeFollower`.
        on_leading: called after a leader started (open the topic's subscriptions).
        on_not_leading: called before a leader stops (close its subscriptions' streams).
    """

    def __init__(
        self,
        topics: TopicRegistry,
        *,
        make_leader: MakeLeader,
        make_follower: MakeFollower,
        on_leading: TopicHook = _nothing,
        on_not_leading: TopicHook = _nothing,
    ) -> None:
        self._topics = topics
        self._make_leader = make_leader
        self._make_follower = make_follower
        self._on_leading = on_leading
        self._on_not_leading = on_not_leading
        self._roles: dict[str, _Role] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def leader(self, name: str) -> LeaderRole | None:
        """The started leader of ``name`` here, or None (the servicer refuses then)."""
        role = self._roles.get(name)
        return role.leader if role is not None else None

    def follower(self, name: str) -> FollowerRole | None:
        """The follower of ``name`` here, or None."""
        role = self._roles.get(name)
        return role.follower if role is not None else None

    def roles(self) -> dict[str, tuple[str, int]]:
        """``name -> ("leader" | "follower", epoch)``."""
        return {
            name: ("leader" if role.leader is not None else "follower", role.epoch)
            for name, role in self._roles.items()
        }

    async def lead(
        self, name: str, record: TopicRecord, change_isr: ChangeIsr = _no_isr_change
    ) -> None:
        """Lead ``name`` at ``record.epoch`` (module docstring); at the epoch led already,
        pass ``record`` on (an isr or min_insync change).

        Raises:
            whatever building or starting the leader, or ``on_leading``, raises
            (nothing is then led: a leader started is stopped again; the member retries).
        """
        role = self._roles.get(name)
        if role is not None and role.leader is not None and role.epoch == record.epoch:
            role.leader.update(record)  # no await: an isr change never waits on a switch
            return
        async with self._lock(name):
            role = self._roles.get(name)
            if role is not None and role.leader is not None and role.epoch == record.epoch:
                role.leader.update(record)
                return
            await self._end(name)
            leader = self._make_leader(self._topics.get(name), record, change_isr)
            await leader.start()
            self._roles[name] = _Role(record.epoch, leader=leader)
            logger.info("topic %s: leading at epoch %d", name, record.epoch)
            try:
                await self._on_leading(name)
            except BaseException as exc:
                # Not half-led: a leader whose subscriptions were not taken over (its
                # state log's replay failed) stops, and the member retries or hands the
                # topic over (cluster.replica_member), which logs the error.
                logger.warning(
                    "topic %s: taking over at epoch %d failed (%r): leading stops",
                    name,
                    record.epoch,
                    exc,
                )
                await self._end(name)
                raise

    async def follow(self, name: str, record: TopicRecord, leader_address: str) -> None:
        """Follow ``name``'s leader at ``leader_address`` (module docstring); following
        the same leader at the same epoch already, nothing; another, a new follower."""
        async with self._lock(name):
            role = self._roles.get(name)
            same = role is not None and (role.epoch, role.address) == (
                record.epoch,
                leader_address,
            )
            if role is not None and role.follower is not None and same:
                return
            # A new leader or epoch: a new follower (the old one's append in flight ends
            # first), so that no fetch of the old epoch is still on its way when the new
            # one starts.
            await self._end(name)
            follower = self._make_follower(self._topics.get(name), record, leader_address)
            await follower.start()
            self._roles[name] = _Role(record.epoch, follower=follower, address=leader_address)
            logger.info(
                "topic %s: following %s at %s, epoch %d",
                name,
                record.owner,
                leader_address,
                record.epoch,
            )

    async def stop(self, name: str) -> None:
        """Neither lead nor follow ``name``; idempotent."""
        async with self._lock(name):
            await self._end(name)

    async def aclose(self) -> None:
        """Stop every role (the broker is shutting down). Idempotent."""
        for name in list(self._roles):
            await self.stop(name)

    async def _end(self, name: str) -> None:
        """End ``name``'s role: a follower stops (an append in flight finishes); a leader
        stops being served, then closes."""
        role = self._roles.pop(name, None)
        if role is None:
            return
        if role.follower is not None:
            await role.follower.aclose()
        if role.leader is not None:
            await self._on_not_leading(name)
            await role.leader.aclose()
            logger.info("topic %s: no longer leading (epoch %d)", name, role.epoch)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())


class Channels:
    """Opens the followers' channels to their leaders: a new one at each call, which the
    follower that asked owns and closes (a follower changes leader by closing its channel).

    Over TLS with ``tls`` (the broker serves TLS: so do its peers;
    :func:`broker.tls.load_peer_tls`), else plain text. A handshake the leader refuses
    (an untrusted certificate, a name that does not match) fails the fetch as
    ``UNAVAILABLE`` with gRPC's reason, which the follower logs.

    A channel takes answers of any size (gRPC's default is 4 MiB): a leader's answer is
    what the follower asked (1 MiB; at most ``leader.MAX_BYTES``, 16 MiB) or one whole
    batch past it, which may be as big as a publish the leader accepted (its
    ``max_request_bytes``, 17 MiB by default) or a state-log record of one subscription
    bigger than a chunk. A limit below that would stop the follower at that batch for
    good (it cannot skip it). The leader's server has no send limit either
    (:mod:`broker.app`): its answer is bounded by that rule, not by ``max_request_bytes``."""

    def __init__(self, tls: PeerTls | None = None) -> None:
        self._tls = tls

    def get(self, address: str) -> grpc.aio.Channel:
        """A new channel to ``address``."""
        options = [("grpc.max_receive_message_length", -1)]
        if self._tls is None:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(
            address, self._tls.credentials(), options=[*options, *self._tls.options()]
        )

    async def aclose(self) -> None:
        """Nothing left to close: each follower closes its own channel."""


def real_roles(
    node_id: str,
    channels: Channels,
    *,
    lag_time_max_ms: int = LAG_TIME_MAX_MS,
    credential: Callable[[], str | None] = lambda: None,
    extra_logs: Callable[[str], Mapping[str, Partition]] = lambda _name: {},
    open_log: Callable[[str], Callable[[str], Awaitable[Partition | None]]] | None = None,
) -> tuple[MakeLeader, MakeFollower]:
    """The production :data:`MakeLeader` and :data:`MakeFollower`: ``LeaderTopic`` and
    ``FollowerTopic`` of this package, for ``node_id``; ``credential`` is asked at each
    follower's start (the cluster's internal secret, or None without tokens);
    ``open_log(topic)`` is a follower's ``open_log`` (the logs its leader makes later:
    dead-letter queues)."""

    def make_leader(topic: Topic, record: TopicRecord, change_isr: ChangeIsr) -> LeaderRole:
        return LeaderTopic(
            topic,
            record,
            node_id,
            lag_time_max_ms=lag_time_max_ms,
            change_isr=change_isr,
            extra_logs=extra_logs(topic.name),
        )

    def make_follower(topic: Topic, record: TopicRecord, address: str) -> FollowerRole:
        return FollowerTopic(
            topic,
            record,
            node_id,
            address,
            channel=channels.get,
            credential=credential(),
            extra_logs=extra_logs(topic.name),
            open_log=open_log(topic.name) if open_log is not None else None,
        )

    return make_leader, make_follower
