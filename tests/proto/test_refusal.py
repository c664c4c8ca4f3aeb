"""The refusal's wire forms: trailers and Redirect fields round-trip, and a client's
action follows the reason."""

from __future__ import annotations

import pytest

from proto import broker_pb2 as pb
from proto.refusal import (
    ABORTED,
    REASONS,
    TRAILERS,
    Action,
    Redirection,
    action,
    from_redirect_fields,
    from_trailers,
    redirect_fields,
    trailers,
)

B2 = Redirection("not-owner", "orders", "b2", "10.0.0.2:50051", 3)


def test_trailers_are_the_five_keys_in_order_and_read_back() -> None:
    """Scenario: the trailers of a not-owner refusal, read back as bytes values among
    other metadata. Expected: the five keys in spec order with ASCII values (epoch in
    decimal); the same Redirection comes back."""
    sent = trailers(B2)
    assert [k for k, _ in sent] == list(TRAILERS)
    assert dict(sent) == {
        "headrace-refusal": "not-owner",
        "headrace-topic": "orders",
        "headrace-owner-node": "b2",
        "headrace-owner-address": "10.0.0.2:50051",
        "headrace-owner-epoch": "3",
    }
    received = [("grpc-status", b"10"), *((k, v.encode()) for k, v in sent)]
    assert from_trailers(received) == B2


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (None, None),
        ([("headrace-topic", "orders")], None),
        ([("headrace-refusal", "offline")], Redirection("offline", "")),
        (
            [("headrace-refusal", "creating"), ("headrace-owner-epoch", "x1")],
            Redirection("creating", ""),
        ),
        (
            [("headrace-refusal", "offline"), ("headrace-refusal", "not-owner")],
            Redirection("offline", ""),
        ),
    ],
)
def test_trailers_missing_or_malformed(
    metadata: list[tuple[str, str]] | None, expected: Redirection | None
) -> None:
    """Scenario: metadata with no refusal, with only a reason, with a bad epoch, with a
    repeated key. Expected: None without headrace-refusal; missing fields empty, a bad
    epoch 0, the first of a repeated key."""
    assert from_trailers(metadata) == expected


def test_redirect_fields_fill_the_proto_message_and_read_back() -> None:
    """Scenario: the Redirect of a refused PublishStream request. Expected: the message
    built from redirect_fields holds the facts; reading its fields back gives the same
    Redirection; an empty Redirect (no refusal) reads as None."""
    message = pb.Redirect(
        reason="not-owner", topic="orders", owner_node="b2", owner_address="10.0.0.2:50051",
        owner_epoch=3,
    )  # fmt: skip
    assert redirect_fields(B2) == {
        f.name: getattr(message, f.name) for f in pb.Redirect.DESCRIPTOR.fields
    }
    fields = {f.name: getattr(message, f.name) for f in pb.Redirect.DESCRIPTOR.fields}
    assert from_redirect_fields(fields) == B2
    assert from_redirect_fields({f.name: "" for f in pb.Redirect.DESCRIPTOR.fields}) is None


@pytest.mark.parametrize(
    ("redirection", "expected"),
    [
        (B2, Action.REDIRECT),
        (Redirection("not-owner", "orders"), Action.BACKOFF),  # owner unknown: look up again
        *(
            (Redirection(r, "orders", "b2", "10.0.0.2:50051", 3), Action.BACKOFF)
            for r in REASONS[1:]
        ),
        (Redirection("moved-to-mars", "orders", "b2", "10.0.0.2:50051"), Action.BACKOFF),
    ],
)
def test_action_redirects_only_to_a_known_owner(redirection: Redirection, expected: Action) -> None:
    """Scenario: each reason, a not-owner with no address, and an unknown reason.
    Expected: redirect at once only for not-owner with an address; every other case backs
    off and looks up again (an unknown reason as offline)."""
    assert action(redirection) is expected


def test_the_status_number_is_grpc_aborted() -> None:
    """Scenario: the refusal's status number. Expected: grpc's ABORTED."""
    import grpc

    assert grpc.StatusCode.ABORTED.value[0] == ABORTED


def test_a_value_that_is_not_printable_ascii_is_masked() -> None:
    """Scenario: a refusal whose owner address holds a non-ASCII letter and a newline
    (bad data from a cluster's store). Expected: each such character becomes '?', so the
    trailers can still be sent; the others are kept."""
    odd = Redirection("offline", "orders", "b\u00e9", "h\nx:1", 2)
    assert dict(trailers(odd))["headrace-owner-node"] == "b?"
    assert dict(trailers(odd))["headrace-owner-address"] == "h?x:1"
