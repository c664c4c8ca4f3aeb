"""ClusterMember: one running broker's membership of the cluster.

Role: the composition the broker holds in cluster mode. It owns this broker's
:class:`~cluster.session.Session`, :class:`~cluster.view.View` and
:class:`~cluster.controller.Controller` candidacy, and a reconcile task that does the
owner's part of the topic lifecycle (``cluster.records``):

- ``creating`` on me: make the topic locally through the broker's
  :class:`~cluster.local.LocalTopics` hook, then claim it (``ready``, epoch + 1). A create
  that can never succeed here (the hook's ``check_create``: the open-files budget, the
  partition limit, a local topic of that name with another id) ends instead: the record
  becomes ``failed`` with the status and message a single broker would answer; its
  creator sees it, removes the key and answers with it (the owner removes a ``failed``
  record its creator left, after ``FAILED_KEEP_S``);
- ``ready`` on me, not yet claimed in this session: claim it (epoch + 1). A topic whose
  local data is missing is NOT recreated: it stays unclaimed and is refused as
  ``data-missing``, logged loudly;
- ``deleting`` on me: delete it locally, then delete its key.

Replicated topics (issue 37: ``effective_replicas()`` longer than one) take the path of
:mod:`cluster.replica_member` instead, on every replica: each makes its local files while
``creating``; the leader claims ``ready`` at epoch + 1 (after a restart, while it is in
the isr) and leads; the followers follow it; when the leader's broker key goes, an
in-sync follower wins an election (staggered by its rank) and leads at the new epoch.
Factor-1 records keep the path above exactly.

Every claim is a transaction guarded by the topic's ``mod_revision`` as read AND
``lease(brokers/<me>) == my lease``: a broker whose session ended cannot claim.

Local topics the cluster does not hold (a broker that ran alone, then joined; a data
directory carried over): at :meth:`ClusterMember.start`, after the view's first listing
and before the broker serves, each local topic with no record is **adopted** (unless it
was a replica of a replicated topic, ``LocalTopic.replicated``: deleted while this broker
was down, it must not come back; it is a stray): a
transaction on the key's absence AND my lease writes ``{id: the local id, partitions,
owner: me, epoch: 1, state: ready}`` and the member counts it claimed (as a reclaim
does). A local topic whose name the cluster holds with another id, or owned by another
broker, is a **stray**: never served, never deleted or overwritten, logged at WARNING
(both ids, its directory, what to do) and listed by :meth:`ClusterMember.strays`; calls
for the name follow the record. A local topic the cluster does not hold after the join
(its key deleted behind the broker's back) is answered as not found (the ``absent``
refusal), never served.

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

One piece, though past 600 lines (the class about 470): the invariant above is stated
over this class's state (the claims of the current session, ``_claimed`` and
``_claimed_generation``, beside the session and the view), and every part here reads or
writes it: :meth:`refusal` and the Lookup answers read it, the reconcile task and the
adoption at start write it, and create/delete wait on the same view and write through
the same guarded transaction (``_cas``). What has rules of its own already lives apart:
the replicated path (:mod:`cluster.replica_member`), the routes and answers
(:mod:`cluster.routes`, :mod:`cluster.answers`), the controller. A split along adoption
or create/delete would hand those modules the claims to write, and the one-writer rule
would no longer be checked in one file.
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
    TopicCreateFailedError,
    TopicExistsError,
    TopicNotReadyError,
)
from cluster.etcd import Compare, EtcdStore, Op
from cluster.local import LocalTopic, LocalTopics
from cluster.ownership import Refusal, RefusalReason
from cluster.records import (
    FAILED_KEEP_S,
    BrokerRecord,
    ClusterRecord,
    CreateFailure,
    Keys,
    TopicRecord,
    TopicState,
    decode,
    encode,
)
from cluster.replica_member import ReplicaRoles
from cluster.replica_roles import is_replicated
from cluster.routes import (
    Me,
    broker_entries,
    lookup,
    offline_topics,
    topic_route,
    under_replicated_topics,
)
from cluster.session import Clock, Session
from cluster.state import Topic
from cluster.view import View

log = logging.getLogger(__name__)

CREATE_TIMEOUT_S = 30.0
"""How long CreateTopic waits for the topic to become ready when the call has no deadline."""

RETRY_S = 0.5
"""Seconds before a reconcile pass that failed on etcd is tried again."""


ADOPT_VISIBLE_S = 5.0
"""How long a join waits for its view to show the topics it adopted."""

HAND_OVER_SLACK_S = 0.5
"""What the controlled shutdown may take past its ``timeout_s`` before it is cut (its own
deadline ends the waits; this cuts an etcd call that hangs)."""

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
        auto_rebalance: as controller, move leadership back to preferred leaders
            (``cluster.moves``). Default False.
        rebalance_interval_s: seconds between those passes. Default 300.
    """

    node_id: str
    address: str
    ttl_s: int = 10
    prefix: str = "/headrace/"
    version: str = ""
    auto_rebalance: bool = False
    rebalance_interval_s: float = 300.0


@dataclass(frozen=True, slots=True)
class Stray:
    """A local topic this broker does not serve: the cluster holds the name with another
    id (``cluster_id``), or with this id on another broker, or not at all (``cluster_id``
    and ``owner_node`` empty: its record was deleted behind this broker's back)."""

    topic: str
    local_id: str
    cluster_id: str
    owner_node: str
    path: str

    def advice(self, node_id: str) -> str:
        """What it is and what an operator can do, for a log line or ``cluster status``."""
        local_id = self.local_id or "none"
        here = f"broker {node_id} has topic {self.topic!r} (id {local_id}) at {self.path}"
        if not self.cluster_id:
            return (
                f"{here}, which the cluster does not hold: it is not served; move the "
                "directory away (or restart this broker to adopt it)"
            )
        if self.cluster_id != self.local_id:
            owner = self.owner_node or "(none yet)"
            what = f"another topic of that name, id {self.cluster_id}, on broker {owner}"
        else:
            what = f"that topic on broker {self.owner_node}"
        return (
            f"{here}, but the cluster holds {what}: this copy is not served, calls go to "
            "the cluster's owner; move the directory away, or delete the cluster's topic "
            "and restart this broker to adopt it"
        )


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
        self.controller.mover.auto_rebalance = config.auto_rebalance
        self.controller.mover.interval_s = config.rebalance_interval_s
        self._claimed: dict[str, int] = {}
        self._claimed_generation = 0
        self._missing_logged: set[str] = set()
        self._strays_logged: set[Stray] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.replicas = ReplicaRoles(
            store,
            self._keys,
            self.view,
            self.session,
            local,
            node_id=config.node_id,
            cas=self._cas,
            fail=self._fail,
            clock=clock,
        )

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
        """Join: the cluster record, the session (registration), the view, the adoption
        of the local topics the cluster does not hold (module docstring), then the
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
        await self._adopt()
        self._tasks = [
            asyncio.create_task(self.controller.run(), name=f"controller-{self.node_id}"),
            asyncio.create_task(self._reconcile_loop(), name=f"reconcile-{self.node_id}"),
        ]

    async def aclose(self) -> None:
        """Leave: stop the tasks and the view, and end the session (its lease is revoked,
        so its registration and any controller key go at once)."""
        await self.abandon()
        await self.session.aclose()

    async def hand_over(self, timeout_s: float) -> dict[str, str]:
        """Controlled shutdown (before :meth:`aclose`): the reconcile task stops (no role
        is taken again), then every replicated topic this broker leads is handed to an
        in-sync follower (``ReplicaRoles.hand_over``), in at most ``timeout_s`` all told
        (etcd calls included: with etcd slow or gone the rest is given up, logged, and
        those topics wait for an election); 0 hands nothing over. Factor-1 topics are
        not moved (they are offline until this broker returns).

        Returns:
            ``topic -> new leader`` of each topic handed over.
        """
        for task in self._tasks:
            if task.get_name().startswith("reconcile-"):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._tasks = [t for t in self._tasks if not t.done()]
        if timeout_s <= 0:
            log.info(
                "broker %s: controlled shutdown off (timeout 0): nothing handed over", self.node_id
            )
            return {}
        try:
            async with asyncio.timeout(timeout_s + HAND_OVER_SLACK_S):
                return await self.replicas.hand_over(timeout_s)
        except TimeoutError:
            log.warning(
                "broker %s: controlled shutdown: out of time after %g s (etcd slow or "
                "unreachable?): the topics not handed over wait for an election",
                self.node_id,
                timeout_s,
            )
            return {}
        except ClusterError as exc:
            log.warning("broker %s: controlled shutdown: hand-over failed: %s", self.node_id, exc)
            return {}

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
        single broker would; if this broker has local data of that name (a stray), the
        refusal is ``absent``, which the broker answers as not found too, so the stray is
        never served."""
        route = topic_route(self.view.state, topic, self._me(write=write))
        if route.state == ABSENT:
            if self._local.topic_id(topic) is None:
                return None
            message = f"topic {topic!r} does not exist in the cluster"
            return Refusal("absent", topic, "", "", 0, message)
        if route.online and route.owner_node == self.node_id:
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
        message = route.message
        if reason == "data-missing" and (held := self._local.topic_id(topic)) is not None:
            message = (
                f"topic {topic!r} is owned by broker {self.node_id}, but the local topic of "
                f"that name there is another one (id {held or 'none'}, not "
                f"{route_id(self.view.state.topics.get(topic))}): it is not served; move it "
                "away and restore the topic's data directory"
            )
        return Refusal(reason, topic, route.owner_node, route.owner_address, route.epoch, message)

    def strays(self) -> list[Stray]:
        """The local topics this broker does not serve because the cluster's record names
        another topic or another owner, or none (module docstring), by name."""
        found = []
        state = self.view.state
        for local in self._local.held():
            topic = state.topics.get(local.name)
            if topic is None:
                if local.name not in state.failed:
                    found.append(Stray(local.name, local.topic_id, "", "", local.path))
                continue
            record = topic.record
            if self.replicas.owns_copy(local.name, local.topic_id):
                continue  # a replica of a replicated topic: its data is the cluster's
            if record.id != local.topic_id or record.owner != self.node_id:
                found.append(Stray(local.name, local.topic_id, record.id, record.owner, local.path))
        return found

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
            under_replicated=tuple(under_replicated_topics(state)),
        )

    async def create_topic_record(
        self,
        name: str,
        partitions: int,
        timeout_s: float = CREATE_TIMEOUT_S,
        *,
        factor: int = 1,
        min_insync: int = 1,
    ) -> TopicRecord:
        """Create ``name`` in the cluster and wait until its owner made it.

        The name is taken by a transaction on the key's absence, so exactly one of any
        number of concurrent creators wins, on whichever brokers. ``factor`` and
        ``min_insync`` are already resolved (``cluster.replicas.replication_settings``);
        a factor of 1 writes issue 36's record byte for byte, a higher one asks the
        controller for that many replicas (``TopicRecord.factor``).

        Returns:
            the topic's record once ``ready``.

        Raises:
            TopicExistsError: the name is taken.
            TopicNotReadyError: not ready within ``timeout_s`` (the name stays taken; the
                topic becomes ready when its owner is up).
            TopicCreateFailedError: its owner can never make it, or the controller found
                fewer live brokers than ``factor`` (the record was ``failed``; it is
                removed here, so the name is free again).
            EtcdUnavailableError: etcd did not answer.
        """
        key = self._keys.topic(name)
        record = TopicRecord(
            name,
            secrets.token_hex(8),
            partitions,
            self._wall_ms(),
            "",
            0,
            TopicState.PLACING,
            min_insync=min_insync,
            factor=factor if factor > 1 else 0,
        )
        await self._store.txn([Compare.absent(key)], [Op.put(key, encode(record))])
        held = await self._store.get(key)  # re-read: a retried txn may hide our success
        if held is None or decode(key, held.value, TopicRecord).id != record.id:
            raise TopicExistsError(name)
        ended = await self.view.wait_for(
            lambda state: (
                _ready(state.topics.get(name), record.id)
                or _ready(state.failed.get(name), record.id)
            ),
            timeout_s,
        )
        if ended is not None and ended.record.state is TopicState.FAILED:
            await self._remove_failed(ended)
            failure = ended.record.failure
            code, message = (failure.code, failure.message) if failure else ("UNKNOWN", "")
            raise TopicCreateFailedError(name, ended.record.owner, code, message)
        if ended is not None:
            return ended.record
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
        # Claims count only in the session that made them: a new session (after a lost
        # lease) opens its write window before the reconcile task has cleared the old
        # claims and claimed again, and the view may still be stale then (found by
        # tests/netsplit: writes acknowledged at the old epoch after a split healed).
        fresh = self._claimed_generation == self.session.generation
        return Me(self.node_id, self._claimed if fresh else {}, may_write, self._holds)

    def _holds(self, name: str) -> bool:
        """Whether the local data of the cluster's topic ``name`` is here: a local topic
        of that name with the record's id."""
        held = self._local.topic_id(name)
        topic = self.view.state.topics.get(name)
        return held is not None and (topic is None or held == topic.record.id)

    async def _adopt(self) -> None:
        """Adopt every local topic the cluster does not hold; log the strays (module
        docstring). Runs at start, before the reconcile task and before the broker
        serves."""
        self._claimed_generation = self.session.generation
        revision = 0
        for local in self._local.held():
            if local.name not in self.view.state.topics and not local.replicated:
                revision = max(revision, await self._adopt_one(local))
        if revision:
            await self.view.wait_for(
                lambda state: True if state.revision >= revision else None, ADOPT_VISIBLE_S
            )
        self._log_strays()

    async def _adopt_one(self, local: LocalTopic) -> int:
        """Write ``local``'s record (owner me, epoch 1, ready) if the name is free and my
        session holds; the store's revision after it (0 if it lost: a stray)."""
        key = self._keys.topic(local.name)
        record = TopicRecord(
            local.name,
            local.topic_id,
            local.partitions,
            self._wall_ms(),
            self.node_id,
            1,
            TopicState.READY,
        )
        guards = [
            Compare.absent(key),
            Compare.leased_by(self._keys.broker(self.node_id), self.session.lease),
        ]
        done = await self._store.txn(guards, [Op.put(key, encode(record))])
        if not done.succeeded:  # a retried txn may hide our success: re-read
            held = await self._store.get(key)
            if held is None or held.value != encode(record):
                return 0
        self._claimed[local.name] = 1
        log.info(
            "broker %s: adopted local topic %s (id %s, %d partitions, at %s) into the "
            "cluster at epoch 1",
            self.node_id,
            local.name,
            local.topic_id or "none",
            local.partitions,
            local.path,
        )
        return done.revision

    def _log_strays(self) -> None:
        """Log each stray once, at WARNING, with what to do."""
        for stray in self.strays():
            if stray not in self._strays_logged:
                self._strays_logged.add(stray)
                log.warning("%s", stray.advice(self.node_id))

    async def _reconcile_loop(self) -> None:
        seen = -1
        while True:
            wait_s = self._config.ttl_s / 3
            due = self.replicas.wake_in()
            seen = await self.view.changed(
                seen, timeout_s=wait_s if due is None else min(wait_s, due)
            )
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
        await self.replicas.reconcile(self._claimed)  # each step checks its own session
        mine = [
            t
            for t in self.view.state.topics.values()
            if t.record.owner == self.node_id and not is_replicated(t.record)
        ]
        for topic in mine:
            if not self.session.may_write():
                return
            await self._own(topic)
        self._log_strays()
        now_ms = self._wall_ms()
        for topic in list(self.view.state.failed.values()):
            failure = topic.record.failure
            left = failure is None or now_ms - failure.at_ms > FAILED_KEEP_S * 1000
            if topic.record.owner == self.node_id and left and self.session.may_write():
                await self._remove_failed(topic)

    async def _own(self, topic: Topic) -> None:
        record = topic.record
        name = record.name
        if record.state is TopicState.CREATING:
            refused = self._local.check_create(name, record.id, record.partitions)
            if refused is not None:
                await self._fail(topic, refused.code, refused.message)
                return
            try:
                await self._local.create(name, record.id, record.partitions)
            except Exception:  # the broker's hook: whatever it raises, retry next pass
                log.exception("broker %s: cannot create topic %s locally", self.node_id, name)
                return
            await self._claim(topic)
        elif record.state is TopicState.READY and name not in self._claimed:
            if not self._holds(name):
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

    async def _fail(self, topic: Topic, code: str, message: str) -> None:
        """End a create this broker can never carry out: ``failed``, with why."""
        name = topic.record.name
        why = f"broker {self.node_id} cannot create topic {name!r}: {message}"
        failed = topic.record.replace(
            state=TopicState.FAILED, failure=CreateFailure(code, why, self._wall_ms())
        )
        if await self._cas(topic, [Op.put(self._keys.topic(name), encode(failed))]):
            log.warning("create of topic %s failed: %s (%s)", name, why, code)

    async def _remove_failed(self, topic: Topic) -> None:
        """Remove a ``failed`` record, unless it changed since ``topic`` was read."""
        key = self._keys.topic(topic.record.name)
        await self._store.txn([Compare.modified_at(key, topic.mod_revision)], [Op.delete(key)])

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
    """``topic`` if it is the one of ``topic_id`` and it ended its create (``ready``, or
    ``failed``)."""
    if topic is None or topic.record.id != topic_id:
        return None
    ended = topic.record.state in (TopicState.READY, TopicState.FAILED)
    return topic if ended else None


def route_id(topic: Topic | None) -> str:
    """The id of the cluster's topic, for a message."""
    return topic.record.id if topic is not None else "(none)"
