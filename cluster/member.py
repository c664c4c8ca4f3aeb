"""ClusterMember: one running broker's membership of the cluster.

Role: the composition the broker holds in cluster mode. It owns this broker's
:class:`~cluster.session.Session`, :class:`~cluster.view.View` and
:class:`~cluster.controller.Controller` candidacy, and a reconcile task that does the
owner's part of the topic lifecycle (``cluster.records``):

- ``creating`` on me: make the topic locally through the broker's
  :class:`~cluster.local.LocalTopics` hook, then claim it (``ready``, epoch + 1);
- ``ready`` on me, not yet claimed in this session: claim it (epoch + 1). A topic whose
  local data is missing is NOT recreated: it stays unclaimed and is refused as
  ``data-missing``, logged loudly;
- ``deleting`` on me: delete it locally, then delete its key.

Every claim is a transaction guarded by the topic's ``mod_revision`` as read AND
``lease(brokers/<me>) == my lease``: a broker whose session ended cannot claim.

It answers the broker's questions: :meth:`ClusterMember.refusal` (the
:class:`~cluster.ownership.Ownership` protocol), :meth:`ClusterMember.lookup` and
:meth:`ClusterMember.status` (``broker.cluster_service.ClusterSource``), and runs
:meth:`ClusterMember.create_topic_record` / :meth:`ClusterMember.delete_topic_record`
for CreateTopic / DeleteTopic.

Invariant (the one-writer rule): :meth:`refusal` with ``write=True`` answers None only
while (a) the view says ``owner == me`` at epoch E, (b) this member claimed E in its
current session, and (c) the session may write by this process's clock
(``cluster.session``). A new owner session claims E+1 only after the old lease is gone,
and (c) stops writes before that, so two brokers never write one topic.

Task-safety: the reconcile task and the controller task are the only writers of their
state; the broker's calls run on the same event loop and only read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import get_args

from cluster.answers import ABSENT, EndpointEntry, LookupResult, StatusResult
from cluster.controller import Controller
from cluster.errors import (
    ClusterError,
    NotOwnerError,
    TopicExistsError,
    TopicNotReadyError,
)
from cluster.etcd import Compare, EtcdStore, Op
from cluster.local import LocalTopics
from cluster.ownership import Refusal, RefusalReason
from cluster.records import (
    BrokerRecord,
    ClusterRecord,
    Keys,
    TopicRecord,
    TopicState,
    decode,
    encode,
)
from cluster.routes import Me, broker_entries, lookup, offline_topics, topic_route
from cluster.session import Clock, Session
from cluster.state import Topic
from cluster.view import View

log = logging.getLogger(__name__)

CREATE_TIMEOUT_S = 30.0
"""How long CreateTopic waits for the topic to become ready when the call has no deadline."""

RETRY_S = 0.5
"""Seconds before a reconcile pass that failed on etcd is tried again."""


_REASONS: dict[str, RefusalReason] = {reason: reason for reason in get_args(RefusalReason)}


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class MemberConfig:
    """How this broker joins the cluster.

    Attributes:
        node_id: its unique name (the ``[cluster] node_id`` rules).
        address: ``host:port`` other brokers and clients call it at.
        ttl_s: session lease TTL, whole seconds (2..60). Default 10.
        prefix: the etcd key prefix of the cluster. Default ``/headrace/``.
        version: Headrace's version, shown in the broker record.
    """

    node_id: str
    address: str
    ttl_s: int = 10
    prefix: str = "/headrace/"
    version: str = ""


class ClusterMember:
    """This broker in the cluster. Start with :meth:`start`, end with :meth:`aclose`.

    Args:
        store: an open etcd connection (the member does not close it).
        config: who this broker is.
        local: the broker's hook to make and remove local topics (``cluster.local``).
        clock: monotonic seconds (the session's write deadline is on it).
        wall_ms: wall-clock milliseconds (records' ``*_ms`` fields).
    """

    def __init__(
        self,
        store: EtcdStore,
        config: MemberConfig,
        local: LocalTopics,
        *,
        clock: Clock = time.monotonic,
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self._store = store
        self._config = config
        self._local = local
        self._wall_ms = wall_ms
        self._keys = Keys(config.prefix)
        record = BrokerRecord(
            config.node_id, config.address, os.getpid(), wall_ms(), config.version
        )
        self.session = Session(
            store, self._keys, record, config.ttl_s, clock=clock, wall_ms=wall_ms
        )
        self.view = View(store, self._keys)
        self.controller = Controller(store, self._keys, self.view, self.session, config.address)
        self._claimed: dict[str, int] = {}
        self._claimed_generation = 0
        self._missing_logged: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def node_id(self) -> str:
        return self._config.node_id

    @property
    def store(self) -> EtcdStore:
        """The etcd connection this member uses (the caller opened it and closes it)."""
        return self._store

    @property
    def local(self) -> LocalTopics:
        """The broker's local-topics hook."""
        return self._local

    @property
    def claimed(self) -> dict[str, int]:
        """``topic -> epoch`` claimed in the current session (a copy)."""
        return dict(self._claimed)

    async def start(self) -> None:
        """Join: the cluster record, the session (registration), the view, then the
        controller candidacy and the reconcile task.

        Raises:
            DuplicateNodeError: a live broker holds this node id.
            EtcdUnavailableError: etcd did not answer.
        """
        cluster = ClusterRecord(secrets.token_hex(8), self._wall_ms())
        await self._store.txn(
            [Compare.absent(self._keys.cluster)], [Op.put(self._keys.cluster, encode(cluster))]
        )
        await self.session.start()
        await self.view.start()
        self._tasks = [
            asyncio.create_task(self.controller.run(), name=f"controller-{self.node_id}"),
            asyncio.create_task(self._reconcile_loop(), name=f"reconcile-{self.node_id}"),
        ]

    async def aclose(self) -> None:
        """Leave: stop the tasks and the view, and end the session (its lease is revoked,
        so its registration and any controller key go at once)."""
        await self.abandon()
        await self.session.aclose()

    async def abandon(self) -> None:
        """Stop everything WITHOUT ending the session: its lease runs out on etcd's clock,
        as after a SIGKILL (for tests; :meth:`aclose` is the clean way out)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.view.aclose()
        await self.session.abandon()

    # -- the broker's questions ----------------------------------------------------------

    def refusal(self, topic: str, *, write: bool) -> Refusal | None:
        """The :class:`~cluster.ownership.Ownership` answer (module invariant). A topic
        the cluster does not hold is not refused: the broker answers "not found" as a
        single broker would."""
        route = topic_route(self.view.state, topic, self._me(write=write))
        if route.state == ABSENT or (route.online and route.owner_node == self.node_id):
            return None
        if route.online:
            message = (
                f"topic {topic!r} is owned by broker {route.owner_node} at "
                f"{route.owner_address}: call it there"
            )
            return Refusal(
                "not-owner", topic, route.owner_node, route.owner_address, route.epoch, message
            )
        reason = _REASONS[route.reason]
        return Refusal(
            reason, topic, route.owner_node, route.owner_address, route.epoch, route.message
        )

    async def lookup(self, topics: Sequence[str]) -> LookupResult:
        """The Lookup answer from this broker's view (``broker.cluster_service``)."""
        return lookup(self.view.state, list(topics), self._me(write=True), self._wall_ms())

    async def status(self) -> StatusResult:
        """The ClusterStatus answer: the view, plus each etcd endpoint asked now."""
        health = await self._store.endpoint_health(timeout_s=1.0)
        state = self.view.state
        me = self._me(write=True)
        return StatusResult(
            self.node_id,
            state.cluster.id if state.cluster else "",
            tuple(broker_entries(state, self._wall_ms())),
            state.controller.record.node_id if state.controller else "",
            tuple(EndpointEntry(h.endpoint, h.healthy, h.error) for h in health),
            tuple(offline_topics(state, me)),
            state.revision,
        )

    async def create_topic_record(
        self, name: str, partitions: int, timeout_s: float = CREATE_TIMEOUT_S
    ) -> TopicRecord:
        """Create ``name`` in the cluster and wait until its owner made it.

        The name is taken by a transaction on the key's absence, so exactly one of any
        number of concurrent creators wins, on whichever brokers.

        Returns:
            the topic's record once ``ready``.

        Raises:
            TopicExistsError: the name is taken.
            TopicNotReadyError: not ready within ``timeout_s`` (the name stays taken; the
                topic becomes ready when its owner is up).
            EtcdUnavailableError: etcd did not answer.
        """
        key = self._keys.topic(name)
        record = TopicRecord(
            name, secrets.token_hex(8), partitions, self._wall_ms(), "", 0, TopicState.PLACING
        )
        await self._store.txn([Compare.absent(key)], [Op.put(key, encode(record))])
        held = await self._store.get(key)  # re-read: a retried txn may hide our success
        if held is None or decode(key, held.value, TopicRecord).id != record.id:
            raise TopicExistsError(name)
        ready = await self.view.wait_for(
            lambda state: _ready(state.topics.get(name), record.id), timeout_s
        )
        if ready is not None:
            return ready.record
        now = self.view.state.topics.get(name)
        state = now.record.state.value if now else "placing"
        raise TopicNotReadyError(name, state, now.record.owner if now else "", timeout_s)

    async def delete_topic_record(self, name: str, timeout_s: float = CREATE_TIMEOUT_S) -> None:
        """Delete ``name``, which this broker owns: mark it ``deleting``, then wait until
        the reconcile task deleted it locally and removed its key.

        Raises:
            NotOwnerError: this broker may not write ``name`` now (see :meth:`refusal`).
            TopicNotReadyError: the key is still there after ``timeout_s``.
        """
        topic = self.view.state.topics.get(name)
        if topic is None or self.refusal(name, write=True) is not None:
            raise NotOwnerError(name, self.node_id, topic.record.owner if topic else "")
        marked = topic.record.replace(state=TopicState.DELETING)
        await self._cas(topic, [Op.put(self._keys.topic(name), encode(marked))])
        gone = await self.view.wait_for(
            lambda state: True if name not in state.topics else None, timeout_s
        )
        if gone is None:
            raise TopicNotReadyError(name, "deleting", self.node_id, timeout_s)

    # -- the owner's part of the lifecycle -----------------------------------------------

    def _me(self, *, write: bool) -> Me:
        may_write = self.session.may_write() if write else self.session.lease != 0
        return Me(self.node_id, self._claimed, may_write, self._local.exists)

    async def _reconcile_loop(self) -> None:
        seen = -1
        while True:
            seen = await self.view.changed(seen, timeout_s=self._config.ttl_s / 3)
            try:
                await self._reconcile()
            except ClusterError as exc:
                log.warning("broker %s: reconcile failed: %s", self.node_id, exc)
                await asyncio.sleep(RETRY_S)
                seen = -1

    async def _reconcile(self) -> None:
        if self.session.generation != self._claimed_generation:
            self._claimed = {}
            self._claimed_generation = self.session.generation
        for name in [n for n in self._claimed if n not in self.view.state.topics]:
            del self._claimed[name]
        mine = [t for t in self.view.state.topics.values() if t.record.owner == self.node_id]
        for topic in mine:
            if not self.session.may_write():
                return
            await self._own(topic)

    async def _own(self, topic: Topic) -> None:
        record = topic.record
        name = record.name
        if record.state is TopicState.CREATING:
            try:
                await self._local.create(name, record.id, record.partitions)
            except Exception:  # the broker's hook: whatever it raises, retry next pass
                log.exception("broker %s: cannot create topic %s locally", self.node_id, name)
                return
            await self._claim(topic)
        elif record.state is TopicState.READY and name not in self._claimed:
            if not self._local.exists(name):
                if name not in self._missing_logged:
                    self._missing_logged.add(name)
                    log.error(
                        "broker %s owns topic %s (id %s) but its data is missing here: "
                        "it is served as offline, not recreated empty",
                        self.node_id,
                        name,
                        record.id,
                    )
                return
            await self._claim(topic)
        elif record.state is TopicState.DELETING:
            await self._local.delete(name)
            await self._cas(topic, [Op.delete(self._keys.topic(name))])
            self._claimed.pop(name, None)

    async def _claim(self, topic: Topic) -> None:
        """Set ``ready`` at epoch + 1, guarded by the topic as read and by my lease."""
        claimed = topic.record.replace(epoch=topic.record.epoch + 1, state=TopicState.READY)
        key = self._keys.topic(topic.record.name)
        if await self._cas(topic, [Op.put(key, encode(claimed))]):
            self._claimed[claimed.name] = claimed.epoch
            log.info(
                "broker %s: claimed topic %s at epoch %d", self.node_id, claimed.name, claimed.epoch
            )

    async def _cas(self, topic: Topic, ops: list[Op]) -> bool:
        """Apply ``ops`` if ``topic`` is unchanged and my lease holds my registration.
        On a failed answer, re-read: True too if the key already is what ``ops`` wrote."""
        key = self._keys.topic(topic.record.name)
        guards = [
            Compare.modified_at(key, topic.mod_revision),
            Compare.leased_by(self._keys.broker(self.node_id), self.session.lease),
        ]
        if (await self._store.txn(guards, ops)).succeeded:
            return True
        held = await self._store.get(key)
        wanted = ops[0].value
        return (held is None and wanted is None) or (held is not None and held.value == wanted)


def _ready(topic: Topic | None, topic_id: str) -> Topic | None:
    if topic is None or topic.record.id != topic_id:
        return None
    return topic if topic.record.state is TopicState.READY else None
