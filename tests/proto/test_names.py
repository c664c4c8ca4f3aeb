"""The consumer name rule (:func:`proto.names.is_valid_consumer_name`): pure.

The broker refusing the same names over gRPC is tested with the conformance vectors
(tests/test_vectors.py); the client refusing them before sending in
tests/client/test_consumer.py.
"""

from __future__ import annotations

import pytest

from proto.name_vectors import INVALID_CONSUMER_NAMES, VALID_CONSUMER_NAMES
from proto.names import MAX_CONSUMER_NAME_LENGTH, is_valid_consumer_name, is_valid_node_id


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("", True),
        ("worker 7", True),
        ("über", True),
        ("x" * MAX_CONSUMER_NAME_LENGTH, True),
        ("x" * (MAX_CONSUMER_NAME_LENGTH + 1), False),
        ("x" * 5000, False),
        ("a\nb", False),
        ("a\rb", False),
        ("a\x00b", False),
        ("\x1b[31mred", False),
        ("\x7f", False),
        ("\x85", False),  # NEL, a C1 control
        ("a\u00a0b", False),  # NO-BREAK SPACE: a separator other than the space
        ("a\u200bb", False),  # ZERO WIDTH SPACE: a format character
        ("\ue000", False),  # private use
    ],
)
def test_consumer_names_at_each_edge_of_the_rule(name: str, valid: bool) -> None:
    """Scenario: names at and past the length limit, and each kind of character that is
    not printable. Expected: only printable names of at most 200 characters pass."""
    assert is_valid_consumer_name(name) is valid


def test_the_rule_agrees_with_the_conformance_vectors() -> None:
    """Scenario: every name of docs/protocol/vectors/names/consumer_name.json (written from
    proto.name_vectors, independently of the rule). Expected: valid ones pass, invalid
    ones do not, so the rule and the published vectors cannot drift apart."""
    assert all(is_valid_consumer_name(n) for n in VALID_CONSUMER_NAMES)
    assert not any(is_valid_consumer_name(b.name) for b in INVALID_CONSUMER_NAMES)


@pytest.mark.parametrize(
    ("node_id", "valid"),
    [
        ("b1", True),
        ("eu-west.b_2", True),
        ("9", True),
        ("x" * 64, True),
        ("", False),
        ("b 1", False),
        ("a/b", False),
        ("-b", False),
        (".b", False),
        ("b\n", False),
        ("b\u00e9", False),
        ("x" * 65, False),
    ],
)
def test_node_id_rule(node_id: str, valid: bool) -> None:
    """Scenario: node ids at and past each edge of the rule. Expected: 1-64 characters of
    A-Z a-z 0-9 . _ -, the first a letter or digit; nothing else (no slash: it ends an etcd
    key; no space or control character: it is a label and a trailer value)."""
    assert is_valid_node_id(node_id) is valid
