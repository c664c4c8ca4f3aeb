"""What an unclean election gives up (issue 37): the leader's published high watermarks,
and the winner's count of the committed records it lacks.

Role: :class:`~cluster.replica_member.ReplicaRoles` (the member's replica roles) holds
one :class:`UncleanMarks`. An unclean election (off unless the cluster default
``unclean_leader_election`` is on) makes an out-of-sync replica leader, and the records
only the old in-sync set had are lost. How many is counted from the old leader's
*published marks*: while the switch is on and a leader has replicas outside its in-sync
set (so an unclean election could follow), it writes its high watermark per partition
to ``<prefix>marks/<topic>`` (:class:`PublishedMarks`, with the topic id and its epoch;
not a key of the view's layout; fenced by the record as read and its lease, as every
leader's write) at most every ``MARKS_INTERVAL_S`` when they moved (nothing while the
switch is off: no etcd write is added to a cluster that cannot elect uncleanly). The
winner compares the marks of the epoch it replaces with its own log ends
(:func:`cluster.replicas.records_given_up`): a lower bound (what was committed after the
last publication is not in it), logged as a WARNING ("at least N records") and counted
(:attr:`UncleanMarks.records_given_up`, ``headrace_cluster_unclean_lost_records_total``).
With no marks of that epoch (the switch was turned on after the leader died) the WARNING
says the number is not known, and nothing is added to the count.

Worked example: b1 leads ``t`` at epoch 3 with b3 out of sync and publishes ``{0: 100}``.
b1 and the in-sync b2 die; b3, whose log ends at 60, wins uncleanly: at least 40 records
of partition 0 are given up, ``records_given_up == {"t": 40}``.

Task-safety: not task-safe; only the member's reconcile task calls it. It must not
depend on the broker: the broker's log marks come in as a :data:`LogMarks` callable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

import msgspec

from cluster.errors import ClusterError
from cluster.etcd import Compare, EtcdStore, Op
from cluster.records import Keys, TopicRecord
from cluster.replicas import records_given_up
from cluster.session import Clock, Session
from cluster.state import Topic

log = logging.getLogger(__name__)

MARKS_INTERVAL_S = 1.0
"""Seconds between a leader's publications of its high watermarks (module docstring)."""

LogMarks = Callable[[str], Mapping[int, tuple[int, int]]]
"""The broker's ``partition -> (high watermark, log end)`` of a local topic (empty when
it holds none)."""


class PublishedMarks(msgspec.Struct, frozen=True):
    """A leader's high watermarks as published to ``<prefix>marks/<topic>``."""

    id: str
    epoch: int
    committed: dict[int, int]


class UncleanMarks:
    """This broker's published marks as leader, and its count as an unclean winner.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        session: the member's session (its lease fences each publication).
        node_id: this broker.
        clock: monotonic seconds (the publication interval).
    """

    def __init__(
        self, store: EtcdStore, keys: Keys, session: Session, *, node_id: str, clock: Clock
    ) -> None:
        self._store = store
        self._keys = keys
        self._session = session
        self._me = node_id
        self._clock = clock
        #: Unclean elections this broker won since it started.
        self.unclean_elections = 0
        #: topic -> records unclean elections won here gave up, at least (summed).
        self.records_given_up: dict[str, int] = {}
        #: name -> (monotonic time the next publication may go, the marks last published).
        self._published: dict[str, tuple[float, PublishedMarks | None]] = {}

    def key(self, name: str) -> str:
        """``<prefix>marks/<topic>``: the leader's published high watermarks (not a key of
        the view's layout: the view ignores it)."""
        return f"{self._keys.prefix}marks/{name}"

    def dues(self) -> Iterable[float]:
        """The monotonic times the next publications may go (the member's wake-up)."""
        return (due for due, _ in self._published.values())

    def forget(self, name: str) -> None:
        """This broker no longer leads ``name``: nothing more published for it."""
        self._published.pop(name, None)

    async def publish(
        self, topic: Topic, marks: LogMarks | None, allowed: Callable[[], bool]
    ) -> None:
        """As leader, publish this epoch's high watermarks (``marks``) while unclean
        elections are ``allowed`` and a replica is outside the in-sync set (module
        docstring), at most every ``MARKS_INTERVAL_S``, when they moved. The put is
        fenced as every leader's write is: the topic's record as read (its
        ``mod_revision``) and this broker's lease; a leader deposed or deleted behind its
        view writes nothing (else its stale marks replaced the new leader's, or came back
        after the topic's delete, for good)."""
        record = topic.record
        name = record.name
        in_sync = set(record.effective_isr()) >= set(record.effective_replicas())
        if marks is None or in_sync or not allowed():
            self._published.pop(name, None)
            return
        now = self._clock()
        due, last = self._published.get(name, (now, None))
        if now < due or not self._session.may_write():
            return
        committed = {p: hw for p, (hw, _end) in marks(name).items()}
        published: PublishedMarks | None = PublishedMarks(record.id, record.epoch, committed)
        if published != last:
            guards = [
                Compare.modified_at(self._keys.topic(name), topic.mod_revision),
                Compare.leased_by(self._keys.broker(self._me), self._session.lease),
            ]
            put = Op.put(self.key(name), msgspec.json.encode(published))
            try:
                if not (await self._store.txn(guards, [put])).succeeded:
                    published = last  # the record moved since the view read it: next pass
            except ClusterError as exc:
                log.warning("topic %s: publishing its high watermarks failed: %s", name, exc)
                published = last  # tried again at the next due time
        self._published[name] = (now + MARKS_INTERVAL_S, published)

    async def given_up(self, record: TopicRecord, marks: LogMarks | None) -> dict[int, int] | None:
        """Per partition, the records an unclean election of this broker gives up, at
        least: the old leader's published marks of ``record``'s epoch over this log's ends
        (``marks``); None when it published none at that epoch (not known)."""
        if marks is None:
            return None
        try:
            held = await self._store.get(self.key(record.name))
            old = None if held is None else msgspec.json.decode(held.value, type=PublishedMarks)
        except (ClusterError, msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("topic %s: the old leader's marks cannot be read: %s", record.name, exc)
            old = None
        if old is None or (old.id, old.epoch) != (record.id, record.epoch):
            return None  # none published at that epoch (the switch was off)
        ends = {p: end for p, (_hw, end) in marks(record.name).items()}
        return records_given_up(old.committed, ends)

    def count(
        self, before: TopicRecord, after: TopicRecord, lost: Mapping[int, int] | None
    ) -> None:
        """This broker won an unclean election of ``before``'s topic (now ``after``),
        giving up ``lost`` (:meth:`given_up`): counted and logged as a WARNING."""
        name = after.name
        total = sum(lost.values()) if lost is not None else 0
        self.unclean_elections += 1
        self.records_given_up[name] = self.records_given_up.get(name, 0) + total
        if lost is None:
            given_up = (
                f"how many records the old leader had committed are given up is not known "
                f"(it published no high watermark at epoch {before.epoch}: unclean election "
                f"was off then)"
            )
        else:
            by_partition = ", ".join(f"{p}: {n}" for p, n in lost.items()) or "none"
            given_up = (
                f"at least {total} records the old leader had committed are given up "
                f"(by partition: {by_partition})"
            )
        log.warning(
            "topic %s: UNCLEAN election: broker %s (out of sync) leads at epoch %d after "
            "%s (epoch %d) and the in-sync set %s were gone; %s",
            name,
            self._me,
            after.epoch,
            before.owner or "none",
            before.epoch,
            list(before.effective_isr()),
            given_up,
        )
