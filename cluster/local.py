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

:class:`MemoryTopics` is the fake (STYLE rule 34): a dict, with switches to fail.
"""

from __future__ import annotations

from typing import Protocol


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


class MemoryTopics:
    """A :class:`LocalTopics` in a dict, for tests. ``fail_create`` makes create raise."""

    def __init__(self) -> None:
        self.topics: dict[str, tuple[str, int]] = {}
        self.fail_create = False
        self.created: list[str] = []

    async def create(self, name: str, topic_id: str, partitions: int) -> None:
        if self.fail_create:
            raise OSError(f"cannot create {name}: disk full (test)")
        if name not in self.topics:
            self.created.append(name)
        self.topics[name] = (topic_id, partitions)

    async def delete(self, name: str) -> None:
        self.topics.pop(name, None)

    def exists(self, name: str) -> bool:
        return name in self.topics
