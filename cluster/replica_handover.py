"""Handing a replicated topic's leadership over (issue 37): the controlled shutdown, and a
leader whose data is missing.

Role: the one place a leader gives its replicated topics away to an in-sync follower,
this broker leaving the in-sync set: :func:`cluster.replica_txn.transfer_leadership`
with ``leave_isr``, fenced by the record's epoch and this broker's session lease.
:class:`~cluster.replica_member.ReplicaRoles` (the member's replica roles) holds one
:class:`HandOver` and calls it in two cases:

- :meth:`HandOver.run`, the controlled shutdown (Kafka's does the same): every led topic
  handed to an alive in-sync follower still fetching from here and not stopping too
  (its ``<prefix>leaving/<node>`` key), bounded by ``timeout_s``; the roles take no role
  after it (the broker is stopping).
- :meth:`HandOver.missing`: the record names this broker leader, but its data is gone
  here (it came back on an empty data directory before a follower was elected): the
  topic goes to an alive in-sync follower that holds the data, and this broker copies it
  back as a follower; with none, it stays unserved (nothing is recreated empty).

Both try the candidates in the in-sync set's order, the first that takes the topic wins
(:meth:`HandOver._transfer`): a refusal (that broker not alive or not in sync when the
transaction ran) tries the next; an etcd error, a lost race or a stale fence ends the
try (the record moved: the roles read it again at their next pass).

Invariants:

- Only the leader of the record as read, with a session that may write, hands a topic
  over (the transaction's fence checks it again in etcd).
- A stopping broker never waits on a target that will not claim: a target stopping too,
  gone (its session ended), or not fetching lately is skipped or stopped waiting for, so
  a stop stays within ``timeout_s`` (and ``LEAVING_WITHIN_S`` when etcd is gone).

Task-safety: not task-safe; the member's tasks call it one at a time (the reconcile task
for :meth:`HandOver.missing`; the broker's stop for :meth:`HandOver.run`, after which the
reconcile task takes no role). It must not depend on the broker: what it needs of the
roles (their newest record of a topic, stopping a role) comes in as callables.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from cluster.errors import ClusterError
from cluster.etcd import EtcdStore
from cluster.records import Keys
from cluster.replica_txn import ChangeResult, Outcome, transfer_leadership
from cluster.session import Clock, Session
from cluster.state import Topic
from cluster.view import View

log = logging.getLogger(__name__)

LEAVING_WITHIN_S = 2.0
"""How long the controlled shutdown waits for etcd to take its ``leaving`` key (a few ms
when etcd answers); past it, etcd is taken as gone and nothing is handed over."""

Fetching = Callable[[str, str], bool]
"""``(topic, node) -> whether node fetched that topic from this broker's leader lately``
(the broker's; a follower SIGKILLed keeps its session until its TTL ends, and this tells
the controlled shutdown not to hand it a topic it would never claim)."""


class HandOver:
    """This broker's hand-overs of the replicated topics it leads (module docstring).

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        view: the member's view.
        session: the member's session (its lease fences each transfer).
        node_id: this broker.
        clock: monotonic seconds (the shutdown's bound).
        latest: the roles' newest record of a topic (the view's, or one they wrote).
        stop: the roles' end of this broker's role in a topic.
    """

    def __init__(
        self,
        store: EtcdStore,
        keys: Keys,
        view: View,
        session: Session,
        *,
        node_id: str,
        clock: Clock,
        latest: Callable[[str], Topic | None],
        stop: Callable[[str], Awaitable[None]],
    ) -> None:
        self._store = store
        self._keys = keys
        self._view = view
        self._session = session
        self._me = node_id
        self._clock = clock
        self._latest = latest
        self._stop = stop

    async def run(
        self, led: Sequence[str], timeout_s: float, fetching: Fetching | None
    ) -> dict[str, str]:
        """Controlled shutdown: hand every topic of ``led`` to an alive in-sync follower
        that is fetching from here (``fetching``; None: every one may take it) and is not
        stopping itself (its ``leaving`` key), with ``leave_isr`` (so the new leader's
        watermark does not wait for this broker); stop leading it (pending acks: "outcome
        unknown", the producer resends to the new leader), and wait until each new leader
        has taken it (its claim is in etcd) or ``timeout_s`` ends. A topic with no such
        follower is not waited for (logged: it waits for an election, or this broker's
        return).

        Returns:
            ``topic -> new leader`` of each topic handed over (for the log and tests).
        """
        deadline = self._clock() + timeout_s
        if not await self._say_leaving(deadline):
            if not led:
                return {}
            log.warning(
                "broker %s: controlled shutdown: etcd does not answer: %d led topic(s) not "
                "handed over: %s",
                self._me,
                len(led),
                ", ".join(sorted(led)),
            )
            return {}
        moved: dict[str, tuple[str, int]] = {}
        for name in led:
            if self._clock() >= deadline:
                break  # past the bound (etcd slow): the rest wait for an election
            handed = await self._hand_one(name, fetching)
            if handed is not None:
                moved[name] = handed
        kept = [name for name in led if name not in moved]
        if kept:
            log.warning(
                "broker %s: controlled shutdown: %d led topic(s) not handed over (no target, "
                "or out of time): %s",
                self._me,
                len(kept),
                ", ".join(sorted(kept)),
            )
        # stop leading once the view shows the transfer, so the consumers' streams end
        # with a refusal naming the new leader
        await self._until(
            lambda: all(_seen(self._topic(n), r, 0) for n, (_, r) in moved.items()), deadline
        )
        for name in moved:
            await self._stop(name)
        waiting = dict(moved)
        while waiting and self._clock() < deadline:
            waiting = {n: m for n, m in waiting.items() if not _seen(self._topic(n), m[1], 1)}
            if waiting:  # a target stopping too, or gone (its session, and with it its
                # leaving key, ended: it stopped fast), never claims: stop waiting for it
                await self._until(lambda: False, min(deadline, self._clock() + 0.25))
                waiting = {n: m for n, m in waiting.items() if await self._may_claim(m[0])}
        for name, (to, _rev) in waiting.items():
            log.warning("topic %s: %s has not taken the leadership", name, to)
        return {name: to for name, (to, _) in moved.items()}

    async def missing(self, name: str) -> Topic | None:
        """The record names this broker leader of ``name``, whose data is gone here: hand
        the topic to an alive in-sync follower (module docstring), so a copy that holds
        the data serves it and this broker copies it back as a follower.

        Returns:
            The record as written (the roles keep it as their newest); None when no
            such follower took it (the topic then stays unserved, ``data-missing``).
        """
        topic = self._led_here(name)
        if topic is None:
            return None
        record = topic.record
        alive = self._view.state.brokers
        targets = [n for n in record.effective_isr() if n != self._me and n in alive]
        handed = await self._transfer(topic, targets, tell=False)
        if handed is None:
            return None
        to, result = handed
        if result.record is None:
            return None
        log.warning(
            "broker %s: leads topic %s but its data is missing here: handed to "
            "in-sync %s at epoch %d; this broker copies it back as a follower",
            self._me,
            name,
            to,
            result.record.epoch,
        )
        return Topic(result.record, result.mod_revision)

    def _leaving_key(self, node: str) -> str:
        """``<prefix>leaving/<node>``: present, under its session's lease, while ``node``
        hands over (not a key of the view's layout: the view ignores it)."""
        return f"{self._keys.prefix}leaving/{node}"

    async def _say_leaving(self, deadline: float) -> bool:
        """Tell the other stopping brokers not to hand topics here (several stopped at
        once would each wait for the other's claim). False when etcd did not take it
        within ``LEAVING_WITHIN_S`` (or by ``deadline``): no hand-over could be written."""
        if self._session.lease == 0:
            return True
        within = max(0.0, min(LEAVING_WITHIN_S, deadline - self._clock()))
        try:
            async with asyncio.timeout(within):
                await self._store.put(self._leaving_key(self._me), b"", lease=self._session.lease)
        except (ClusterError, TimeoutError) as exc:
            log.warning(
                "broker %s: cannot mark itself leaving: %s", self._me, str(exc) or "no answer"
            )
            return False
        return True

    async def _may_claim(self, node: str) -> bool:
        """Whether a hand-over's target may still claim: alive and not stopping."""
        return node in self._view.state.brokers and not await self._is_leaving(node)

    async def _is_leaving(self, node: str) -> bool:
        try:
            return await self._store.get(self._leaving_key(node)) is not None
        except ClusterError:
            return False

    def _topic(self, name: str) -> Topic | None:
        return self._view.state.topics.get(name)

    async def _until(self, done: Callable[[], bool], deadline: float) -> None:
        left = deadline - self._clock()
        if left > 0:
            await self._view.wait_for(lambda _state: True if done() else None, left)

    def _led_here(self, name: str) -> Topic | None:
        """The newest record of ``name`` when it names this broker leader and its session
        may write (only then may it hand the topic over); else None."""
        topic = self._latest(name)
        if topic is None or topic.record.owner != self._me or not self._session.may_write():
            return None
        return topic

    async def _hand_one(self, name: str, fetching: Fetching | None) -> tuple[str, int] | None:
        topic = self._led_here(name)
        if topic is None:
            return None
        alive = self._view.state.brokers
        isr = topic.record.effective_isr()
        targets = [n for n in isr if n != self._me and n in alive and not await self._is_leaving(n)]
        if fetching is not None:
            silent = [n for n in targets if not fetching(name, n)]
            if silent:  # dead or frozen before its session ended: it would never claim
                log.info("topic %s: not handed to %s: not fetching from here", name, silent)
            targets = [n for n in targets if n not in silent]
        handed = await self._transfer(topic, targets, tell=True)
        if handed is not None:
            to, result = handed
            log.info("broker %s: controlled shutdown: topic %s handed to %s", self._me, name, to)
            return to, result.mod_revision
        if not targets:
            log.warning(
                "broker %s: controlled shutdown: topic %s not handed over: no in-sync "
                "follower alive, fetching and not stopping itself; it waits for an "
                "election after this broker leaves (or for this broker's return)",
                self._me,
                name,
            )
        return None

    async def _transfer(
        self, topic: Topic, targets: Sequence[str], *, tell: bool
    ) -> tuple[str, ChangeResult] | None:
        """Hand ``topic`` to the first of ``targets`` that takes it (module docstring).

        Args:
            topic: the record as read, led here.
            targets: the candidates, in the in-sync set's order.
            tell: log each attempt not won (the controlled shutdown, once per topic,
                does; the missing-data step, tried again at every pass, does not).

        Returns:
            The target that took it and the transaction's result; None when none did.
        """
        record = topic.record
        name = record.name
        for to in targets:
            try:
                result = await transfer_leadership(
                    self._store, self._keys, name, record, topic.mod_revision,
                    leader=self._me, epoch=record.epoch, leader_lease=self._session.lease,
                    to=to, leave_isr=True,
                )  # fmt: skip
            except ClusterError as exc:
                log.warning("topic %s: handing over to %s failed: %s", name, to, exc)
                return None
            if result.outcome.is_won():
                return to, result
            if tell:
                log.info(
                    "topic %s: hand-over to %s: %s (%s)",
                    name,
                    to,
                    result.outcome.value,
                    result.reason,
                )
            if result.record is None or result.outcome is not Outcome.REFUSED:
                return None
        return None


def _seen(topic: Topic | None, handed_rev: int, later: int) -> bool:
    """Whether the view holds a topic handed over at ``handed_rev`` at that revision
    (``later`` 0) or at a later one (``later`` 1: the new leader's claim), or it is gone."""
    return topic is None or topic.mod_revision >= handed_rev + later
