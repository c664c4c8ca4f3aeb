"""Every error the client raises, under one root: :class:`ClientError`.

Role: callers branch on classes, never on gRPC internals. :func:`from_rpc_error` translates
a ``grpc.RpcError`` once, at the edge, keeping the broker's actionable message and the
status code; :attr:`ClientError.retryable` says whether trying again may succeed.

A failed send also says whether its records were written (:attr:`ClientError.outcome`,
set by :func:`publish_failure`): only a status that the broker gives *before* it appends
proves they were not (``REFUSED``); any other failure is ``UNKNOWN``. Example: a batch
answered ``RESOURCE_EXHAUSTED`` on its first attempt was refused; one answered
``UNAVAILABLE`` and then, on the retry, ``RESOURCE_EXHAUSTED`` (the backlog quota) is
unknown, because the first attempt may have been appended before its answer was lost.

A request over the broker's ``[broker] max_request_bytes`` is refused by gRPC itself, whose
message does not name the setting ("SERVER: Received message larger than max (70000 vs.
65536)"): :func:`from_rpc_error` restates it as the broker's own refusal would ("request is
70000 bytes, over the broker's limit of 65536 bytes ([broker] max_request_bytes); ...").

A cluster's refusal (``ABORTED`` with ``headrace-*`` trailers: the broker called does not
serve the topic, nothing was done) is :class:`Refused`, carrying the
:class:`~proto.refusal.Redirection` the routed clients follow.
"""

from __future__ import annotations

import re

import grpc

from client._types import PublishOutcome
from proto.refusal import Redirection, from_trailers


class ClientError(Exception):
    """Root of every error raised by the ``client`` package.

    Attributes:
        code: The gRPC status code behind the error, if any.
        outcome: For a failed send or publish, whether its records were written
            (:class:`PublishOutcome`: ``REFUSED``, not written, safe to resend; or
            ``UNKNOWN``, may or may not have been written, resending may duplicate);
            ``None`` for every other call.
    """

    retryable = False

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        *,
        outcome: PublishOutcome | None = None,
    ) -> None:
        self.code = code
        self.outcome = outcome
        super().__init__(message)


class InvalidArgument(ClientError):
    """Raised when the broker rejects a request as malformed (INVALID_ARGUMENT)."""


class NotFound(ClientError):
    """Raised when a topic or subscription does not exist (NOT_FOUND)."""


class AlreadyExists(ClientError):
    """Raised when creating something that exists (ALREADY_EXISTS)."""


class ResourceExhausted(ClientError):
    """Raised when a record, batch or message is over a limit (RESOURCE_EXHAUSTED)."""


class FailedPrecondition(ClientError):
    """Raised when the broker's state forbids the request, e.g. a producer sequence gap."""


class OutOfRange(ClientError):
    """Raised when an offset is outside the retained log (OUT_OF_RANGE)."""


class Unauthenticated(ClientError):
    """Raised when the token is missing or wrong (UNAUTHENTICATED)."""


class PermissionDenied(ClientError):
    """Raised when the token may not do this (PERMISSION_DENIED)."""


class DataLoss(ClientError):
    """Raised when the broker found damaged data where the read starts (DATA_LOSS)."""


class Unavailable(ClientError):
    """Raised when the broker cannot be reached or is shutting down (UNAVAILABLE)."""

    retryable = True


class DeadlineExceeded(ClientError):
    """Raised when a call did not finish in time (DEADLINE_EXCEEDED)."""

    retryable = True


class Refused(ClientError):
    """Raised when the broker called does not serve the topic now (ABORTED with the
    ``headrace-*`` trailers, docs/protocol.md section 11): nothing of the call was done.
    A routed client follows it by itself (to the owner, or after a backoff and a Lookup)
    and raises it only when the call's deadline ran out first.

    Attributes:
        redirection: The refusal's facts (reason, topic, owner node, address, epoch).
    """

    retryable = True

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = grpc.StatusCode.ABORTED,
        *,
        redirection: Redirection,
        outcome: PublishOutcome | None = None,
    ) -> None:
        super().__init__(message, code, outcome=outcome)
        self.redirection = redirection


class ClientClosed(ClientError):
    """Raised when a closed client is used."""


_BY_CODE: dict[grpc.StatusCode, type[ClientError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


#: The statuses a broker answers a Publish with only before it appends anything: a batch
#: failed with one of them on its only attempt is certainly not in the log.
REFUSING_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
        # The cluster's refusal: the broker did nothing (docs/protocol.md section 11).
        grpc.StatusCode.ABORTED,
    }
)


def publish_outcome(error: ClientError, *, attempts: int) -> PublishOutcome:
    """What a publish that failed with ``error`` after ``attempts`` calls left in the log.

    ``REFUSED`` only if there was one attempt and its status is in :data:`REFUSING_CODES`
    (a retry follows an unknown outcome, so a refused retry proves nothing of the first
    attempt); ``UNKNOWN`` otherwise.
    """
    if attempts == 1 and error.code in REFUSING_CODES:
        return PublishOutcome.REFUSED
    return PublishOutcome.UNKNOWN


def publish_failure(error: ClientError, outcome: PublishOutcome, where: str) -> ClientError:
    """``error`` restated for a failed publish to ``where`` (``topic/partition``): the same
    class and code, with ``outcome`` set and its advice at the end of the message. Raise it
    ``from error``."""
    message = f"publish to {where} failed: {error} ({outcome.advice})"
    if isinstance(error, Refused):
        return Refused(message, error.code, redirection=error.redirection, outcome=outcome)
    return type(error)(message, error.code, outcome=outcome)


def from_status(code: grpc.StatusCode, message: str) -> ClientError:
    """The client error for a status code and the broker's message."""
    cls = _BY_CODE.get(code, ClientError)
    return cls(message or code.name.lower().replace("_", " "), code)


_OVER_RECEIVE_LIMIT = re.compile(r"SERVER: Received message larger than max \((\d+) vs\. (\d+)\)")


def restated(code: grpc.StatusCode, details: str) -> str:
    """``details``, or for gRPC's refusal of a request over the broker's receive limit
    (which is ``[broker] max_request_bytes``) a message naming the size, the limit and the
    setting to raise."""
    over = _OVER_RECEIVE_LIMIT.search(details)
    if code != grpc.StatusCode.RESOURCE_EXHAUSTED or over is None:
        return details
    size, limit = over.groups()
    return (
        f"request is {size} bytes, over the broker's limit of {limit} bytes ([broker] "
        "max_request_bytes); send less per request (split the records over several "
        "publishes), or raise max_request_bytes in the broker's config"
    )


def from_rpc_error(exc: grpc.RpcError) -> ClientError:
    """Translate a gRPC error (raise the result ``from exc``)."""
    # grpc.aio.AioRpcError is not a grpc.Call, but both carry code() and details().
    code_of = getattr(exc, "code", None)
    details_of = getattr(exc, "details", None)
    code = code_of() if callable(code_of) else grpc.StatusCode.UNKNOWN
    details = details_of() if callable(details_of) else str(exc)
    if code == grpc.StatusCode.ABORTED:
        trailers_of = getattr(exc, "trailing_metadata", None)
        redirection = from_trailers(trailers_of() if callable(trailers_of) else None)
        if redirection is not None:
            return Refused(details or "refused: not served here", code, redirection=redirection)
    return from_status(code, restated(code, details or ""))
