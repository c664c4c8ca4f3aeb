"""The one question the broker asks before any topic-scoped call: may I serve this here, now?

Role: the interface between :mod:`broker` and cluster mode. The broker holds one
:class:`Ownership` and calls :meth:`Ownership.refusal` before it does anything for a call
that names a topic (publish, subscribe, ack, seek, fetch, describe, DLQ commands, delete).
``None`` means "serve it here"; a :class:`Refusal` means "do nothing, and tell the caller
why and where to go" (on the wire: gRPC ``ABORTED`` with ``headrace-*`` trailers, see
``docs/protocol.md``).

Implementations:

- :class:`SingleBroker`: no cluster, no etcd. Always ``None``: a single broker is exactly
  what it was before cluster mode existed.
- ``cluster.member.ClusterMember``: the running cluster node. ``None`` only while its view
  of etcd says this broker owns the topic at the epoch it claimed and, for ``write=True``,
  while its session may still write (``cluster.session``).

Invariants:

- A refusal is given *before* anything is done: a refused call changed nothing, so a
  client may resend it elsewhere with the same producer sequence.
- ``refusal`` is synchronous and cheap (a dict lookup and a clock read): it runs on every
  call, on the event loop, and never waits for etcd.

Pure: imports neither asyncio, os nor time.
"""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec

RefusalReason = Literal[
    "not-owner",
    "offline",
    "no-session",
    "data-missing",
    "creating",
    "absent",
    "not-enough-replicas",
]
"""Why a broker refused a topic-scoped call. ``not-owner``: another broker owns it (go
there). ``offline``: its owner is not alive (the topic waits for it). ``no-session``: this
broker owns it but may no longer write (its etcd session may have expired). ``data-missing``:
this broker owns it but its local files are gone. ``creating``: the topic is being made on
its owner and is not ready yet. ``absent``: the cluster holds no such topic, though this
broker has local files of that name (a stray copy it never serves): the broker answers
``NOT_FOUND``, as for any unknown topic, not ``ABORTED`` (it never reaches the wire as a
refusal). ``not-enough-replicas``: this broker leads the (replicated) topic but it has
fewer in-sync replicas than its ``min_insync``, so no publish is appended (issue 37; the
message names both numbers); reads go on."""


class Refusal(msgspec.Struct, frozen=True):
    """A topic-scoped call refused before anything was done, and where to go instead.

    Attributes:
        reason: why (see :data:`RefusalReason`).
        topic: the topic the call named.
        owner_node: the owner's node id; ``""`` when unknown (no such topic, not placed yet).
        owner_address: the owner's advertised ``host:port``; ``""`` when unknown.
        epoch: the owner's epoch of the topic as this broker last saw it; 0 when unknown.
        message: for a person: what happened and what to do.
    """

    reason: RefusalReason
    topic: str
    owner_node: str
    owner_address: str
    epoch: int
    message: str


class Ownership(Protocol):
    """What the broker asks before every topic-scoped call."""

    def refusal(self, topic: str, *, write: bool) -> Refusal | None:
        """Return ``None`` to serve ``topic`` here, or why not.

        Args:
            topic: the topic the call names.
            write: True for a call that changes state (publish, an ack that saves, seek, DLQ
                writes, delete); False for reads (fetch, subscribe deliveries, describe).

        Returns:
            ``None`` when this broker serves the call; otherwise the :class:`Refusal` to
            answer with. Called before anything is done; never blocks.
        """
        ...


class SingleBroker:
    """The :class:`Ownership` of a broker with no cluster: it serves every topic it has.

    Task-safe: stateless.
    """

    def refusal(self, topic: str, *, write: bool) -> Refusal | None:
        """Always ``None``: a single broker owns every topic it holds."""
        del topic, write
        return None
