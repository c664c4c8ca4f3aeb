"""The cluster's refusal on the wire: its status, its trailers, and what a client must do.

Role: part of the wire contract (``docs/protocol.md``, section "Cluster: finding a topic's
owner"). A topic-scoped call that reaches a broker that does not serve its topic now is
refused before anything is done, with gRPC status ``ABORTED`` (no other Headrace refusal
uses it) and these trailing metadata entries (ASCII values):

=========================  ==============================================================
key                        value
=========================  ==============================================================
``headrace-refusal``       the reason: ``not-owner``, ``offline``, ``no-session``,
                           ``data-missing``, ``creating`` or ``not-enough-replicas``
``headrace-topic``         the topic the call named
``headrace-owner-node``    the owner's node id; empty when unknown
``headrace-owner-address`` the owner's ``host:port``; empty when unknown
``headrace-owner-epoch``   the owner's epoch of the topic, decimal; ``0`` when unknown
=========================  ==============================================================

On ``PublishStream`` the refused request's response carries ``error_code = 10``
(``ABORTED``) and a ``Redirect`` message with the same five facts; the stream stays open.
The broker builds both from one :class:`Redirection` (:func:`trailers`,
:func:`redirect_fields`); a client reads either back (:func:`from_trailers`,
:func:`from_redirect_fields`) and decides with :func:`action`.

Worked example: ``orders`` is owned by ``b2`` at ``10.0.0.2:50051``, epoch 3; a Publish
of ``orders`` reaches ``b1``. ``b1`` answers ``ABORTED`` with trailers
``(("headrace-refusal", "not-owner"), ("headrace-topic", "orders"), ("headrace-owner-node",
"b2"), ("headrace-owner-address", "10.0.0.2:50051"), ("headrace-owner-epoch", "3"))``;
:func:`action` of that is :data:`Action.REDIRECT`: the client sends the same batch (same
producer id and sequence) to ``10.0.0.2:50051`` at once, and caches ``orders -> b2``.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``, and nothing of ours.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The gRPC status code of a refusal (``grpc.StatusCode.ABORTED``), as a number.
ABORTED = 10

#: Every refusal reason, in the order the spec lists them.
REASONS = ("not-owner", "offline", "no-session", "data-missing", "creating", "not-enough-replicas")

TRAILER_REASON = "headrace-refusal"
TRAILER_TOPIC = "headrace-topic"
TRAILER_OWNER_NODE = "headrace-owner-node"
TRAILER_OWNER_ADDRESS = "headrace-owner-address"
TRAILER_OWNER_EPOCH = "headrace-owner-epoch"

#: Every trailer a refusal carries, in the order the broker sends them.
TRAILERS = (
    TRAILER_REASON,
    TRAILER_TOPIC,
    TRAILER_OWNER_NODE,
    TRAILER_OWNER_ADDRESS,
    TRAILER_OWNER_EPOCH,
)


class Action(enum.Enum):
    """What a client does with a refused call (nothing of it was done)."""

    #: Resend it at once to ``owner_address``, with the same producer id and sequence.
    REDIRECT = "redirect"
    #: Wait (backoff with jitter), look the topic up again, then resend it where the new
    #: route says, with the same producer id and sequence, until the call's deadline.
    BACKOFF = "backoff"


@dataclass(frozen=True, slots=True)
class Redirection:
    """The facts of one refusal, as they travel (trailers or a ``Redirect`` message).

    Attributes:
        reason: One of :data:`REASONS` (a client treats a reason it does not know as
            ``offline``: back off and look up again).
        topic: The topic the refused call named.
        owner_node: The owner's node id; ``""`` when unknown.
        owner_address: The owner's ``host:port``; ``""`` when unknown.
        owner_epoch: The owner's epoch of the topic as the refusing broker knew it; 0
            when unknown.
    """

    reason: str
    topic: str
    owner_node: str = ""
    owner_address: str = ""
    owner_epoch: int = 0


def trailers(r: Redirection) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of a refused call, in :data:`TRAILERS` order. Values are
    printable ASCII (gRPC sends nothing else in a text entry): any other character, which
    no valid name or address holds, becomes ``?``."""
    return (
        (TRAILER_REASON, _ascii(r.reason)),
        (TRAILER_TOPIC, _ascii(r.topic)),
        (TRAILER_OWNER_NODE, _ascii(r.owner_node)),
        (TRAILER_OWNER_ADDRESS, _ascii(r.owner_address)),
        (TRAILER_OWNER_EPOCH, str(r.owner_epoch)),
    )


def _ascii(value: str) -> str:
    if value.isascii() and value.isprintable():
        return value
    return "".join(c if " " <= c <= "~" else "?" for c in value)


def from_trailers(metadata: Iterable[tuple[str, str | bytes]] | None) -> Redirection | None:
    """The refusal a call's trailing metadata carries, or ``None`` when it carries none
    (``headrace-refusal`` absent). A missing or malformed epoch reads as 0, missing
    owner fields as ``""``."""
    values: dict[str, str] = {}
    for key, value in metadata or ():
        if key in TRAILERS and key not in values:
            values[key] = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    return from_redirect_fields(
        {
            "reason": values.get(TRAILER_REASON, ""),
            "topic": values.get(TRAILER_TOPIC, ""),
            "owner_node": values.get(TRAILER_OWNER_NODE, ""),
            "owner_address": values.get(TRAILER_OWNER_ADDRESS, ""),
            "owner_epoch": values.get(TRAILER_OWNER_EPOCH, "0"),
        }
    )


def redirect_fields(r: Redirection) -> dict[str, str | int]:
    """The fields of the ``Redirect`` message on a refused ``PublishStream`` response."""
    return {
        "reason": r.reason,
        "topic": r.topic,
        "owner_node": r.owner_node,
        "owner_address": r.owner_address,
        "owner_epoch": r.owner_epoch,
    }


def from_redirect_fields(fields: Mapping[str, str | int]) -> Redirection | None:
    """The refusal of a ``Redirect`` message's fields (``None`` when ``reason`` is empty:
    the response was no refusal)."""
    reason = str(fields.get("reason", ""))
    if not reason:
        return None
    epoch = str(fields.get("owner_epoch", 0))
    return Redirection(
        reason,
        str(fields.get("topic", "")),
        str(fields.get("owner_node", "")),
        str(fields.get("owner_address", "")),
        int(epoch) if epoch.isascii() and epoch.isdigit() else 0,
    )


def action(r: Redirection) -> Action:
    """What a client does: :data:`Action.REDIRECT` for ``not-owner`` with a known owner
    address, :data:`Action.BACKOFF` for everything else (the owner is unknown, offline,
    without a session, missing its data, still creating the topic, or leading it with
    too few in-sync replicas)."""
    if r.reason == "not-owner" and r.owner_address:
        return Action.REDIRECT
    return Action.BACKOFF


class RouteAction(enum.Enum):
    """What a client does with a ``TopicRoute`` of a Lookup answer."""

    #: Send the topic's calls to ``owner_address``.
    CALL = "call"
    #: The topic does not exist: answer as ``NOT_FOUND`` would (or create it).
    NOT_FOUND = "not-found"
    #: The topic exists but nobody serves it now (offline owner, being created, no owner
    #: yet): back off and look it up again, until the call's deadline.
    BACKOFF = "backoff"


def route_action(*, state: str, online: bool, owner_address: str) -> RouteAction:
    """What a client does with a route: call the owner only when the route is online and
    names an address; an ``absent`` topic is not found; anything else waits."""
    if online and owner_address:
        return RouteAction.CALL
    if state == "absent":
        return RouteAction.NOT_FOUND
    return RouteAction.BACKOFF
