"""The one table from domain errors to gRPC status codes, and its use in servicers.

Role: servicers catch nothing themselves; their unary methods are decorated with
:func:`rpc`, which hands any error to :func:`abort_for`, which turns it into
``context.abort(code, message)`` with the error's own actionable message. Unknown errors are
logged with their traceback and reported as ``INTERNAL`` without internals.

Cluster refusals: :class:`~broker.errors.TopicRefusedError` (this broker does not serve the
call's topic now; nothing was done) is ``ABORTED``, which no other error uses, and its
status carries the refusal's ``headrace-*`` trailing metadata (:func:`trailers_for`,
:mod:`proto.refusal`), so a client can tell it from ``UNAVAILABLE`` (outcome unknown) and
``FAILED_PRECONDITION`` (a sequence gap) and knows where the owner is.

I/O errors: a full disk is ``RESOURCE_EXHAUSTED`` (the request was fine, the broker has no
room; it accepts writes again by itself once space is freed). Any other I/O error is
``UNAVAILABLE``: this broker's disk failed the request, which may succeed later or on
another broker, and the message names the file and the cause. A bare ``OSError`` that
reaches a servicer (a subscription's state save) is first translated with
:func:`wal.errors.io_error`, so it gets the same rows and messages.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn, TypeVar

import grpc

from broker.errors import (
    AuthenticationError,
    BacklogQuotaExceededError,
    ClusterUnavailableError,
    DeadLetterReplayError,
    FileLimitError,
    InvalidRequestError,
    LimitExceededError,
    MalformedRequestError,
    PermissionDeniedError,
    PlacedCreateError,
    ProducerSequenceError,
    ReplicationOutcomeUnknownError,
    RequestTooLargeError,
    ShuttingDownError,
    TooFewBrokersError,
    TopicExistsError,
    TopicNotFoundError,
    TopicRefusedError,
)
from broker.topic_guard import refusal_trailers
from dispatcher import (
    DispatcherClosedError,
    InvalidAckError,
    InvalidSubscriptionError,
    SubscriptionBusyError,
    SubscriptionCommittedError,
    SubscriptionInUseError,
    SubscriptionLimitError,
    SubscriptionNotFoundError,
)
from dispatcher.errors import DlqCorruptError
from proto.shown import shown_text
from wal import (
    BatchTooLargeError,
    CorruptSegmentError,
    DiskFullError,
    InvalidBatchError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    WalClosedError,
    WalFailedError,
    WalIOError,
)
from wal.errors import DISK_FULL_ERRNOS, io_error

logger = logging.getLogger(__name__)

#: Most specific classes first: the first ``isinstance`` match wins.
STATUS_TABLE: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (TopicRefusedError, grpc.StatusCode.ABORTED),
    (AuthenticationError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (RecordTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (BatchTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (RequestTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (BacklogQuotaExceededError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DiskFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (FileLimitError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (LimitExceededError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (SubscriptionLimitError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InvalidBatchError, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (MalformedRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (TopicNotFoundError, grpc.StatusCode.NOT_FOUND),
    (TopicExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (InvalidSubscriptionError, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidAckError, grpc.StatusCode.INVALID_ARGUMENT),
    (SubscriptionNotFoundError, grpc.StatusCode.NOT_FOUND),
    (SubscriptionBusyError, grpc.StatusCode.FAILED_PRECONDITION),
    (SubscriptionCommittedError, grpc.StatusCode.FAILED_PRECONDITION),
    (SubscriptionInUseError, grpc.StatusCode.FAILED_PRECONDITION),
    (ProducerSequenceError, grpc.StatusCode.FAILED_PRECONDITION),
    (DeadLetterReplayError, grpc.StatusCode.FAILED_PRECONDITION),
    (TooFewBrokersError, grpc.StatusCode.FAILED_PRECONDITION),
    (OffsetOutOfRangeError, grpc.StatusCode.OUT_OF_RANGE),
    (CorruptSegmentError, grpc.StatusCode.DATA_LOSS),
    (DlqCorruptError, grpc.StatusCode.DATA_LOSS),
    (WalFailedError, grpc.StatusCode.UNAVAILABLE),
    (WalIOError, grpc.StatusCode.UNAVAILABLE),
    (WalClosedError, grpc.StatusCode.UNAVAILABLE),
    (ShuttingDownError, grpc.StatusCode.UNAVAILABLE),
    (ClusterUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (ReplicationOutcomeUnknownError, grpc.StatusCode.UNAVAILABLE),
    (DispatcherClosedError, grpc.StatusCode.UNAVAILABLE),
)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message for ``exc`` (``INTERNAL`` for anything unknown)."""
    exc = _typed_io_error(exc)
    if isinstance(exc, PlacedCreateError):  # another broker's answer from this same table
        return _placed_status(exc.code), str(exc)
    for cls, code in STATUS_TABLE:
        if isinstance(exc, cls):
            return code, str(exc)
    logger.error("unexpected error serving a request", exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal broker error; see the broker log"


def _placed_status(name: str) -> grpc.StatusCode:
    """The status called ``name`` (``UNAVAILABLE`` for a name this grpc does not know)."""
    return getattr(grpc.StatusCode, name, grpc.StatusCode.UNAVAILABLE)


def trailers_for(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The trailing metadata the status of ``exc`` carries: a cluster refusal's
    ``headrace-*`` entries (:mod:`proto.refusal`), none for any other error."""
    if isinstance(exc, TopicRefusedError):
        return refusal_trailers(exc.refusal)
    return ()


def _typed_io_error(exc: BaseException) -> BaseException:
    """``exc``, with a foreign ``OSError`` translated to the wal's typed I/O error, and an
    I/O error that reports a full disk made a :class:`DiskFullError`."""
    if isinstance(exc, OSError):
        return io_error("file I/O", "a file of the data directory", exc)
    if (
        isinstance(exc, WalIOError)
        and not isinstance(exc, DiskFullError)
        and exc.errno in DISK_FULL_ERRNOS
    ):
        return DiskFullError(exc.op, exc.path, exc.errno)
    return exc


async def abort_for(exc: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
    """End the call with the status that the table gives ``exc``.

    When the call has already ended (its deadline passed, or the caller went away, while
    the broker worked out the answer), grpc cannot send the status and its ``abort``
    raises ``ExecuteBatchError`` (a ``grpc.aio.InternalError``); grpc logs that at ERROR
    with a traceback unless it has noticed the end itself. Answering a call that is over
    is not a failure of the broker, so it is logged here at DEBUG, without a traceback,
    and the handler ends as grpc ends a cancelled one: with ``CancelledError``.

    Raises:
        grpc.aio.AbortError: always, when the status went out (grpc expects it).
        asyncio.CancelledError: the call had already ended.
    """
    code, message = status_for(exc)
    trailers = trailers_for(exc)
    try:
        if trailers:
            await context.abort(code, message, trailers)
        await context.abort(code, message)
    except grpc.aio.AbortError:
        raise
    except grpc.aio.InternalError:
        logger.debug(
            "the call had ended before its answer (%s: %s) could be sent",
            code.name,
            shown_text(message),
        )
        raise asyncio.CancelledError from None
    raise AssertionError("context.abort returned")  # pragma: no cover


S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = grpc.aio.ServicerContext[Any, Any]


def rpc(
    handler: Callable[[S, Req, Context], Awaitable[Resp]],
) -> Callable[[S, Req, Context], Coroutine[Any, Any, Resp]]:
    """Decorate a unary servicer method: any error ends the call through :func:`abort_for`."""

    @functools.wraps(handler)
    async def wrapper(self: S, request: Req, context: Context) -> Resp:
        try:
            return await handler(self, request, context)
        except Exception as exc:
            await abort_for(exc, context)

    return wrapper
