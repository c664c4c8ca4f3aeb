"""Helpers shared by test packages: a manual clock, and awaiting one thing while watching
the tasks that must keep running meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class ManualClock:
    """Seconds (monotonic or wall-clock, as the code under test wants) that move only when
    a test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def until(awaitable: Awaitable[T], *tasks: asyncio.Task[Any]) -> T:
    """Await ``awaitable``, but if one of ``tasks`` ends first, raise what it raised."""
    waiter = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not waiter.done():
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
    for task in tasks:
        if task.done():
            task.result()
            raise AssertionError(f"{task.get_name()} ended early")
    return waiter.result()
