"""The hook through which a cluster member makes and removes topics on this broker's disk.

Role: :mod:`cluster` cannot import :mod:`broker` (the layers run ``broker > cluster``), yet
the member must act when etcd says "topic X is ``creating`` on you" or "``deleting`` on
you". So the broker hands the member a :class:`LocalTopics`: three calls on its own
``TopicRegistry``. The member calls them from its one reconcile task, never two at once.

Contract (what the broker's implementation must do):

- :meth:`LocalTopics.create`: make the topic with exactly this ``topic_id`` and
  ``partitions`` (a create-with-id path of the registry), durably, before returning.
  Idempotent: if the topic exists already with this id, return at once. Raise anything on
  failure: the member logs it and retries at its next pass.
- :meth:`LocalTopics.delete`: today's crash-safe delete; a topic that is absent is done.
- :meth:`LocalTopics.exists`: whether the topic's local data is present now (it is asked
  on the event loop: no I/O beyond the registry's map).
- :meth:`LocalTopics.topic_id`: the id of the local topic of that name (``""`` for one
  made before topics had ids), ``None`` when there is none; asked on every topic-scoped
  call, so a map read.
- :meth:`LocalTopics.held`: every local topic, with its id, partitions and directory (at
  join, to adopt or set aside what the cluster does not hold; and for ``cluster status``).
- :meth:`LocalTopics.check_create`: why a create of this name and partition count would
  be refused here whatever the retries (the name, the count, the open-files budget, a
  local topic of that name with another id), as a :class:`CreateRefusal` carrying the
  gRPC status name and message a single broker would answer; ``None`` when it may go
  ahead. The member asks it before :meth:`~LocalTopics.create` and ends the create
  (state ``failed``) on a refusal; anything :meth:`~LocalTopics.create` raises is taken
  as transient and retried.

Replicated topics (issue 37; records whose ``effective_replicas()`` has more than one
node) also get a role on each replica, which the member sets from its reconcile task:

- :meth:`LocalTopics.lead`: this broker leads the topic at ``record.epoch``. Before it
  returns, the leader's epoch is assigned in every partition and commits wait for the
  in-sync set; only then may the member count the epoch claimed (and publishes be
  served). Called again with a newer record of the same epoch (an isr change), it only
  passes the record on. ``change_isr(new_isr)`` is how the leader asks the member to
  write a new in-sync set (True once etcd holds it).
- :meth:`LocalTopics.follow`: this broker follows the topic's leader at
  ``leader_address`` (a leader of this topic stops serving it first). Called again with
  a new epoch or leader, it passes them on.
- :meth:`LocalTopics.stop`: neither (deleted, dropped from the replica set, session
  lost); idempotent.

Factor-1 topics never get a role: their path is issue 36's.

:class:`MemoryTopics` is the fake (STYLE rule 34): a dict, with switches to fail.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from cluster.records import TopicRecord

ChangeIsr = Callable[[tuple[str, ...]], Awaitable[bool]]
"""A leader's request for a new in-sync set; True once etcd holds it."""


@dataclass(frozen=True, slots=True)
class LocalTopic:
    """A topic in this broker's data directory.

    Attributes:
        name: its name.
        topic_id: its id (``""`` for a topic made before topics had ids).
        partitions: its partition count.
        path: its directory, for a person reading a log line.
        replicated: its partitions hold leader epochs: it was a replica of a replicated
            topic (issue 37), so a join never adopts it (the cluster deleted it, or holds
            it elsewhere: another replica may hold more than this copy).
    """

    name: str
    topic_id: str
    partitions: int
    path: str
    replicated: bool = False


@dataclass(frozen=True, slots=True)
class CreateRefusal:
    """Why a topic cannot be made here as asked, whatever the retries.

    Attributes:
        code: the gRPC status name a single broker would answer (``RESOURCE_EXHAUSTED``,
            ``INVALID_ARGUMENT``, ``ALREADY_EXISTS``).
        message: that answer's message.
    """

    code: str
    message: str


class LocalTopics(Protocol):
    """The broker's local topics, as the cluster member needs them."""

    async def create(self, name: str, topic_id: str, partitions: int) -> None:
        """Create ``name`` locally with ``topic_id`` and ``partitions``; idempotent."""
        ...

    async def delete(self, name: str) -> None:
        """Delete ``name`` locally (crash-safe); absent is done."""
        ...

    def exists(self, name: str) -> bool:
        """Whether ``name``'s local data is present."""
        ...

    def topic_id(self, name: str) -> str | None:
        """The id of the local topic ``name``; ``None`` when there is none."""
        ...

    def held(self) -> list[LocalTopic]:
        """Every local topic, by name."""
        ...

    def check_create(self, name: str, topic_id: str, partitions: int) -> CreateRefusal | None:
        """Why creating ``name`` (``topic_id``, ``partitions``) here can never succeed;
        ``None`` when it may."""
        ...

    async def lead(self, name: str, record: TopicRecord, change_isr: ChangeIsr) -> None:
        """Lead replicated ``name`` at ``record.epoch`` (module docstring)."""
        ...

    async def follow(self, name: str, record: TopicRecord, leader_address: str) -> None:
        """Follow replicated ``name``'s leader at ``leader_address``."""
        ...

    async def stop(self, name: str) -> None:
        """Neither lead nor follow ``name``; idempotent."""
        ...


class MemoryTopics:
    """A :class:`LocalTopics` in a dict, for tests. ``fail_create`` makes create raise (a
    transient failure); ``fail_lead`` makes that many next ``lead`` calls raise (a
    takeover that failed: no role is taken); ``max_partitions`` makes a bigger create
    refused for good.
    ``roles`` holds each replicated topic's role as ``("leader", epoch, "")`` or
    ``("follower", epoch, leader_address)``; ``change_isr`` the leader's callback."""

    def __init__(self, max_partitions: int = 10_000) -> None:
        self.topics: dict[str, tuple[str, int]] = {}
        self.roles: dict[str, tuple[str, int, str]] = {}
        self.records: dict[str, TopicRecord] = {}
        self.change_isr: dict[str, ChangeIsr] = {}
        #: topics that had a role here (a real broker's partitions then hold epochs).
        self.replicated: set[str] = set()
        self.fail_create = False
        self.fail_lead = 0
        #: ``lead`` calls that raised (``fail_lead``), with the epoch asked.
        self.failed_leads: list[int] = []
        self.max_partitions = max_partitions
        self.created: list[str] = []

    async def create(self, name: str, topic_id: str, partitions: int) -> None:
        if self.fail_create:
            raise OSError(f"cannot create {name}: disk full (test)")
        if name not in self.topics:
            self.created.append(name)
        self.topics[name] = (topic_id, partitions)

    async def delete(self, name: str) -> None:
        self.topics.pop(name, None)
        self.replicated.discard(name)

    def exists(self, name: str) -> bool:
        return name in self.topics

    def topic_id(self, name: str) -> str | None:
        held = self.topics.get(name)
        return held[0] if held is not None else None

    def held(self) -> list[LocalTopic]:
        return [
            LocalTopic(name, topic_id, partitions, f"memory:{name}", name in self.replicated)
            for name, (topic_id, partitions) in sorted(self.topics.items())
        ]

    def check_create(self, name: str, topic_id: str, partitions: int) -> CreateRefusal | None:
        if partitions > self.max_partitions:
            return CreateRefusal(
                "RESOURCE_EXHAUSTED", f"{partitions} partitions do not fit here (test)"
            )
        held = self.topics.get(name)
        if held is not None and held[0] != topic_id:
            return CreateRefusal("ALREADY_EXISTS", f"topic {name!r} already exists")
        return None

    async def lead(self, name: str, record: TopicRecord, change_isr: ChangeIsr) -> None:
        if self.fail_lead > 0:
            self.fail_lead -= 1
            self.failed_leads.append(record.epoch)
            self.roles.pop(name, None)
            raise OSError(f"cannot take {name} over: state log unreadable (test)")
        self.roles[name] = ("leader", record.epoch, "")
        self.replicated.add(name)
        self.records[name] = record
        self.change_isr[name] = change_isr

    async def follow(self, name: str, record: TopicRecord, leader_address: str) -> None:
        self.roles[name] = ("follower", record.epoch, leader_address)
        self.replicated.add(name)
        self.records[name] = record
        self.change_isr.pop(name, None)

    async def stop(self, name: str) -> None:
        self.roles.pop(name, None)
        self.records.pop(name, None)
        self.change_isr.pop(name, None)
