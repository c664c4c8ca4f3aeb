"""The replica group's writes to etcd (issue 37): election, in-sync set changes, replica set
changes and leadership transfer, each ONE compare-and-set transaction.

Role: the only code that changes a topic record's ``owner``/``epoch``/``isr``/``replicas``
for replication. Each function takes the record as its caller read it (``read_record``
at ``read_mod_rev``), checks the rules of :mod:`cluster.replicas` on it, and writes the
new record guarded by ``mod_revision(topic) == read_mod_rev`` and:

- :func:`elect` (by a follower): the old leader's broker key absent; the candidate's
  broker key under ``candidate_lease``; unclean: every in-sync member's broker key absent.
- :func:`shrink_isr`, :func:`expand_isr` (by the leader): the leader's broker key under
  its lease; and, checked on the record as read, ``owner == leader and epoch == epoch``.
- :func:`transfer_leadership` (by the leader): as above, and the target's broker key
  under the lease it had when read (it is alive).
- :func:`set_replicas` (by the controller): ``create_revision(controller) == token``.
- :func:`replicate_single` (by the controller): the token; a topic of one copy becomes
  replicated (one replica, epoch + 1) before a reassignment moves it.
- :func:`move_leadership` (by the controller): the token, and the target's broker key
  under the lease it had when read (it is alive); the target must be in sync.

The ``mod_revision`` guard is what turns the owner/epoch check on the record as read into
a fence: if anyone wrote the record since, nothing is written. A leader's fencing token is
its epoch; a deposed leader (older epoch) or one whose session lapsed writes nothing.

Outcomes (:class:`Outcome`): ``WON`` the record now says what the call wanted; ``LOST_RACE``
someone changed the record first (read again, decide again); ``STALE`` the caller's own
fence failed (its session, its epoch, its controller token); ``REFUSED`` the rules forbid it
as read (nothing was sent, or a guard on another broker's key failed: e.g. the old leader
is alive). Nothing is written unless the outcome is ``WON``.

Idempotent across etcd3aio's retry (``cluster.etcd``, fact 1): a transaction that applied
and whose reply was lost comes back failed; every failed transaction re-reads the key, and
a record at a newer revision equal to the one wanted is ``WON`` (whoever wrote it: the
record says what the call wanted, which is what its caller acts on). So a caller whose call
raised :class:`~cluster.errors.EtcdUnavailableError` (outcome unknown) calls again with the
same arguments: it gets ``WON`` if the first attempt applied, and nothing is applied twice
(the first write moved the ``mod_revision`` the second one compares).

Worked example: ``t`` is ``owner b1, epoch 4, replicas (b1, b2, b3), isr (b1, b2, b3)`` at
revision 90. b1's session lapses (its broker key goes). b2 and b3 both call :func:`elect`
with that record at revision 90: b2's transaction runs first and writes ``owner b2, epoch
5, isr (b2, b3)`` (revision 95); b3's compares revision 90, fails, re-reads, finds b2's
record: ``LOST_RACE``. b1 returns with a new session and tries to shrink the isr with its
old read (epoch 4, revision 90): the compare fails, the re-read says owner b2: ``STALE``.

One piece, though past 600 lines: every write here is one protocol (the record as read,
one compare-and-set in ``_write``, a failed answer re-read and classified by the writer's
own fence), and the list above is that protocol's one statement, each writer's guards
side by side, the outcomes shared; split, a reader would check the fences in two places.
Should it grow, the seam is the writer: the controller's writes (:func:`set_replicas`,
:func:`replicate_single`, :func:`move_leadership`, with ``_as_controller`` and
``_why_not_controller``) go to a module of their own over ``_write``, :class:`Outcome`
and :class:`ChangeResult`, which stay here.

Task-safety: stateless functions; an :class:`~cluster.etcd.EtcdStore` may be shared.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from cluster.errors import RecordError, ReplicationSettingsError
from cluster.etcd import Compare, EtcdStore, Op
from cluster.records import DefaultsRecord, Keys, TopicRecord, TopicState, decode, encode
from cluster.replicas import check_target

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """How a replica transaction ended (module docstring)."""

    WON = "won"
    LOST_RACE = "lost-race"
    STALE = "stale"
    REFUSED = "refused"

    def is_won(self) -> bool:
        """The record now says what the call wanted."""
        return self is Outcome.WON


@dataclass(frozen=True, slots=True)
class ChangeResult:
    """A replica transaction's outcome and the record as it stands after it.

    Attributes:
        outcome: see :class:`Outcome`.
        record: the record written (``WON``), re-read after a failed transaction, or as
            read when nothing was sent; None when the key is gone.
        mod_revision: ``record``'s mod_revision (0 when gone); the next CAS compares it.
        reason: for a person or a log line; "" when won.
    """

    outcome: Outcome
    record: TopicRecord | None
    mod_revision: int
    reason: str = ""


Classify = Callable[[TopicRecord, int], Awaitable[tuple[Outcome, str]]]
"""Why a failed transaction failed, from the record as re-read and its mod_revision."""


async def elect(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_record: TopicRecord,
    read_mod_rev: int,
    *,
    candidate: str,
    candidate_lease: int,
    unclean: bool = False,
) -> ChangeResult:
    """Make ``candidate`` leader of ``name`` after its leader's session lapsed: ``owner =
    candidate``, ``epoch + 1``, the old leader out of the isr.

    Only an in-sync replica may win; with ``unclean``, an out-of-sync replica may win when
    no in-sync member's broker key exists (the isr becomes the candidate alone; records it
    lacks are lost, the caller counts them). Refused while the old leader's broker key
    exists: its session may still write.

    Raises:
        EtcdUnavailableError: etcd did not answer; call again with the same arguments.
    """
    refusal = _election_refusal(read_record, candidate, candidate_lease, unclean)
    if refusal is not None:
        return _as_read(read_record, read_mod_rev, *refusal)
    old, isr = read_record.owner, read_record.effective_isr()
    clean = candidate in isr
    new_isr = tuple(n for n in isr if n != old) if clean else (candidate,)
    wanted = read_record.replace(owner=candidate, epoch=read_record.epoch + 1, isr=new_isr)
    must_be_gone = [old] if clean else sorted({old, *isr})
    guards = [Compare.leased_by(keys.broker(candidate), candidate_lease)]
    guards += [Compare.absent(keys.broker(n)) for n in must_be_gone if n]
    if not clean:  # the switch as stored in etcd, and fenced: not a view that may lag
        switch_rev = await _unclean_switch_revision(store, keys)
        if switch_rev is None:
            return _as_read(
                read_record,
                read_mod_rev,
                Outcome.REFUSED,
                "unclean election is off in the cluster's defaults (unclean_leader_election)",
            )
        guards.append(Compare.modified_at(keys.config_defaults, switch_rev))
    why = _why_not_elected(
        store,
        keys,
        read_mod_rev=read_mod_rev,
        candidate=candidate,
        lease=candidate_lease,
        must_be_gone=must_be_gone,
        unclean=not clean,
    )
    return await _write(
        store,
        keys,
        name,
        read_mod_rev,
        guards=guards,
        wanted=wanted,
        classify=why,
        on_won=lambda: _log_elected(read_record, wanted, clean=clean),
    )


def _log_elected(before: TopicRecord, after: TopicRecord, *, clean: bool) -> None:
    log.log(
        logging.INFO if clean else logging.WARNING,
        "topic %s: %s elected leader at epoch %d (%s election; isr %s, was %s led by %s)",
        after.name,
        after.owner,
        after.epoch,
        "clean" if clean else "UNCLEAN: records only the old in-sync set had are lost",
        list(after.effective_isr()),
        list(before.effective_isr()),
        before.owner,
    )


def _election_refusal(
    record: TopicRecord, candidate: str, lease: int, unclean: bool
) -> tuple[Outcome, str] | None:
    if lease == 0:
        return Outcome.STALE, f"{candidate} has no session"
    if record.state is not TopicState.READY:
        return Outcome.REFUSED, f"topic {record.name} is {record.state.value}, not ready"
    if candidate == record.owner:
        return Outcome.REFUSED, f"{candidate} already leads topic {record.name}"
    if candidate not in record.effective_replicas():
        return Outcome.REFUSED, f"{candidate} is not a replica of topic {record.name}"
    if not unclean and candidate not in record.effective_isr():
        return Outcome.REFUSED, (
            f"{candidate} is not in the in-sync set {list(record.effective_isr())} of topic "
            f"{record.name} (unclean election is off)"
        )
    return None


def _why_not_elected(
    store: EtcdStore,
    keys: Keys,
    *,
    read_mod_rev: int,
    candidate: str,
    lease: int,
    must_be_gone: Sequence[str],
    unclean: bool = False,
) -> Classify:
    async def classify(now: TopicRecord, mod_revision: int) -> tuple[Outcome, str]:
        if mod_revision != read_mod_rev:
            return Outcome.LOST_RACE, _changed(now)
        for node in must_be_gone:
            if node and await store.get(keys.broker(node)) is not None:
                return Outcome.REFUSED, f"broker {node} is alive (its session holds)"
        if not await _holds(store, keys, candidate, lease):
            return Outcome.STALE, f"{candidate}'s session lapsed"
        if unclean and await _unclean_switch_revision(store, keys) is None:
            return Outcome.REFUSED, "unclean election was turned off while it ran"
        return Outcome.LOST_RACE, "a guard changed while the transaction ran; read again"

    return classify


async def shrink_isr(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_record: TopicRecord,
    read_mod_rev: int,
    *,
    leader: str,
    epoch: int,
    leader_lease: int,
    remove: Collection[str],
) -> ChangeResult:
    """The leader (at ``epoch``, in the session of ``leader_lease``) takes ``remove`` out
    of the in-sync set. Removing the leader itself is refused; removing a non-member is a
    no-op (``WON``, nothing written).

    Raises:
        EtcdUnavailableError: etcd did not answer; call again with the same arguments.
    """
    if leader in remove:
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, "the leader stays in sync")
    isr = tuple(n for n in read_record.effective_isr() if n not in remove)
    fence = _Fence(leader, epoch, leader_lease)
    return await _change_isr(store, keys, name, read_record, read_mod_rev, fence=fence, isr=isr)


async def expand_isr(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_record: TopicRecord,
    read_mod_rev: int,
    *,
    leader: str,
    epoch: int,
    leader_lease: int,
    add: Collection[str],
) -> ChangeResult:
    """The leader (at ``epoch``, in the session of ``leader_lease``) adds ``add`` (replicas
    that caught up, ``cluster.replicas.may_join_isr``) to the in-sync set, which stays in
    preferred order. A non-replica is refused.

    Raises:
        EtcdUnavailableError: etcd did not answer; call again with the same arguments.
    """
    replicas = read_record.effective_replicas()
    strangers = sorted(set(add) - set(replicas))
    if strangers:
        reason = f"{strangers} not replicas of topic {name} {list(replicas)}"
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, reason)
    members = set(read_record.effective_isr()) | set(add)
    isr = tuple(n for n in replicas if n in members)
    fence = _Fence(leader, epoch, leader_lease)
    return await _change_isr(store, keys, name, read_record, read_mod_rev, fence=fence, isr=isr)


async def _change_isr(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_record: TopicRecord,
    read_mod_rev: int,
    *,
    fence: _Fence,
    isr: tuple[str, ...],
) -> ChangeResult:
    stale = _not_leader(read_record, fence)
    if stale:
        return _as_read(read_record, read_mod_rev, Outcome.STALE, stale)
    if isr == read_record.effective_isr():
        return _as_read(read_record, read_mod_rev, Outcome.WON, "")
    return await _write(
        store,
        keys,
        name,
        read_mod_rev,
        guards=[Compare.leased_by(keys.broker(fence.leader), fence.lease)],
        wanted=read_record.replace(isr=isr),
        classify=_why_not_leader(store, keys, read_mod_rev, fence),
        on_won=lambda: log.info(
            "topic %s: isr %s -> %s (leader %s, epoch %d)",
            name,
            read_record.effective_isr(),
            isr,
            fence.leader,
            fence.epoch,
        ),
    )


async def transfer_leadership(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_record: TopicRecord,
    read_mod_rev: int,
    *,
    leader: str,
    epoch: int,
    leader_lease: int,
    to: str,
    leave_isr: bool = False,
) -> ChangeResult:
    """The leader hands ``name`` to the in-sync follower ``to`` (a graceful transfer or a
    controlled shutdown): ``owner = to``, ``epoch + 1``; with ``leave_isr`` the old leader
    also leaves the in-sync set (it is stopping, so the new leader's high watermark does
    not wait for it). ``to`` must be alive when the transaction runs.

    The caller stops accepting publishes and lets ``to`` catch up to its end first.

    Raises:
        EtcdUnavailableError: etcd did not answer; call again with the same arguments.
    """
    fence = _Fence(leader, epoch, leader_lease)
    stale = _not_leader(read_record, fence)
    if stale:
        return _as_read(read_record, read_mod_rev, Outcome.STALE, stale)
    if to == leader or to not in read_record.effective_isr():
        reason = f"{to} is not an in-sync follower of topic {name}"
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, reason)
    target_lease = await _lease_of(store, keys, to)
    if target_lease is None:
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, f"broker {to} is not alive")
    isr = read_record.effective_isr()
    new_isr = tuple(n for n in isr if n != leader) if leave_isr else isr
    wanted = read_record.replace(owner=to, epoch=epoch + 1, isr=new_isr)
    return await _write(
        store,
        keys,
        name,
        read_mod_rev,
        guards=[
            Compare.leased_by(keys.broker(leader), leader_lease),
            Compare.leased_by(keys.broker(to), target_lease),
        ],
        wanted=wanted,
        classify=_why_not_leader(store, keys, read_mod_rev, fence, to),
        on_won=lambda: log.info(
            "topic %s: leadership %s -> %s at epoch %d", name, leader, to, wanted.epoch
        ),
    )


@dataclass(frozen=True, slots=True)
class _Fence:
    """A leader's fence: who, at which epoch (its fencing token), in which session."""

    leader: str
    epoch: int
    lease: int


def _not_leader(record: TopicRecord, fence: _Fence) -> str:
    leader, epoch = fence.leader, fence.epoch
    if fence.lease == 0:
        return f"{leader} has no session"
    if record.owner != leader or record.epoch != epoch:
        return (
            f"{leader} at epoch {epoch} no longer leads topic {record.name} "
            f"(leader {record.owner or 'none'} at epoch {record.epoch})"
        )
    return ""


def _why_not_leader(
    store: EtcdStore, keys: Keys, read_mod_rev: int, fence: _Fence, to: str = ""
) -> Classify:
    async def classify(now: TopicRecord, mod_revision: int) -> tuple[Outcome, str]:
        stale = _not_leader(now, fence)
        if stale:
            return Outcome.STALE, stale
        if not await _holds(store, keys, fence.leader, fence.lease):
            return Outcome.STALE, f"{fence.leader}'s session lapsed: it may not write"
        if mod_revision != read_mod_rev:
            return Outcome.LOST_RACE, _changed(now)
        if to:
            return Outcome.REFUSED, f"broker {to}'s session changed or ended"
        return Outcome.LOST_RACE, "a guard changed while the transaction ran; read again"

    return classify


async def set_replicas(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_record: TopicRecord,
    read_mod_rev: int,
    *,
    controller_token: int,
    replicas: Sequence[str],
    reassign_to: Sequence[str] = (),
) -> ChangeResult:
    """The controller (fenced by its token) sets ``name``'s replica set (a reassignment
    step or a rebalance reorder, ``cluster.replicas``) and ``reassign_to``. The in-sync
    set keeps its members that stay; a new replica joins it when the leader sees it
    caught up. The leader must stay a replica: move leadership first.

    Raises:
        EtcdUnavailableError: etcd did not answer; call again with the same arguments.
    """
    try:
        wanted_replicas = check_target(replicas)
    except ReplicationSettingsError as exc:
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, str(exc))
    if read_record.owner not in wanted_replicas:
        reason = f"leader {read_record.owner or 'none'} would leave: move leadership first"
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, reason)
    isr = tuple(n for n in read_record.effective_isr() if n in wanted_replicas)
    throttle = read_record.reassign_throttle if reassign_to else 0  # ends with it
    wanted = read_record.replace(
        replicas=wanted_replicas,
        isr=isr,
        reassign_to=tuple(reassign_to),
        reassign_throttle=throttle,
    )
    return await _as_controller(
        store, keys, name, read_mod_rev, token=controller_token, wanted=wanted
    )


async def move_leadership(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_record: TopicRecord,
    read_mod_rev: int,
    *,
    controller_token: int,
    to: str,
) -> ChangeResult:
    """The controller (fenced by its token) makes the in-sync replica ``to`` leader of
    ``name``: ``owner = to``, ``epoch + 1``, the in-sync set unchanged (a reassignment
    moving leadership into its target, or a preferred-leader move; Kafka's controller
    writes its LeaderAndIsr the same way). ``to`` must be alive (its broker key under the
    lease it had when read). Safe without the old leader: every record it committed is
    on ``to`` (in sync, so counted in its watermark), and it can no longer commit or
    change the in-sync set (its epoch is stale); it learns of the move from its view.

    Raises:
        EtcdUnavailableError: etcd did not answer; call again with the same arguments.
    """
    if read_record.state is not TopicState.READY or to == read_record.owner:
        reason = f"topic {name} is not ready, or {to} leads it already"
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, reason)
    if to not in read_record.effective_isr():
        reason = f"{to} is not in the in-sync set {list(read_record.effective_isr())} of {name}"
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, reason)
    target_lease = await _lease_of(store, keys, to)
    if target_lease is None:
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, f"broker {to} is not alive")
    wanted = read_record.replace(owner=to, epoch=read_record.epoch + 1)
    return await _as_controller(
        store, keys, name, read_mod_rev, token=controller_token, wanted=wanted,
        target=(to, target_lease),
        on_won=lambda: log.info(
            "topic %s: leadership %s -> %s at epoch %d (controller)",
            name, read_record.owner, to, wanted.epoch,
        ),
    )  # fmt: skip


def _why_not_controller(
    store: EtcdStore, keys: Keys, token: int, read_mod_rev: int, to: str
) -> Classify:
    """A controller's failed transaction: its token is stale; else the record changed;
    else (``to`` given) the target's session changed or ended."""

    async def classify(now: TopicRecord, mod_revision: int) -> tuple[Outcome, str]:
        held = await store.get(keys.controller)
        current = held.create_revision if held is not None else 0
        if current != token:
            return Outcome.STALE, f"controller token {token} is stale (now {current})"
        if not to or mod_revision != read_mod_rev:
            return Outcome.LOST_RACE, _changed(now)
        return Outcome.REFUSED, f"broker {to}'s session changed or ended"

    return classify


async def _as_controller(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_mod_rev: int,
    *,
    token: int,
    wanted: TopicRecord,
    target: tuple[str, int] | None = None,
    on_won: Callable[[], None] | None = None,
) -> ChangeResult:
    """The controller's :func:`_write` of ``wanted``, fenced by its ``token``; with
    ``target`` (a node and the lease it had when read), also by that node being alive in
    the same session."""
    guards = [Compare.created_at(keys.controller, token)]
    to = ""
    if target is not None:
        to, lease = target
        guards.append(Compare.leased_by(keys.broker(to), lease))
    classify = _why_not_controller(store, keys, token, read_mod_rev, to)
    return await _write(
        store, keys, name, read_mod_rev,
        guards=guards, wanted=wanted, classify=classify, on_won=on_won,
    )  # fmt: skip


async def _write(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_mod_rev: int,
    *,
    guards: list[Compare],
    wanted: TopicRecord,
    classify: Classify,
    on_won: Callable[[], None] | None = None,
) -> ChangeResult:
    """The one write every change makes: put ``wanted`` if the topic is at
    ``read_mod_rev`` and ``guards`` hold; on a failed answer re-read: ``WON`` if the key
    already holds ``wanted`` at a newer revision (an attempt that applied and lost its
    reply), else ``classify`` says why. ``on_won`` (the call's log line) runs once the
    outcome is ``WON``."""
    key = keys.topic(name)
    compares = [Compare.modified_at(key, read_mod_rev), *guards]
    result = await store.txn(compares, [Op.put(key, encode(wanted))])
    if result.succeeded:
        changed = ChangeResult(Outcome.WON, wanted, result.revision)
    else:
        changed = await _reread(store, key, name, read_mod_rev, wanted=wanted, classify=classify)
    if on_won is not None and changed.outcome.is_won():
        on_won()
    return changed


async def _reread(
    store: EtcdStore,
    key: str,
    name: str,
    read_mod_rev: int,
    *,
    wanted: TopicRecord,
    classify: Classify,
) -> ChangeResult:
    """A failed transaction's outcome, from the record as it stands now."""
    held = await store.get(key)
    if held is None:
        return ChangeResult(Outcome.LOST_RACE, None, 0, f"topic {name} is gone")
    now = decode(key, held.value, TopicRecord)
    if now == wanted and held.mod_revision != read_mod_rev:
        return ChangeResult(Outcome.WON, now, held.mod_revision)
    outcome, reason = await classify(now, held.mod_revision)
    return ChangeResult(outcome, now, held.mod_revision, reason)


async def _unclean_switch_revision(store: EtcdStore, keys: Keys) -> int | None:
    """The ``mod_revision`` of the cluster's defaults document while it turns
    ``unclean_leader_election`` on; None while it is off, absent or unreadable (an unclean
    election compares this revision, so a switch turned off meanwhile makes it fail)."""
    held = await store.get(keys.config_defaults)
    if held is None:
        return None
    try:
        defaults = decode(keys.config_defaults, held.value, DefaultsRecord)
    except RecordError:
        return None
    return held.mod_revision if defaults.unclean_leader_election is True else None


def _as_read(record: TopicRecord, mod_revision: int, outcome: Outcome, reason: str) -> ChangeResult:
    """The outcome of a call that sent nothing: the record as its caller read it."""
    return ChangeResult(outcome, record, mod_revision, reason)


async def _lease_of(store: EtcdStore, keys: Keys, node: str) -> int | None:
    """The lease of ``node``'s broker key (its session); None when it is not alive."""
    held = await store.get(keys.broker(node))
    return None if held is None else held.lease


async def _holds(store: EtcdStore, keys: Keys, node: str, lease: int) -> bool:
    held = await store.get(keys.broker(node))
    return held is not None and held.lease == lease


def _changed(now: TopicRecord) -> str:
    return (
        f"topic {now.name} changed since it was read: leader {now.owner or 'none'} at epoch "
        f"{now.epoch}, isr {list(now.effective_isr())}"
    )


async def replicate_single(
    store: EtcdStore,
    keys: Keys,
    name: str,
    read_record: TopicRecord,
    read_mod_rev: int,
    *,
    controller_token: int,
    reassign_to: Sequence[str],
) -> ChangeResult:
    """The controller (fenced by its token) turns ``name``, a topic of one copy (a
    factor-1 record: no ``replicas``), into a replicated topic of one replica, its
    owner, so that a reassignment can move it (``cluster.moves``): ``replicas = isr =
    (owner,)``, ``epoch + 1`` and ``reassign_to``. The new epoch is the fence: the owner's
    claim of the old epoch no longer lets writes through, so it claims the topic again
    on the replicated path (epoch + 1 once more) and counts that claim only after its
    local switch (``cluster.replica_member``: the partitions' commit gate and leader
    epochs, the subscription state snapshotted into the ``state`` log) returned.

    Raises:
        EtcdUnavailableError: etcd did not answer; call again with the same arguments.
    """
    if read_record.replicas or read_record.state is not TopicState.READY:
        reason = f"topic {name} is replicated already, or not ready"
        return _as_read(read_record, read_mod_rev, Outcome.REFUSED, reason)
    owner = read_record.owner
    wanted = read_record.replace(
        replicas=(owner,), isr=(owner,), epoch=read_record.epoch + 1, reassign_to=tuple(reassign_to)
    )
    return await _as_controller(
        store, keys, name, read_mod_rev, token=controller_token, wanted=wanted,
        on_won=lambda: log.info(
            "topic %s: one copy on %s becomes a replicated topic of one replica (epoch %d)",
            name, owner, wanted.epoch,
        ),
    )  # fmt: skip
