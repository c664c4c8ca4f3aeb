"""The one topic and subscription name pattern (:mod:`dispatcher.names`): pure."""

from __future__ import annotations

import re

import pytest

from broker.errors import InvalidRequestError
from broker.topics import check_topic_name
from dispatcher import InvalidSubscriptionError, check_subscription_name
from dispatcher.names import MAX_NAME_LENGTH, NAME_PATTERN, is_valid_name


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("orders", True),
        ("orders.v2", True),
        ("eu-west_1", True),
        ("0", True),
        ("a" * MAX_NAME_LENGTH, True),
        ("a" * (MAX_NAME_LENGTH + 1), False),
        ("", False),
        (".hidden", False),
        ("..", False),
        ("-x", False),
        ("a/b", False),
        ("a b", False),
        ("über", False),
    ],
)
def test_one_pattern_for_topics_and_subscriptions(name: str, valid: bool) -> None:
    """Scenario: names at and past each edge of the rule. Expected: topics and
    subscriptions agree on every one; a refused name's message states the pattern."""
    assert is_valid_name(name) is valid
    if valid:
        check_topic_name(name)
        check_subscription_name(name)
        return
    with pytest.raises(InvalidRequestError, match=re.escape(NAME_PATTERN)):
        check_topic_name(name)
    with pytest.raises(InvalidSubscriptionError, match="not a valid subscription name"):
        check_subscription_name(name)
