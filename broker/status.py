"""The one table from domain errors to gRPC status codes, and its use in servicers.

Role: servicers catch nothing themselves; :func:`abort_for` turns any known error into
``context.abort(code, message)`` with the error's own actionable message. Unknown errors are
logged with their traceback and reported as ``INTERNAL`` without internals.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import grpc

from broker.errors import (
    InvalidRequestError,
    ProducerSequenceError,
    ShuttingDownError,
    TopicExistsError,
    TopicNotFoundError,
)
from wal import (
    BatchTooLargeError,
    CorruptSegmentError,
    InvalidBatchError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    WalClosedError,
    WalFailedError,
)

logger = logging.getLogger(__name__)

#: Most specific classes first: the first ``isinstance`` match wins.
STATUS_TABLE: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (RecordTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (BatchTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InvalidBatchError, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (TopicNotFoundError, grpc.StatusCode.NOT_FOUND),
    (TopicExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (ProducerSequenceError, grpc.StatusCode.FAILED_PRECONDITION),
    (OffsetOutOfRangeError, grpc.StatusCode.OUT_OF_RANGE),
    (CorruptSegmentError, grpc.StatusCode.DATA_LOSS),
    (WalFailedError, grpc.StatusCode.UNAVAILABLE),
    (WalClosedError, grpc.StatusCode.UNAVAILABLE),
    (ShuttingDownError, grpc.StatusCode.UNAVAILABLE),
)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message for ``exc`` (``INTERNAL`` for anything unknown)."""
    for cls, code in STATUS_TABLE:
        if isinstance(exc, cls):
            return code, str(exc)
    logger.error("unexpected error serving a request", exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal broker error; see the broker log"


async def abort_for(exc: BaseException, context: grpc.aio.ServicerContext) -> NoReturn:  # type: ignore[type-arg]
    """End the call with the status that the table gives ``exc``."""
    code, message = status_for(exc)
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # pragma: no cover
