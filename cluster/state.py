"""The decoded cluster: every record under the prefix, at one etcd revision. Pure.

Role: :class:`ClusterState` holds the live brokers, the controller and the topics, each
with the revisions a compare-and-set needs, and applies listings and watch events to
itself. :mod:`cluster.view` is the asyncio shell that feeds it.

Invariants:

- :attr:`ClusterState.revision` only rises, and the state equals etcd's keys under the
  prefix at that revision (after a listing, wholly replaced; between listings, patched
  by every event in revision order).
- A broker is in :attr:`ClusterState.brokers` exactly while its key exists, which is while
  its session lease is alive: "alive" means "in this map".
- A value that does not decode is left out and remembered in :attr:`ClusterState.bad`
  (logged once); it never stops the view.
- A topic record in state ``failed`` (its owner could not make it) is in
  :attr:`ClusterState.failed`, never in :attr:`ClusterState.topics`: to routing, listings,
  placement and the owner's claims the name is free; only its creator (who removes the
  key) and its owner (who removes it if the creator does not) look at it.

Imports neither asyncio, os nor time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cluster.errors import RecordError
from cluster.etcd import KeyValue, Listing
from cluster.records import (
    BrokerRecord,
    ClusterRecord,
    ControllerRecord,
    Keys,
    TopicRecord,
    TopicState,
    decode,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Broker:
    """A live broker: its record and its session lease."""

    record: BrokerRecord
    lease: int


@dataclass(frozen=True, slots=True)
class Controller:
    """The controller: its record, lease, and fencing token (its key's create_revision)."""

    record: ControllerRecord
    lease: int
    token: int


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic's record and the revision a compare-and-set on it compares."""

    record: TopicRecord
    mod_revision: int


@dataclass
class ClusterState:
    """The decoded keys under one prefix, at :attr:`revision`. Pure; not task-safe."""

    keys: Keys
    revision: int = 0
    cluster: ClusterRecord | None = None
    controller: Controller | None = None
    brokers: dict[str, Broker] = field(default_factory=dict)
    topics: dict[str, Topic] = field(default_factory=dict)
    failed: dict[str, Topic] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)

    def replace(self, listing: Listing) -> None:
        """Become exactly ``listing`` (a relist)."""
        self.cluster, self.controller = None, None
        self.brokers, self.topics, self.failed, self.bad = {}, {}, {}, {}
        for kv in listing.items:
            self.put(kv)
        self.revision = listing.revision

    def put(self, kv: KeyValue) -> None:
        """Apply a put of ``kv`` (a key outside the layout is ignored)."""
        self.bad.pop(kv.key, None)
        try:
            self._put(kv)
        except RecordError as exc:
            self.bad[kv.key] = str(exc)
            self.delete(kv.key)
            log.error("cluster view: %s", exc)
        self.revision = max(self.revision, kv.mod_revision)

    def _put(self, kv: KeyValue) -> None:
        keys = self.keys
        if kv.key == keys.cluster:
            self.cluster = decode(kv.key, kv.value, ClusterRecord)
        elif kv.key == keys.controller:
            record = decode(kv.key, kv.value, ControllerRecord)
            self.controller = Controller(record, kv.lease, kv.create_revision)
        elif kv.key.startswith(keys.brokers):
            broker = decode(kv.key, kv.value, BrokerRecord)
            self.brokers[kv.key[len(keys.brokers) :]] = Broker(broker, kv.lease)
        elif kv.key.startswith(keys.topics):
            topic = decode(kv.key, kv.value, TopicRecord)
            name = kv.key[len(keys.topics) :]
            held = self.failed if topic.state is TopicState.FAILED else self.topics
            (self.topics if held is self.failed else self.failed).pop(name, None)
            held[name] = Topic(topic, kv.mod_revision)

    def delete(self, key: str, revision: int = 0) -> None:
        """Apply a delete of ``key``."""
        keys = self.keys
        if key == keys.cluster:
            self.cluster = None
        elif key == keys.controller:
            self.controller = None
        elif key.startswith(keys.brokers):
            self.brokers.pop(key[len(keys.brokers) :], None)
        elif key.startswith(keys.topics):
            self.topics.pop(key[len(keys.topics) :], None)
            self.failed.pop(key[len(keys.topics) :], None)
        self.revision = max(self.revision, revision)

    def load(self) -> dict[str, tuple[int, int]]:
        """``node_id -> (partitions, topics)`` owned, for every live broker (0, 0 if none)."""
        load = dict.fromkeys(self.brokers, (0, 0))
        for topic in self.topics.values():
            record = topic.record
            if record.owner in load:
                partitions, count = load[record.owner]
                load[record.owner] = (partitions + record.partitions, count + 1)
        return load

    def placing(self) -> list[Topic]:
        """Topics waiting for the controller, oldest first."""
        waiting = [t for t in self.topics.values() if t.record.state is TopicState.PLACING]
        return sorted(waiting, key=lambda t: t.mod_revision)
