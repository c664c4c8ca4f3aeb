"""Helpers shared by test packages: a manual clock, awaiting one thing while watching the
tasks that must keep running meanwhile, polling for state other tasks reach, and the
order check of the broker-kill tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
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


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``check()`` holds, looking every 10 ms: state that tasks of the code
    under test reach on their own. Raises ``AssertionError`` after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not true after {timeout_s} s")


def check_first_deliveries_in_order(offsets: Mapping[int, Sequence[int]], label: str) -> None:
    """Per partition, the distinct offsets in first-seen order (``offsets``: every
    delivery, redeliveries included) are 0, 1, 2, ...: nothing was skipped, not even for a
    while, and nothing was delivered out of order. ``label`` names what was checked."""
    for partition, delivered in offsets.items():
        first_seen = list(dict.fromkeys(delivered))
        if first_seen != list(range(len(first_seen))):
            bad = next(i for i, offset in enumerate(first_seen) if offset != i)
            raise AssertionError(
                f"{label} partition {partition}: new offsets arrived as "
                f"{first_seen[max(0, bad - 3) : bad + 3]}, expected offset {bad} next"
            )
