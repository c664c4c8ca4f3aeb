"""Retrying a gRPC call while the broker is briefly unavailable: one rule for every client.

Role: call, and on a retryable error (:attr:`ClientError.retryable`: the broker restarting
or shutting down) wait a full-jitter exponential backoff and call again, until a
deadline; any other error, or the deadline, raises the :mod:`client.errors` class at
once. Each attempt gets what is left of the deadline as its own gRPC timeout.

Example: with a 30 s deadline, UNAVAILABLE, UNAVAILABLE, OK takes the two pauses (up to
0.05 s, then up to 0.1 s) and returns the answer; NOT_FOUND raises ``NotFound`` at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from client.errors import from_rpc_error
from proto.shown import shown_text

logger = logging.getLogger(__name__)

R = TypeVar("R")

_BACKOFF_BASE_S = 0.05
_BACKOFF_MAX_S = 2.0


#: The longest pause before a routed call looks its topic up again. Short, because the
#: wait is for the cluster (an election, a session that lapses), not for a broker to
#: recover from load: a new leader is found within this of being elected. A Lookup is
#: answered from the broker's memory, so a few a second per stuck call cost little.
ROUTE_BACKOFF_MAX_S = 0.25


def backoff_s(attempt: int, rng: random.Random) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(max, base * 2**attempt)]."""
    return rng.uniform(0, min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2**attempt))


def route_backoff_s(attempt: int, rng: random.Random, *, lookup: bool) -> float:
    """The pause of a routed call: as :func:`backoff_s`, at most
    :data:`ROUTE_BACKOFF_MAX_S` when the call looks its topic up next (``lookup``)."""
    if not lookup:
        return backoff_s(attempt, rng)
    return rng.uniform(0, min(ROUTE_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2**attempt))


async def retrying(
    call: Callable[[float], Awaitable[R]], *, timeout_s: float, rng: random.Random, what: str
) -> R:
    """``await call(remaining_s)`` until it succeeds, a non-retryable error, or the
    deadline ``timeout_s`` from now. ``what`` names the call in the retry log line."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        remaining = deadline - time.monotonic()
        try:
            return await call(max(remaining, 0.001))
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            pause = backoff_s(attempt, rng)
            if not error.retryable or time.monotonic() + pause >= deadline:
                raise error from exc
            logger.info("%s failed (%s); retrying in %.3f s", what, shown_text(str(error)), pause)
            await asyncio.sleep(pause)
            attempt += 1


def retrying_blocking(
    call: Callable[[float], R], *, timeout_s: float, rng: random.Random, what: str
) -> R:
    """:func:`retrying` for blocking calls: the pauses are ``time.sleep``."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        remaining = deadline - time.monotonic()
        try:
            return call(max(remaining, 0.001))
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            pause = backoff_s(attempt, rng)
            if not error.retryable or time.monotonic() + pause >= deadline:
                raise error from exc
            logger.info("%s failed (%s); retrying in %.3f s", what, shown_text(str(error)), pause)
            time.sleep(pause)
            attempt += 1
