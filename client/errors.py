"""Every error the client raises, under one root: :class:`ClientError`.

Role: callers branch on classes, never on gRPC internals. :func:`from_rpc_error` translates
a ``grpc.RpcError`` once, at the edge, keeping the broker's actionable message and the
status code; :attr:`ClientError.retryable` says whether trying again may succeed.
"""

from __future__ import annotations

import grpc


class ClientError(Exception):
    """Root of every error raised by the ``client`` package."""

    retryable = False

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        self.code = code
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


def from_status(code: grpc.StatusCode, message: str) -> ClientError:
    """The client error for a status code and the broker's message."""
    cls = _BY_CODE.get(code, ClientError)
    return cls(message or code.name.lower().replace("_", " "), code)


def from_rpc_error(exc: grpc.RpcError) -> ClientError:
    """Translate a gRPC error (raise the result ``from exc``)."""
    # grpc.aio.AioRpcError is not a grpc.Call, but both carry code() and details().
    code_of = getattr(exc, "code", None)
    details_of = getattr(exc, "details", None)
    code = code_of() if callable(code_of) else grpc.StatusCode.UNKNOWN
    details = details_of() if callable(details_of) else str(exc)
    return from_status(code, details or "")
