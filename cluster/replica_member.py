"""The member's part in replicated topics (issue 37): create, claim, lead, follow, elect.

Role: the shell of :mod:`cluster.replica_roles`. The member's reconcile task calls
:meth:`ReplicaRoles.reconcile` on every pass; for each replicated topic this broker is a
replica of, it takes the :func:`~cluster.replica_roles.decide` step and carries it out:
local files through the broker's :class:`~cluster.local.LocalTopics` hook, a claim
through the member's compare-and-set, an election through
:func:`cluster.replica_txn.elect`, and the role through the hook's ``lead`` / ``follow``
/ ``stop``. The leader's in-sync set changes come back through :meth:`ReplicaRoles.changer`
(``cluster.replica_txn.shrink_isr`` / ``expand_isr``).

Operations (issue 37): as leader, a pass takes the in-sync followers whose session ended
out of the in-sync set at once (a stopped broker; Kafka's controlled shutdown does the
same), and the changer lets no broker without a session join. A replica a reassignment
dropped stops its role and deletes its copy. :meth:`ReplicaRoles.hand_over` is the
controlled shutdown, and no role is taken after it. A broker the record names leader
whose data is missing (``MISSING``: it came back on an empty data directory before a
follower was elected) hands the topic over too, then copies it back as a follower; with
no alive in-sync follower the topic stays unserved.

What moved out, each a piece that reads, and is tested, on its own:

- :mod:`cluster.replica_handover` (:class:`~cluster.replica_handover.HandOver`): how a
  leader hands its topics to in-sync followers, for the controlled shutdown and for the
  missing data; this module decides when (its ``_leaving`` latch, the ``MISSING`` step).
- :mod:`cluster.replica_marks` (:class:`~cluster.replica_marks.UncleanMarks`): the
  leader's published high watermarks and an unclean winner's count of what it gave up;
  this module publishes them on each ``LEAD`` pass and counts after an unclean win.

Invariants:

- A claim or an election counts (``claimed[name] = epoch``, so the member lets writes
  through) only after the hook's ``lead`` returned: the leader's epoch is in every
  partition's leader-epochs file before its first append.
- Elections are staggered: the candidate of rank ``r`` (its place among the in-sync
  followers in preferred order) tries ``r x ELECTION_STEP_S`` after it first saw the
  leader gone, so the preferred one usually wins and the others see its record first;
  any number may try, exactly one transaction wins (``replica_txn``).
- The hook is told a role only when it changes (role, epoch, leader address, or the
  record of a leader), so a pass with nothing new makes no call.
- A ``lead`` the hook failed (the broker's takeover: its state-log replay) is neither
  counted nor claimed again at once: the topic goes to the first alive in-sync follower
  (``transfer_leadership``), else no claim or election of it here before a backoff of
  1 s doubling to 30 s (:mod:`cluster.lead_retry`).

Unclean election (issue 37): off unless :attr:`ReplicaRoles.unclean_allowed` says so
(the cluster default ``unclean_leader_election``). With it on, an alive replica outside
the in-sync set runs :func:`~cluster.replica_txn.elect` with ``unclean`` once the leader
and every in-sync member are gone, ``UNCLEAN_GRACE_S`` plus its rank's stagger after it
first saw that (an in-sync replica back in time wins cleanly instead). What it gives up
is counted from the old leader's published marks (:mod:`cluster.replica_marks`).

Task-safety: the member's reconcile task is the only caller of :meth:`reconcile`; a
changer runs in the leader's task and only writes etcd (compare-and-set) and
:attr:`ReplicaRoles._written`, which the reconcile task only reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from cluster.errors import ClusterError
from cluster.etcd import EtcdStore, Op
from cluster.lead_retry import LeadBackoff, takeover_target
from cluster.local import ChangeIsr, LocalTopics
from cluster.records import Keys, TopicRecord, TopicState, encode
from cluster.replica_handover import Fetching, HandOver
from cluster.replica_marks import LogMarks, UncleanMarks
from cluster.replica_roles import Decision, Step, decide, is_replicated
from cluster.replica_txn import elect, expand_isr, shrink_isr, transfer_leadership
from cluster.session import Clock, Session
from cluster.state import Topic
from cluster.view import View

log = logging.getLogger(__name__)

ELECTION_STEP_S = 0.5
"""Seconds between the election attempts of successive candidates (by rank)."""

UNCLEAN_GRACE_S = 2.0
"""Seconds an unclean candidate waits, beyond its rank's stagger, after it first saw the
leader and every in-sync replica gone (one coming back in time wins cleanly)."""

Cas = Callable[[Topic, list[Op]], Awaitable[bool]]
"""The member's compare-and-set on a topic as read, under its lease."""

Fail = Callable[[Topic, str, str], Awaitable[None]]
"""The member's end of a create that can never succeed (``failed``, code, message)."""


class ReplicaRoles:
    """This broker's roles in the replicated topics it is a replica of.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        view: the member's view.
        session: the member's session (its lease fences claims and elections).
        local: the broker's hook.
        node_id: this broker.
        cas: the member's guarded compare-and-set.
        fail: the member's end of an impossible create.
        clock: monotonic seconds (the election stagger).
    """

    def __init__(
        self,
        store: EtcdStore,
        keys: Keys,
        view: View,
        session: Session,
        local: LocalTopics,
        *,
        node_id: str,
        cas: Cas,
        fail: Fail,
        clock: Clock = time.monotonic,
    ) -> None:
        self._store = store
        self._keys = keys
        self._view = view
        self._session = session
        self._local = local
        self._me = node_id
        self._cas = cas
        self._fail = fail
        self._clock = clock
        #: name -> (step, record, address) the hook was last given (LEAD or FOLLOW).
        self._given: dict[str, tuple[Step, TopicRecord, str]] = {}
        #: name -> monotonic time this broker may try an election.
        self._due: dict[str, float] = {}
        #: topics whose files were made empty while the record counted this broker in sync.
        self._fresh: set[str] = set()
        #: name -> the record (and revision) the changer last wrote.
        self._written: dict[str, Topic] = {}
        self._logged: set[tuple[str, str]] = set()
        #: set by :meth:`hand_over`: the broker is stopping; no pass takes a role again.
        self._leaving = False
        #: Whether a follower fetched a topic from this broker's leader lately (the
        #: broker sets it; None: every alive in-sync follower may take a hand-over).
        self.fetching_lately: Fetching | None = None
        #: topics whose takeover failed here: tried again after a backoff.
        self._lead_backoff = LeadBackoff()
        #: Whether an unclean election may run (the broker sets it: the cluster default).
        self.unclean_allowed: Callable[[], bool] = lambda: False
        #: The broker's log marks (the broker sets it); None: nothing published or counted.
        self.marks: LogMarks | None = None
        #: Elections this broker won (clean and unclean) since it started.
        self.elections_won = 0
        #: the leader's published marks, and what unclean elections won here gave up.
        self._unclean = UncleanMarks(store, keys, session, node_id=node_id, clock=clock)
        #: the controlled shutdown's, and a missing-data leader's, hand-overs.
        self._hand_over = HandOver(
            store, keys, view, session,
            node_id=node_id, clock=clock, latest=self._latest, stop=self._stop,
        )  # fmt: skip

    @property
    def unclean_elections(self) -> int:
        """Unclean elections this broker won since it started."""
        return self._unclean.unclean_elections

    @property
    def records_given_up(self) -> dict[str, int]:
        """``topic ->`` records the unclean elections won here gave up, at least (summed)."""
        return self._unclean.records_given_up

    def roles(self) -> dict[str, tuple[str, int]]:
        """``name -> ("leader" | "follower", epoch)`` as given to the hook (for tests,
        status and logs)."""
        return {
            name: ("leader" if step is Step.LEAD else "follower", record.epoch)
            for name, (step, record, _) in self._given.items()
        }

    def wake_in(self) -> float | None:
        """Seconds until the next staggered election attempt falls due; None when none is
        ahead (one already due and not tried, as while the session may not write, waits
        for the member's usual pass: a due time in the past must not make it spin)."""
        now = self._clock()
        dues = [*self._due.values(), *self._unclean.dues()]
        ahead = [due - now for due in dues if due > now]
        ahead += [due - now for due in self._lead_backoff.dues() if due > now]
        return min(ahead) if ahead else None

    def owns_copy(self, name: str, topic_id: str) -> bool:
        """Whether a local topic ``name`` with ``topic_id`` is this broker's replica of the
        cluster's topic (so not a stray)."""
        topic = self._view.state.topics.get(name)
        if topic is None:
            return False
        record = topic.record
        return record.id == topic_id and self._me in record.effective_replicas()

    async def reconcile(self, claimed: dict[str, int]) -> None:
        """One pass over the replicated topics (module docstring). ``claimed`` is the
        member's map of this session's claims; it is updated here.

        Raises:
            ClusterError: etcd did not answer (the member retries the pass).
        """
        if self._leaving:
            return  # handing over or handed over (controlled shutdown): no new role
        topics = self._view.state.topics
        for name in [n for n in self._given if n not in topics]:
            await self._stop(name)  # deleted behind our back (or a relist): no role
        for name, topic in list(topics.items()):
            record = topic.record
            if not is_replicated(record):
                if name in self._given:
                    await self._stop(name)
                continue
            if self._me not in record.effective_replicas():
                if name in self._given:
                    await self._dropped(topic)
                continue
            try:
                await self._one(topic, claimed)
            except ClusterError:
                raise
            except Exception:  # the broker's hook: whatever it raises, retry next pass
                log.exception("broker %s: replica step for topic %s failed", self._me, name)

    async def _one(self, topic: Topic, claimed: dict[str, int]) -> None:
        record = topic.record
        name = record.name
        if self._me not in record.effective_isr():
            self._fresh.discard(name)
        alive = {node: b.record.address for node, b in self._view.state.brokers.items()}
        decision = decide(
            record,
            self._me,
            alive=alive,
            claimed=claimed.get(name),
            holds=self._local.topic_id(name) == record.id,
            fresh=name in self._fresh,
            unclean=self.unclean_allowed(),
        )
        if decision.step is not Step.ELECT:
            self._due.pop(name, None)
        if record.owner != self._me and name in claimed:
            del claimed[name]  # deposed: another broker leads at a newer epoch
        if decision.step.is_write() and not self._session.may_write():
            return
        await self._act(topic, decision, claimed)

    async def _act(self, topic: Topic, decision: Decision, claimed: dict[str, int]) -> None:
        name = topic.record.name
        step = decision.step
        if step is Step.STOP:
            await self._stop(name)
        elif step is Step.DELETE:
            await self._delete(topic, claimed)
        elif step is Step.CREATE:
            await self._create(topic, decision, claimed)
        elif step is Step.CLAIM:
            await self._claim(topic, claimed)
        elif step is Step.LEAD:
            await self._lead(topic.record)
            await self._drop_gone(topic)
            await self._unclean.publish(topic, self.marks, self.unclean_allowed)
        elif step is Step.FOLLOW:
            await self._follow(topic.record, decision.address)
        elif step is Step.ELECT:
            await self._elect(topic, decision, claimed)
        elif step is Step.MISSING:
            handed = await self._hand_over.missing(name)
            if handed is not None:
                self._written[name] = handed
                return
            self._log_once(
                name,
                "missing",
                logging.ERROR,
                "it leads the topic but its data is missing here: it is served as offline, "
                "not recreated empty",
            )

    # -- the steps ------------------------------------------------------------------------

    async def _stop(self, name: str) -> None:
        self._due.pop(name, None)
        self._lead_backoff.forget(name)
        self._written.pop(name, None)
        self._unclean.forget(name)
        if self._given.pop(name, None) is not None:
            await self._local.stop(name)
            log.info("broker %s: no longer a replica of topic %s here", self._me, name)

    async def _dropped(self, topic: Topic) -> None:
        """A reassignment dropped this broker from the replicas of a topic it held a role
        in: no role any more, and its local copy is deleted (the target holds the topic)."""
        name = topic.record.name
        await self._stop(name)
        if self._local.topic_id(name) == topic.record.id:
            await self._local.delete(name)
            log.info(
                "broker %s: dropped from topic %s's replicas: local copy deleted", self._me, name
            )

    async def _drop_gone(self, topic: Topic) -> None:
        """As leader, take the in-sync followers whose session ended (their broker key is
        gone: a stopped broker, Kafka's controlled shutdown) out of the in-sync set at
        once, instead of holding every acknowledgement for ``replica_lag_time_max_ms``."""
        record = topic.record
        alive = self._view.state.brokers
        gone = [n for n in record.effective_isr() if n != self._me and n not in alive]
        if not gone or not self._session.may_write():
            return
        latest = self._latest(record.name)
        if latest is None or latest.record.epoch != record.epoch:
            return
        kept = tuple(n for n in latest.record.effective_isr() if n not in gone)
        try:
            written = await self._change(latest, kept, record.epoch)
        except ClusterError as exc:
            log.warning(
                "topic %s: removing stopped %s from the isr failed: %s", record.name, gone, exc
            )
            return
        if written is not None:
            self._written[record.name] = written
            log.info("topic %s: stopped broker(s) %s left the isr", record.name, gone)

    async def _delete(self, topic: Topic, claimed: dict[str, int]) -> None:
        name = topic.record.name
        await self._stop(name)
        await self._local.delete(name)
        if topic.record.owner == self._me:
            deletes = [Op.delete(self._keys.topic(name)), Op.delete(self._unclean.key(name))]
            await self._cas(topic, deletes)
            claimed.pop(name, None)

    async def _create(self, topic: Topic, decision: Decision, claimed: dict[str, int]) -> None:
        record = topic.record
        name = record.name
        refused = self._local.check_create(name, record.id, record.partitions)
        if refused is not None:
            if decision.then_claim:
                await self._fail(topic, refused.code, refused.message)
            else:
                self._log_once(
                    name, "refused", logging.ERROR, f"cannot make a replica: {refused.message}"
                )
            return
        try:
            await self._local.create(name, record.id, record.partitions)
        except Exception:  # the broker's hook: whatever it raises, retry next pass
            log.exception("broker %s: cannot create replica of topic %s", self._me, name)
            return
        if record.state is TopicState.READY and self._me in record.effective_isr():
            self._fresh.add(name)
            log.warning(
                "broker %s: made replicated topic %s empty while the record counts it in "
                "sync: it takes part in no election until the leader lets it back in",
                self._me,
                name,
            )
        if decision.then_claim and self._session.may_write():
            await self._claim(topic, claimed)
        elif record.state is TopicState.READY:
            await self._one(topic, claimed)  # now held: follow (or wait) at once

    async def _claim(self, topic: Topic, claimed: dict[str, int]) -> None:
        """``ready`` at epoch + 1 under my lease, then lead; the claim counts after."""
        if self._lead_backoff.waiting(topic.record.name, self._clock()):
            return  # its last takeover here failed: not again before its backoff
        record = topic.record.replace(epoch=topic.record.epoch + 1, state=TopicState.READY)
        name = record.name
        if not await self._cas(topic, [Op.put(self._keys.topic(name), encode(record))]):
            return
        log.info("broker %s: claimed replicated topic %s at epoch %d", self._me, name, record.epoch)
        await self._lead(record)
        claimed[name] = record.epoch

    async def _lead(self, record: TopicRecord) -> None:
        name = record.name
        given = self._given.get(name)
        if given is not None and given[0] is Step.LEAD and given[1] == record:
            return
        try:
            await self._local.lead(name, record, self.changer(name, record.epoch))
        except Exception as exc:
            await self._lead_failed(record, exc)
            raise
        self._lead_backoff.succeeded(name)
        if given is None or given[0] is not Step.LEAD or given[1].epoch != record.epoch:
            log.info("broker %s: leads topic %s at epoch %d", self._me, name, record.epoch)
        self._given[name] = (Step.LEAD, record, "")

    async def _lead_failed(self, record: TopicRecord, exc: Exception) -> None:
        """The hook could not lead ``record`` (the broker's takeover failed: its state
        log's replay, a subscription file; the broker stopped the leader again, so the
        topic is refused here meanwhile). No claim or election of it here before a
        backoff (:class:`~cluster.lead_retry.LeadBackoff`: a claim that failed again at
        once bumped the epoch in a hot loop, a thousand times a second), and the topic is
        handed to the first alive in-sync follower (:func:`~cluster.lead_retry.takeover_target`):
        it holds the same committed logs, so the topic is served again at once, and this
        broker follows; with none, this broker tries again after the backoff."""
        name = record.name
        failure = self._lead_backoff.failed(name, self._clock())
        target = takeover_target(record, self._me, self._view.state.brokers)
        log.error(
            "broker %s: cannot lead topic %s at epoch %d (%d in a row): %r; %s",
            self._me, name, record.epoch, failure.count, exc,
            f"handing it to {target}" if target else
            f"no other in-sync replica is alive: trying again in {failure.delay_s:.1f} s",
        )  # fmt: skip
        topic = self._latest(name)
        if target is None or topic is None or not self._session.may_write():
            return
        try:
            result = await transfer_leadership(
                self._store, self._keys, name, topic.record, topic.mod_revision,
                leader=self._me, epoch=record.epoch, leader_lease=self._session.lease, to=target,
            )  # fmt: skip
        except ClusterError as exc2:
            log.warning("topic %s: handing it to %s failed: %s", name, target, exc2)
            return
        log.info(
            "topic %s: hand-over to %s: %s (%s)", name, target, result.outcome.value, result.reason
        )

    async def _follow(self, record: TopicRecord, address: str) -> None:
        name = record.name
        given = self._given.get(name)
        if (
            given is not None
            and given[0] is Step.FOLLOW
            and (given[1].epoch, given[2]) == (record.epoch, address)
        ):
            return
        await self._local.follow(name, record, address)
        self._given[name] = (Step.FOLLOW, record, address)
        log.info(
            "broker %s: follows topic %s, leader %s at %s, epoch %d",
            self._me,
            name,
            record.owner,
            address,
            record.epoch,
        )

    async def _elect(self, topic: Topic, decision: Decision, claimed: dict[str, int]) -> None:
        name = topic.record.name
        now = self._clock()
        if self._lead_backoff.waiting(name, now):
            return  # its last takeover here failed: not again before its backoff
        wait_s = decision.rank * ELECTION_STEP_S + (UNCLEAN_GRACE_S if decision.unclean else 0)
        due = self._due.setdefault(name, now + wait_s)
        if now < due:
            return
        del self._due[name]
        # what the old leader committed, and this log's ends, before the election moves them
        lost = await self._unclean.given_up(topic.record, self.marks) if decision.unclean else None
        result = await elect(
            self._store,
            self._keys,
            name,
            topic.record,
            topic.mod_revision,
            candidate=self._me,
            candidate_lease=self._session.lease,
            unclean=decision.unclean,
        )
        if not result.outcome.is_won() or result.record is None:
            log.info(
                "broker %s: election for topic %s: %s (%s)",
                self._me,
                name,
                result.outcome.value,
                result.reason,
            )
            return
        self._written[name] = Topic(result.record, result.mod_revision)
        self.elections_won += 1
        if decision.unclean:
            self._unclean.count(topic.record, result.record, lost)
        await self._lead(result.record)
        claimed[name] = result.record.epoch

    # -- controlled shutdown ----------------------------------------------------------------

    async def hand_over(self, timeout_s: float) -> dict[str, str]:
        """Controlled shutdown: hand every replicated topic this broker leads to an alive
        in-sync follower that is fetching from here (:attr:`fetching_lately`) and is not
        stopping itself, within ``timeout_s``
        (:meth:`HandOver.run <cluster.replica_handover.HandOver.run>`). No pass takes a
        role after this (the broker is stopping).

        Returns:
            ``topic -> new leader`` of each topic handed over (for the log and tests).
        """
        self._leaving = True
        led = [name for name, (step, _record, _) in self._given.items() if step is Step.LEAD]
        return await self._hand_over.run(led, timeout_s, self.fetching_lately)

    # -- the leader's in-sync set -----------------------------------------------------------

    def changer(self, name: str, epoch: int) -> ChangeIsr:
        """The ``change_isr`` callback of this broker's leadership of ``name`` at ``epoch``:
        it writes the asked in-sync set (``shrink_isr`` for members that leave, then
        ``expand_isr`` for those that join), fenced by that epoch and this session's
        lease; True once etcd holds it. The leader hears of the new record through the
        hook's ``lead`` at the next reconcile pass (the view sees the write)."""

        async def change(new_isr: tuple[str, ...]) -> bool:
            topic = self._latest(name)
            if topic is None or (topic.record.owner, topic.record.epoch) != (self._me, epoch):
                return False
            alive = self._view.state.brokers
            current = topic.record.effective_isr()
            if any(n not in current and n not in alive for n in new_isr):
                return False  # a broker without a session does not join (it would flap)
            try:
                written = await self._change(topic, new_isr, epoch)
            except ClusterError as exc:
                log.warning("topic %s: isr change to %s failed: %s", name, list(new_isr), exc)
                return False
            if written is None:
                return False
            self._written[name] = written
            return set(written.record.effective_isr()) == set(new_isr)

        return change

    async def _change(self, topic: Topic, new_isr: tuple[str, ...], epoch: int) -> Topic | None:
        record, revision = topic.record, topic.mod_revision
        current = record.effective_isr()
        remove = [n for n in current if n not in new_isr]
        add = [n for n in new_isr if n not in current]
        lease = self._session.lease
        if remove:
            result = await shrink_isr(
                self._store, self._keys, record.name, record, revision,
                leader=self._me, epoch=epoch, leader_lease=lease, remove=remove,
            )  # fmt: skip
            if not result.outcome.is_won() or result.record is None:
                self._refused(record.name, f"remove {remove}", result.reason)
                return None
            record, revision = result.record, result.mod_revision
        if add:
            result = await expand_isr(
                self._store, self._keys, record.name, record, revision,
                leader=self._me, epoch=epoch, leader_lease=lease, add=add,
            )  # fmt: skip
            if not result.outcome.is_won() or result.record is None:
                self._refused(record.name, f"add {add}", result.reason)
                return None
            record, revision = result.record, result.mod_revision
        return Topic(record, revision)

    def _refused(self, name: str, what: str, reason: str) -> None:
        log.info("topic %s: isr change (%s) not made: %s", name, what, reason)

    def _latest(self, name: str) -> Topic | None:
        """The newest of the view's record of ``name`` and the one the changer wrote."""
        seen = self._view.state.topics.get(name)
        written = self._written.get(name)
        if seen is None or (written is not None and written.mod_revision > seen.mod_revision):
            return written if seen is not None else None
        return seen

    def _log_once(self, name: str, what: str, level: int, message: str) -> None:
        if (name, what) in self._logged:
            return
        self._logged.add((name, what))
        topic = self._view.state.topics.get(name)
        topic_id = topic.record.id if topic else "?"
        log.log(level, "broker %s, topic %s (id %s): %s", self._me, name, topic_id, message)
