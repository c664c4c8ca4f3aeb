"""Roles and grants: glob matching, admin implying the other roles, and the grant syntax."""

from __future__ import annotations

import pytest

from broker.auth.grants import Grant, Role, make_grant, parse_grant


@pytest.mark.parametrize(
    ("grant", "role", "topic", "subscription", "covered"),
    [
        (
            Grant(Role.CONSUME, "orders.*", "billing-*"),
            Role.CONSUME,
            "orders.eu",
            "billing-1",
            True,
        ),
        (Grant(Role.CONSUME, "orders.*", "billing-*"), Role.CONSUME, "orders.eu", "audit", False),
        (Grant(Role.CONSUME, "orders.*", "billing-*"), Role.CONSUME, "orders.eu", None, True),
        (Grant(Role.CONSUME, "orders.*", "billing-*"), Role.PRODUCE, "orders.eu", None, False),
        (Grant(Role.CONSUME, "orders.*"), Role.CONSUME, "orders", "s", False),
        (Grant(Role.PRODUCE, "orders"), Role.PRODUCE, "orders", None, True),
        (Grant(Role.PRODUCE, "orders"), Role.PRODUCE, "Orders", None, False),
        (Grant(Role.PRODUCE, "orders"), Role.CONSUME, "orders", "s", False),
        (Grant(Role.PRODUCE, "orders"), Role.ADMIN, "orders", None, False),
        (Grant(Role.ADMIN, "*"), Role.PRODUCE, "anything", None, True),
        (Grant(Role.ADMIN, "*"), Role.CONSUME, "anything", "any", True),
        (Grant(Role.ADMIN, "*", "ops-*"), Role.CONSUME, "t", "billing", False),
        (Grant(Role.ADMIN, "*", "ops-*"), Role.ADMIN, "t", "billing", False),
        (Grant(Role.ADMIN, "*", "ops-*"), Role.ADMIN, "t", "ops-1", True),
        (Grant(Role.ADMIN, "*", "ops-*"), Role.ADMIN, "t", None, True),
        (Grant(Role.ADMIN, "team-[ab]"), Role.ADMIN, "team-c", None, False),
    ],
)
def test_covers(
    grant: Grant, role: Role, topic: str, subscription: str | None, covered: bool
) -> None:
    """Scenario: one grant, one (role, topic, subscription). Expected: covered as the table
    says: globs are case-sensitive, admin implies produce and consume, a subscription
    pattern limits consume and admin work on subscriptions, and no subscription (a Fetch)
    passes a consume grant."""
    assert grant.covers(role, topic, subscription) is covered


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("produce:orders", Grant(Role.PRODUCE, "orders")),
        ("consume:orders.*:billing-*", Grant(Role.CONSUME, "orders.*", "billing-*")),
        ("admin:*", Grant(Role.ADMIN, "*")),
    ],
)
def test_parse_grant(text: str, expected: Grant) -> None:
    """Scenario: ROLE:TOPICS[:SUBS] text. Expected: the grant, which prints back as given."""
    assert parse_grant(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("produce", "must be ROLE:TOPICS[:SUBSCRIPTIONS]"),
        ("owner:*", "role 'owner' is not one of admin, produce, consume"),
        ("produce:", "topic pattern is empty"),
        ("consume:t:", "subscription pattern is empty"),
        ("produce:t:s", "a produce grant takes no subscription pattern"),
        ("produce:a b", "must be printable ASCII without spaces"),
        ("produce:" + "x" * 257, "longer than 256 characters"),
    ],
)
def test_bad_grants_say_what_is_wrong(text: str, message: str) -> None:
    """Scenario: a malformed grant. Expected: ValueError naming the problem."""
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_grant(text)


def test_make_grant_defaults_subscriptions_to_every_one() -> None:
    """Scenario: a consume grant without a subscription pattern. Expected: pattern *."""
    assert make_grant("consume", "t").subscriptions == "*"
