"""The controller's moves of replicated topics (issue 37): reassignments and leadership
balance.

Role: while a broker holds the controller token, :class:`Mover` runs on every controller
pass:

- **Reassignment.** An operator (``headrace cluster reassign``, :func:`request`) writes
  the target replica set into the topic record's ``reassign_to``. A topic of one copy
  (a factor-1 record, no ``replicas``) is first made a replicated topic of one replica
  (:func:`cluster.replica_txn.replicate_single`: ``replicas = isr = (owner,)``, epoch
  + 1); its owner claims it again on the replicated path, which switches the local topic
  over (commit gate and leader epochs at the partitions' durable end, the subscription
  state snapshotted into the ``state`` log, the dead-letter queues led as
  ``dlq/<subscription>`` logs) before the claim counts. The mover then takes the
  next :func:`cluster.replicas.reassignment_step` and writes it, fenced by the token:
  add the target's new replicas (they create their copy and fetch from the leader until
  the leader lets them into the in-sync set), wait until every target replica is in sync,
  move leadership to the target's first replica (its preferred leader) when it is alive
  and in sync and the leader is another, drop the replicas outside the target (each
  deletes its local copy) and clear ``reassign_to``. Resumable: each step reads only the
  record, so a new controller carries on where the old one stopped. The topic serves
  throughout; a leadership move is what a client sees (a refusal naming the new leader,
  or "outcome unknown" for an ack in flight: the idempotent producer resends).
- **Cancel.** ``headrace cluster reassign TOPIC --cancel`` (:func:`cancel`, Kafka's
  KIP-455 cancel) sets ``reassign_to`` back to ``reassign_from`` (the replica set the
  reassignment started from) and clears the throttle; the mover then takes
  :func:`cluster.replicas.cancel_step`: leadership back to an original in-sync replica
  if an added one leads, then the added replicas dropped (they delete their copy).
- **Balance.** ``headrace cluster rebalance`` asks for replica moves
  (:func:`cluster.replicas.replica_moves`: reassignments under a throttle, at most
  ``max_moves`` running at once), reorders
  (:func:`cluster.replicas.rebalance_moves`) and preferred-leader moves the same way (a
  ``reassign_to`` of the same replicas, the wanted leader first). With ``[cluster]
  auto_rebalance``, every ``rebalance_interval_s`` the mover also moves leadership back
  to each topic's preferred leader when it is alive and in sync
  (:func:`cluster.replicas.preferred_leader_moves`; Kafka's
  ``auto.leader.rebalance.enable``), and starts replica moves while replica counts
  differ by two or more, at most :data:`AUTO_MAX_MOVES` running at once, each under
  :data:`REBALANCE_THROTTLE` (Cruise Control's self-healing, rate-limited).

Every write is :func:`cluster.replica_txn.set_replicas`,
:func:`cluster.replica_txn.replicate_single` or
:func:`cluster.replica_txn.move_leadership`: one compare-and-set on the record as read
plus the controller token; a deposed controller writes nothing.

Task-safety: called from the controller's task only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from cluster.errors import ReplicationSettingsError
from cluster.etcd import Compare, EtcdStore, Op
from cluster.records import Keys, TopicRecord, TopicState, decode, encode
from cluster.replica_txn import (
    ChangeResult,
    Outcome,
    move_leadership,
    replicate_single,
    set_replicas,
)
from cluster.replicas import (
    ReplicaMove,
    StepKind,
    cancel_step,
    check_target,
    is_cancelling,
    preferred_leader_moves,
    reassignment_step,
    replica_moves,
)
from cluster.state import ClusterState, Topic

log = logging.getLogger(__name__)

REBALANCE_INTERVAL_S = 300.0
"""Default seconds between automatic preferred-leader passes (Kafka's
``leader.imbalance.check.interval.seconds``)."""

REBALANCE_THROTTLE = 10 * 1024 * 1024
"""Bytes per second the leader sends a replica a rebalance added while it catches up
(``headrace cluster rebalance --throttle`` overrides it; 0: no limit)."""

MAX_MOVES = 2
"""Replica moves (reassignments) a rebalance lets run at once by default."""

AUTO_MAX_MOVES = 1
"""Replica moves the automatic rebalance lets run at once: one at a time."""


class Mover:
    """The controller's reassignments and leadership balance (module docstring).

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        auto_rebalance: move leadership back to preferred leaders every ``interval_s``.
        interval_s: seconds between automatic passes.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        store: EtcdStore,
        keys: Keys,
        *,
        auto_rebalance: bool = False,
        interval_s: float = REBALANCE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._keys = keys
        self.auto_rebalance = auto_rebalance
        self.interval_s = interval_s
        self._clock = clock
        self._next_auto: float | None = None  # the first pass sets it (interval_s may change)

    async def run_pass(self, state: ClusterState, token: int) -> bool:
        """One pass: each reassignment's next step, then (when due) the automatic
        preferred-leader moves. Returns False when the token turned out stale.

        Raises:
            EtcdUnavailableError: etcd did not answer (the controller retries the pass).
        """
        alive = set(state.brokers)
        for topic in sorted(state.topics.values(), key=lambda t: t.record.name):
            moving = topic.record.reassign_to and topic.record.state is TopicState.READY
            if moving and not await self._step(topic, alive, token):
                return False
        if self._next_auto is None:
            self._next_auto = self._clock() + self.interval_s
        if self.auto_rebalance and self._clock() >= self._next_auto:
            self._next_auto = self._clock() + self.interval_s
            records = [t.record for t in state.topics.values()]
            for move in replica_moves(records, alive, AUTO_MAX_MOVES):
                if not await self._start_move(state.topics[move.topic], move, token):
                    return False
            for name, to in preferred_leader_moves(records, alive):
                topic = state.topics[name]
                result = await move_leadership(
                    self._store, self._keys, name, topic.record, topic.mod_revision,
                    controller_token=token, to=to,
                )  # fmt: skip
                if not _note(result, f"auto rebalance: leadership of {name} to {to}"):
                    return False
        return True

    async def _start_move(self, topic: Topic, move: ReplicaMove, token: int) -> bool:
        """Start ``move`` as a reassignment (``reassign_to``, ``reassign_from`` and the
        throttle written, fenced by the token); False when the token turned out stale."""
        record = topic.record
        # set_replicas keeps the read record's other fields: the throttle and the set
        # the move starts from go in through it.
        read = record.replace(
            reassign_throttle=REBALANCE_THROTTLE, reassign_from=record.effective_replicas()
        )
        result = await set_replicas(
            self._store, self._keys, record.name, read, topic.mod_revision,
            controller_token=token, replicas=record.effective_replicas(),
            reassign_to=move.replicas,
        )  # fmt: skip
        what = f"auto rebalance: replica of {record.name} from {move.source} to {move.to}"
        return _note(result, what)

    async def _step(self, topic: Topic, alive: set[str], token: int) -> bool:
        record, rev = topic.record, topic.mod_revision
        name, target = record.name, record.reassign_to
        if is_cancelling(record):
            return await self._cancel_step(topic, alive, token)
        if not record.replicas:  # one copy: replicated first (one replica, its owner)
            result = await replicate_single(
                self._store, self._keys, name, record, rev, controller_token=token,
                reassign_to=target,
            )  # fmt: skip
            return _note(result, f"reassignment of {name}: one copy on {record.owner} replicated")
        step = reassignment_step(record, target, alive)
        preferred = target[0]
        if (
            step.kind is StepKind.DROP_REPLICAS
            and record.owner != preferred
            and preferred in alive
            and preferred in record.effective_isr()
        ):  # end with the target's preferred leader leading
            result = await move_leadership(
                self._store, self._keys, name, record, rev, controller_token=token, to=preferred
            )
            return _note(result, f"reassignment of {name}: leadership to {preferred}")
        if step.kind is StepKind.MOVE_LEADERSHIP:
            result = await move_leadership(
                self._store, self._keys, name, record, rev, controller_token=token, to=step.leader
            )
            return _note(result, f"reassignment of {name}: leadership to {step.leader}")
        if step.kind in (StepKind.ADD_REPLICAS, StepKind.DROP_REPLICAS):
            if step.kind is StepKind.DROP_REPLICAS:
                record = record.replace(reassign_from=())  # ends with reassign_to
            result = await set_replicas(
                self._store, self._keys, name, record, rev,
                controller_token=token, replicas=step.replicas, reassign_to=step.reassign_to,
            )  # fmt: skip
            what = "add" if step.kind is StepKind.ADD_REPLICAS else "drop to"
            return _note(result, f"reassignment of {name}: replicas {what} {list(step.replicas)}")
        return True  # waiting for the new replicas to be in sync

    async def _cancel_step(self, topic: Topic, alive: set[str], token: int) -> bool:
        """The next step of a cancelled reassignment (:func:`cluster.replicas.cancel_step`)."""
        record, rev, name = topic.record, topic.mod_revision, topic.record.name
        step = cancel_step(record, alive)
        if step.kind is StepKind.MOVE_LEADERSHIP:
            result = await move_leadership(
                self._store, self._keys, name, record, rev, controller_token=token, to=step.leader
            )
            return _note(result, f"cancelled reassignment of {name}: leadership to {step.leader}")
        if step.kind is StepKind.DROP_REPLICAS:
            result = await set_replicas(
                self._store, self._keys, name, record.replace(reassign_from=()), rev,
                controller_token=token, replicas=step.replicas, reassign_to=(),
            )  # fmt: skip
            return _note(result, f"cancelled reassignment of {name}: back to {list(step.replicas)}")
        return True  # waiting for an original replica to be in sync


def _note(result: ChangeResult, what: str) -> bool:
    """Log a move's outcome; False when the controller token was stale."""
    if result.outcome.is_won():
        log.info("controller: %s", what)
    elif result.outcome is not Outcome.LOST_RACE:
        log.info("controller: %s not made: %s (%s)", what, result.outcome.value, result.reason)
    return result.outcome is not Outcome.STALE


async def request(
    store: EtcdStore, keys: Keys, name: str, target: Sequence[str], throttle: int = 0
) -> tuple[TopicRecord, TopicRecord]:
    """An operator's request: set topic ``name``'s ``reassign_to`` to ``target`` and its
    ``reassign_throttle`` to ``throttle`` bytes per second (0: none) (a compare-and-set
    on the record as read; the controller carries it out). Returns the record before and
    after. A replicated topic may go down to one replica (its leader then commits alone:
    the high watermark is its durable end) and back up. A topic of one copy (no
    ``replicas`` in its record: created with factor 1, auto-created, or created while
    one broker was alive) is moved too: the mover first makes it a replicated topic of
    one replica (:func:`cluster.replica_txn.replicate_single`), then carries on as for
    any replicated topic.

    Raises:
        ReplicationSettingsError: ``target`` is not a replica set or names a broker
            that is not alive, the topic is not ready, ``target`` is
            shorter than its ``min_insync``, or a reassignment of it runs to another
            target.
        RuntimeError: the record kept changing while it was written (retry).
        EtcdUnavailableError: etcd did not answer.
    """
    wanted = check_target(target)
    down = [n for n in wanted if await store.get(keys.broker(n)) is None]
    if down:
        raise ReplicationSettingsError(
            f"broker(s) {', '.join(down)} not alive: every broker of a reassignment's target "
            "must be running (start it, or leave it out)"
        )
    key = keys.topic(name)
    for _attempt in range(5):
        held = await store.get(key)
        if held is None:
            raise ReplicationSettingsError(f"topic {name!r} does not exist in the cluster")
        record = decode(key, held.value, TopicRecord)
        if record.state is not TopicState.READY:
            raise ReplicationSettingsError(f"topic {name} is {record.state.value}, not ready")
        if len(wanted) < record.min_insync:
            raise ReplicationSettingsError(
                f"topic {name}: {len(wanted)} replica(s) {list(wanted)} is below its "
                f"min_insync {record.min_insync}: every publish would be refused"
            )
        if record.reassign_to and record.reassign_to != wanted:
            raise ReplicationSettingsError(
                f"topic {name} is being reassigned to {list(record.reassign_to)}: wait until "
                "it ends (headrace cluster reassign --status)"
            )
        if is_cancelling(record):
            raise ReplicationSettingsError(
                f"topic {name}'s reassignment is being cancelled: wait until it ends "
                "(headrace cluster reassign --status)"
            )
        started = record.reassign_from if record.reassign_to else record.effective_replicas()
        after = record.replace(
            reassign_to=wanted,
            reassign_throttle=max(throttle, 0),
            reassign_from=started if wanted != record.effective_replicas() else (),
        )
        result = await store.txn(
            [Compare.modified_at(key, held.mod_revision)], [Op.put(key, encode(after))]
        )
        if result.succeeded:
            return record, after
    raise RuntimeError(f"topic {name} kept changing while the reassignment was written; retry")


async def cancel(store: EtcdStore, keys: Keys, name: str) -> tuple[TopicRecord, TopicRecord]:
    """An operator's cancel of topic ``name``'s running reassignment (Kafka's KIP-455
    cancel): ``reassign_to`` back to ``reassign_from`` and the throttle cleared (a
    compare-and-set on the record as read; the controller carries it out,
    :func:`cluster.replicas.cancel_step`). A request that changed no replica (a move to
    the preferred leader) ends at once: ``reassign_to`` cleared. Idempotent. Returns the
    record before and after.

    Raises:
        ReplicationSettingsError: no such topic, or no reassignment of it is running.
        RuntimeError: the record kept changing while it was written (retry).
        EtcdUnavailableError: etcd did not answer.
    """
    key = keys.topic(name)
    for _attempt in range(5):
        held = await store.get(key)
        if held is None:
            raise ReplicationSettingsError(f"topic {name!r} does not exist in the cluster")
        record = decode(key, held.value, TopicRecord)
        if not record.reassign_to:
            raise ReplicationSettingsError(f"no reassignment of topic {name} is running")
        if is_cancelling(record) and not record.reassign_throttle:
            return record, record
        if not record.replicas:  # not replicated yet: nothing moved, nothing to undo
            after = record.replace(reassign_to=(), reassign_from=(), reassign_throttle=0)
        elif record.reassign_from:
            after = record.replace(reassign_to=record.reassign_from, reassign_throttle=0)
        else:
            after = record.replace(reassign_to=(), reassign_throttle=0)
        result = await store.txn(
            [Compare.modified_at(key, held.mod_revision)], [Op.put(key, encode(after))]
        )
        if result.succeeded:
            log.info("topic %s: reassignment to %s cancelled", name, list(record.reassign_to))
            return record, after
    raise RuntimeError(f"topic {name} kept changing while the cancel was written; retry")
