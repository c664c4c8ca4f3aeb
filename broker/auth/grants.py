"""Roles and grants: what a token may do, on which topics and subscriptions.

Role: the vocabulary of authorization. A :class:`Grant` binds one :class:`Role` to a topic
name pattern and, for ``consume``, a subscription name pattern; patterns are shell globs
matched case-sensitively (``fnmatch.fnmatchcase``: ``*``, ``?``, ``[abc]``). Pure: no I/O.

Invariants:
- ``admin`` implies ``produce`` and ``consume`` on the same patterns; nothing implies
  ``admin``.
- A subscription pattern limits every check that names a subscription: consuming it, and
  admin work on it (purging or replaying its dead letters). A check with no subscription
  (Fetch, OffsetsForTime: reading a topic by offset) passes a consume grant on the topic
  whatever its subscription pattern. Produce grants have none (always ``*``).

Worked example: ``Grant(CONSUME, "orders.*", "billing-*")`` covers consume on
``orders.eu`` / ``billing-1`` and a Fetch of ``orders.eu``; it does not cover consume on
``orders.eu`` / ``audit``, produce on ``orders.eu``, or anything on ``orders`` (the dot is
literal). ``Grant(ADMIN, "*")`` covers every role on every topic; ``Grant(ADMIN, "*",
"ops-*")`` covers a purge of ``t`` / ``ops-1`` but not of ``t`` / ``billing``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fnmatch import fnmatchcase

#: Longest topic or subscription pattern accepted, characters.
MAX_PATTERN_CHARS = 256


class Role(enum.Enum):
    """What a grant allows."""

    ADMIN = "admin"  # create and delete topics, purge and replay dead letters; and the two below
    PRODUCE = "produce"  # publish to the topic
    CONSUME = "consume"  # subscribe, fetch, ack, seek, read the dead-letter queue

    def implies(self, other: Role) -> bool:
        """Whether a grant of this role also allows ``other``."""
        return self is other or self is Role.ADMIN


def parse_role(text: str) -> Role:
    """The role named ``text``.

    Raises:
        ValueError: Not a role name; the message lists them.
    """
    try:
        return Role(text)
    except ValueError:
        known = ", ".join(r.value for r in Role)
        raise ValueError(f"role {text!r} is not one of {known}") from None


def check_pattern(what: str, pattern: str) -> str:
    """``pattern``, checked: non-empty printable ASCII without spaces, at most
    :data:`MAX_PATTERN_CHARS`.

    Raises:
        ValueError: Naming ``what`` and the problem.
    """
    if not pattern:
        raise ValueError(f"{what} pattern is empty; use * for every name")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"{what} pattern is longer than {MAX_PATTERN_CHARS} characters")
    if not all(" " < ch <= "~" for ch in pattern):
        raise ValueError(f"{what} pattern {pattern!r} must be printable ASCII without spaces")
    return pattern


@dataclass(frozen=True, slots=True)
class Grant:
    """One role on the topics matching ``topics`` and, where a check names a subscription,
    the subscriptions matching ``subscriptions`` (default every one)."""

    role: Role
    topics: str
    subscriptions: str = "*"

    def covers(self, role: Role, topic: str, subscription: str | None = None) -> bool:
        """Whether this grant allows ``role`` on ``topic`` (and ``subscription``)."""
        if not self.role.implies(role) or not fnmatchcase(topic, self.topics):
            return False
        return subscription is None or fnmatchcase(subscription, self.subscriptions)

    def __str__(self) -> str:
        base = f"{self.role.value}:{self.topics}"
        return base if self.subscriptions == "*" else f"{base}:{self.subscriptions}"


def parse_grant(text: str) -> Grant:
    """A grant written ``ROLE:TOPICS[:SUBSCRIPTIONS]`` (``consume:orders.*:billing-*``).

    Raises:
        ValueError: A bad role or pattern, or subscriptions on a role other than consume
            or admin.
    """
    parts = text.split(":", 2)
    if len(parts) < 2:
        raise ValueError(f"grant {text!r} must be ROLE:TOPICS[:SUBSCRIPTIONS]")
    return make_grant(parts[0], parts[1], parts[2] if len(parts) == 3 else "*")


def make_grant(role: str, topics: str, subscriptions: str = "*") -> Grant:
    """A checked grant (see :func:`parse_grant`).

    Raises:
        ValueError: As :func:`parse_grant`.
    """
    parsed = parse_role(role)
    if parsed is Role.PRODUCE and subscriptions != "*":
        raise ValueError("a produce grant takes no subscription pattern")
    return Grant(
        parsed, check_pattern("topic", topics), check_pattern("subscription", subscriptions)
    )
