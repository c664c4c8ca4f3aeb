"""Cluster mode's broker side: join the cluster, the LocalTopics hook, topic changes.

Role: what :class:`broker.app.Broker` holds when ``[cluster] etcd`` is set. It opens the
etcd connection, builds and starts the :class:`cluster.member.ClusterMember` (registration
before the broker serves), and gives the member :class:`BrokerTopics`, the
:class:`cluster.local.LocalTopics` hook over this broker's own
:class:`~broker.topics.TopicRegistry`. The servicers call :class:`ClusterNode` for the
cluster-wide topic changes and listings:

- CreateTopic (and auto-create on publish): :meth:`ClusterNode.create_topic`, the name
  taken cluster-wide by an etcd transaction, then a wait until the owner made it;
- DeleteTopic: :meth:`ClusterNode.delete_topic`, on the owner only (the guard refuses
  others first);
- ListTopics: :meth:`ClusterNode.records`, every topic of the cluster from the view;
- the Cluster service: :meth:`ClusterNode.lookup` and :meth:`ClusterNode.status` (the
  member's answers; Lookup names this node as the one that answered).

Cluster errors become broker errors here (the status table knows those): a taken name is
``ALREADY_EXISTS`` as on a single broker; a replication factor above the live brokers is
``FAILED_PRECONDITION`` naming both numbers (the cluster's state, not the request, is
what falls short: it succeeds once enough brokers run); min_insync above the factor is
``INVALID_ARGUMENT``; a topic not ready in time (its owner down) is
the refusal of ``broker.topic_guard`` (``ABORTED``, reason ``offline`` or ``creating``,
naming the owner); etcd not answering is ``UNAVAILABLE``.

Shutdown order (``Broker.aclose``): the server stops first, then :meth:`ClusterNode.aclose`
closes the member (its lease is revoked: liveness and any controller role move at once),
then the etcd connection.

Size: past 600 lines, as two classes. :class:`ClusterNode` (about 340 lines) is one
piece: the join is one ordered sequence (etcd, defaults, credential, member, replica
manager, each undone if a later step fails) and the servicers' calls translate the
member's errors with the one mapping above. :class:`BrokerTopics` (about 120 lines) is
the seam: it needs only the registries and the replica manager, and ClusterNode only
builds it; it moves to a module of its own when either class grows again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from broker.cluster_defaults import TopicDefaults
from broker.config_cluster import ClusterConfig
from broker.error_status import status_for
from broker.errors import (
    BrokerError,
    ClusterJoinError,
    ClusterUnavailableError,
    InvalidRequestError,
    PlacedCreateError,
    TooFewBrokersError,
    TopicExistsError,
    TopicNotFoundError,
    TopicRefusedError,
)
from broker.replica.dlq_log import DlqReplication
from broker.replica.leader import LeaderTopic
from broker.replica.manager import Channels, ReplicaManager, real_roles
from broker.replica.state_log import StateReplication
from broker.tls import PeerTls
from broker.topics import TopicRegistry
from cluster.answers import LookupResult, StatusResult, StrayTopic
from cluster.config_defaults import DefaultsView, EtcdDefaults
from cluster.errors import (
    ClusterError,
    DuplicateNodeError,
    EtcdUnavailableError,
    NotEnoughBrokersError,
    RecordError,
    ReplicationSettingsError,
    TopicCreateFailedError,
    TopicNotReadyError,
)
from cluster.errors import TopicExistsError as ClusterTopicExistsError
from cluster.etcd import EtcdStore, TlsFiles
from cluster.internal_credential import ensure as ensure_credential
from cluster.local import ChangeIsr, CreateRefusal, LocalTopic
from cluster.member import ClusterMember, MemberConfig
from cluster.ownership import Refusal
from cluster.records import DefaultsRecord, Keys, TopicRecord, TopicState
from cluster.replicas import replication_settings
from dispatcher import SubscriptionRegistry

logger = logging.getLogger(__name__)

AUTO_CREATE_TIMEOUT_S = 10.0
"""How long a publish that auto-creates its topic waits for the topic to be ready."""

CREATE_TOPIC_TIMEOUT_S = 30.0
"""How long CreateTopic and DeleteTopic wait at most (less when the call's deadline is
nearer)."""


def _version() -> str:
    try:
        return version("headrace")
    except PackageNotFoundError:  # a source tree that is not installed
        return "0+unknown"


class BrokerTopics:
    """The :class:`cluster.local.LocalTopics` hook over this broker's registries.

    ``create`` is the registry's create with the cluster's topic id (idempotent for that
    id); ``delete`` is DeleteTopic's crash-safe delete, which stops and drops the topic's
    subscriptions; ``exists``, ``topic_id`` and ``held`` read the registry's map only;
    ``check_create`` is the registry's :meth:`~broker.topics.TopicRegistry.check_create`
    (name, partition count, open-files budget) plus a local topic of that name with
    another id, answered with the status the one table gives a single broker's refusal.
    """

    def __init__(
        self,
        topics: TopicRegistry,
        subscriptions: SubscriptionRegistry,
        replicas: ReplicaManager | None = None,
        state: StateReplication | None = None,
        dlq: DlqReplication | None = None,
    ) -> None:
        self._topics = topics
        self._subscriptions = subscriptions
        #: The roles of replicated topics (``lead``/``follow``/``stop`` go there).
        self.replicas = replicas
        #: Their subscription-state logs (opened before a role, closed after).
        self.state = state
        #: Their dead-letter queues' logs (the follower's writers closed after a role).
        self.dlq = dlq

    async def create(self, name: str, topic_id: str, partitions: int) -> None:
        try:
            held = self._topics.get(name)
        except TopicNotFoundError:
            await self._topics.create(name, partitions, topic_id=topic_id)
            return
        if held.topic_id != topic_id:
            raise TopicExistsError(name)  # another topic of that name here: never overwrite

    async def delete(self, name: str) -> None:
        if self.state is not None:  # its directory goes with the subscriptions'
            await self.state.close(name)
        if self.dlq is not None:
            await self.dlq.close(name)
        try:
            await self._topics.delete(
                name, before_close=functools.partial(self._subscriptions.drop_topic, name)
            )
        except TopicNotFoundError:
            return

    def exists(self, name: str) -> bool:
        return self.topic_id(name) is not None

    def topic_id(self, name: str) -> str | None:
        try:
            return self._topics.get(name).topic_id
        except (TopicNotFoundError, InvalidRequestError):
            return None

    def held(self) -> list[LocalTopic]:
        found = []
        for name in self._topics.names():
            topic = self._topics.get(name)
            path = self._topics.directory(name)
            replicated = any(
                p.writer.log.leader_epochs.latest() is not None for p in topic.partitions
            )
            found.append(LocalTopic(name, topic.topic_id, len(topic.partitions), path, replicated))
        return found

    def marks(self, name: str) -> dict[int, tuple[int, int]]:
        """``partition -> (high watermark, log end)`` of local topic ``name`` (empty when
        none is here): what a leader publishes and an unclean winner compares
        (``cluster.replica_member``)."""
        try:
            topic = self._topics.get(name)
        except (TopicNotFoundError, InvalidRequestError):
            return {}
        return {p.index: (p.writer.high_water_mark, p.writer.head) for p in topic.partitions}

    def check_create(self, name: str, topic_id: str, partitions: int) -> CreateRefusal | None:
        held = self.topic_id(name)
        if held == topic_id:
            return None  # made already: create returns at once
        if held is not None:
            return CreateRefusal(
                "ALREADY_EXISTS",
                f"a local topic of that name with another id ({held or 'none'}) is at "
                f"{self._topics.directory(name)}: move it out of the data directory, then "
                "create the topic again",
            )
        try:
            self._topics.check_create(name, partitions)
        except BrokerError as exc:
            code, message = status_for(exc)
            return CreateRefusal(code.name, message)
        return None

    async def lead(self, name: str, record: TopicRecord, change_isr: ChangeIsr) -> None:
        if self.state is not None:
            await self.state.prepare(name)
        await self._roles().lead(name, record, change_isr)

    async def follow(self, name: str, record: TopicRecord, leader_address: str) -> None:
        if self.state is not None:
            await self.state.prepare(name)
        await self._roles().follow(name, record, leader_address)
        if self.state is not None:  # a follower holds no live subscription of it
            await self.state.following(name)

    async def stop(self, name: str) -> None:
        if self.replicas is not None:
            await self.replicas.stop(name)
        if self.state is not None:
            await self.state.close(name)
        if self.dlq is not None:
            await self.dlq.close(name)

    def _roles(self) -> ReplicaManager:
        if self.replicas is None:
            raise RuntimeError("this broker was built without replication")
        return self.replicas


HAND_OVER_TIMEOUT_S = 10.0
"""How long a stopping broker waits for the new leaders of the topics it hands over (the
default of ``[cluster] controlled_shutdown_timeout_s``)."""

FETCHING_WITHIN_MS = 1000
"""A follower that fetched none of a topic's logs from its leader here for this long is
not handed that topic at a controlled shutdown (twice a fetch's longest wait, 500 ms): it
is dead or frozen, though its session may last until its TTL ends. Too strict costs an
election instead (the stopping broker's lease is revoked as it leaves)."""


def _fetching_lately(replicas: ReplicaManager, name: str, node: str) -> bool:
    """Whether ``node`` fetched topic ``name`` lately from its leader here (True when no
    started leader of it is here: nothing to tell)."""
    leader = replicas.leader(name)
    if not isinstance(leader, LeaderTopic):
        return True
    return leader.fetched_within(node, FETCHING_WITHIN_MS)


class ClusterNode:
    """This broker's membership, as the servicers use it. Build with :meth:`join`.

    Attributes:
        member: the running :class:`~cluster.member.ClusterMember` (the broker's
            ``Ownership`` and the Cluster service's source).
    """

    #: How long a publish that auto-creates its topic waits for it.
    auto_create_timeout_s = AUTO_CREATE_TIMEOUT_S

    def __init__(
        self,
        store: EtcdStore,
        member: ClusterMember,
        topics: TopicRegistry,
        max_partitions: int,
        *,
        defaults: TopicDefaults,
        defaults_view: DefaultsView | None = None,
    ) -> None:
        self._store = store
        self.member = member
        self._topics = topics
        self._max_partitions = max_partitions
        #: What a new topic gets: the cluster's defaults over this broker's file's.
        self.defaults = defaults
        self._defaults_view = defaults_view
        #: The roles of the replicated topics here (the Replication servicer's lookup).
        self.replicas: ReplicaManager | None = None
        self._channels: Channels | None = None
        self._state: StateReplication | None = None
        self._dlq: DlqReplication | None = None
        #: The cluster's internal credential when ``[cluster] tokens`` is on (the
        #: Replication service's only caller; ``cluster.internal_credential``).
        self.internal_credential: str | None = None

    @classmethod
    async def join(
        cls,
        store: EtcdStore,
        config: ClusterConfig,
        address: str,
        topics: TopicRegistry,
        subscriptions: SubscriptionRegistry,
        *,
        max_partitions: int,
        defaults: TopicDefaults,
        peer_tls: PeerTls | None = None,
    ) -> ClusterNode:
        """Join as ``config.node_id`` advertising ``address``, over ``store`` (from
        :func:`connect`; closed here if the join fails, else by :meth:`aclose`). The
        cluster's defaults are watched from before the member starts (it may make topics
        placed here at once) and applied to ``defaults`` and ``topics``. Followers call
        their leaders over TLS with ``peer_tls`` (:func:`broker.tls.load_peer_tls`), else
        in plain text.

        Raises:
            ClusterJoinError: a live broker holds the node id, or etcd did not answer.
        """
        assert config.node_id is not None  # ClusterConfig: etcd needs node_id
        member_config = MemberConfig(
            config.node_id,
            address,
            config.session_ttl_s,
            config.prefix,
            _version(),
            auto_rebalance=config.auto_rebalance,
            rebalance_interval_s=config.rebalance_interval_s,
        )
        channels = Channels(peer_tls)
        secret: dict[str, str] = {}  # the internal credential, read before any role starts
        roles: list[ReplicaManager] = []  # the manager, made below with state's hooks

        def leader_of(name: str) -> object | None:
            return roles[0].leader(name) if roles else None

        state = StateReplication(topics, subscriptions, leader_of)
        dlq = DlqReplication(subscriptions, leader_of)
        make_leader, make_follower = real_roles(
            config.node_id,
            channels,
            credential=lambda: secret.get("internal"),
            extra_logs=state.extra_logs,
            lag_time_max_ms=config.replica_lag_time_max_ms,
            open_log=dlq.opener,
        )

        async def leading(name: str) -> None:
            """A topic led from now on: its subscriptions taken over from the state log,
            then its dead-letter queues opened and led."""
            await state.leading(name)
            await dlq.leading(name)

        async def not_leading(name: str) -> None:
            """A led topic moves away: its consumers' streams end with this broker's
            refusal (not-owner naming the new leader, or no-session), so they look it up."""
            refusal = member.refusal(name, write=True) or Refusal(
                "no-session", name, "", "", 0, f"broker {config.node_id} no longer leads {name!r}"
            )
            for sub in subscriptions.subscriptions(name):
                sub.end_sessions(TopicRefusedError(refusal))
            await dlq.not_leading(name)
            await state.not_leading(name)

        replicas = ReplicaManager(
            topics,
            make_leader=make_leader,
            make_follower=make_follower,
            on_leading=leading,
            on_not_leading=not_leading,
        )
        roles.append(replicas)
        local = BrokerTopics(topics, subscriptions, replicas, state, dlq)
        member = ClusterMember(store, member_config, local)
        member.replicas.marks = local.marks  # an unclean election counts what it gives up
        member.replicas.unclean_allowed = lambda: defaults.unclean_leader_election
        member.replicas.fetching_lately = functools.partial(_fetching_lately, replicas)
        view = DefaultsView(
            store, Keys(config.prefix), functools.partial(apply_defaults, defaults, topics)
        )
        try:
            if config.tokens:  # followers send it to their leaders' Replication service
                now_ms = time.time_ns() // 1_000_000
                secret["internal"] = await ensure_credential(store, Keys(config.prefix), now_ms)
            await view.start()
            await member.start()
        except BaseException as exc:
            await view.aclose()
            await _quietly_close(member, store)
            await replicas.aclose()
            await state.aclose()
            await dlq.aclose()
            await channels.aclose()
            if isinstance(exc, DuplicateNodeError | EtcdUnavailableError):
                raise ClusterJoinError(
                    f"cannot join the cluster as {config.node_id}: {exc}"
                ) from exc
            raise
        logger.info(
            "joined the cluster as %s at %s (etcd %s, session TTL %d s; other brokers called %s)",
            config.node_id,
            address,
            ", ".join(store.endpoints),
            config.session_ttl_s,
            f"over TLS, trusting {peer_tls.ca_setting}" if peer_tls else "in plain text",
        )
        node = cls(store, member, topics, max_partitions, defaults=defaults, defaults_view=view)
        node.replicas, node._channels, node._state = replicas, channels, state
        node._dlq = dlq
        node.internal_credential = secret.get("internal")
        return node

    async def lookup(self, topics: Sequence[str]) -> LookupResult:
        """The Lookup answer (:class:`~broker.cluster_service.ClusterSource`): the member's,
        naming this node as the one that answered."""
        return await self.member.lookup(topics)

    async def status(self) -> StatusResult:
        """The ClusterStatus answer (:class:`~broker.cluster_service.ClusterSource`), with
        this broker's stray local topics (``ClusterMember.strays``)."""
        status = await self.member.status()
        node = self.member.node_id
        strays = tuple(
            StrayTopic(s.topic, s.local_id, s.cluster_id, s.owner_node, s.path, s.advice(node))
            for s in self.member.strays()
        )
        return dataclasses.replace(status, strays=strays)

    async def hand_over(self, timeout_s: float = HAND_OVER_TIMEOUT_S) -> dict[str, str]:
        """Controlled shutdown: hand every replicated topic led here to an in-sync follower
        and wait (at most ``timeout_s``) until each new leader serves it
        (``ClusterMember.hand_over``), with one log line naming each. Returns ``topic ->
        new leader``."""
        started = time.monotonic()
        moved = await self.member.hand_over(timeout_s)
        if moved:
            logger.info(
                "controlled shutdown: %d replicated topic(s) handed over in %.0f ms: %s",
                len(moved),
                (time.monotonic() - started) * 1000,
                ", ".join(f"{name} -> {to}" for name, to in sorted(moved.items())),
            )
        return moved

    async def aclose(self) -> None:
        """Leave the cluster (lease revoked), then close the etcd connection."""
        if self._defaults_view is not None:
            await self._defaults_view.aclose()
        await _quietly_close(self.member, self._store)
        if self.replicas is not None:  # after the member: no role call comes any more
            await self.replicas.aclose()
        if self._state is not None:
            await self._state.aclose()
        if self._dlq is not None:
            await self._dlq.aclose()
        if self._channels is not None:
            await self._channels.aclose()

    def replica_leader(self, name: str) -> LeaderTopic | None:
        """The leader of replicated topic ``name`` here, once started (the Replication
        service's lookup); None when this broker does not lead it."""
        leader = self.replicas.leader(name) if self.replicas is not None else None
        return leader if isinstance(leader, LeaderTopic) else None

    def records(self) -> list[TopicRecord]:
        """Every topic of the cluster as this broker's view holds it, by name (a topic
        being deleted is left out)."""
        topics = self.member.view.state.topics
        return [
            topics[name].record
            for name in sorted(topics)
            if topics[name].record.state is not TopicState.DELETING
        ]

    def knows(self, name: str) -> bool:
        """Whether the cluster holds a topic called ``name`` (any state)."""
        return name in self.member.view.state.topics

    @staticmethod
    def wait_s(remaining_s: float | None) -> float:
        """How long a CreateTopic or DeleteTopic may wait, given the call's time left: at
        most :data:`CREATE_TOPIC_TIMEOUT_S`, and enough before the deadline (a fifth of
        the time left, at most 1 s) for the answer to reach the caller."""
        if remaining_s is None:
            return CREATE_TOPIC_TIMEOUT_S
        return max(0.0, min(CREATE_TOPIC_TIMEOUT_S, remaining_s - min(1.0, remaining_s / 5)))

    async def create_topic(
        self,
        name: str,
        partitions: int,
        timeout_s: float,
        *,
        replication_factor: int = 0,
        min_insync_replicas: int = 0,
    ) -> TopicRecord:
        """Take ``name`` cluster-wide and wait until its owner made it (``name`` is valid);
        ``partitions`` 0: :attr:`defaults`' ``default_partitions``; ``replication_factor``
        and ``min_insync_replicas`` 0: :attr:`defaults`' (clamped to the live brokers and
        to the factor, :func:`cluster.replicas.replication_settings`).

        Raises:
            InvalidRequestError: ``partitions`` out of range, a replication setting below
                0, or ``min_insync_replicas`` above the factor (nothing written).
            TooFewBrokersError: ``replication_factor`` above the live brokers as this
                broker's view counts them (nothing written). When the controller counts
                fewer as it places the topic, it is the PlacedCreateError below, with
                ``FAILED_PRECONDITION`` and the same message.
            TopicExistsError: the name is taken in the cluster.
            TopicRefusedError: not ready within ``timeout_s`` (its owner is down); the name
                stays taken and the topic becomes ready when the owner is up.
            PlacedCreateError: the broker it was placed on can never make it (its
                open-files budget, its partition limit, a local topic of that name): the
                status that broker gave; the name is free again.
            ClusterUnavailableError: etcd did not answer.
        """
        if partitions == 0:
            partitions = self.defaults.default_partitions
        if not 1 <= partitions <= self._max_partitions:
            raise InvalidRequestError(
                "partitions",
                f"must be from 1 to {self._max_partitions} ([limits] max_partitions_per_topic), "
                f"got {partitions}",
            )
        factor, min_insync = self._replication(replication_factor, min_insync_replicas)
        if not replication_factor and factor < self.defaults.replication_factor:
            logger.warning(
                "topic %s gets %d cop%s, not the cluster's default %d: only %d broker(s) "
                "alive; once the others run, give it more with `headrace cluster reassign "
                "%s --replicas ...`",
                name,
                factor,
                "y" if factor == 1 else "ies",
                self.defaults.replication_factor,
                factor,
                name,
            )
        try:
            return await self.member.create_topic_record(
                name, partitions, timeout_s, factor=factor, min_insync=min_insync
            )
        except ClusterTopicExistsError as exc:
            raise TopicExistsError(name) from exc
        except TopicNotReadyError as exc:
            raise TopicRefusedError(self._not_ready(name, exc)) from exc
        except TopicCreateFailedError as exc:
            raise PlacedCreateError(name, exc.owner_node, exc.code, str(exc)) from exc
        except EtcdUnavailableError as exc:
            raise ClusterUnavailableError(f"create topic {name!r}", str(exc)) from exc

    def _replication(self, asked_factor: int, asked_min_insync: int) -> tuple[int, int]:
        """``(factor, min_insync)`` of a new topic: the asked values (0: the defaults),
        checked against the live brokers of this broker's view.

        Raises:
            InvalidRequestError: a value below 0, or min_insync above the factor.
            TooFewBrokersError: an asked factor above the live brokers.
        """
        asked = (("replication_factor", asked_factor), ("min_insync_replicas", asked_min_insync))
        for field, value in asked:
            if value < 0:
                raise InvalidRequestError(field, f"must be 0 (the default) or more, got {value}")
        live = len(self.member.view.state.brokers)
        try:
            return replication_settings(
                asked_factor or None,
                asked_min_insync or None,
                self.defaults.replication_factor,
                self.defaults.min_insync_replicas,
                live,
            )
        except NotEnoughBrokersError as exc:
            raise TooFewBrokersError(exc.factor, exc.live, str(exc)) from exc
        except ReplicationSettingsError as exc:
            raise InvalidRequestError("min_insync_replicas", exc.detail) from exc

    async def delete_topic(self, name: str, timeout_s: float) -> None:
        """Delete ``name``, which this broker owns (the guard checked), cluster-wide.

        Raises:
            TopicRefusedError: this broker may not write it now.
            ClusterUnavailableError: etcd did not answer, or the delete did not finish in
                ``timeout_s`` (it finishes when the owner next reconciles).
        """
        refusal = self.member.refusal(name, write=True)
        if refusal is not None and refusal.reason == "absent":
            raise TopicNotFoundError(name)
        if refusal is not None:
            raise TopicRefusedError(refusal)
        try:
            await self.member.delete_topic_record(name, timeout_s)
        except TopicNotReadyError as exc:
            raise ClusterUnavailableError(f"delete topic {name!r}", str(exc)) from exc
        except EtcdUnavailableError as exc:
            raise ClusterUnavailableError(f"delete topic {name!r}", str(exc)) from exc

    def _not_ready(self, name: str, exc: TopicNotReadyError) -> Refusal:
        """The refusal of a create that timed out: ``offline`` when the placed owner is
        not running (the topic exists and becomes ready when it returns), else the
        current refusal (``creating`` while the owner works on it)."""
        refusal = self.member.refusal(name, write=True)
        if refusal is not None and refusal.reason == "absent":
            refusal = None  # gone meanwhile: say what the create saw
        owner_up = exc.owner_node in self.member.view.state.brokers
        if exc.owner_node and not owner_up:
            epoch = refusal.epoch if refusal is not None else 0
            return Refusal("offline", name, exc.owner_node, "", epoch, str(exc))
        if refusal is not None:
            return refusal
        return Refusal("creating", name, exc.owner_node, "", 0, str(exc))


async def connect(config: ClusterConfig) -> EtcdStore:
    """Open the etcd connection of ``config`` and check that etcd answers (one read), so
    that a wrong endpoint stops the start before the data directory is touched.

    Raises:
        ClusterJoinError: etcd did not answer, or a TLS file cannot be read.
    """
    tls = None
    if config.etcd_ca is not None:
        tls = TlsFiles(
            Path(config.etcd_ca),
            Path(config.etcd_cert) if config.etcd_cert else None,
            Path(config.etcd_key) if config.etcd_key else None,
        )
    joining = f"cannot join the cluster as {config.node_id}"
    try:
        store = await EtcdStore.connect(list(config.etcd or ()), tls=tls)
    except ClusterError as exc:
        raise ClusterJoinError(f"{joining}: {exc}") from exc
    try:
        await store.get(Keys(config.prefix).cluster)
    except BaseException as exc:
        await store.aclose()
        if isinstance(exc, ClusterError):
            raise ClusterJoinError(f"{joining}: {exc}") from exc
        raise
    return store


def apply_defaults(defaults: TopicDefaults, topics: TopicRegistry, record: DefaultsRecord) -> None:
    """Use the cluster's defaults ``record`` for new topics (the view's ``on_change``); a
    key the file's rules refuse is left out, logged."""
    for message in defaults.apply(record):
        logger.error("%s: ignored (the file's value, or the built-in one, applies)", message)
    topics.set_default_wal_config(defaults.wal)


async def read_defaults(store: EtcdStore, config: ClusterConfig) -> DefaultsRecord:
    """The cluster's defaults now (one read; a start applies them before it opens its
    topics, which then open with the cluster's [wal] defaults). A document that is not
    one is logged and ignored (none applies), as the watch does: it does not stop a start.

    Raises:
        ClusterJoinError: etcd did not answer.
    """
    try:
        return await EtcdDefaults(store, Keys(config.prefix)).read()
    except RecordError as exc:
        logger.error("the cluster's defaults cannot be read and are ignored: %s", exc)
        return DefaultsRecord()
    except ClusterError as exc:
        raise ClusterJoinError(f"cannot read the cluster's defaults in etcd: {exc}") from exc


async def _quietly_close(member: ClusterMember, store: EtcdStore) -> None:
    """Close the member, then the store; a failure is logged (the lease then runs out on
    etcd's clock), never raised over the error that explains a failed start."""
    try:
        await member.aclose()
    except Exception as exc:
        logger.warning("leaving the cluster failed (%s); the session expires by its TTL", exc)
    try:
        await store.aclose()
    except Exception as exc:
        logger.warning("closing the etcd connection failed: %s", exc)
