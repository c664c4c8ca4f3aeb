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
creating`` (guards: the token, and the topic's ``mod_revision`` as read).

A failed transaction may be one that applied and whose reply was lost
(:mod:`cluster.etcd`, fact 1): the controller re-reads and decides from what it finds.

Task-safety: :meth:`Controller.run` is one task; :meth:`Controller.campaign` and
:meth:`Controller.place` are called from it (tests call them directly).
"""

from __future__ import annotations

import asyncio
import logging

from cluster.errors import ClusterError, NotControllerError
from cluster.etcd import Compare, EtcdStore, Op
from cluster.placement import place
from cluster.records import ControllerRecord, Keys, TopicRecord, TopicState, decode, encode
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

    async def place(self, topic: Topic, owner: str) -> bool:
        """Set ``owner`` and ``creating`` on ``topic`` (as read at its mod_revision).

        Returns:
            True when the topic is now placed on ``owner``; False when someone changed the
            topic first (the next pass sees the new record).

        Raises:
            NotControllerError: the token is stale: nothing was written.
        """
        key = self._keys.topic(topic.record.name)
        placed = topic.record.replace(owner=owner, state=TopicState.CREATING)
        guards = [Compare.created_at(self._keys.controller, self.token)]
        guards.append(Compare.modified_at(key, topic.mod_revision))
        result = await self._store.txn(guards, [Op.put(key, encode(placed))])
        if result.succeeded:
            return True
        await self._check_token()
        now = await self._store.get(key)
        return now is not None and _placed_on(key, now.value, owner)

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
        plan = place([(name, t.record.partitions) for name, t in waiting.items()], state.load())
        for name, owner in plan:
            if await self.place(waiting[name], owner):
                log.info("controller %s: topic %s placed on %s", self._session.node_id, name, owner)


def _placed_on(key: str, raw: bytes, owner: str) -> bool:
    record = decode(key, raw, TopicRecord)
    return record.owner == owner and record.state is not TopicState.PLACING
