"""The controller: one broker at a time, elected in etcd, fenced by a token; it places topics.

Role: every member runs a :class:`Controller` candidacy. The election is one transaction:
``controller`` absent -> put ``{node_id, address}`` under this broker's session lease. The
winner's **fencing token** is the ``create_revision`` of the key it created. When its
session ends (the lease expires or is revoked), etcd deletes the key and the next
candidate's transaction creates it again, at a higher revision: a higher token.

Every controller write is a transaction that compares
``create_revision(controller) == token`` besides its own guards. So a controller that
was deposed but does not know it yet (frozen, partitioned) has every write refused:
:class:`~cluster.errors.NotControllerError`. Two controllers never act at once.

What it does while it holds the token: for each ``placing`` topic (oldest first), choose
an owner among live brokers (:mod:`cluster.placement`) and set ``owner`` and ``state =
creating`` (guards: the token, and the topic's ``mod_revision`` as read). A replicated
topic (its record's ``factor`` above 1) gets its ordered ``replicas`` too, its owner the
first of them and ``isr = (owner,)``: its leader adds each follower as it catches up
(``cluster.replicas.may_join_isr``); ``factor`` is cleared. A topic asking for more
replicas than there are live brokers ends ``failed`` (``FAILED_PRECONDITION``, the message
naming both numbers), owned by the controller's node so that it is removed even if its
creator is gone; its creator answers with that status.

Then, on each pass, :class:`~cluster.moves.Mover` takes the next step of every
reassignment and, with ``[cluster] auto_rebalance``, moves leadership back to preferred
leaders (:mod:`cluster.moves`).

A failed transaction may be one that applied and whose reply was lost
(:mod:`cluster.etcd`, fact 1): the controller re-reads and decides from what it finds.

Task-safety: :meth:`Controller.run` is one task; :meth:`Controller.campaign` and
:meth:`Controller.place` are called from it (tests call them directly).
"""

from __future__ import annotations

import asyncio
import logging
import time

from cluster.errors import ClusterError, NotControllerError, NotEnoughBrokersError
from cluster.etcd import Compare, EtcdStore, Op
from cluster.moves import Mover
from cluster.placement import Ask, Placement, Unplaceable, plan
from cluster.records import (
    ControllerRecord,
    CreateFailure,
    Keys,
    TopicRecord,
    TopicState,
    decode,
    encode,
)
from cluster.replicas import replica_load
from cluster.session import Session
from cluster.state import Topic
from cluster.view import View

log = logging.getLogger(__name__)

PASS_RETRY_S = 0.5
"""Seconds before a pass that failed on etcd is tried again."""


class Controller:
    """This broker's candidacy and, while it wins, the controller's work.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        view: this broker's view (to see the controller key and the topics).
        session: this broker's session (its lease backs the controller key).
        address: this broker's advertised address, written in the controller record.
    """

    def __init__(
        self, store: EtcdStore, keys: Keys, view: View, session: Session, address: str
    ) -> None:
        self._store = store
        self._keys = keys
        self._view = view
        self._session = session
        self._record = ControllerRecord(session.node_id, address)
        #: reassignments and leadership balance (``cluster.moves``); the member sets
        #: ``mover.auto_rebalance`` / ``mover.interval_s`` from ``[cluster]``.
        self.mover = Mover(store, keys)
        self.token = 0
        """The fencing token while this broker believes it is controller; 0 otherwise."""

    @property
    def is_controller(self) -> bool:
        return self.token != 0

    async def campaign(self) -> bool:
        """Try to become controller (if the key is absent); True when this broker holds it.

        Re-reads after the transaction, whatever it answered, and takes the token only
        if the key is under this session's lease.
        """
        key = self._keys.controller
        lease = self._session.lease
        await self._store.txn(
            [Compare.absent(key)], [Op.put(key, encode(self._record), lease=lease)]
        )
        held = await self._store.get(key)
        if held is not None and held.lease == lease and lease != 0:
            if self.token != held.create_revision:
                log.info(
                    "broker %s: controller, token %d", self._session.node_id, held.create_revision
                )
            self.token = held.create_revision
        else:
            self.token = 0
        return self.is_controller

    async def place(self, topic: Topic, owner: str, replicas: tuple[str, ...] = ()) -> bool:
        """Set ``owner`` and ``creating`` on ``topic`` (as read at its mod_revision); a
        replicated topic's ``replicas`` (``replicas[0] == owner``) with ``isr = (owner,)``.

        Returns:
            True when the topic is now placed on ``owner``; False when someone changed the
            topic first (the next pass sees the new record).

        Raises:
            NotControllerError: the token is stale: nothing was written.
        """
        changes: dict[str, object] = {"owner": owner, "state": TopicState.CREATING}
        if replicas:
            changes.update(replicas=replicas, isr=(owner,), factor=0)
        return await self._write(topic, topic.record.replace(**changes))

    async def refuse(self, topic: Topic, live: int) -> bool:
        """End the create of ``topic``, which asks for more replicas than the ``live``
        brokers: ``failed`` with ``FAILED_PRECONDITION`` naming both numbers, owned by
        this node (module docstring).

        Returns:
            True when the record is now failed; False when someone changed it first.

        Raises:
            NotControllerError: the token is stale: nothing was written.
        """
        why = NotEnoughBrokersError(topic.record.factor, live)
        failure = CreateFailure("FAILED_PRECONDITION", str(why), time.time_ns() // 1_000_000)
        failed = topic.record.replace(
            owner=self._session.node_id, state=TopicState.FAILED, failure=failure
        )
        return await self._write(topic, failed)

    async def _write(self, topic: Topic, wanted: TopicRecord) -> bool:
        """Put ``wanted`` over ``topic`` as read, fenced by the token; on a failed answer
        re-read: True too when the key already holds what was written (a lost reply)."""
        key = self._keys.topic(topic.record.name)
        guards = [Compare.created_at(self._keys.controller, self.token)]
        guards.append(Compare.modified_at(key, topic.mod_revision))
        result = await self._store.txn(guards, [Op.put(key, encode(wanted))])
        if result.succeeded:
            return True
        await self._check_token()
        now = await self._store.get(key)
        return now is not None and _written(key, now.value, wanted)

    async def _check_token(self) -> None:
        held = await self._store.get(self._keys.controller)
        current = held.create_revision if held is not None else 0
        if current != self.token:
            stale, self.token = self.token, 0
            raise NotControllerError(self._session.node_id, stale, current)

    async def run(self) -> None:
        """Campaign whenever there is no controller; place topics while this broker is it.
        Runs until cancelled."""
        seen = -1
        while True:
            seen = await self._view.changed(seen, timeout_s=self._session.ttl_s / 2)
            try:
                await self._pass()
            except ClusterError as exc:
                log.warning("broker %s: controller pass failed: %s", self._session.node_id, exc)
                await asyncio.sleep(PASS_RETRY_S)
                seen = -1

    async def _pass(self) -> None:
        if not self._session.may_write():
            self.token = 0
            return
        state = self._view.state
        held = state.controller
        if held is None or (held.lease == self._session.lease and held.token != self.token):
            await self.campaign()
        elif held.token != self.token:
            self.token = 0
        if not self.is_controller:
            return
        waiting = {t.record.name: t for t in state.placing()}
        asks = [Ask(name, t.record.partitions, t.record.factor) for name, t in waiting.items()]
        records = [t.record for t in state.topics.values()]
        decisions = plan(asks, state.load(), replica_load(records, state.brokers))
        for decision in decisions:
            await self._carry_out(waiting[decision.name], decision)
        if not await self.mover.run_pass(state, self.token):
            await self._check_token()

    async def _carry_out(self, topic: Topic, decision: Placement | Unplaceable) -> None:
        node, name = self._session.node_id, decision.name
        if isinstance(decision, Unplaceable):
            if await self.refuse(topic, decision.live):
                log.warning(
                    "controller %s: topic %s asks for %d replicas and %d brokers are live: "
                    "its create failed",
                    node,
                    name,
                    decision.factor,
                    decision.live,
                )
        elif await self.place(topic, decision.owner, decision.replicas):
            where = ", ".join(decision.replicas) if decision.replicas else decision.owner
            log.info("controller %s: topic %s placed on %s", node, name, where)


def _written(key: str, raw: bytes, wanted: TopicRecord) -> bool:
    """Whether the record at ``key`` is ``wanted``, the failure's time aside (a re-read
    after a lost reply)."""
    record = decode(key, raw, TopicRecord)
    if record.state is TopicState.FAILED and wanted.state is TopicState.FAILED:
        return record.owner == wanted.owner and record.id == wanted.id
    return (
        record.owner == wanted.owner
        and record.state is not TopicState.PLACING
        and record.replicas == wanted.replicas
    )
