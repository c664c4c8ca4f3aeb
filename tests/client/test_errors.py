"""Client errors: what a failed publish says about its records. Pure: no loop, no broker."""

from __future__ import annotations

import grpc
import pytest

from client import ClientError, DeadlineExceeded, PublishOutcome, ResourceExhausted
from client.errors import from_status, publish_failure, publish_outcome, restated

Code = grpc.StatusCode
REFUSED, UNKNOWN = PublishOutcome.REFUSED, PublishOutcome.UNKNOWN


@pytest.mark.parametrize(
    ("code", "attempts", "outcome"),
    [
        # statuses the broker gives a Publish before appending: not written
        (Code.INVALID_ARGUMENT, 1, REFUSED),
        (Code.NOT_FOUND, 1, REFUSED),
        (Code.RESOURCE_EXHAUSTED, 1, REFUSED),
        (Code.FAILED_PRECONDITION, 1, REFUSED),
        (Code.UNAUTHENTICATED, 1, REFUSED),
        (Code.PERMISSION_DENIED, 1, REFUSED),
        # no answer, or an error that can follow an append: unknown
        (Code.UNAVAILABLE, 1, UNKNOWN),
        (Code.DEADLINE_EXCEEDED, 1, UNKNOWN),
        (Code.UNKNOWN, 1, UNKNOWN),
        (Code.INTERNAL, 1, UNKNOWN),
        (Code.CANCELLED, 1, UNKNOWN),
        (Code.DATA_LOSS, 1, UNKNOWN),
        # a refused retry proves nothing of the attempt before it, whose answer was lost
        (Code.RESOURCE_EXHAUSTED, 2, UNKNOWN),
        (Code.FAILED_PRECONDITION, 3, UNKNOWN),
    ],
)
def test_only_a_status_given_before_any_append_proves_a_refusal(
    code: grpc.StatusCode, attempts: int, outcome: PublishOutcome
) -> None:
    """Scenario: a publish failed with ``code`` on its last of ``attempts`` calls.
    Expected: REFUSED only for a first and only attempt refused with a status the broker
    gives before appending; UNKNOWN for everything else."""
    assert publish_outcome(from_status(code, "x"), attempts=attempts) is outcome


def test_a_publish_failure_keeps_its_class_and_says_what_to_do() -> None:
    """Scenario: a RESOURCE_EXHAUSTED refusal and a DEADLINE_EXCEEDED timeout restated as
    publish failures. Expected: the same class and code, the outcome set, and the message
    naming the partition, the broker's reason and the advice."""
    refused = publish_failure(
        from_status(Code.RESOURCE_EXHAUSTED, "record over max_record_bytes"), REFUSED, "t/0"
    )
    assert isinstance(refused, ResourceExhausted)
    assert (refused.code, refused.outcome) == (Code.RESOURCE_EXHAUSTED, REFUSED)
    assert str(refused) == (
        "publish to t/0 failed: record over max_record_bytes (not written; safe to resend)"
    )
    unknown = publish_failure(from_status(Code.DEADLINE_EXCEEDED, "late"), UNKNOWN, "t/1")
    assert isinstance(unknown, DeadlineExceeded)
    assert unknown.retryable
    assert str(unknown) == (
        "publish to t/1 failed: late (may or may not have been written; resending may duplicate)"
    )


def test_errors_of_other_calls_have_no_outcome() -> None:
    """A ClientError not from a publish carries ``outcome`` None."""
    assert ClientError("boom").outcome is None
    assert from_status(Code.NOT_FOUND, "no topic").outcome is None


@pytest.mark.parametrize(
    ("code", "details", "names_the_setting"),
    [
        # the broker's transport refusing a request over [broker] max_request_bytes
        (
            Code.RESOURCE_EXHAUSTED,
            "SERVER: Received message larger than max (70000 vs. 65536)",
            True,
        ),
        # the client's own receive limit, another status, another message: kept as said
        (
            Code.RESOURCE_EXHAUSTED,
            "CLIENT: Received message larger than max (70000 vs. 65536)",
            False,
        ),
        (Code.INTERNAL, "SERVER: Received message larger than max (70000 vs. 65536)", False),
        (Code.RESOURCE_EXHAUSTED, "backlog quota of t/0 is full", False),
    ],
)
def test_only_the_brokers_receive_limit_is_restated(
    code: grpc.StatusCode, details: str, names_the_setting: bool
) -> None:
    """Scenario: gRPC's refusal of a request over the broker's receive limit, and three
    look-alikes. Expected: the first is restated naming the size, the limit and
    ``[broker] max_request_bytes``; the others are kept word for word."""
    said = restated(code, details)
    if names_the_setting:
        assert said.startswith(
            "request is 70000 bytes, over the broker's limit of 65536 bytes ([broker] "
            "max_request_bytes); "
        )
    else:
        assert said == details
